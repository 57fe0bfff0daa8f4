"""``export_onnx``: checkpoint or model -> FP32 ONNX (dynamic batch), checked and parity-tested.

The stages, each in its own module: trace the embedding and one ACT segment
(:mod:`~hrm_deploy.export.trace`), assemble the graph of the chosen mode (step and unrolled:
:mod:`~hrm_deploy.export.assemble`; loop: :mod:`~hrm_deploy.export.loop`), then here the structural
checks, the parity check against PyTorch (:mod:`~hrm_deploy.export.parity`) and the artifact with
its manifest.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError, ConfigError, ParityError, require
from hrm_deploy.export.assemble import assemble, io_contract
from hrm_deploy.export.loop import LoopHalt, assemble_loop, check_loop_parity
from hrm_deploy.export.metadata import write_graph_metadata
from hrm_deploy.export.trace import trace_pieces
from hrm_deploy.export.unroll import FixedStepHRM
from hrm_deploy.io import check_output_path, sha256_file, staging_dir
from hrm_deploy.manifest import check_replaceable, output_path, publish_artifact
from hrm_deploy.model.families import family_of
from hrm_deploy.progress import Stages, progress
from hrm_deploy.provenance import reference_files
from hrm_deploy.puzzle_table import Placement, table_path, write_table
from hrm_deploy.sources import file_sha256, hub_origin

MODES = ("unrolled", "step", "loop")
MIN_OPSET = 17
MAX_OPSET = 20  # torch.onnx TorchScript exporter maximum (ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET)
MAX_BATCH = 1 << 16
MAX_STEPS = 256  # each unrolled step inlines the whole segment graph
DEFAULT_WORKSPACE = Path("export")
EXTERNAL_DATA_BYTES = 1_500_000_000  # protobuf's hard limit is 2 GiB; stay well below it


@dataclass(frozen=True)
class ExportConfig:
    """How to export. ``steps`` defaults to the model's ``halt_max_steps``; ``mode`` None is the
    model family's default (unrolled for HRM, step for TRM), recorded in the manifest as chosen."""

    mode: str | None = None
    steps: int | None = None
    max_batch: int = 64
    opset: int = 18
    step_predictions: bool = False
    parity: bool = True
    parity_batches: tuple[int, ...] = (1, 2)
    external_data: bool | None = None  # None: automatic above ~1.5 GB of weights
    # fold the traced pieces' shape arithmetic (onnxslim) before the unroll is assembled
    fold: bool = True
    # EXTERNAL: the table goes beside the graph (.puzzle_emb.npy), the graph takes puzzle_emb_rows
    puzzle_emb: Placement = Placement.EMBEDDED
    # mode loop: the halting rule the graph tests after each step (off | q | threshold:X)
    halt: str = "off"

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"export mode {self.mode!r} is unknown; use one of {MODES}")
        if not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise ConfigError(f"opset {self.opset} is out of range; use --opset between {MIN_OPSET} and {MAX_OPSET}")
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise ConfigError(f"--max-batch must be between 1 and {MAX_BATCH}, got {self.max_batch}")
        if self.steps is not None and not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"--steps must be between 1 and {MAX_STEPS}, got {self.steps}")
        if not self.parity_batches or any(not 1 <= b <= MAX_BATCH for b in self.parity_batches):
            raise ConfigError(f"parity batches must be between 1 and {MAX_BATCH}, got {self.parity_batches}")
        if self.halt != "off" and self.mode not in ("loop", None):
            raise ConfigError(
                f"--halt {self.halt}: only a loop graph fixes its halting rule at export (--mode loop); "
                "step graphs take --halt at run time (verify, solve, serve)"
            )
        if self.halt != "off":  # the rule's text checked now, before the model loads
            from hrm_deploy.export.loop import LoopHalt

            LoopHalt.parse(self.halt, q_halt_only=False)
        try:
            object.__setattr__(self, "puzzle_emb", Placement(self.puzzle_emb))
        except ValueError:
            raise ConfigError(f"--puzzle-emb {self.puzzle_emb!r}: use one of {[p.value for p in Placement]}") from None


@dataclass
class ExportResult:
    path: Path
    manifest: Path
    parity: dict[str, Any] | None
    timings: dict[str, float] = field(default_factory=dict)
    nodes: int = 0
    folding: dict[str, Any] = field(default_factory=dict)


def default_name(source: Any) -> str:
    """A readable artifact name: upstream ``<run>/step_N`` -> ``<run>-step_N``; ours -> stem; a file
    from the Hub cache -> its repository's name (``HRM-checkpoint-sudoku-extreme``)."""
    from hrm_deploy.sources import hub_name

    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if hub_name(p):
            return _slug(str(hub_name(p)))
        if p.is_dir():
            return _slug(p.name)
        if re.fullmatch(r"step_\d+", p.name):
            return _slug(f"{p.parent.name}-{p.name}")
        return _slug(p.stem)
    return "hrm"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "hrm"


