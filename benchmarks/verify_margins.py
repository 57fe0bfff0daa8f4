"""How far every real build of the bundled models is from its reference, as ``verify`` measures it:
the numbers its tolerances (``hrm_deploy.precision.registry.Thresholds``) and the cell band
(``hrm_deploy.agreement.CELL_BAND``) are calibrated on (docs/guarantees.md).

Per bundled model (HRM sudoku-small and sudoku-tiny, TRM trm-sudoku-small), per graph (unrolled,
step and loop graph halting by q; TRM has no unrolled default): the FP32 graph, the precision
stage's FP16, INT8 and FP8 graphs (BF16 graphs have no ONNX Runtime CPU kernels: verify them as
engines on a GPU), the cpu target at FP32, FP16 and each INT8 recipe, and the PyTorch engine (FP32,
BF16) on this machine's CPU. Each is verified on the model's own test split and its report's
measures kept: argmax agreement, the flips and the largest reference margin among them (a fraction
of the logits' scale, against the precision's tolerance), the largest cell error (against the
closeness threshold: the band's ratio), the same for q_halt, and the verdict.

    nice python benchmarks/verify_margins.py [--samples 512] [--models sudoku-small,trm-sudoku-small,sudoku-tiny]
    python benchmarks/verify_margins.py --tiny     # a smoke run: sudoku-tiny, FP32 and cpu INT8, 16 puzzles
Writes benchmarks/results/verify_margins.json (--out to change). No timing is taken.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS = ("sudoku-small", "trm-sudoku-small", "sudoku-tiny")
GRAPHS = {"unrolled": "off", "step": "off", "loop": "q"}  # mode -> the halting rule fixed at export


def _builds(model: str, work: Path, data: str, tiny: bool) -> dict[str, Callable[[], Path]]:
    """Every build of ``model`` to verify: name -> a function that makes it (and returns its path)."""
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.backends.torch.builder.options import TorchOptions
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.train.presets import bundled_checkpoint

    checkpoint = bundled_checkpoint(model)
    builds: dict[str, Callable[[], Path]] = {}
    modes = ["unrolled"] if tiny else [m for m in GRAPHS if not (model.startswith("trm") and m == "unrolled")]
    for mode in modes:
        graph = work / f"{mode}.onnx"

        def export(mode: str = mode, graph: Path = graph) -> Path:
            if not graph.exists():
                export_onnx(checkpoint, graph, ExportConfig(mode=mode, halt=GRAPHS[mode], parity=False), quiet=True)
            return graph

        builds[f"{mode}.fp32"] = export
        for precision in () if tiny else ("fp16", "int8", "fp8"):

            def convert(precision: str = precision, mode: str = mode, export: Callable[[], Path] = export) -> Path:
                config = PrecisionConfig(precision, calib_data=data, cache_dir=str(work / "calib"))
                return make_precision_graph(export(), config, out=work / f"{mode}.{precision}.onnx", quiet=True).path

            builds[f"{mode}.{precision}"] = convert
        cpu: list[tuple[str, str | None]] = [("int8", None)]  # (precision, INT8 recipe)
        cpu += [] if tiny else [("fp32", None), ("fp16", None), ("int8", "dynamic"), ("int8", "blockwise")]
        for precision, recipe in cpu:
            name = f"{mode}.cpu.{precision}" + (f".{recipe}" if recipe else "")

            def cpu_build(
                precision: str = precision, recipe: str | None = recipe, name: str = name, export=export
            ) -> Path:
                static = precision == "int8" and recipe is None  # only it calibrates (on the model's data)
                config = EngineConfig(
                    precision,
                    target="cpu",
                    calib_data=data if static else None,
                    options=CpuOptions(int8_recipe=recipe),
                )
                return build_engine(export(), config, work / f"{name}.ort.onnx", quiet=True).path

            builds[name] = cpu_build
    for precision in () if tiny else ("fp32", "bf16"):

        def torch_build(precision: str = precision) -> Path:
            config = EngineConfig(precision, backend="torch", max_batch=64, options=TorchOptions(device="cpu"))
            return build_engine(checkpoint, config, work / f"torch.{precision}.pt2", quiet=True).path

        builds[f"torch.{precision}"] = torch_build
    return builds


def _measures(report: dict[str, Any]) -> dict[str, Any]:
    """What calibrates the tolerances, from a verify report: each measure and its ratio to its bound."""
    from hrm_deploy.agreement import CELL_BAND, flip_margin, q_halt_flip
    from hrm_deploy.precision.registry import Thresholds

    thresholds = Thresholds(**report["thresholds"])
    logits, q_halt = report["logits"], report.get("q_halt") or {}
    row: dict[str, Any] = {
        "precision": report["precision"],
        "passed": report["passed"],
        "failures": report["failures"],
        "argmax_agreement": logits["argmax_agreement"],
        "flips": logits["flips"],
        "largest_flip_margin": logits["largest_flip_margin"],
        "flip_margin_over_tolerance": logits["largest_flip_margin"] / flip_margin(thresholds),
        "max_rel_over_closeness": logits["max_rel"] / thresholds.max_logits_rel_error,
        "max_rel_agreeing_over_closeness": logits["max_rel_agreeing"] / thresholds.max_logits_rel_error,
    }
    if q_halt:
        row.update(
            q_halt_sign_agreement=q_halt["sign_agreement"],
            q_halt_flips=q_halt["flips"],
            largest_q_halt_flip=q_halt["largest_flip_margin"],
            q_halt_flip_over_tolerance=q_halt["largest_flip_margin"] / q_halt_flip(thresholds),
            q_halt_max_rel_over_closeness=q_halt["max_rel"] / thresholds.max_q_halt_rel_error,
        )
    row["cell_band"] = CELL_BAND
    return row


def measure(models: list[str], samples: int, tiny: bool, work: Path) -> dict[str, Any]:
    from hrm_deploy.provenance import default_data
    from hrm_deploy.train.presets import bundled_checkpoint
    from hrm_deploy.verify import verify

    result: dict[str, Any] = {"samples": samples, "models": {}}
    for model in models:
        folder = work / model
        folder.mkdir(parents=True, exist_ok=True)
        data = str(default_data(bundled_checkpoint(model), "--data").path)
        rows: dict[str, Any] = {}
        for name, make in _builds(model, folder, data, tiny).items():
            try:
                rows[name] = _measures(verify(make(), data, samples=samples, quiet=True))
            except Exception as exc:  # noqa: BLE001 - a build this machine cannot make is recorded, not fatal
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                traceback.print_exc()
            print(model, name, json.dumps(rows[name])[:200], flush=True)
        result["models"][model] = rows
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="bundled models, comma-separated")
    parser.add_argument("--samples", type=int, default=512, help="test puzzles verified per build")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: sudoku-tiny, FP32 and cpu INT8, 16 puzzles")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "verify_margins.json"))
    args = parser.parse_args()
    models = ["sudoku-tiny"] if args.tiny else [m for m in args.models.split(",") if m]
    samples = 16 if args.tiny else args.samples
    with tempfile.TemporaryDirectory(prefix="verify-margins-") as tmp:
        result = measure(models, samples, args.tiny, Path(tmp))
    result["machine"] = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
