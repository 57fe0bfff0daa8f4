"""The PyTorch engine (``build-engine --backend torch``): AOTInductor packages of the trained
tiny model built and run through the device loop on the CPU (answers equal to the reference),
the torch.compile fallback's plumbing, and (marker ``gpu``) the CUDA checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.backends.torch.builder.options import TorchOptions
from hrm_deploy.errors import ConfigError
from tests.backends.torch.helpers import examples as _examples, reference as _reference

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.mark.slow
def test_step_engine_on_cpu_answers_like_the_reference(torch_engines):
    from hrm_deploy.backends import open_runner

    manifest = json.loads(torch_engines.step.with_name(torch_engines.step.name + ".manifest.json").read_text())
    assert manifest["compile_path"] == "aoti" and manifest["mode"] == "step" and manifest["device"] == "cpu"
    assert manifest["backend"]["name"] == "torch" and manifest["checkpoint"]["sha256"]
    # the build loaded its package in a fresh process, and saved the exported program beside it
    assert manifest["load_check"]["ok"] is True and manifest["load_fallback"] == "tiny.step.pt2.program"
    assert manifest["tf32"] is False and set(manifest["companions"]) == {"tiny.step.pt2.program"}
    feeds = _examples(torch_engines.data).feeds(0, 40)
    ref = _reference(torch_engines.checkpoint, feeds, steps=3)
    with open_runner(torch_engines.step, steps=3) as runner:  # the loop runs 3 ACT steps of the 1-step preset
        assert runner.name == "torch" and runner.memory.kind == "torch-cpu"
        out = runner.infer(feeds)
        again = runner.infer(feeds)
        assert runner.loop.plans[64].graph is None  # no CUDA graphs on the CPU
    for result in (out, again):
        np.testing.assert_array_equal(result["logits"].argmax(-1), ref["logits"].argmax(-1))
        np.testing.assert_array_equal(result["step_predictions"], ref["step_predictions"])
        np.testing.assert_allclose(result["logits"], ref["logits"], atol=2e-3, rtol=1e-3)
        np.testing.assert_allclose(result["q_halt_logits"], ref["q_halt_logits"], atol=1e-3)
        np.testing.assert_array_equal(result["steps_used"], np.full(40, 3))


@pytest.mark.slow
def test_step_engine_halts_rows_with_their_halting_step_output(torch_engines):
    from hrm_deploy.backends import open_runner

    feeds = _examples(torch_engines.data).feeds(0, 6)
    stop_at = np.array([1, 2, 3, 1, 2, 3])

    def halt(step, q_halt, q_continue):
        assert q_halt.shape == (6,) and q_halt.dtype == np.float32
        return stop_at <= step

    with open_runner(torch_engines.step, steps=3) as runner:
        out = runner.infer(feeds, halt=halt)
    np.testing.assert_array_equal(out["steps_used"], stop_at)
    for steps in (1, 2, 3):
        ref = _reference(torch_engines.checkpoint, feeds, steps=steps)
        rows = stop_at == steps
        np.testing.assert_allclose(out["logits"][rows], ref["logits"][rows], atol=2e-3, rtol=1e-3)


@pytest.mark.slow
def test_unrolled_engine_from_the_onnx_export_and_verify_end_to_end(torch_engines, tmp_path):
    from hrm_deploy.artifacts import find_reference
    from hrm_deploy.backends import open_runner
    from hrm_deploy.verify import verify

    manifest = json.loads(torch_engines.unrolled.with_name(torch_engines.unrolled.name + ".manifest.json").read_text())
    assert manifest["parent"]["path"].endswith("tiny.onnx") and manifest["mode"] == "unrolled"
    assert (
        find_reference(torch_engines.unrolled).resolve() == Path(torch_engines.checkpoint).resolve()
    )  # via the ONNX, sha256-checked
    with pytest.raises(ConfigError, match="always runs 1 ACT steps"):
        open_runner(torch_engines.unrolled, steps=4).activate()
    report = verify(torch_engines.unrolled, torch_engines.data, samples=64)
    assert report["passed"], report["failures"]
    assert report["runner"] == "torch" and report["logits"]["argmax_agreement"] == 1.0
    assert report["per_step_disagreement"] == [0.0]


@pytest.mark.slow
def test_fallback_saves_the_exported_program_and_runs_it_compiled(trained_tiny, tmp_path, monkeypatch):
    """Without a working AOTInductor (no host compiler / CUDA headers) the build saves the
    exported program and says so; the runner compiles it with torch.compile inside the same
    loop (torch.compile itself is replaced by the identity here: its compile time is not the test)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.torch.builder import TorchEngineConfig, build_torch_engine

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Failed to find a C++ compiler (simulated)")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
    result = build_torch_engine(
        trained_tiny.checkpoint, TorchEngineConfig(max_batch=8), tmp_path / "fb.pt2", quiet=True
    )
    manifest = json.loads((tmp_path / "fb.pt2.manifest.json").read_text())
    assert manifest["compile_path"] == "torch.compile" and "C++ compiler" in manifest["compile_fallback_reason"]
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: compiled.append(kw) or module)
    feeds = _examples(trained_tiny.data, 8).feeds(0, 8)
    with open_runner(result.path, steps=2) as runner:  # auto: eager while the work is short
        eager = runner.infer(feeds)
    assert compiled == []
    monkeypatch.setenv("HRM_DEPLOY_FALLBACK", "compile")
    with open_runner(result.path, steps=2) as runner:
        out = runner.infer(feeds)
    assert compiled == [{"dynamic": True}]
    np.testing.assert_allclose(eager["logits"], out["logits"])
    ref = _reference(trained_tiny.checkpoint, feeds, steps=2)
    np.testing.assert_array_equal(out["logits"].argmax(-1), ref["logits"].argmax(-1))
    with pytest.raises(ConfigError, match="--fp32 or --bf16"):
        TorchEngineConfig(precision="fp16")


