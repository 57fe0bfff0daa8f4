"""Writing upstream's checkpoint layout for any model family: ``<run>/step_N`` (a bare state
dict with upstream's key prefix, H_init/L_init in bf16 as upstream's bf16 buffers are saved)
and ``all_config.yaml`` (the family's ``arch`` section, its data key, hyper-parameters), so the
family's upstream code and this toolkit's loader both read it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hrm_deploy.model.families import family_of


def upstream_state_dict(model, prefix: str = "_orig_mod.model.inner.") -> dict[str, Any]:
    """State dict in upstream's layout: prefixed keys, bf16 H_init/L_init, as upstream saves."""
    import torch

    core = getattr(model, "inner", model)
    out = {}
    for k, v in core.state_dict().items():
        v = v.detach().cpu()
        if k in ("H_init", "L_init"):
            v = v.to(torch.bfloat16)
        out[prefix + k] = v
    return out


def upstream_arch(config, loss_type: str = "stablemax_cross_entropy") -> dict[str, Any]:
    """The ``arch`` section upstream's training writes for ``config``'s family."""
    family = family_of(config)
    arch: dict[str, Any] = {
        "name": family.arch_names[0],
        "loss": {"name": "losses@ACTLossHead", "loss_type": loss_type},
    }
    for key in family.upstream_arch_fields:
        arch[key] = "bfloat16" if key == "forward_dtype" else getattr(config, key)
    return arch


def write_upstream_run(
    run_dir: str | os.PathLike,
    model,
    *,
    step: int,
    data_path: str,
    train_config: dict[str, Any] | None = None,
    loss_type: str = "stablemax_cross_entropy",
    prefix: str = "_orig_mod.model.inner.",
) -> Path:
    """Write upstream's checkpoint layout: ``<run_dir>/step_N`` and ``all_config.yaml`` (arch +
    the dataset under the family row's ``data_key`` + hyper-parameters). Returns step_N."""
    import torch
    import yaml

    from hrm_deploy.io import atomic_path

    cfg = getattr(model, "inner", model).config
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    family = family_of(cfg)
    data = family.upstream_data(data_path)
    # the dataset is named once, under the family's key (TRM's upstream config has no data_path)
    hyper = {k: v for k, v in (train_config or {}).items() if k not in (family.data_key, "data_path", "data_paths")}
    all_config = {"arch": upstream_arch(cfg, loss_type), "checkpoint_path": str(run), **hyper, **data}
    target = run / f"step_{step}"
    with atomic_path(target) as tmp:
        torch.save(upstream_state_dict(model, prefix), tmp)
    with atomic_path(run / "all_config.yaml") as tmp:
        Path(tmp).write_text(yaml.safe_dump(all_config, sort_keys=False))
    return target
