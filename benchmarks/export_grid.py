"""The export grid: every valid recursion of HRM and both TRM variants over cycles and layers, in
step and unrolled modes, exported with the export's own parity check, its verdicts recorded: for
every case, pass or fail, the worst tensor's max abs difference over its limit, which rule set the
limit (depth-scaled strict limit, float32's own variation here, argmax agreement) and the seconds it
took; plus this CPU's vector extensions (AVX2 vs AVX-512 round differently).

    python benchmarks/export_grid.py [--upstream] [--no-grid] [--out benchmarks/results/export_grid_avx2.json]

The grid is defined here (:data:`TRM_GRID`, :data:`HRM_GRID`, the models by :func:`trm_model` and
:func:`hrm_model`); the test suite (tests/export/test_export_grid.py) exports a pairwise subset of it
that holds every value of every axis and every pair of values. ``--upstream`` adds TRM attention at
upstream's full size (hidden 512, 8 heads, 2 layers, seq 81, 16 ACT steps, random weights) at H/L
2/5 and 3/6 in step mode: the recipes refused on an AVX2 machine before the limits followed depth
and float32's variation.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ParityError
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model import HRMConfig, TRMConfig
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.hrm import build_model

# small enough that one export with parity takes about a second
GRID_BASE: dict[str, Any] = dict(
    seq_len=16, vocab_size=11, num_puzzle_identifiers=1, hidden_size=32, num_heads=2, halt_max_steps=2
)
TRM_MIXERS = ("attention", "mlp_t")  # attention with RoPE, or upstream's Sudoku recipe: mlp_t, no positions

# (mode, mixer or layers, H_cycles, L_cycles). The folding bug this grid guards against lived in the
# traced segment, which step and unrolled graphs share (the unroll repeats the folded segment): the
# step mode sweeps every cycle count, the unrolled mode the corners and upstream's recipes.
TRM_GRID = [("step", m, hc, lc) for m in TRM_MIXERS for hc in (1, 2, 3) for lc in range(1, 7)]
TRM_GRID += [("unrolled", m, hc, lc) for m in TRM_MIXERS for hc, lc in ((1, 1), (1, 6), (3, 1), (3, 4), (3, 6))]
HRM_GRID = [("step", n, hc, lc) for n in (1, 2, 3, 4) for hc in (1, 2, 3) for lc in (1, 2, 3)]
HRM_GRID += [("unrolled", n, hc, lc) for n in (1, 4) for hc, lc in ((1, 1), (3, 3), (1, 3), (3, 1))]


def trm_model(mixer: str, H_cycles: int, L_cycles: int) -> Any:
    """The grid's TRM of ``mixer`` (attention or mlp_t) at these cycles: seeded, random weights."""
    mlp_t = mixer == "mlp_t"
    cfg = TRMConfig(
        **GRID_BASE,
        H_cycles=H_cycles,
        L_cycles=L_cycles,
        L_layers=2,
        puzzle_emb_len=4,
        puzzle_emb_ndim=32,
        mlp_t=mlp_t,
        pos_encodings="none" if mlp_t else "rope",
    )
    return build_model(cfg, seed=H_cycles * 10 + L_cycles).eval()


def hrm_model(layers: int, H_cycles: int, L_cycles: int) -> Any:
    """The grid's HRM with ``layers`` H and L layers at these cycles: seeded, random weights."""
    cfg = HRMConfig(
        **GRID_BASE,
        H_cycles=H_cycles,
        L_cycles=L_cycles,
        H_layers=layers,
        L_layers=layers,
        puzzle_emb_ndim=32,
        pos_encodings="rope",
    )
    return build_model(cfg, seed=layers * 100 + H_cycles * 10 + L_cycles).eval()


UPSTREAM_TRM: dict[str, Any] = dict(
    seq_len=81,
    vocab_size=11,
    num_puzzle_identifiers=1,
    hidden_size=512,
    num_heads=8,
    L_layers=2,
    halt_max_steps=16,
    puzzle_emb_ndim=512,
    puzzle_emb_len=16,
)


def _cpu() -> dict[str, Any]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return {
        "model": model or platform.processor(),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "amx": any(f.startswith("amx") for f in flags),
    }


def _case(model, mode: str, folder: Path) -> dict[str, Any]:
    ckpt = save_checkpoint(folder / "m.pt", model)
    start = time.perf_counter()
    try:
        result = export_onnx(ckpt, folder / f"m.{mode}.onnx", ExportConfig(mode=mode, max_batch=4), quiet=True)
    except ParityError as exc:
        return {"passed": False, "seconds": time.perf_counter() - start, "error": str(exc)}
    verdicts = [v for batch in (result.parity or {}).get("batches", {}).values() for v in batch.values()]
    worst = max(verdicts, key=lambda v: v["max_abs"] / (v.get("limit") or v.get("strict_limit") or 1.0))
    return {
        "passed": True,
        "seconds": time.perf_counter() - start,
        "worst_ratio": worst["max_abs"] / (worst.get("limit") or worst["strict_limit"]),
        "decided_by": sorted({v.get("decided_by") or v.get("limit_from", "strict") for v in verdicts}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", action="store_true")
    parser.add_argument("--no-grid", action="store_true", help="only the --upstream cases")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases: list[tuple[str, Any, str]] = []
    for mode, mixer, hc, lc in [] if args.no_grid else TRM_GRID:
        cases.append((f"trm {mixer} {mode} H{hc}/L{lc}", trm_model(str(mixer), hc, lc), mode))
    for mode, layers, hc, lc in [] if args.no_grid else HRM_GRID:
        cases.append((f"hrm {layers} layers {mode} H{hc}/L{lc}", hrm_model(int(layers), hc, lc), mode))
    if args.upstream:
        for hc, lc in ((2, 5), (3, 6)):
            cfg = TRMConfig(**UPSTREAM_TRM, H_cycles=hc, L_cycles=lc, pos_encodings="rope", mlp_t=False)
            cases.append((f"trm attention upstream size step H{hc}/L{lc}", build_model(cfg, seed=0).eval(), "step"))
    rows = {}
    for name, model, mode in cases:
        with tempfile.TemporaryDirectory() as tmp:
            rows[name] = _case(model, mode, Path(tmp))
        print(name, json.dumps(rows[name]), flush=True)
    result = {
        "cpu": _cpu(),
        "cases": len(rows),
        "passed": sum(r["passed"] for r in rows.values()),
        "seconds": sum(r["seconds"] for r in rows.values()),
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
