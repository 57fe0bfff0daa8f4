"""``hrm-deploy profile`` and ``bench --profile``: where the time of one call goes, per block.

Each backend is timed by its own profiler, over ``calls`` calls after ``warmup``:

* ONNX Runtime (``.onnx``): the session profiler's per-node JSON; the runtime's own time
  (``model_run``) beyond its kernels and the runner's beyond the runtime are host rows.
* The PyTorch reference and the PyTorch engine (``.pt2``): ``torch.profiler`` (operators, and
  CUDA kernels on a GPU). The reference's modules are opened as profiler scopes, so every
  operator is charged to the module that ran it; a compiled engine has no module scopes left
  (AOTInductor fuses across them), so its time folds by operator.
* TensorRT / TensorRT-RTX engines: a ``trt.IProfiler`` attached to the runner's contexts (step
  loop without CUDA graph capture); trtexec's ``--exportProfile`` JSON reads the same way
  (:func:`read_trtexec_profile`).

Rows and files: :mod:`hrm_deploy.bench.blocks`; the files are ``profile.json``, ``profile.md``
and ``profile.png`` in the output folder (beside ``report.json`` with ``bench --profile``).
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.artifacts import check_artifact_file
from hrm_deploy.bench.blocks import Block, Layer, Profile, compare, fold, table
from hrm_deploy.errors import ArtifactError, ConfigError

log = logging.getLogger(__name__)

MAX_CALLS = 1000


@dataclass(frozen=True)
class ProfileConfig:
    """What to profile: ``calls`` timed calls of batch ``batch`` after ``warmup`` calls, inputs
    from ``data`` (default: the reference checkpoint's own dataset); ``threads`` for ONNX Runtime
    (default: the graph's manifest, else ORT's); a trtexec JSON is labelled with ``batch``."""

    data: str | None = None
    batch: int = 1
    calls: int = 3
    warmup: int = 1
    provider: str = "cpu"
    threads: int | None = None
    out_dir: str = "bench"

    def __post_init__(self) -> None:
        if not 1 <= self.calls <= MAX_CALLS or self.warmup < 0 or self.batch < 1:
            raise ConfigError(f"profile: calls must be 1..{MAX_CALLS}, warmup >= 0 and batch >= 1")
        from hrm_deploy.bench.common import MAX_BATCH

        if self.batch > MAX_BATCH:  # bounded as bench is, before any graph is loaded
            raise ConfigError(
                f"--batch {self.batch} is too large; profiled batches go up to {MAX_BATCH} "
                "(larger batches are tiled from the data and would exhaust memory)"
            )


def read_ort_profile(path: str | Path, calls: int, warmup: int) -> tuple[list[Layer], float]:
    """Layers and summed ``model_run`` ms of the last ``calls`` calls in ORT's profile JSON, whose
    first ``warmup`` calls are dropped. A call may be several runs (a step graph runs once per ACT
    step): runs per call = runs / (warmup + calls)."""
    events = _load_json(path, "ONNX Runtime profile")
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=_ts)
    if not runs or len(runs) % (warmup + calls):
        raise ArtifactError(f"{path}: {len(runs)} runs recorded, not a multiple of {warmup + calls} calls")
    kept = runs[len(runs) // (warmup + calls) * warmup :]
    start = _ts(kept[0])
    nodes = [
        (e["name"].removesuffix("_kernel_time"), e.get("args", {}).get("op_name", ""), e["dur"] / 1e3)
        for e in events
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and _ts(e) >= start
    ]
    return fold(nodes), sum(e["dur"] for e in kept) / 1e3


def read_trtexec_profile(path: str | Path, batch: int = 1, steps: int = 1) -> Profile:
    """A trtexec ``--exportProfile`` JSON (``[{"count": N}, {"name", "timeMs", "averageMs", ...}, ...]``)
    as a profile of ``count`` calls; ``steps`` is what one engine call runs (1 for a step engine)."""
    records = _load_json(path, "trtexec profile")
    count = next((int(r["count"]) for r in records if isinstance(r, dict) and "count" in r), None)
    layers = [r for r in records if isinstance(r, dict) and "name" in r]
    if count is None or not layers or not all("timeMs" in r or "averageMs" in r for r in layers):
        raise ArtifactError(f"{path} is not a trtexec --exportProfile JSON (a count and layers with timeMs)")
    events = [(str(r["name"]), "", float(r.get("timeMs", r.get("averageMs", 0.0) * count))) for r in layers]
    return Profile(str(path), "trtexec", "?", "trtexec --exportProfile", batch, steps, count, fold(events))


def _ts(event: dict[str, Any]) -> float:
    return float(event.get("ts", 0))


def _load_json(path: str | Path, what: str) -> list[Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a readable {what} JSON ({type(exc).__name__})") from None
    if not isinstance(data, list):
        raise ArtifactError(f"{path} is not a {what} JSON (a list of records)")
    return data


def _timed(
    runner: Any, feeds: dict[str, np.ndarray], config: ProfileConfig, after_warmup: Callable[[], None]
) -> tuple[float, int]:
    """Warm up, call ``after_warmup``, then time ``config.calls`` calls: their summed wall ms, and
    the ACT steps one call ran (a loop graph stops when every row has halted: its rows' most, not
    its maximum; every other artifact runs all of its steps)."""
    for _ in range(config.warmup):
        runner.infer(feeds)
    after_warmup()
    wall, out = 0.0, {}
    for _ in range(config.calls):
        start = time.perf_counter()
        out = runner.infer(feeds)
        wall += time.perf_counter() - start
    ran = out.get("steps_used") if isinstance(out, dict) else None
    return wall * 1e3, int(np.max(ran)) if ran is not None and np.size(ran) else int(runner.steps)


def profile_ort(path: Path, feeds: dict[str, np.ndarray], config: ProfileConfig) -> Profile:
    """An ONNX graph through ORT's session profiler (the ``ort`` runner, its thread settings)."""
    from hrm_deploy.backends import open_runner

    with tempfile.TemporaryDirectory(prefix="hrm-profile-") as tmp:
        prefix = Path(tmp) / "ort"
        runner: Any = open_runner(path, provider=config.provider, threads=config.threads, profile_prefix=prefix)
        runner.activate()
        try:
            wall, steps = _timed(runner, feeds, config, lambda: None)
            layers, model_run = read_ort_profile(runner.end_profiling(), config.calls, config.warmup)
            settings = dict(runner.runtime_settings)
        finally:
            runner.close()
    return Profile(
        str(path),
        "ort",
        runner.precision,
        "onnxruntime session profiler",
        len(feeds["inputs"]),
        steps,
        config.calls,
        layers,
        wall_ms=wall,
        runtime_ms=model_run,
        environment={"runtime": settings},
    )


class _ModuleScopes:
    """Every named module of ``module`` opened as a torch.profiler scope ``module::<name>`` while
    it runs (forward pre/post hooks), so operators are charged to the module that ran them."""

    PREFIX = "module::"

    def __init__(self, module: Any) -> None:
        import torch

        self.handles: list[Any] = []
        for name, sub in module.named_modules():
            # the model's own path (the core is shared by the embedding and the step); the
            # root is the unrolled ACT loop (carry, halting)
            scope = self.PREFIX + (re.sub(r"^(embed_init|step)\.core\.", "", name) or "step")
            stack: list[Any] = []

            def enter(_m: Any, _args: Any, scope: str = scope, stack: list[Any] = stack) -> None:
                stack.append(torch.autograd.profiler.record_function(scope).__enter__())

            def leave(_m: Any, _args: Any, _out: Any, stack: list[Any] = stack) -> None:
                stack.pop().__exit__(None, None, None)

            self.handles += [sub.register_forward_pre_hook(enter), sub.register_forward_hook(leave)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _torch_layers(events: Any, device: bool, scoped: bool) -> tuple[list[Layer], float]:
    """Each event's own time charged to its nearest module scope; outside any, to the runner's
    own work (``scoped``: the model ran inside scopes, so the rest is input/output copies) or
    else to the event itself, by operator name. Also the summed time of the top-level events (ms)."""
    charged: list[tuple[str, str, float]] = []
    top = 0.0
    for event in events:
        own = (getattr(event, "self_device_time_total", 0.0) if device else event.self_cpu_time_total) / 1e3
        scope, parent = None, event
        while parent is not None and scope is None:
            if parent.name.startswith(_ModuleScopes.PREFIX):
                scope = parent.name.removeprefix(_ModuleScopes.PREFIX)
            parent = parent.cpu_parent
        op = "" if event.name.startswith(_ModuleScopes.PREFIX) else event.name
        charged.append((scope or ("(runner)" if scoped else event.name), op, own))
        if event.cpu_parent is None:
            top += (getattr(event, "device_time_total", 0.0) if device else event.cpu_time_total) / 1e3
    return fold(c for c in charged if c[2] > 0), top


def profile_torch(runner: Any, path: Path, feeds: dict[str, np.ndarray], config: ProfileConfig) -> Profile:
    """The reference (module scopes) or a PyTorch engine (operators) through torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    runner.activate()
    try:
        module = getattr(runner, "_module", None)
        scopes = _ModuleScopes(module) if isinstance(module, torch.nn.Module) else None
        cuda = torch.cuda.is_available() and "cuda" in str(getattr(runner, "device", "cpu"))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        try:
            for _ in range(config.warmup):
                runner.infer(feeds)
            with torch_profile(activities=activities) as prof:
                wall, steps = _timed(runner, feeds, ProfileConfig(calls=config.calls, warmup=0), lambda: None)
        finally:
            if scopes is not None:
                scopes.remove()
        layers, runtime = _torch_layers(prof.events(), cuda, scopes is not None)
        precision = runner.precision
    finally:
        runner.close()
    source = "torch.profiler, " + ("module scopes" if scopes else "operators (compiled: no module scopes)")
    return Profile(
        str(path),
        runner.name,
        precision,
        source + (" + CUDA kernels" if cuda else ""),
        len(feeds["inputs"]),
        steps,
        config.calls,
        layers,
        wall_ms=wall,
        runtime_ms=runtime,
        gap=Block.HOST_RUNNER if scopes else Block.COMPILED,
    )


def layer_profiler(trt: Any) -> Any:
    """A ``trt.IProfiler`` that keeps every ``(layer, ms)`` TensorRT reports (``.reports``)."""

    class LayerTimes(trt.IProfiler):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)
            self.reports: list[tuple[str, float]] = []

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            self.reports.append((layer_name, float(ms)))

    return LayerTimes()


def profile_trt(runner: Any, path: Path, feeds: dict[str, np.ndarray], config: ProfileConfig) -> Profile:
    """A TensorRT / TensorRT-RTX engine through an IProfiler on its contexts (no graph capture)."""
    runner.activate()
    try:
        profiler = runner.attach_profiler(layer_profiler)
        wall, steps = _timed(runner, feeds, config, profiler.reports.clear)
        precision = runner.precision
    finally:
        runner.close()
    return Profile(
        str(path),
        runner.name,
        precision,
        "TensorRT IProfiler (no CUDA graph)",
        len(feeds["inputs"]),
        steps,
        config.calls,
        fold((name, "", ms) for name, ms in profiler.reports),
        wall_ms=wall,
    )


def profile_artifact(path: str | Path, feeds: dict[str, np.ndarray], config: ProfileConfig) -> Profile:
    """One profile of ``path``: a graph, an engine, a checkpoint (the reference) or a trtexec
    ``--exportProfile`` JSON, by the runner table's suffixes."""
    from hrm_deploy.artifacts import runner_name
    from hrm_deploy.backends import open_runner

    path = Path(path)
    if path.suffix == ".json":
        return read_trtexec_profile(path, batch=config.batch)
    kind = runner_name(path)
    if kind == "ort":
        return profile_ort(path, feeds, config)
    if kind == "trt":
        return profile_trt(open_runner(path, cuda_graph=False), path, feeds, config)
    if kind == "torch_engine":  # per-operator events need the eager loop, not a replayed graph
        return profile_torch(open_runner(path, cuda_graph=False), path, feeds, config)
    return profile_torch(open_runner(path), path, feeds, config)


def profile(artifacts: list[str | Path], config: ProfileConfig, reference: str | Path | None = None) -> dict[str, Any]:
    """Profile ``artifacts`` (and the ``reference`` checkpoint, when given) at ``config.batch``;
    write profile.json, profile.md (per-block tables, and the first two side by side per ACT
    step) and profile.png under ``config.out_dir``. Returns what profile.json holds."""
    from hrm_deploy.bench.common import bench_data, environment, tile
    from hrm_deploy.bench.files import PROFILE_FILES, ReportFolder
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.io import write_json, write_text

    paths = [Path(a) for a in artifacts] + ([Path(reference)] if reference else [])
    if not paths:
        raise ConfigError("nothing to profile: give an ONNX graph, an engine, a checkpoint or a trtexec JSON")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ArtifactError(f"{', '.join(missing)} not found; give existing graphs, engines, checkpoints or JSONs")
    for path in paths:  # a FIFO or a device is named as one, before the data
        check_artifact_file(path)
    folder = ReportFolder(config.out_dir, PROFILE_FILES)
    folder.check()  # before the work: no user's file there is replaced
    feeds: dict[str, np.ndarray] = {}
    if any(p.suffix != ".json" for p in paths):
        from dataclasses import replace

        data = bench_data(config.data, str(reference) if reference else None, paths)
        examples = load_examples(data, config.batch, split="test")
        feeds = tile(examples.feeds(0, config.batch), config.batch)
        config = replace(config, data=data)
    profiles = [profile_artifact(p, feeds, config).as_dict() for p in paths]
    machine = environment("desktop") | {"cpu": cpu_description()}
    result: dict[str, Any] = {"config": _config_dict(config), "environment": machine, "profiles": profiles}
    markdown = "\n".join(table(p) for p in profiles)
    if len(profiles) >= 2:
        result["comparison"] = compare(profiles[0], profiles[1])
        markdown += "\nPer ACT step, side by side:\n\n" + result["comparison"]
    markdown += f"\nMachine: {machine['cpu']}.\n"
    with folder.writing(result["config"]) as stage:
        if plot(profiles, stage / "profile.png"):
            result["plot"] = str(folder.path("profile.png"))
        write_text(stage / "profile.md", markdown)
        write_json(stage / "profile.json", result)
    return result


def _config_dict(config: ProfileConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config)


def cpu_description() -> str:
    """The CPU model, cores and the vector ISA that decides INT8 speed (VNNI, AMX, AVX-512, AVX2)."""
    import os

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    isa = [
        f for f in ("amx_int8", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512f", "avx2") if f in flags
    ]
    return f"{model}, {os.cpu_count()} CPUs, ISA: {' '.join(isa) or 'no AVX2'}"


def plot(profiles: list[dict[str, Any]], path: Path) -> Path | None:
    """Horizontal bars of ms per ACT step per block, one bar per profile (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    blocks = [b.value for b in Block if any(b.value == r["block"] for p in profiles for r in p["rows"])]
    fig, ax = plt.subplots(figsize=(8, min(12.0, 0.22 * len(blocks) * len(profiles) + 1.5)))
    height = 0.8 / len(profiles)
    for i, prof in enumerate(profiles):
        ms = {r["block"]: r["ms_per_step"] for r in prof["rows"]}
        ys = [j + i * height for j in range(len(blocks))]
        ax.barh(
            ys,
            [ms.get(b, 0.0) for b in blocks],
            height,
            label=f"{prof['runner']} {prof['precision']} {Path(prof['artifact']).name}",
        )
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(blocks))], blocks)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per ACT step (batch {profiles[0]['batch']})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    from hrm_deploy.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
