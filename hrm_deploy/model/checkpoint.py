"""Checkpoint loading (upstream ``step_N`` + ``all_config.yaml``, or ours) and saving (ours).

Upstream files are bare state dicts whose keys start with ``_orig_mod.model.inner.``
(compiled), ``model.inner.`` (``DISABLE_COMPILE``) or ``inner.``; the architecture is in
``all_config.yaml`` beside them and ``seq_len``/``vocab_size``/``num_puzzle_identifiers``
in ``<data_path>/{train,test}/dataset.json``. Our own checkpoints are self-describing.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.errors import CheckpointError, ConfigError
from hrm_deploy.metrics import current_names
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.families import ModelFamily, config_from_dict, detect_family, family_of
from hrm_deploy.model.upstream_writer import upstream_state_dict, write_upstream_run

__all__ = ["load_checkpoint", "read_checkpoint", "save_checkpoint", "upstream_state_dict", "write_upstream_run"]
from hrm_deploy.model.validate import check_finite, reconcile_overrides

# Where a checkpoint file comes from (a file, a run folder's newest step_N, a Hub snapshot) lives in sources.
from hrm_deploy.sources import resolve_checkpoint_path  # noqa: E402

CHECKPOINT_FORMAT = "hrm-deploy-checkpoint"
UPSTREAM_PREFIXES = ("_orig_mod.model.inner.", "model.inner.", "inner.")
DATASET_FIELDS = ("seq_len", "vocab_size", "num_puzzle_identifiers")
# Provenance records of metrics; older checkpoints (the bundled presets among them) use the
# trainer's old metric names, read under the current ones.
METRIC_RECORDS = ("metrics", "act_report")
FLAGS = {
    "num_heads": "--num-heads",
    "H_cycles": "--h-cycles",
    "L_cycles": "--l-cycles",
    "halt_max_steps": "--halt-max-steps",
    "seq_len": "--seq-len",
    "vocab_size": "--vocab-size",
    "num_puzzle_identifiers": "--num-puzzle-ids",
}


@dataclass
class CheckpointContents:
    """What a checkpoint file holds, before a model is built from it."""

    path: Path
    kind: str  # "upstream" or "hrm-deploy"
    config: HRMConfig
    state_dict: dict[str, Any]  # keys without prefix, as HRMCore names them
    prefix: str = ""
    step: int | None = None
    train_config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # optimizer states etc. (ours only)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"path": str(self.path), "kind": self.kind, "prefix": self.prefix}
        described.update(step=self.step, data=self.data_record())
        return {**described, **({"overrides": self.extra["overrides"]} if self.extra.get("overrides") else {})}

    def data_record(self) -> dict[str, Any]:
        """What the file records of the data it was trained on: our trainer's dataset spec
        (``dataset``: regenerable; None without one) and the data path (``data_path``: ours, or
        upstream's ``all_config.yaml``, the first of a list in some TRM configs; None without one).
        An export's manifest keeps it, so commands on the export need not read the checkpoint."""
        spec = self.extra.get("dataset")
        path = self.train_config.get("data_path")
        paths = self.train_config.get("data_paths")
        if not path and isinstance(paths, list) and paths:
            path = paths[0]
        return {
            "dataset": spec if isinstance(spec, dict) and spec.get("generator") else None,
            "data_path": str(path) if path else None,
        }


# --------------------------------------------------------------------------------- reading
def _torch_load(path: Path) -> Any:
    import pickle

    import torch

    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes); the file was not written completely")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many unrelated types for bad files
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        if not zipfile.is_zipfile(path):
            raise CheckpointError(
                f"{path} is not a PyTorch checkpoint (not a complete torch.save zip archive: {first}); "
                "the file is truncated or of another kind: pass the step_N or .pt file written by the trainer"
            ) from None
        if isinstance(exc, pickle.UnpicklingError):
            raise CheckpointError(
                f"{path} contains Python objects that safe loading (weights_only=True) refuses: "
                f"{first}; re-save it as a plain state dict"
            ) from None
        raise CheckpointError(
            f"{path} cannot be read as a PyTorch checkpoint ({first}); "
            "the file is truncated or damaged: copy it again or pick another step"
        ) from None