def _source_file(model_or_ckpt) -> tuple[Path | None, str | None]:
    """The checkpoint file an export reads (a run folder's newest step_N) and its sha256, taken
    before loading so the manifest's parent record is of the bytes the graph came from."""
    from hrm_deploy.errors import HRMDeployError
    from hrm_deploy.model.checkpoint import resolve_checkpoint_path

    if not isinstance(model_or_ckpt, (str, os.PathLike)):
        return None, None
    try:
        file = resolve_checkpoint_path(model_or_ckpt)
    except HRMDeployError:
        return None, None  # the loader raises the same error with its full message
    return file, file_sha256(file)  # computed once: the manifest's Hub record reuses it


def _resolve_source(model_or_ckpt, overrides):
    from hrm_deploy.model.checkpoint import load_checkpoint

    if isinstance(model_or_ckpt, (str, os.PathLike)):
        model, _ = load_checkpoint(model_or_ckpt, **overrides)
        return model, Path(model_or_ckpt)
    if overrides:
        raise ConfigError("checkpoint overrides only apply when exporting from a checkpoint path")
    return model_or_ckpt, None


def _save(model, path: Path, external: bool) -> None:
    """Write ``path`` (and ``path.data`` with external weights). Callers write into a
    staging folder and rename into place, so nothing half-written is ever visible."""
    import onnx

    if external:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, path)


