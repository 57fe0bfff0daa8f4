"""verify: does a deployed artifact solve the same puzzles as its checkpoint?

Runs the PyTorch reference (float32, SDPA) and the candidate (ONNX on ORT, or an engine on
TensorRT) on the same K examples and compares outputs, answers and accuracy against the
labels, with thresholds per precision. Writes ``<artifact>.verify.json`` and ``.verify.md``
and records the summary in the artifact's manifest.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.artifacts import recorded_overrides
from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.io import check_output_path, write_json, write_text
from hrm_deploy.manifest import (
    check_artifact,
    manifest_path,
    read_manifest,
    report_paths,
    resolve_parent,
    update_manifest,
)
from hrm_deploy.precision.registry import PRECISIONS, Thresholds

log = logging.getLogger(__name__)


def _run(
    runner, examples, batch: int, label: str, quiet: bool, check_vocab: bool = False, halt: Any = None
) -> dict[str, np.ndarray]:
    from hrm_deploy.data.examples import check_vocabulary
    from hrm_deploy.progress import progress
    from hrm_deploy.runtime.infer import infer_all

    runner.activate()
    try:
        if check_vocab:  # the vocabulary from one all-padding row (token 0 pads every model's input)
            pad = {k: np.zeros_like(v[:1]) for k, v in examples.feeds(0, 1).items()}
            check_vocabulary(examples, int(np.shape(runner.infer(pad)["logits"])[-1]))
        with progress(len(examples), label, quiet, unit="examples") as advance:
            return infer_all(runner, examples, batch, advance, halt=halt)
    finally:
        runner.close()


def compare(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], labels: np.ndarray | None
) -> dict[str, Any]:
    """Output errors, answer agreement (:func:`hrm_deploy.agreement.measure`: closeness, flips and
    non-finite values cell by cell), accuracy of both and the puzzles that flipped."""
    from hrm_deploy.agreement import measure
    from hrm_deploy.metrics import accuracy, row_scores, solved_rows

    report: dict[str, Any] = measure(reference, candidate, "the PyTorch reference").as_dict()
    ref_q, cand_q = reference.get("q_halt_logits"), candidate.get("q_halt_logits")
    if ref_q is not None and cand_q is not None and ref_q.shape == cand_q.shape:
        with np.errstate(invalid="ignore"):  # NaN after a halted row's last step: not the same sign
            same = (ref_q >= 0) == (cand_q >= 0)
        report["per_step_q_halt_sign_agreement"] = [float(x) for x in same.mean(0)]
    ref_p, cand_p = reference.get("step_predictions"), candidate.get("step_predictions")
    if ref_p is not None and cand_p is not None and ref_p.shape == cand_p.shape:
        # the per-ACT-step curve: where do the two start to disagree, and how does accuracy grow
        report["per_step_disagreement"] = [float(x) for x in (ref_p != cand_p).mean(axis=(0, 2))]
        if labels is not None:
            for name, preds in (("reference", ref_p), ("candidate", cand_p)):
                solved = row_scores(preds, labels[:, None, :])[0]  # [N, steps]
                report[f"per_step_exact_{name}"] = [float(x) for x in solved.mean(0)]
    if labels is not None:
        report["reference"] = accuracy(reference["logits"], labels)
        report["candidate"] = accuracy(candidate["logits"], labels)
        ref_ok, cand_ok = solved_rows(reference["logits"], labels), solved_rows(candidate["logits"], labels)
        report["flipped"] = {
            "lost": np.flatnonzero(ref_ok & ~cand_ok).tolist(),
            "gained": np.flatnonzero(~ref_ok & cand_ok).tolist(),
        }
    return report


def judge(report: dict[str, Any], thresholds: Thresholds) -> list[str]:
    """What fails ``thresholds`` in a :func:`compare` report: the cells' judgement
    (:meth:`hrm_deploy.agreement.Agreement.failures`: non-finite outputs, flips where the reference
    was sure, the bound on every cell, closeness, agreement), a loop graph's halting steps and, with
    labels, the exact-accuracy drop."""
    from hrm_deploy.agreement import Agreement

    failures = list(Agreement.from_dict(report).failures(thresholds))
    if "loop" in report and report["loop"]["steps_agreement"] < thresholds.min_q_halt_sign_agreement:
        failures.append(  # the halting decisions are the q_halt signs' consequence: held to their threshold
            f"halting steps agree on {report['loop']['steps_agreement']:.4f} of rows < "
            f"{thresholds.min_q_halt_sign_agreement}"
        )
    if "reference" in report:
        drop = 100.0 * (report["reference"]["exact_accuracy"] - report["candidate"]["exact_accuracy"])
        report["exact_drop_points"] = drop
        if drop > thresholds.max_exact_drop_points:
            failures.append(f"exact accuracy dropped {drop:.2f} points > {thresholds.max_exact_drop_points}")
    return failures


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# verify {report['artifact']}",
        "",
        f"**{'PASSED' if report['passed'] else 'FAILED'}** ({report['precision']}, {report['examples']} examples, "
        f"reference {report['reference_checkpoint']})",
        "",
        "| check | value |",
        "|---|---|",
        f"| logits max abs / rel error | {report['logits']['max_abs']:.3g} / {report['logits']['max_rel']:.3g} |",
        f"| logits rel error where the answers agree | {report['logits']['max_rel_agreeing']:.3g} |",
        f"| argmax agreement | {report['logits']['argmax_agreement']:.4%} |",
        f"| answers flipped; largest reference margin among them (of the scale) | {report['logits']['flips']}; "
        f"{report['logits']['largest_flip_margin']:.3g} |",
    ]
    if "q_halt" in report:
        q_halt = report["q_halt"]
        lines += [
            f"| q_halt sign agreement | {q_halt['sign_agreement']:.4%} |",
            f"| q_halt rel error: every step / last step where the signs agree | {q_halt['max_rel']:.3g} / "
            f"{q_halt['max_rel_agreeing']:.3g} |",
            f"| q_halt signs flipped; largest reference abs(q_halt) among them (of the scale) | {q_halt['flips']}; "
            f"{q_halt['largest_flip_margin']:.3g} |",
        ]
    for bad in report.get("nonfinite", []):
        lines.append(
            f"| non-finite {bad['output']} | {bad['count']} (first: puzzle {bad['puzzle']}, {bad['position']}) |"
        )
    if "loop" in report:
        loop = report["loop"]
        lines.append(
            f"| loop graph (halts by {loop['halt']}): steps agreement, mean steps candidate / reference | "
            f"{loop['steps_agreement']:.4%}, {loop['mean_steps']:.2f} / {loop['reference_mean_steps']:.2f} |"
        )
    if report.get("checkpoint_overrides"):  # fields the checkpoint lacked, given at export
        given = ", ".join(f"{k}={v}" for k, v in report["checkpoint_overrides"].items())
        lines.append(f"| checkpoint overrides (not in its config) | {given} |")
    if "reference" in report:
        lines += [
            f"| exact accuracy reference / candidate | {report['reference']['exact_accuracy']:.2%} / "
            f"{report['candidate']['exact_accuracy']:.2%} |",
            f"| token accuracy reference / candidate | {report['reference']['token_accuracy']:.4%} / "
            f"{report['candidate']['token_accuracy']:.4%} |",
            f"| puzzles lost / gained | {len(report['flipped']['lost'])} / {len(report['flipped']['gained'])} |",
        ]
    if "per_step_disagreement" in report:
        lines += ["", "| ACT step | token disagreement | exact (reference) | exact (candidate) |", "|---|---|---|---|"]
        for i, d in enumerate(report["per_step_disagreement"]):
            ref = report.get("per_step_exact_reference", [None] * (i + 1))[i]
            cand = report.get("per_step_exact_candidate", [None] * (i + 1))[i]
            lines.append(
                f"| {i + 1} | {d:.4%} | {ref:.2%} | {cand:.2%} |"
                if ref is not None
                else f"| {i + 1} | {d:.4%} | - | - |"
            )
    if "halting" in report:
        from hrm_deploy.halting_report import halting_markdown

        lines += ["", "Early halting (candidate):", "", halting_markdown(report["halting"]).rstrip()]
    lines += [""] + [f"- failure: {f}" for f in report["failures"]]
    return "\n".join(lines) + "\n"


def _check_thresholds(thresholds: Thresholds) -> None:
    for name, value in asdict(thresholds).items():
        if value is None and name in ("max_flip_margin", "max_q_halt_flip"):  # None: the closeness threshold
            continue
        if (
            not isinstance(value, (int, float))
            or not np.isfinite(value)
            or value < 0
            or (name.startswith("min_") and value > 1)
        ):
            raise ConfigError(
                f"threshold {name}={value} is out of range (agreements are fractions 0 to 1, errors and drops >= 0)"
            )


def _halting(
    path: Path, candidate, examples, ref_out, cand_out, data, texts, batch, min_steps, max_steps, runner_options
) -> dict[str, Any]:
    from hrm_deploy.halting_report import evaluate_halting, plot_curve, prepare_rules

    rules = prepare_rules(list(texts), str(path), str(data), min_steps=min_steps, max_steps=max_steps, **runner_options)
    candidate.activate()
    try:
        result = evaluate_halting(
            candidate, examples, rules, batch, full=cand_out, min_steps=min_steps, max_steps=max_steps
        )
    finally:
        candidate.close()
    write_json(path.with_name(path.name + ".halting.json"), result)
    plot = plot_curve(result, path.with_name(path.name + ".halting.png"), f"{path.name}: early halting")
    result["files"] = [str(path.with_name(path.name + ".halting.json"))] + ([str(plot)] if plot else [])
    return result


def _can_save_reports(path: Path) -> bool:
    """Whether the reports can go beside ``path``. A link leading out of the workspace is refused
    (ArtifactError); a read-only or foreign folder is a one-line warning: the verdict is still
    printed, only the saved report and the manifest's verify entry are skipped."""
    from hrm_deploy.errors import MachineError

    try:
        for report_file in report_paths(path):
            check_output_path(report_file)
    except MachineError as exc:
        log.warning("the verify report will not be saved: %s", exc)
        return False
    return True


