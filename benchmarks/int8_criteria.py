"""What an INT8 build's accuracy rule should judge: how argmax agreement over all cells, agreement
over the cells of puzzles FP32 solves, and exact accuracy relate, measured on real candidates.

A checkpoint's FP32 export is calibrated once (minmax, the build's default) and quantized in both
INT8 forms the builds write: TensorRT's convention (int8 activations) and the cpu target's (uint8
activations). For each form the weights are ranked by the fallback's one-pass signal (each weight's
own output error) and every mix is measured: all quantized, then the k most sensitive weights kept
FP32 for k = 1 .. all-1 (the candidates a fallback chooses among). Each candidate runs on ONNX
Runtime CPU over the held-out puzzles against the FP32 graph, and the row records:

* exact accuracy of both, puzzles lost / gained (paired), points lost;
* argmax agreement over all cells, over the cells of puzzles FP32 solves, over the others;
* where the flipped cells are: in puzzles FP32 solves (each such flip loses the puzzle: every
  labelled cell of a solved puzzle is right) or in puzzles it gets wrong (a flip there costs no
  answer), and how sure FP32 was where they flipped: its top-1 minus top-2 logit margin there, as a
  share of its largest |logit| (median over the flips, and over every cell for comparison), and how
  many flips had a margin above :data:`CONFIDENT_SHARE`;
* q_halt sign agreement (the last step's, as ``verify`` reads it).

The summary gives, over the candidates, the rank correlation of points lost with the disagreement
over all cells and over solved cells, and the share of flips that fall in puzzles FP32 gets wrong.

    python benchmarks/int8_criteria.py                       # the bundled sudoku-small, 1,000 fresh puzzles
    python benchmarks/int8_criteria.py --checkpoint /work/trained/run-full/last.pt --data /work/trained/data-easy
    python benchmarks/int8_criteria.py --tiny                # smoke: the tiny bundled model, 64 puzzles

Writes benchmarks/results/int8_criteria.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# a flip is "confident" where FP32's top-1 minus top-2 logit exceeds this share of its largest |logit|
# over the puzzles (the scale verify's closeness thresholds use)
CONFIDENT_SHARE = 0.1


def _outputs(path: Path, examples: Any, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    from hrm_deploy.precision.accuracy import graph_outputs

    out = graph_outputs(path, examples, meta=meta)
    return {"logits": out.logits, "q_halt": out.q_halt}


def _spearman(a: list[float], b: list[float]) -> float | None:
    """Rank correlation (ties averaged); None when either side is constant."""
    if len(a) < 3:
        return None
    ra, rb = (np.argsort(np.argsort(np.asarray(x, np.float64), kind="stable")).astype(np.float64) for x in (a, b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], labels: np.ndarray) -> dict[str, Any]:
    """One candidate's row (see the module docstring)."""
    from hrm_deploy.metrics import solved_rows

    ref_arg, cand_arg = reference["logits"].argmax(-1), candidate["logits"].argmax(-1)  # [N, S]
    agree = ref_arg == cand_arg
    base, ours = solved_rows(reference["logits"], labels), solved_rows(candidate["logits"], labels)
    top2 = np.sort(reference["logits"], -1)[..., -2:]
    scale = max(float(np.abs(reference["logits"]).max()), 1e-6)
    margin = (top2[..., 1] - top2[..., 0]) / scale  # [N, S]: FP32's top-1 minus top-2, of its largest |logit|
    flips = ~agree
    n = len(labels)
    lost, gained = int((base & ~ours).sum()), int((~base & ours).sum())
    solved_cells = agree[base]
    other_cells = agree[~base]
    q_agree = (reference["q_halt"] >= 0) == (candidate["q_halt"] >= 0)
    return {
        "fp32_exact_pct": round(100.0 * float(base.mean()), 4),
        "exact_pct": round(100.0 * float(ours.mean()), 4),
        "puzzles_lost": lost,
        "puzzles_gained": gained,
        "loss_points": round(100.0 * (lost - gained) / n, 4),
        "agreement_all_pct": round(100.0 * float(agree.mean()), 4),
        "agreement_solved_pct": round(100.0 * float(solved_cells.mean()), 4) if solved_cells.size else None,
        "agreement_unsolved_pct": round(100.0 * float(other_cells.mean()), 4) if other_cells.size else None,
        "flipped_cells": int(flips.sum()),
        "flipped_cells_in_unsolved_puzzles": int(flips[~base].sum()),
        "confident_flips": int((flips & (margin > CONFIDENT_SHARE)).sum()),
        "fp32_margin_at_flips_median": round(float(np.median(margin[flips])), 4) if flips.any() else None,
        "fp32_margin_all_cells_median": round(float(np.median(margin)), 4),
        "q_halt_sign_agreement_pct": round(100.0 * float(q_agree.mean()), 4),
    }