@pytest.mark.slow
def test_bench_measures_a_torch_engine_on_cpu(torch_engines, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench

    report = bench(
        [torch_engines.step],
        BenchConfig(
            data=torch_engines.data,
            batches=(1, 8),
            iters=2,
            warmup=1,
            reference=str(torch_engines.checkpoint),
            accuracy_samples=16,
            out_dir=str(tmp_path / "bench"),
        ),
    )
    row = report["rows"][0]
    assert row["status"] == "ok" and row["runner"] == "torch", row
    assert set(row["batches"]["8"]["phases_median_ms"]) == {"h2d_ms", "compute_ms", "d2h_ms"}
    assert row["accuracy"] == report["rows"][1]["accuracy"]  # same answers as the reference row


@pytest.mark.slow
def test_cli_builds_a_torch_engine_with_fp32_by_default(trained_tiny, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    monkeypatch.setattr(
        torch._inductor,
        "aoti_compile_and_package",  # keep the CLI test fast
        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no compiler (simulated)")),
    )
    out = tmp_path / "cli.pt2"
    result = CliRunner().invoke(
        app, ["build-engine", str(trained_tiny.checkpoint), "--backend", "torch", "-o", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "cli.pt2.manifest.json").read_text())
    assert (
        manifest["precision"] == "fp32" and manifest["mode"] == "step" and manifest["compile_path"] == "torch.compile"
    )
    refused = CliRunner().invoke(app, ["build-engine", str(trained_tiny.checkpoint), "--backend", "torch", "--fp16"])
    assert refused.exit_code == 2 and "--fp32 or --bf16" in refused.output


# -- GPU: run wherever a CUDA GPU is available ------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["torch"])
def test_gpu_engine_through_the_loop_races_and_graphs(cuda_engine, trained_tiny, memory):
    from hrm_deploy.backends import open_runner

    feeds = _examples(trained_tiny.data, 64).feeds(0, 64)
    ref = _reference(trained_tiny.checkpoint, feeds, steps=4)
    with open_runner(cuda_engine, steps=4, memory=memory) as runner:
        eager = open_runner(cuda_engine, steps=4, memory=memory, cuda_graph=False).activate().infer(feeds)
        first = runner.infer(feeds)
        for _ in range(3):
            # race: a long kernel on torch's *current* stream before the upload; the loop's
            # copies and launches are all on its own stream, so the answers cannot change
            torch.cuda._sleep(50_000_000)
            out = runner.infer(feeds)
        captured = memory == "torch"
        assert (runner.loop.plans[64].graph is not None) == captured
    for result in (eager, first, out):
        np.testing.assert_array_equal(result["logits"].argmax(-1), ref["logits"].argmax(-1))
        np.testing.assert_allclose(result["logits"], ref["logits"], atol=5e-3, rtol=1e-3)
    np.testing.assert_allclose(out["logits"], eager["logits"], atol=1e-5)  # replay == eager


@pytest.mark.gpu
def test_gpu_phase_timings_sum_to_the_wall_time(cuda_engine, trained_tiny):
    from hrm_deploy.backends import open_runner

    feeds = _examples(trained_tiny.data, 200).feeds(0, 200)
    feeds = {k: np.concatenate([v] * 5)[:256] for k, v in feeds.items()}
    with open_runner(cuda_engine, steps=16, step_predictions=False) as runner:  # no host argmax in the wall time
        for _ in range(3):
            runner.infer(feeds)
        timing = runner.last_timing
    phases = timing["h2d_ms"] + timing["compute_ms"] + timing["d2h_ms"]
    assert min(timing["h2d_ms"], timing["compute_ms"], timing["d2h_ms"]) > 0
    assert abs(phases - timing["wall_ms"]) <= 0.1 * timing["wall_ms"], timing
    assert timing["peak_gpu_mib"] and timing["peak_gpu_mib"] > 0


@pytest.mark.gpu
def test_gpu_bench_end_to_end(cuda_engine, trained_tiny, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench

    report = bench(
        [cuda_engine],
        BenchConfig(
            data=trained_tiny.data,
            batches=(1, 64),
            iters=5,
            warmup=2,
            reference=trained_tiny.checkpoint,
            accuracy_samples=64,
            out_dir=str(tmp_path / "bench"),
        ),
    )
    row = report["rows"][0]
    assert row["status"] == "ok" and row["runner"] == "torch", row
    assert row["batches"]["64"]["phases_median_ms"]["compute_ms"] > 0


# -- the GPU-only seams, checked on the CPU -------------------------------------------------------


def test_captured_loops_load_aoti_single_threaded_on_the_runner_gpu():
    """AOTInductor's default runner queries CUDA events between calls, which fails inside a
    stream capture: a captured loop must load it with run_single_threaded=True, on its GPU."""
    from types import SimpleNamespace

    from hrm_deploy.backends.torch.runner import load_aoti_package

    calls = []

    def load(path, run_single_threaded=False, device_index=-1):
        calls.append((path, run_single_threaded, device_index))
        return "model"

    fake = SimpleNamespace(_inductor=SimpleNamespace(aoti_load_package=load), __version__="2.11")
    assert load_aoti_package(fake, Path("e.pt2"), single_threaded=True, device_index=1) == ("model", True)
    assert load_aoti_package(fake, Path("e.pt2"), single_threaded=False, device_index=-1) == ("model", True)
    assert calls == [("e.pt2", True, 1), ("e.pt2", False, -1)]

    def old_load(path):  # a torch without the flag: loaded as is, and the loop must stay eager
        return "old"

    old = SimpleNamespace(_inductor=SimpleNamespace(aoti_load_package=old_load), __version__="2.5")
    assert load_aoti_package(old, Path("e.pt2"), single_threaded=True, device_index=0) == ("old", False)
    # the installed torch has both options (API introspection, no GPU needed)
    import inspect

    assert {"run_single_threaded", "device_index"} <= set(
        inspect.signature(torch._inductor.aoti_load_package).parameters
    )


def test_adapter_runs_on_the_memory_backends_gpu_and_views_bf16_cuda_python_buffers(monkeypatch):
    from types import SimpleNamespace

    from hrm_deploy.backends.torch.runner import TorchEngineAdapter
    from hrm_deploy.runtime.memory.cuda_python import _CudaBuffer

    memory = SimpleNamespace(kind="cuda-python", stream_handle=0, device_index=1)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle: None)
    adapter = TorchEngineAdapter(lambda *a: a, [], memory, (1, 8))
    assert adapter.device == torch.device("cuda", 1)  # not torch's current device
    torch_memory = SimpleNamespace(kind="torch-cuda", stream_handle=0, device=torch.device("cuda", 2))
    assert TorchEngineAdapter(lambda *a: a, [], torch_memory, (1, 8)).device == torch.device("cuda", 2)

    seen = {}

    def as_tensor(buffer, device=None):  # what torch does with a __cuda_array_interface__, on the CPU
        iface = buffer.__cuda_array_interface__
        seen["typestr"], seen["device"] = iface["typestr"], device
        return torch.zeros(iface["shape"], dtype={"<i2": torch.int16, "<f4": torch.float32}[iface["typestr"]])

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    context = adapter.new_context()
    adapter.bind(context, "z_H", _CudaBuffer(1234, (2, 3), "bfloat16", owner=False))
    assert context["bound"]["z_H"].dtype == torch.bfloat16 and seen == {"typestr": "<i2", "device": adapter.device}
    adapter.bind(context, "logits", _CudaBuffer(1234, (2, 3), "float32", owner=False))
    assert context["bound"]["logits"].dtype == torch.float32


def test_graph_capture_is_thread_local_and_on_the_runner_device(monkeypatch):
    """A server runs several threads: a global-mode capture fails when another thread makes an
    unsafe CUDA call, so the loop captures in thread-local mode, with its own device current."""
    from types import SimpleNamespace

    from hrm_deploy.runtime.memory import TorchMemory

    events = []

    class Graph:
        pass

    class Ctx:
        def __init__(self, name, **kw):
            self.name, self.kw = name, kw

        def __enter__(self):
            events.append((self.name, self.kw))

        def __exit__(self, *exc):
            return False

    cuda = SimpleNamespace(
        CUDAGraph=Graph,
        graph=lambda g, **kw: Ctx("graph", **kw),
        device=lambda d: Ctx("device", d=d),
    )
    memory = TorchMemory.__new__(TorchMemory)
    memory.torch, memory.device, memory.stream = SimpleNamespace(cuda=cuda), "cuda:3", "stream"
    memory.synchronize = lambda: None
    graph = memory.capture(lambda: events.append(("work", {})))
    assert isinstance(graph, Graph)
    assert events == [
        ("device", {"d": "cuda:3"}),
        ("graph", {"stream": "stream", "capture_error_mode": "thread_local"}),
        ("work", {}),
    ]


@pytest.fixture(scope="module")
def cuda_bf16_engine(trained_tiny, tmp_path_factory):
    from hrm_deploy.backends.torch.builder import TorchEngineConfig, build_torch_engine

    folder = tmp_path_factory.mktemp("cuda_bf16")
    config = TorchEngineConfig(precision="bf16", max_batch=64, device="cuda")
    return build_torch_engine(trained_tiny.checkpoint, config, folder / "bf16.pt2", quiet=True).path


@pytest.mark.gpu
def test_gpu_bf16_engine_runs_and_refuses_cuda_python_memory(cuda_bf16_engine, trained_tiny):
    from hrm_deploy.backends import open_runner

    path = cuda_bf16_engine
    with pytest.raises(ConfigError, match="memory='torch'"):
        open_runner(path, memory="cuda-python").activate()
    memory = "torch"
    feeds = _examples(trained_tiny.data, 64).feeds(0, 64)
    ref = _reference(trained_tiny.checkpoint, feeds, steps=1)
    with open_runner(path, steps=1, memory=memory) as runner:
        out = runner.infer(feeds)
    agreement = (out["logits"].argmax(-1) == ref["logits"].argmax(-1)).mean()
    assert agreement >= 0.99, agreement


@pytest.mark.gpu
def test_gpu_every_batch_size_through_bounded_captured_plans(cuda_engine, trained_tiny):
    from hrm_deploy.backends import open_runner

    examples = _examples(trained_tiny.data, 200)
    with open_runner(cuda_engine, steps=2) as runner:
        runner.loop.max_plans = 3
        for n in (1, 3, 17, 64, 100, 200, 5):
            feeds = examples.feeds(0, n)
            out = runner.infer(feeds)
            ref = _reference(trained_tiny.checkpoint, feeds, steps=2)
            np.testing.assert_array_equal(out["logits"].argmax(-1), ref["logits"].argmax(-1))
            np.testing.assert_array_equal(out["step_predictions"][:, -1], ref["logits"].argmax(-1))
        assert len(runner.loop.plans) == 3 and runner.loop.path == "cuda_graph"
        assert all(p.graph is not None for p in runner.loop.plans.values())


def test_cuda_python_memory_is_refused_for_a_cuda_torch_engine(tmp_path, monkeypatch):
    from hrm_deploy.backends import open_runner
    from hrm_deploy.manifest import write_manifest

    path = tmp_path / "e.pt2"
    path.write_bytes(b"not loaded")
    write_manifest(
        path, stage="engine", config={}, backend={"name": "torch", "version": torch.__version__}, device="cuda"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="memory='cuda-python' is for TensorRT engines"):
        open_runner(path, memory="cuda-python").activate()


@pytest.mark.slow
def test_torch_engine_of_an_upstream_step_export_without_its_dataset(tmp_path, tiny_model, monkeypatch):
    """export step_N --mode step --seq-len ... then build-engine --backend torch: the engine build
    reloads the checkpoint with the sizes the export recorded (no dataset.json anywhere)."""
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from tests.conftest import write_upstream_run

    monkeypatch.chdir(tmp_path)
    step_file = write_upstream_run(tmp_path, tiny_model, with_dataset=False)
    cfg = tiny_model.inner.config
    sizes = {"seq_len": cfg.seq_len, "vocab_size": cfg.vocab_size, "num_puzzle_identifiers": cfg.num_puzzle_identifiers}
    onnx = export_onnx(
        step_file, tmp_path / "up.step.onnx", ExportConfig(mode="step", parity=False), quiet=True, **sizes
    )
    monkeypatch.setattr(  # the compile itself is not the test
        torch._inductor, "aoti_compile_and_package", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("skip"))
    )
    result = build_engine(
        onnx.path,
        EngineConfig(precision="fp32", backend="torch", max_batch=8, options=TorchOptions(device="cpu")),
        tmp_path / "up.pt2",
        quiet=True,
    )
    manifest = json.loads(result.manifest.read_text())
    assert manifest["mode"] == "step" and manifest["model_config"]["seq_len"] == cfg.seq_len
