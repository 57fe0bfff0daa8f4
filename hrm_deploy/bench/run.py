"""The bench stage: every artifact and the PyTorch reference, measured side by side in one
run on one machine, so the ratios compare like with like.

Latency is end to end per ``infer`` call (host arrays in, host arrays out: H2D + compute +
D2H for GPU runners), after warm-up, as median / p90 / p99 over the timed calls of each batch:
as many as fit ``duration_s`` per artifact and batch (like trtexec's ``--duration``; at least
``min_iters`` for the percentiles), or exactly ``iters`` when given. The engine runner also reports host-to-device, compute and device-to-host medians from CUDA events.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.bench.arc_tasks import add_task_rates, task_rates_markdown
from hrm_deploy.bench.common import MAX_BATCH, bench_data, default_artifacts, environment, row_label, tile
from hrm_deploy.bench.stats import latency_stats
from hrm_deploy.errors import ArtifactError, ConfigError, HRMDeployError
from hrm_deploy.io import write_json, write_text
from hrm_deploy.registry import CHECKPOINT_RUNNER, runner_options

log = logging.getLogger(__name__)

BENCH_TARGETS = ("desktop", "jetson")  # jetson adds tegrastats power and JetPack facts
DURATION_S = 10.0  # timed seconds per artifact and batch: a full-size model on 2 CPU cores is ~1-10 s a call
MIN_ITERS = 10  # timed calls at least, whatever the duration: p90 needs a few samples
MAX_ITERS = 100_000
# Host/device bytes one example needs while running, per (token x hidden unit): activations of
# the widest layer (SwiGLU at expansion 4), attention, residuals and the output logits, generous.
BYTES_PER_TOKEN_UNIT = 4 * 32


@dataclass(frozen=True)
class BenchConfig:
    data: str | None = None  # default: the reference checkpoint's own dataset (hrm_deploy.provenance)
    batches: tuple[int, ...] = (1, 8)
    iters: int | None = None  # None: as many calls as fit duration_s (at least min_iters)
    warmup: int = 3
    duration_s: float = DURATION_S
    min_iters: int = MIN_ITERS
    reference: str | None = None  # checkpoint; default: the one the first artifact's manifests name
    include_reference: bool = True
    target: str = "desktop"  # desktop or jetson
    provider: str = "cpu"  # ONNX Runtime provider for .onnx artifacts
    accuracy_samples: int = 256
    out_dir: str = "bench"
    halt: tuple[str, ...] = ()  # early-halting rules to measure where an artifact exposes steps
    min_steps: int = 1
    max_steps: int | None = None
    profile: bool = False  # also per-layer times per block at the first batch (hrm_deploy.bench.profile)

    def __post_init__(self) -> None:
        if self.target not in BENCH_TARGETS:
            raise ConfigError(f"target {self.target!r}: use desktop or jetson")
        if not self.batches or min(self.batches) < 1 or (self.iters is not None and self.iters < 1) or self.warmup < 0:
            raise ConfigError("batches must be >= 1, iters >= 1, warmup >= 0")
        if not 0 < self.duration_s <= 3600 or not 1 <= self.min_iters <= MAX_ITERS:
            raise ConfigError(f"--duration must be between 0 and 3600 s, got {self.duration_s}")
        if max(self.batches) > MAX_BATCH:
            raise ConfigError(
                f"--batch {max(self.batches)} is too large; bench batches go up to {MAX_BATCH} "
                "(larger batches are tiled from the data and would exhaust memory)"
            )
        if (self.iters or 0) > MAX_ITERS or self.warmup > 10_000:
            raise ConfigError("--iters must be <= 100000 and --warmup <= 10000")
        if self.accuracy_samples < 1:
            raise ConfigError(f"accuracy samples must be >= 1, got {self.accuracy_samples}")


def _peak_gpu_mib() -> float | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def timing_rule(config: BenchConfig) -> str:
    """How many calls each artifact and batch gets, as the report states it."""
    if config.iters is not None:
        return f"{config.iters} timed calls per artifact and batch (--iters)"
    return f"timed for {config.duration_s:g} s per artifact and batch (at least {config.min_iters} calls)"


def _more(times: list[float], began: float, config: BenchConfig) -> bool:
    if config.iters is not None:
        return len(times) < config.iters
    if len(times) < config.min_iters:
        return True
    return len(times) < MAX_ITERS and time.perf_counter() - began < config.duration_s


def _time_batch(runner, feeds: dict[str, np.ndarray], config: BenchConfig, advance) -> dict[str, Any]:
    """Latency statistics at one batch size after warm-up: calls for ``config.duration_s``
    (at least ``config.min_iters``), or exactly ``config.iters``."""
    batch = len(feeds["inputs"])
    for _ in range(config.warmup):
        runner.infer(feeds)
        advance(1)
    times: list[float] = []
    phases = []
    began = time.perf_counter()
    while _more(times, began, config):
        start = time.perf_counter()
        runner.infer(feeds)  # returns host arrays: synchronised by construction
        times.append(time.perf_counter() - start)
        if len(times) <= (config.iters or config.min_iters):
            advance(1)  # outside the timed call; the progress total counts the calls known in advance
        else:
            advance.note(f"b{batch}: {time.perf_counter() - began:.0f}/{config.duration_s:g} s")
        timing = runner.last_timing or {}
        if "compute_ms" in timing:  # device-loop runners: phases from events on their stream
            phases.append(timing)
    stats: dict[str, Any] = latency_stats(times, batch)
    if phases:
        stats["phases_median_ms"] = {
            k: float(np.median([p[k] for p in phases])) for k in ("h2d_ms", "compute_ms", "d2h_ms")
        }
        peaks = [p["peak_gpu_mib"] for p in phases if p.get("peak_gpu_mib")]
        if peaks:  # engine scratch + buffers (+ torch's allocator), reset per call
            stats["peak_gpu_mib"] = max(peaks)
    return stats


def _measure(runner, examples, config: BenchConfig, label: str = "bench", quiet: bool = False) -> dict[str, Any]:
    from hrm_deploy.metrics import accuracy
    from hrm_deploy.progress import progress
    from hrm_deploy.runtime.infer import infer_all

    calls = -(-len(examples) // 64) + len(config.batches) * (config.warmup + (config.iters or config.min_iters))
    runner.activate()
    try:
        row: dict[str, Any] = {"precision": runner.precision, "steps": runner.steps, "batches": {}}
        settings = getattr(runner, "runtime_settings", None)  # Runner has it; a duck-typed runner may not
        if settings:
            row["runtime"] = settings
        with progress(calls, label, quiet, unit="calls") as advance:
            out = infer_all(runner, examples, 64, lambda n: advance(1))
            logits = out["logits"].astype(np.float32)
            # ACT steps each puzzle ran: all of them, but a loop graph halts by its own rule
            row["mean_steps"] = float(np.mean(out["steps_used"])) if "steps_used" in out else float(runner.steps)
            base = examples.feeds(0, max(config.batches))
            for batch in config.batches:
                row["batches"][str(batch)] = _time_batch(runner, tile(base, batch), config, advance)
        if examples.labels is not None:
            row["accuracy"] = accuracy(logits, examples.labels)
        row["peak_host_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row["peak_gpu_mib"] = (
            max([s.get("peak_gpu_mib", 0.0) for s in row["batches"].values()] + [_peak_gpu_mib() or 0.0]) or None
        )
        return row
    finally:
        runner.close()


def _available_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_batch_memory(batches: tuple[int, ...], seq_len: int, hidden_size: int) -> None:
    """Refuse a batch whose activations cannot fit in the memory available now (one line,
    instead of an out-of-memory kill halfway through the run)."""
    available = _available_memory_bytes()
    if available is None:
        return
    need = max(batches) * seq_len * hidden_size * BYTES_PER_TOKEN_UNIT
    if need > available:
        fits = max(1, available // (seq_len * hidden_size * BYTES_PER_TOKEN_UNIT))
        raise ConfigError(
            f"--batch {max(batches)} needs about {need / 2**30:.1f} GiB for activations but "
            f"{available / 2**30:.1f} GiB is available; use a batch of at most {fits}"
        )


def _hidden_size(paths: list[Path], reference: str | None) -> int:
    """The model width from the first manifest that records it (512, upstream's default, else)."""
    from hrm_deploy.manifest import read_manifest

    for p in paths:
        try:
            model = read_manifest(p).get("config", {}).get("model", {})
        except HRMDeployError:
            continue
        if isinstance(model, dict) and isinstance(model.get("hidden_size"), int):
            return model["hidden_size"]
    return 512


def resolve_data(config: BenchConfig, paths: list[Path]) -> BenchConfig:
    """``config`` with its data set: as given, else the reference checkpoint's own dataset
    (announced on stderr in one line)."""
    from dataclasses import replace

    return replace(config, data=bench_data(config.data, config.reference, paths))


def bench(artifacts: list[str | Path], config: BenchConfig, quiet: bool = False) -> dict[str, Any]:
    """Measure ``artifacts`` (default: every engine in engines/) and the reference; write
    report.json, report.md (and latency.png with matplotlib) under ``config.out_dir``. Progress
    with ETA per artifact goes to stderr unless ``quiet``."""
    from hrm_deploy.backends import open_runner, reference_runner
    from hrm_deploy.bench.jetson import jetson_model
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.manifest import check_artifact

    on_jetson = jetson_model() is not None
    if config.target == "jetson" and not on_jetson:
        raise ConfigError(
            "--target jetson: this machine is not a Jetson (no /etc/nv_tegra_release or Jetson "
            "device-tree model); run `hrm-deploy bench --target jetson` on the Jetson, or from here "
            "`hrm-deploy bench --target jetson --host USER@JETSON`"
        )
    paths = [Path(a) for a in artifacts] or default_artifacts()
    from hrm_deploy.artifacts import check_artifact_file
    from hrm_deploy.manifest import refuse_companion

    for path in paths:  # a .pt2's .program fallback given alone: name its engine; a FIFO as one
        refuse_companion(path)
        check_artifact_file(path)
    if not paths and not config.include_reference:
        raise ConfigError("nothing to bench: pass artifacts or build engines first (hrm-deploy build-engine)")
    from hrm_deploy.bench.files import BENCH_FILES, PROFILE_FILES, ReportFolder

    # before the work: no user's file there is replaced, nothing is written through a link
    folder = ReportFolder(config.out_dir, BENCH_FILES)
    folder.check()
    if config.profile:
        ReportFolder(config.out_dir, PROFILE_FILES).check()
    reference = None
    if config.include_reference:  # accuracy only against the reference they were built from, checked now
        from hrm_deploy.provenance import checked_reference

        reference = checked_reference(paths, config.reference)
    config = resolve_data(config, paths)
    assert config.data is not None
    examples = load_examples(config.data, config.accuracy_samples, split="test")
    check_batch_memory(config.batches, examples.inputs.shape[1] + 1, _hidden_size(paths, config.reference))
    measured = {path: (check_artifact(path) or {}).get("sha256") for path in paths if path.is_file()}
    rows: list[dict[str, Any]] = []
    steps = None
    for path in paths:
        row: dict[str, Any] = {"artifact": str(path), "size_mb": path.stat().st_size / 1e6 if path.exists() else None}
        try:
            runner = open_runner(path, **runner_options(path, provider=config.provider))
            row["runner"], row["precision"] = runner.name, runner.precision
            if config.target == "jetson":
                from hrm_deploy.bench.jetson import Tegrastats, summarize

                with Tegrastats() as tegra:
                    row.update(_measure(runner, examples, config, path.name, quiet))
                row["power"] = summarize(tegra.samples)
            else:
                row.update(_measure(runner, examples, config, path.name, quiet))
            if config.halt:
                row["halting"] = _halting(path, runner, examples, config)
            row["status"] = "ok"
            steps = steps or runner.steps
        except HRMDeployError as exc:  # e.g. an engine on a machine without a GPU: recorded, not fatal
            row["status"] = f"skipped: {exc}"
        rows.append(row)
    for path, digest in measured.items():
        if digest is not None and (check_artifact(path) or {}).get("sha256") != digest:
            raise ArtifactError(f"{path} was replaced while it was being measured; run bench again")
    if reference is not None:
        ckpt, overrides = reference.checkpoint, reference.overrides
        row = {
            "artifact": str(ckpt),
            "runner": CHECKPOINT_RUNNER,
            "reference": True,
            "size_mb": ckpt.stat().st_size / 1e6,
        }
        row.update(
            _measure(reference_runner(ckpt, steps=steps, **overrides), examples, config, "PyTorch reference", quiet)
        )
        if config.halt:
            row["halting"] = _halting(ckpt, reference_runner(ckpt, steps=steps, **overrides), examples, config)
        row["status"] = "ok"
        rows.append(row)
        _add_ratios(rows, row)
    report: dict[str, Any] = {
        "config": asdict(config),
        "environment": environment(config.target),
        "rows": rows,
        "examples": len(examples),
        "data": examples.source,
        "timing": f"end to end per call (host in, host out), after warm-up; {timing_rule(config)}",
    }
    _energy(report)
    add_task_rates(report, config.data)  # ARC data: tasks/s at each row's best batch
    pinned = report["environment"].get("jetson", {}).get("jetson_clocks_pinned")
    if config.target == "jetson" and pinned is not True:
        report["warnings"] = [
            "GPU clocks are not pinned (or could not be read): run sudo jetson_clocks for stable numbers"
        ]
    if config.profile:  # its own files (profile.json with its manifest), published first
        _profile(report, config)
    with folder.writing(report["config"]) as stage:
        markdown = table(report)
        if _plot(report, stage / "latency.png"):
            report["plot"] = str(folder.path("latency.png"))
        if config.halt:
            markdown += _halting_files(report, stage, folder)
        write_text(stage / "report.md", markdown)
        write_json(stage / "report.json", report)
    return report


def _profile(report: dict[str, Any], config: BenchConfig) -> None:
    """``bench --profile``: every artifact measured (and the reference) profiled at the first
    batch size; profile.json / .md / .png beside the report."""
    from hrm_deploy.bench.profile import ProfileConfig, profile

    ok = [r for r in report["rows"] if r["status"] == "ok"]
    if not ok:  # say why each was not measured, not that nothing was given
        why = "; ".join(f"{Path(r['artifact']).name}: {r['status']}" for r in report["rows"])
        raise ArtifactError(f"nothing to profile: no artifact could be measured ({why})")
    reference = next((r["artifact"] for r in ok if r.get("reference")), None)
    settings = ProfileConfig(
        data=config.data, batch=config.batches[0], provider=config.provider, out_dir=config.out_dir
    )
    result = profile([r["artifact"] for r in ok if not r.get("reference")], settings, reference=reference)
    report["profile"] = str(Path(config.out_dir) / "profile.json")
    if result.get("plot"):
        report["profile_plot"] = result["plot"]


def _halting(path: Path, runner, examples, config: BenchConfig) -> dict[str, Any]:
    """Per rule: exact accuracy, mean/p90 steps and puzzles/s at the largest batch, plus the curve."""
    from hrm_deploy.halting_report import evaluate_halting, prepare_rules

    rules = prepare_rules(
        list(config.halt),
        str(path),
        config.data,
        min_steps=config.min_steps,
        max_steps=config.max_steps,
        **runner_options(path, provider=config.provider),
    )
    runner.activate()
    try:
        return evaluate_halting(
            runner, examples, rules, max(config.batches), min_steps=config.min_steps, max_steps=config.max_steps
        )
    finally:
        runner.close()


def _halting_files(report: dict[str, Any], stage: Path, folder: Any) -> str:
    """halting.json (and halting.png) into ``stage``; returns the report's markdown about them."""
    from hrm_deploy.halting_report import halting_markdown, plot_curve

    rows = {Path(r["artifact"]).name: r["halting"] for r in report["rows"] if "halting" in r}
    write_json(stage / "halting.json", rows)
    first = next((r for r in rows.values() if r.get("curve")), None)
    if first is not None and plot_curve(first, stage / "halting.png"):
        report["halting_plot"] = str(folder.path("halting.png"))
    return "".join(f"\nEarly halting, {name}:\n\n" + halting_markdown(result) for name, result in rows.items())


def _add_ratios(rows: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    for row in rows:
        for batch, stats in row.get("batches", {}).items():
            ref = reference["batches"].get(batch)
            if ref:
                stats["speedup_vs_reference"] = ref["median_ms"] / stats["median_ms"]


def _energy(report: dict[str, Any]) -> None:
    """Energy per puzzle = mean VDD_IN power x median latency / batch (Jetson rows)."""
    for row in report["rows"]:
        power = row.get("power", {}).get("VDD_IN_mean_mw")
        if power:
            for batch, stats in row.get("batches", {}).items():
                stats["energy_mj_per_puzzle"] = power * stats["median_ms"] / 1e3 / int(batch)


def table(report: dict[str, Any]) -> str:
    """Markdown table in the Ultralytics benchmark style."""
    batches = report["config"]["batches"]
    head = (
        ["Format", "Status", "Size (MB)", "Exact acc", "Mean steps"]
        + [f"b{b} ms (p90)" for b in batches]
        + [f"b{b} puzzles/s" for b in batches]
        + [f"b{b} vs ref" for b in batches]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        name = row_label(row)
        status = "ok" if row["status"] == "ok" else "skipped"
        acc = row.get("accuracy", {}).get("exact_accuracy")
        cells = [
            name,
            status,
            f"{row['size_mb']:.1f}" if row.get("size_mb") else "-",
            f"{acc:.2%}" if acc is not None else "-",
            f"{row['mean_steps']:.2f}" if row.get("mean_steps") is not None else "-",
        ]
        stats = row.get("batches", {})
        cells += [
            f"{stats[str(b)]['median_ms']:.2f} ({stats[str(b)]['p90_ms']:.2f})" if str(b) in stats else "-"
            for b in batches
        ]
        cells += [f"{stats[str(b)]['puzzles_per_s']:.1f}" if str(b) in stats else "-" for b in batches]
        ratios = [stats.get(str(b), {}).get("speedup_vs_reference") for b in batches]  # none without a reference
        cells += [f"{r:.2f}x" if r is not None else "-" for r in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    skipped = [f"- {Path(r['artifact']).name}: {r['status']}" for r in report["rows"] if r["status"] != "ok"]
    skipped += [f"- warning: {w}" for w in report.get("warnings", [])]
    env = report["environment"]
    footer = [
        f"\nMachine: {env.get('platform')}, {env.get('cpus')} CPUs, GPU: {env.get('gpu', 'none')}. "
        f"{report['examples']} examples from {report['data']}; {report['timing']}."
    ]
    return "\n".join(lines + [""] + skipped + footer) + "\n" + task_rates_markdown(report)


def _plot(report: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in report["rows"]:
        stats = row.get("batches")
        if not stats:
            continue
        xs = [int(b) for b in stats]
        ax.plot(
            xs,
            [stats[b]["median_ms"] for b in stats],
            marker="o",
            label=f"{row.get('runner')} {row.get('precision', '')}",
        )
    ax.set_xlabel("batch")
    ax.set_ylabel("median latency (ms)")
    ax.set_xscale("log", base=2)
    ax.legend()
    fig.tight_layout()
    from hrm_deploy.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