def candidates(job: Any, form: str, work: Path) -> tuple[Path, list[tuple[str, set[str]]]]:
    """The all-quantized Q/DQ graph of ``form`` (int8: TensorRT's convention; uint8: the cpu
    target's) and the exclusion sets of each mix, most sensitive weights first."""
    import onnx

    from hrm_deploy.precision.fallback import weight_groups
    from hrm_deploy.precision.int8 import quantize_int8
    from hrm_deploy.precision.sensitivity import local_errors

    qdq = work / f"{form}.all.onnx"
    quantize_int8(job, qdq, activations=form)
    groups = weight_groups(job.model, job.plan.quantize)
    signal = local_errors(onnx.load(str(qdq)), job.model, groups, job.examples, job.source, job.meta)
    order = sorted(groups, key=lambda w: -signal[w])
    mixes: list[tuple[str, set[str]]] = [(f"{form}: all quantized", set())]
    for k in range(1, len(order)):
        mixes.append((f"{form}: {k} most sensitive kept FP32", {n for w in order[:k] for n in groups[w]}))
    return qdq, mixes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a checkpoint (default: the bundled sudoku-small)")
    parser.add_argument("--data", help="a dataset folder: its test split is measured (default: fresh puzzles)")
    parser.add_argument("--puzzles", type=int, default=1000, help="held-out puzzles (default 1000)")
    parser.add_argument("--calib-samples", type=int, default=128)
    parser.add_argument("--forms", default="int8,uint8", help="INT8 forms, comma-separated: int8, uint8")
    parser.add_argument("--tiny", action="store_true", help="smoke run: the tiny bundled model, 64 puzzles")
    parser.add_argument("--work", default="/tmp/hrm-int8-criteria")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "int8_criteria.json"))
    args = parser.parse_args()

    import onnx

    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.fallback import keep_float
    from hrm_deploy.precision.job import calibrate_job, new_job
    from hrm_deploy.provenance import heldout_data, provenance_data
    from hrm_deploy.train.presets import bundled_checkpoint

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint or bundled_checkpoint("sudoku-tiny" if args.tiny else "sudoku-small")
    puzzles = 64 if args.tiny else args.puzzles
    fp32 = export_onnx(checkpoint, work / "model.onnx", ExportConfig(parity=False), quiet=True).path
    calib = provenance_data(checkpoint, "--calib-data", {"train": args.calib_samples}).path
    if args.data:
        examples, data_words = load_examples(args.data, puzzles, split="test"), f"{args.data} (test split)"
        calib = Path(args.data)
    else:
        fresh = heldout_data(fp32, puzzles)
        if fresh is None:
            raise SystemExit(f"{checkpoint} records no dataset spec: pass --data DATASET_DIR")
        examples, data_words = load_examples(fresh.path, puzzles, split="train"), fresh.message
    model = load_onnx(fp32, weights=True)
    meta = graph_metadata(model)
    quant = QuantConfig(samples=args.calib_samples)
    calibration = load_examples(calib, args.calib_samples)
    job = new_job(fp32, model, meta, calibration, quant, work / "calib", "x" * 64)
    calibrate_job(job)
    reference = _outputs(fp32, examples, meta)
    if examples.labels is None:
        raise SystemExit(f"{data_words} has no labels: the criteria need answers to compare")
    labels = examples.labels
    rows: list[dict[str, Any]] = []
    for form in [f.strip() for f in args.forms.split(",") if f.strip()]:
        qdq, mixes = candidates(job, form, work)
        graph = onnx.load(str(qdq))
        for name, exclude in mixes:
            path = work / "candidate.onnx"
            onnx.save(keep_float(graph, model, exclude) if exclude else graph, str(path))
            row = {"candidate": name, "form": form, "kept_float_nodes": len(exclude)}
            row.update(compare(reference, _outputs(path, examples, meta), labels))
            rows.append(row)
            print(json.dumps(row), flush=True)
    losses = [r["loss_points"] for r in rows]
    flips = sum(r["flipped_cells"] for r in rows)
    summary = {
        "spearman_loss_vs_disagreement_all": _spearman(losses, [100 - r["agreement_all_pct"] for r in rows]),
        "spearman_loss_vs_disagreement_solved": _spearman(
            losses, [100 - (r["agreement_solved_pct"] or 100.0) for r in rows]
        ),
        "flips_in_unsolved_puzzles_pct": round(
            100.0 * sum(r["flipped_cells_in_unsolved_puzzles"] for r in rows) / max(flips, 1), 2
        ),
        "confident_flips_pct": round(100.0 * sum(r["confident_flips"] for r in rows) / max(flips, 1), 2),
    }
    report = {
        "machine": {"isa": isa_flags(), "cpus": os.cpu_count()},
        "checkpoint": str(checkpoint),
        "data": data_words,
        "puzzles": len(examples),
        "calibration": {"data": str(calib), "samples": args.calib_samples, "method": quant.method},
        "confident_margin_share": CONFIDENT_SHARE,
        "summary": summary,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