def export_onnx(
    model_or_ckpt: Any,
    out: str | os.PathLike | None = None,
    config: ExportConfig = ExportConfig(),
    *,
    quiet: bool = False,
    **checkpoint_overrides: Any,
) -> ExportResult:
    """Export a checkpoint path or an :class:`~hrm_deploy.model.hrm.HRMACT` to ONNX.

    Writes ``out`` (default ``export/<name>.onnx``, ``<name>.step.onnx`` in step mode)
    and its ``.manifest.json``, after the structural checks and, unless disabled, the
    ONNX Runtime parity check. Raises :class:`~hrm_deploy.errors.ParityError` with the
    numbers when parity fails (nothing is written then).
    """
    onnx = require("onnx", "onnx", "ONNX export")
    import torch

    from hrm_deploy.export.graph import check_structure, initializer_bytes
    from hrm_deploy.export.parity import check_parity, check_segment

    stages = Stages(quiet)
    if out is not None and not Path(out).is_dir():  # a file path: refused before even the model loads
        check_replaceable(check_output_path(out), [model_or_ckpt if isinstance(model_or_ckpt, (str, Path)) else None])
    with stages.stage("loading model"):
        source_file, source_sha256 = _source_file(model_or_ckpt)
        model, source = _resolve_source(model_or_ckpt, {k: v for k, v in checkpoint_overrides.items() if v is not None})
        core = model.inner if hasattr(model, "inner") else model
        if core.compute_dtype != torch.float32:
            raise ConfigError(
                "export runs in float32; load the checkpoint with forward_dtype='float32' "
                "(precision is chosen later, per target)"
            )
        core.eval()
    cfg = core.config
    family = family_of(cfg)
    mode = config.mode or family.default_mode
    config = replace(config, mode=mode)
    steps = config.steps or cfg.halt_max_steps
    external_table = config.puzzle_emb is Placement.EXTERNAL
    if external_table and cfg.puzzle_emb_ndim <= 0:
        raise ConfigError("--puzzle-emb external: this model has no puzzle-embedding table (puzzle_emb_ndim 0)")
    loop_halt = None
    if mode == "loop":
        loop_halt = LoopHalt.parse(config.halt, q_halt_only=cfg.halts_on_q_halt_alone)
    elif config.halt != "off":
        raise ConfigError(f"--halt {config.halt}: only --mode loop fixes a halting rule at export")
    suffix = {"step": ".step.onnx", "loop": ".loop.onnx"}.get(mode, ".onnx")
    name = default_name(source if source else model_or_ckpt) + suffix
    out = DEFAULT_WORKSPACE / name if out is None else output_path(out, name)  # -o FOLDER: FOLDER/<name>
    out = check_output_path(out)  # fail before the work, not after
    check_replaceable(out, [source_file, source])  # never the checkpoint, never a file we did not write

    folding: dict[str, Any] = {}
    with stages.stage("tracing embedding and one ACT segment" + (", folding shapes" if config.fold else "")):
        embed, step = trace_pieces(core, config.opset, config.fold, folding, external_table)
    what = {"step": "the single-step graph", "loop": f"the ACT loop (at most {steps} steps)"}
    with stages.stage(f"assembling {what.get(mode, f'{steps}-step unroll')}"):
        if loop_halt is not None:
            io_spec = io_contract(cfg, mode, steps, False, external_table)
            graph = assemble_loop(embed, step, cfg, steps, loop_halt, io_spec, external_table)
            # the same segment as a step graph: the per-step parity check and the loop's host-loop twin
            step_graph, _ = assemble(embed, step, cfg, "step", steps, False, external_table)
        else:
            graph, io_spec = assemble(embed, step, cfg, mode, steps, config.step_predictions, external_table)
    folding["graph_nodes"] = len(graph.graph.node)
    external = (
        config.external_data if config.external_data is not None else initializer_bytes(graph) > EXTERNAL_DATA_BYTES
    )
    write_graph_metadata(
        graph,
        cfg,
        mode=config.mode,
        steps=steps,
        max_batch=config.max_batch,
        puzzle_emb=config.puzzle_emb.value,
        halt=loop_halt.text if loop_halt is not None else None,
    )

    if source_file is not None and sha256_file(source_file) != source_sha256:
        raise ArtifactError(f"{source_file} changed while it was being exported; export it again")
    with staging_dir(out.parent if str(out.parent) else Path("."), "export-check") as staging:
        with stages.stage("structural checks (checker, shape inference, I/O contract)"):
            staged = staging / out.name
            _save(graph, staged, external)
            table_file, table = table_path(out), None
            if external_table:  # float32 [num_ids, puzzle_emb_ndim], memory-mapped by the runners
                table = write_table(staging / table_file.name, core.puzzle_emb.weights.detach().cpu().numpy())
            check_structure(
                onnx.load(staged, load_external_data=False) if external else graph,
                io_spec,
                path=str(staged) if external else None,
                loop=loop_halt is not None,
            )
        parity = None
        if config.parity:
            with stages.stage("parity vs PyTorch on ONNX Runtime CPU"):
                batches = tuple(min(b, config.max_batch) for b in config.parity_batches)
                checked = str(staged)
                if loop_halt is not None:  # the segment vs PyTorch per step, through the step graph
                    checked = str(staging / "segment.step.onnx")
                    _save(step_graph, Path(checked), external)
                with progress(len(batches), "parity", quiet, unit="batch sizes") as advance:
                    report = check_parity(
                        checked,
                        FixedStepHRM(core, steps).eval(),
                        cfg,
                        steps,
                        batches,
                        stepwise=config.mode in ("step", "loop"),
                        advance=advance,
                        puzzle_table=table,
                    )
                if report.method == "end to end":  # loose on chaotic weights, so also one segment, tight
                    report.segment = check_segment(step.SerializeToString(), core)
                parity = report.to_dict()
                if loop_halt is not None and report.passed:
                    parity["loop"] = check_loop_parity(
                        str(staged), checked, cfg, loop_halt, batches, steps, puzzle_table=table
                    )
                    Path(checked).unlink()
                    Path(checked + ".data").unlink(missing_ok=True)
            if not report.passed:
                raise ParityError(f"ONNX Runtime output differs from PyTorch: {report.message}")
        with stages.stage(f"writing {out}"):
            # artifact + manifest as one unit: the manifest is renamed last, sha256 of the staged bytes
            data_file = out.parent / (out.name + ".data")
            manifest = publish_artifact(
                staged,
                out,
                stage="export",
                config={"export": asdict(config), "model": cfg.to_dict()},
                parent=source_file,
                parent_sha256=source_sha256,
                companions=[(staging / data_file.name, data_file)] * external
                + [(staging / table_file.name, table_file)] * external_table,
                # weights and table of an earlier export that kept them outside
                remove=[data_file] * (not external) + [table_file] * (not external_table),
                source=getattr(model, "checkpoint_info", None),
                # a published checkpoint: repository, commit, the refs naming it, file sha256s
                hub=hub_origin(source_file),
                reference_files=reference_files(source_file),  # upstream's config and dataset.json, hashed
                # fields the checkpoint lacked, given on the command line: shown by inspect and
                # verify, and applied when verify loads the reference
                checkpoint_overrides=(getattr(model, "checkpoint_info", None) or {}).get("overrides") or {},
                precision="fp32",
                mode=config.mode,
                unroll={"steps": steps, **family.describe(cfg)},
                halt=loop_halt.to_dict() if loop_halt is not None else None,
                io={
                    k: {n: [onnx.TensorProto.DataType.Name(t), list(s)] for n, (t, s) in v.items()}
                    for k, v in io_spec.items()
                },
                opset=config.opset,
                max_batch=config.max_batch,
                external_data=external,
                puzzle_emb=table.record(table_file.name) if table is not None else {"placement": "embedded"},
                nodes=len(graph.graph.node),
                folding=folding,
                parity=parity,
                timings=stages.timings,
            )
    return ExportResult(out, manifest, parity, stages.timings, len(graph.graph.node), folding)