def _strip_prefix(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    for prefix in UPSTREAM_PREFIXES:
        if all(k.startswith(prefix) for k in state):
            return {k[len(prefix) :]: v for k, v in state.items()}, prefix
    if "H_init" in state or "embed_tokens.embedding_weight" in state:
        return dict(state), ""
    sample = sorted(state)[:3]
    raise CheckpointError(
        f"{path}: state-dict keys {sample} do not start with any HRM prefix {list(UPSTREAM_PREFIXES)}; "
        "this is not an HRM checkpoint (or it mixes prefixes)"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a mapping; expected upstream's all_config.yaml")
    return data


def _find_dataset_json(data_path: str, ckpt_dir: Path) -> Path | None:
    """Upstream's data_path is relative to the directory training ran in; try it as given,
    then relative to the checkpoint folder and its ancestors."""
    candidates = [Path(data_path)]
    if not Path(data_path).is_absolute():
        candidates += [parent / data_path for parent in [ckpt_dir, *ckpt_dir.parents][:6]]
    for base in candidates:
        for split in ("train", "test"):
            meta = base / split / "dataset.json"
            if meta.is_file():
                return meta
    return None


def _infer_from_weights(state: dict[str, Any], family: ModelFamily) -> dict[str, Any]:
    """Sizes the weight shapes determine: the ones every family shares here, the rest from the
    family's ``infer_fields`` (e.g. HRM's seq_len for learned positions, TRM's mlp_t); the prefix +
    token width ``_total_seq_len`` for learned positions and mlp-t token mixing."""
    found: dict[str, Any] = {}
    emb = state.get("embed_tokens.embedding_weight")
    if emb is not None:
        found["vocab_size"], found["hidden_size"] = int(emb.shape[0]), int(emb.shape[1])
    for level, key in (("H", "H_layers"), ("L", "L_layers")):
        idx = {int(m.group(1)) for k in state if (m := re.match(rf"{level}_level\.layers\.(\d+)\.", k))}
        if idx:
            found[key] = max(idx) + 1
    gate_up = state.get(
        "H_level.layers.0.mlp.gate_up_proj.weight", state.get("L_level.layers.0.mlp.gate_up_proj.weight")
    )
    puzzle = state.get("puzzle_emb.weights")
    if puzzle is not None:
        found["num_puzzle_identifiers"], found["puzzle_emb_ndim"] = int(puzzle.shape[0]), int(puzzle.shape[1])
    else:
        found["puzzle_emb_ndim"] = 0
    # Positions inside the model (prefix + tokens): learned positions and TRM's mlp_t have that width.
    if "embed_pos.embedding_weight" in state:
        found["pos_encodings"] = "learned"
        found["_total_seq_len"] = int(state["embed_pos.embedding_weight"].shape[0])
    family.infer_fields(state, found)  # what only this family's weights tell
    if gate_up is not None:
        found["_intermediate_size"] = int(gate_up.shape[0]) // 2
    return found


def _dataset_source(
    path: Path, train_cfg: dict[str, Any], overrides: dict[str, Any], family: ModelFamily
) -> tuple[str, dict[str, Any]] | None:
    """(origin, fields) from the dataset.json of the run's data: under the family row's
    ``data_key`` (then upstream's two spellings, ``data_path`` and ``data_paths``), one path or a
    list (upstream merges those: same seq_len and vocab, puzzle ids summed)."""
    paths: list[str] = []
    if overrides.get("data_path"):
        paths = [str(overrides["data_path"])]
    for key in dict.fromkeys((family.data_key, "data_paths", "data_path")):
        if paths:
            break
        given = train_cfg.get(key)
        if isinstance(given, list):
            paths = [str(p) for p in given]
        elif given:
            paths = [str(given)]
    if not paths:
        return None
    found: list[tuple[Path, dict[str, Any]]] = []
    for data_path in paths:
        meta = _find_dataset_json(data_path, path.parent)
        if meta is None:
            continue
        try:
            info = json.loads(meta.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ConfigError(f"{meta} is not valid JSON; rebuild the dataset") from None
        if not isinstance(info, dict):
            raise ConfigError(f"{meta} is not a JSON object; rebuild the dataset")
        found.append((meta, info))
    if not found:
        return None
    meta, info = found[0]
    fields = {k: info[k] for k in DATASET_FIELDS if info.get(k) is not None}
    for other, more in found[1:]:
        for key in ("seq_len", "vocab_size"):
            if more.get(key) != info.get(key):
                raise ConfigError(
                    f"{meta} and {other} disagree on {key} ({info.get(key)} vs {more.get(key)}); "
                    "upstream cannot have trained on both: check data_paths in all_config.yaml"
                )
    if len(paths) > 1:  # upstream sums the identifiers of all datasets; only known if every one was found
        fields.pop("num_puzzle_identifiers", None)
        if len(found) == len(paths) and all(m.get("num_puzzle_identifiers") is not None for _, m in found):
            fields["num_puzzle_identifiers"] = sum(int(m["num_puzzle_identifiers"]) for _, m in found)
    shown = str(meta.relative_to(meta.parents[2]) if len(meta.parents) > 2 else meta)
    return "{} in " + shown.replace("{", "{{").replace("}", "}}"), fields


def _upstream_config(
    path: Path, state: dict[str, Any], overrides: dict[str, Any], family: ModelFamily, train_cfg: dict[str, Any]
) -> HRMConfig:
    """The config of an upstream checkpoint: sizes from the weights, the rest from
    ``all_config.yaml``/dataset.json/flags. A value that contradicts the weights is named with
    where it came from; a field neither the weights nor a config give is an error, never a default."""
    cfg_file = path.parent / "all_config.yaml"
    raw_arch = train_cfg.get("arch")
    if raw_arch is not None and not isinstance(raw_arch, dict):
        raise ConfigError(f"{cfg_file}: arch is a {type(raw_arch).__name__}, not a mapping; restore upstream's file")
    arch = dict(raw_arch or {})
    inferred = _infer_from_weights(state, family)
    hidden = {k: inferred.pop(k) for k in [k for k in inferred if k.startswith("_")]}
    sources: list[tuple[str, dict[str, Any]]] = [
        ("arch.{} in " + cfg_file.name, {k: v for k, v in arch.items() if k not in ("name", "loss") and v is not None})
    ]
    dataset = _dataset_source(path, train_cfg, overrides, family)
    if dataset is not None:
        sources.append(dataset)
    sources.append(("{flag}", {k: v for k, v in overrides.items() if k not in ("data_path", "forward_dtype")}))
    fields: dict[str, Any] = {}
    for origin, given in sources:
        for key, value in given.items():
            if (
                key in inferred
                and str(value) != str(inferred[key])
                and not (key == "seq_len" and "embed_pos.embedding_weight" not in state)
            ):
                where = origin.format(key, flag=FLAGS.get(key, "--" + key.replace("_", "-")))
                raise CheckpointError(
                    f"{path}: {where} is {value!r} but the weights have {key}={inferred[key]}; "
                    f"fix {where} (or leave it out: the weights determine it)"
                )
        fields.update(given)
    fields.update({k: v for k, v in inferred.items() if k != "seq_len" or "seq_len" not in fields})
    # Upstream computes in bf16; we load for float32 export unless the caller asks otherwise.
    fields["forward_dtype"] = overrides.get("forward_dtype", "float32")

    _require_fields(path, fields, hidden, family, train_cfg, arch)
    intermediate = hidden.get("_intermediate_size")
    if intermediate is not None and fields.get("expansion") is None:
        # upstream sizes the MLP as round(expansion * D * 2/3) up to a multiple of 256: this inverts it exactly
        fields["expansion"] = intermediate * 3 / (2 * fields["hidden_size"])
    family.derive_fields(fields, hidden)
    config = family.config_class.from_dict({**fields, "family": family.name})
    _check_widths(path, config, hidden, cfg_file.name)
    return config


def _require_fields(
    path: Path,
    fields: dict[str, Any],
    hidden: dict[str, Any],
    family: ModelFamily,
    train_cfg: dict[str, Any],
    arch: dict[str, Any],
) -> None:
    """One clear error for a field neither the weights, the config, the dataset nor a flag gave:
    the sizes (seq_len, vocab_size) and the family's required architecture fields."""
    cfg_file = path.parent / "all_config.yaml"
    missing = [k for k in ("seq_len", "vocab_size") if k not in fields]
    if missing:
        where = f"{cfg_file.parent}/all_config.yaml's {family.data_key}" if train_cfg else "all_config.yaml (absent)"
        options = " ".join(f"{FLAGS[k]} N" for k in missing)
        raise ConfigError(
            f"{path} ({family.title}): cannot determine {', '.join(missing)}: no dataset.json found via {where} and the weights "
            f"do not determine it; pass {options} (or --data-path pointing at the dataset folder)"
        )
    derivable = {"puzzle_emb_len"} if "_total_seq_len" in hidden else set()
    absent = [k for k in family.required_fields if fields.get(k) is None and k not in derivable]
    if absent:
        flagged = [k for k in absent if k in FLAGS]
        unflagged = [k for k in absent if k not in FLAGS]  # only all_config.yaml can give these
        options = " ".join(f"{FLAGS[k]} X" for k in flagged)
        options = (f"pass {options}" if options else "") + (
            f"{' and ' if options else ''}set arch.{', arch.'.join(unflagged)}" if unflagged else ""
        )
        where = (
            f"{cfg_file} has no arch section"
            if train_cfg and not arch
            else f"{cfg_file} lacks arch.{', arch.'.join(absent)}"
            if train_cfg
            else "no all_config.yaml beside the checkpoint"
        )
        raise ConfigError(
            f"{path} ({family.title}): {where} and {', '.join(absent)} cannot be read from the weights; copy upstream's "
            f"all_config.yaml next to it or {options} (never guessed: a wrong value is a different model)"
        )


def _check_widths(path: Path, config: HRMConfig, hidden: dict[str, Any], cfg_name: str) -> None:
    """Weight widths the config determines must match it exactly (one line naming the field)."""
    intermediate = hidden.get("_intermediate_size")
    if intermediate is not None and intermediate != config.intermediate_size:
        raise CheckpointError(
            f"{path}: MLP width {intermediate} in the weights does not match arch.expansion {config.expansion} "
            f"(gives {config.intermediate_size} at hidden_size {config.hidden_size}); fix arch.expansion in {cfg_name}"
        )
    total = hidden.get("_total_seq_len")
    if total is not None and total != config.total_seq_len:
        raise CheckpointError(
            f"{path}: the weights span {total} positions but seq_len {config.seq_len} + puzzle prefix "
            f"{config.puzzle_emb_len} = {config.total_seq_len}; fix the dataset's seq_len or arch.puzzle_emb_len in {cfg_name}"
        )
    mlp_t_width = hidden.get("_mlp_t_intermediate_size")
    if mlp_t_width is not None and mlp_t_width != getattr(config, "mlp_t_intermediate_size", None):
        raise CheckpointError(
            f"{path}: mlp_t width {mlp_t_width} in the weights does not match arch.expansion {config.expansion}; "
            f"fix arch.expansion in {cfg_name}"
        )


def read_checkpoint(path: str | os.PathLike, **overrides: Any) -> CheckpointContents:
    """Read a checkpoint (file or folder) and work out its :class:`HRMConfig`.

    ``overrides`` set config fields (``seq_len=81``, ``num_heads=8``, ``forward_dtype=...``)
    or ``data_path`` (where upstream's dataset.json lives). ``None`` values are ignored.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    file = resolve_checkpoint_path(path)
    obj = _torch_load(file)
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        try:
            cfg_fields, recorded = reconcile_overrides(obj["model_config"], overrides, file)
            config = config_from_dict(cfg_fields)
            state = obj["model_state"]
        except KeyError as exc:
            raise CheckpointError(f"{file}: hrm-deploy checkpoint lacks {exc}; the file is damaged") from None
        extra = {
            k: v for k, v in obj.items() if k not in ("format", "model_config", "model_state", "train_config", "step")
        }
        extra.update({"overrides": recorded} if recorded else {})
        for key in METRIC_RECORDS:
            if isinstance(extra.get(key), dict):
                extra[key] = current_names(extra[key])
        return CheckpointContents(
            file, "hrm-deploy", config, dict(state), "", obj.get("step"), dict(obj.get("train_config") or {}), extra
        )
    if not isinstance(obj, dict) or not obj or not all(hasattr(v, "shape") for v in obj.values()):
        raise CheckpointError(
            f"{file} holds a {type(obj).__name__}, not a state dict of tensors; "
            "pass an upstream step_N file or a checkpoint written by hrm-deploy train"
        )
    state, prefix = _strip_prefix(obj, file)
    cfg_file = file.parent / "all_config.yaml"
    train_cfg: dict[str, Any] = _read_yaml(cfg_file) if cfg_file.is_file() else {}
    arch = train_cfg.get("arch")
    arch_name = arch.get("name") if isinstance(arch, dict) else None
    family = detect_family(state, str(arch_name) if arch_name else None, str(file))
    config = _upstream_config(file, state, overrides, family, train_cfg)
    _, recorded = reconcile_overrides(train_cfg.get("arch") or {}, overrides, file, required=())
    step = int(m.group(1)) if (m := re.fullmatch(r"step_(\d+)", file.name)) else None
    return CheckpointContents(file, "upstream", config, state, prefix, step, train_cfg, {"overrides": recorded})


def check_state_dict(expected: dict[str, Any], given: dict[str, Any], source: Path) -> None:
    """Strict key and shape check with one actionable error line."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = sorted(k for k in set(expected) & set(given) if tuple(expected[k].shape) != tuple(given[k].shape))

    def names(keys: list[str]) -> str:
        return ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")

    problems = []
    if missing:
        problems.append(f"missing keys {names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {names(unexpected)}")
    if shapes:
        detail = ", ".join(f"{k} {tuple(given[k].shape)} vs {tuple(expected[k].shape)}" for k in shapes[:3])
        problems.append(f"mis-shaped {detail}")
    if problems:
        raise CheckpointError(
            f"{source} does not match the HRM config: {'; '.join(problems)}. Likely cause: a wrong "
            "all_config.yaml / dataset (seq_len, vocab, layers, puzzle_emb_ndim, pos_encodings) or a different model family"
        )


def load_checkpoint(path: str | os.PathLike, **overrides: Any):
    """Load a checkpoint into the reference model: returns ``(model, HRMConfig)``.

    ``model`` is an :class:`~hrm_deploy.model.hrm.HRMACT` in eval mode with float32
    master weights, computing in ``config.forward_dtype`` (float32 unless overridden).
    The loaded file's description is on ``model.checkpoint_info``.
    """
    # the precision a run trained in (upstream's and the Sudoku-size preset's bfloat16) is a run option,
    # not part of the model: inference, export and references compute in float32 unless asked otherwise
    overrides = {"forward_dtype": "float32", **{k: v for k, v in overrides.items() if v is not None}}
    contents = read_checkpoint(path, **overrides)
    return model_from_contents(contents), contents.config


def model_from_contents(contents: CheckpointContents):
    import torch

    with torch.device("cpu"):
        model = family_of(contents.config).act_class()(contents.config)
    core = model.inner
    expected = core.state_dict()
    check_state_dict(expected, contents.state_dict, contents.path)
    check_finite(contents.state_dict, contents.path)
    state = {k: v.to(expected[k].dtype) for k, v in contents.state_dict.items()}
    core.load_state_dict(state, strict=True)
    model.eval()
    model.checkpoint_info = contents.describe()
    return model


# --------------------------------------------------------------------------------- writing
def save_checkpoint(
    path: str | os.PathLike, model, *, step: int = 0, train_config: dict[str, Any] | None = None, **extra: Any
) -> Path:
    """Write our self-describing checkpoint atomically (temp file, then rename)."""
    import torch

    from hrm_deploy.io import atomic_path

    core = getattr(model, "inner", model)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model_config": core.config.to_dict(),
        "model_state": {k: v.detach().cpu() for k, v in core.state_dict().items()},
        "train_config": dict(train_config or {}),
        "step": int(step),
        **extra,
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return Path(path)