def verify(
    artifact: str | Path,
    data: str | Path | None,
    against: str | Path | None = None,
    samples: int | None = 256,
    thresholds: Thresholds | None = None,
    overrides: dict[str, float] | None = None,
    batch: int = 64,
    halt: list[str] | None = None,
    min_steps: int = 1,
    max_steps: int | None = None,
    quiet: bool = False,
    **runner_options: Any,
) -> dict[str, Any]:
    """Compare ``artifact`` with its checkpoint on K examples of ``data``'s test split; write
    the JSON/Markdown reports beside the artifact and into its manifest; return the report.
    ``thresholds`` default to the candidate's precision's; ``overrides`` replace single fields.
    ``halt``: early-halting rules (``q``, ``threshold:X``, ``budget:P``) to report on the candidate
    (``<artifact>.halting.json`` / ``.halting.png``; ``budget:P`` is calibrated on the train split
    and stored in the manifest when not already there). Progress with ETA goes to stderr unless ``quiet``."""
    from hrm_deploy.backends import open_runner, reference_runner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.manifest import refuse_companion
    from hrm_deploy.provenance import checked_reference

    path = Path(artifact)
    refuse_companion(path)  # a .pt2's .program fallback given alone: name its engine
    if data is None:  # the checkpoint's own dataset, announced
        from hrm_deploy.provenance import default_data

        # the test split; the train split too when a budget:P rule is calibrated on it
        budget = any(str(rule).startswith("budget") for rule in halt or [])
        given = recorded_overrides(path) if against else None  # the fields the export was given
        choice = default_data(against or path, "--data", None if budget else {"test": None}, given)
        log.info(choice.message)
        data = choice.path
    _check_options(samples, batch, thresholds, overrides)
    saving = _can_save_reports(path)  # links refused before the work; a read-only folder only warns
    before = (check_artifact(path) or {}).get("sha256") if path.is_file() else None  # folders: checkpoints
    # a changed config or weights, or a reference that cannot load: one line now, the old report kept
    reference_of = checked_reference([path], against)
    reference_ckpt, ckpt_overrides = reference_of.checkpoint, reference_of.overrides
    candidate = open_runner(path, **runner_options)
    examples = load_examples(data, samples, split="test")
    cand_out = _run(candidate, examples, batch, f"{path.name} ({candidate.name})", quiet, check_vocab=True)
    reference = reference_runner(reference_ckpt, steps=candidate.steps, **ckpt_overrides)
    # a loop graph halts by the rule fixed at its export: the reference runs the host loop with that rule
    loop_rule = builtin_halt_rule(path)
    ref_halt = None
    if loop_rule != "off":
        from hrm_deploy.halting import resolve_rule

        ref_halt = resolve_rule(loop_rule, str(path)).should_halt
        log.info("%s halts by its own rule (%s): the reference runs its host loop with that rule", path.name, loop_rule)
    ref_out = _run(reference, examples, batch, "PyTorch reference", quiet, halt=ref_halt)
    report: dict[str, Any] = {
        "artifact": str(path),
        "runner": candidate.name,
        "runtime": dict(candidate.runtime_settings),  # e.g. which loop ran (CUDA graph or eager)
        "precision": candidate.precision,
        "steps": candidate.steps,
        "reference_checkpoint": str(reference_ckpt),
        "checkpoint_overrides": ckpt_overrides,
        "data": examples.source,
        "examples": len(examples),
        **compare(ref_out, cand_out, examples.labels),
    }
    if loop_rule != "off":  # end state compared; the step counts must agree too
        same = ref_out["steps_used"] == cand_out["steps_used"]
        report["loop"] = {
            "halt": loop_rule,
            "steps_agreement": float(same.mean()),
            "mean_steps": float(cand_out["steps_used"].mean()),
            "reference_mean_steps": float(ref_out["steps_used"].mean()),
        }
    row = PRECISIONS.get(candidate.precision, PRECISIONS["fp32"])  # thresholds from the precision table
    chosen = replace(thresholds or row.thresholds, **(overrides or {}))
    report["thresholds"] = asdict(chosen)
    if halt:
        report["halting"] = _halting(
            path, candidate, examples, ref_out, cand_out, data, halt, batch, min_steps, max_steps, runner_options
        )
    report["failures"] = judge(report, chosen)
    report["passed"] = not report["failures"]
    _write_reports(path, report, before, saving)
    return report


