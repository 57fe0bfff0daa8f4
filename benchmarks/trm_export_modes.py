"""TRM: step vs unrolled export, measured on one machine in one run: graph nodes, file size,
export time (tracing + assembly + structural checks + ONNX Runtime parity) and, where
tensorrt-rtx is installed, the FP16 engine build time (on CPU: RTX builds ahead of time).

The model is upstream's Sudoku recipe at full size (hidden 512, 2 layers, mlp_t, no positions,
T=3 x n=6, 16 ACT steps, 16-position prefix) with random weights (``--size upstream``), or the
test fixture's tiny size (``--size tiny``). Each ACT step applies the network 3 x (6 + 1) = 21
times, so the 16-step unroll holds 336 network passes against 21 for the step graph.

    nice python benchmarks/trm_export_modes.py [--size upstream] [--out benchmarks/results/trm_export_modes.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model.hrm import build_model
from hrm_deploy.model.trm_config import TRMConfig

SIZES: dict[str, dict[str, Any]] = {
    "upstream": dict(
        hidden_size=512,
        num_heads=8,
        L_layers=2,
        H_cycles=3,
        L_cycles=6,
        halt_max_steps=16,
        puzzle_emb_ndim=512,
        puzzle_emb_len=16,
    ),
    "tiny": dict(
        hidden_size=64,
        num_heads=4,
        L_layers=2,
        H_cycles=2,
        L_cycles=3,
        halt_max_steps=3,
        puzzle_emb_ndim=64,
        puzzle_emb_len=4,
    ),
}


def rtx_build_seconds(onnx_path: Path, folder: Path) -> float | None:
    from hrm_deploy.backends.tensorrt.api import load_backend
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.errors import DependencyError

    try:
        load_backend("tensorrt-rtx")
    except DependencyError:
        return None
    t0 = time.perf_counter()
    build_engine(
        onnx_path,
        EngineConfig("fp16", max_batch=8, options=TensorRTOptions(allow_unrolled=True)),
        folder / (onnx_path.stem + ".engine"),
        quiet=True,
    )
    return round(time.perf_counter() - t0, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="upstream")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    config = TRMConfig(
        seq_len=81, vocab_size=11, num_puzzle_identifiers=1, mlp_t=True, pos_encodings="none", **SIZES[args.size]
    )
    model = build_model(config, seed=0).eval()
    out = Path(args.out or Path(__file__).parent / "results" / f"trm_export_modes_{args.size}.json").resolve()
    results: dict = {
        "model": config.to_dict(),
        "passes_per_act_step": config.H_cycles * (config.L_cycles + 1),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "modes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.chdir(folder)  # the engine build's workspace
        for mode in ("step", "unrolled"):
            t0 = time.perf_counter()
            result = export_onnx(model, folder / f"trm.{mode}.onnx", ExportConfig(mode=mode), quiet=True)
            export_s = time.perf_counter() - t0
            results["modes"][mode] = {
                "nodes": result.nodes,
                "file_mib": round(result.path.stat().st_size / 2**20, 2),
                "export_s": round(export_s, 2),
                "stage_s": {k: round(v, 2) for k, v in result.timings.items()},
                "rtx_fp16_build_s": rtx_build_seconds(result.path, folder),
            }
            print(mode, json.dumps(results["modes"][mode]), flush=True)
            _write(out, results)  # after each mode: a run cut short keeps what it measured
    step, unrolled = results["modes"]["step"], results["modes"]["unrolled"]
    results["ratios_unrolled_over_step"] = {
        k: round(unrolled[k] / step[k], 2) for k in ("nodes", "file_mib", "export_s") if step[k]
    }
    if step["rtx_fp16_build_s"] and unrolled["rtx_fp16_build_s"]:
        results["ratios_unrolled_over_step"]["rtx_fp16_build_s"] = round(
            unrolled["rtx_fp16_build_s"] / step["rtx_fp16_build_s"], 2
        )
    _write(out, results)


def _write(out: Path, results: dict) -> None:
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
