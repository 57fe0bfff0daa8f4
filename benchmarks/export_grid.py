"""The export grid of the test suite (tests/export/test_export_grid.py), run once with its parity
verdicts recorded: for every case, pass or fail, the worst tensor's max abs difference over its limit,
which rule set the limit (depth-scaled strict limit, float32's own variation here, argmax agreement)
and the seconds it took; plus this CPU's vector extensions (AVX2 vs AVX-512 round differently).

    python benchmarks/export_grid.py [--upstream] [--no-grid] [--out benchmarks/results/export_grid_avx2.json]

``--upstream`` adds TRM attention at upstream's full size (hidden 512, 8 heads, 2 layers, seq 81,
16 ACT steps, random weights) at H/L 2/5 and 3/6 in step mode: the recipes refused on an AVX2 machine
before the limits followed depth and float32's variation.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test grid it shares (tests/)

from hrm_deploy.errors import ParityError
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model import HRMConfig, TRMConfig
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.hrm import build_model
from tests.conftest import TRM_VARIANTS
from tests.export.test_export_grid import GRID_BASE, HRM_GRID, TRM_GRID

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
    cfg: Any
    for mode, variant, hc, lc in [] if args.no_grid else TRM_GRID:
        cfg = TRMConfig(
            **{**GRID_BASE, "H_cycles": hc, "L_cycles": lc, "L_layers": 2, "puzzle_emb_len": 4, "puzzle_emb_ndim": 32},
            **TRM_VARIANTS[variant],
        )
        cases.append((f"trm {variant} {mode} H{hc}/L{lc}", build_model(cfg, seed=hc * 10 + lc).eval(), mode))
    for mode, layers, hc, lc in [] if args.no_grid else HRM_GRID:
        cfg = HRMConfig(
            **{**GRID_BASE, "H_cycles": hc, "L_cycles": lc, "H_layers": layers, "L_layers": layers},
            puzzle_emb_ndim=32,
            pos_encodings="rope",
        )
        seed = layers * 100 + hc * 10 + lc
        cases.append((f"hrm {layers} layers {mode} H{hc}/L{lc}", build_model(cfg, seed=seed).eval(), mode))
    if args.upstream:
        for hc, lc in ((2, 5), (3, 6)):
            cfg = TRMConfig(**UPSTREAM_TRM, H_cycles=hc, L_cycles=lc, **TRM_VARIANTS["attention"])
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