def builtin_halt_rule(artifact: Path) -> str:
    """The halting rule fixed inside a loop graph or loop engine (its manifest's ``halt``, written by
    ``export --mode loop`` and kept by the builds from it); ``off`` for every other artifact."""
    if not manifest_path(artifact).is_file():
        return "off"
    source, where = read_manifest(artifact), artifact
    for _ in range(4):  # a precision graph or an engine: the export's record up its parents
        if "halt" in source:
            break
        parent = resolve_parent(where, source)
        if parent is None or not manifest_path(parent).is_file():
            break
        source, where = read_manifest(parent), parent
    return str((source.get("halt") or {}).get("rule") or "off")


def _check_options(
    samples: int | None, batch: int, thresholds: Thresholds | None, overrides: dict[str, float] | None
) -> None:
    """verify's numbers, checked before any work (one line each)."""
    if samples is not None and samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {samples}")
    if not 1 <= batch <= 1 << 16:
        raise ConfigError(f"--batch must be between 1 and 65536, got {batch}")
    unknown = set(overrides or {}) - set(Thresholds.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown threshold overrides {sorted(unknown)}")
    for given in (thresholds, replace(PRECISIONS["fp32"].thresholds, **(overrides or {}))):
        if given is not None:
            _check_thresholds(given)


def _write_reports(path: Path, report: dict[str, Any], before: str | None, saving: bool) -> None:
    """The JSON and Markdown reports beside the artifact, and the verdict in its manifest, only
    while the artifact is still the bytes that were judged (``before``, its sha256); nothing when
    the folder cannot take them (``saving`` False: the verdict is still returned and printed)."""
    if before is not None:
        after = (check_artifact(path) or {}).get("sha256")
        if after != before:  # an export replaced the artifact while it was being judged
            raise ArtifactError(f"{path} was replaced while it was being verified; run verify again")
        report["artifact_sha256"] = before
    report["report_saved"] = saving
    if not saving:
        return
    json_report, md_report = report_paths(path)
    write_json(json_report, report)
    write_text(md_report, markdown(report))
    if manifest_path(path).is_file():
        update_manifest(
            path,
            expect_sha256=before,
            verify={k: report[k] for k in ("passed", "failures", "examples", "data", "thresholds")},
        )
