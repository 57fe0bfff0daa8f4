"""The TensorRT adapter + device loop, driven by a fake TensorRT that records calls, on numpy
"device" memory (HostMemory): answers, zero allocations/bindings per step after warm-up,
chunking above the profile, engine dtypes, refused shapes, halting semantics."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.tensorrt import fake_trt
from hrm_deploy.backends.tensorrt.api import Backend
from hrm_deploy.errors import ArtifactError, ConfigError, DataError, EngineError
from hrm_deploy.manifest import write_manifest


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    import hrm_deploy.backends.tensorrt.runner as trt_runner

    monkeypatch.setattr(trt_runner, "load_backend", lambda name: Backend("tensorrt", fake_trt))
    fake_trt.CALLS.clear()


def make_engine(tmp_path, name="fake.engine", **spec):
    path = tmp_path / name
    return path, fake_trt.write_engine(path, precision="fp16", **spec)


def feeds(batch, s, seed=0):
    rng = np.random.default_rng(seed)
    return {"inputs": rng.integers(0, s["V"], (batch, s["S"])), "puzzle_identifiers": rng.integers(0, 3, batch)}


def open_fake(path, **options):
    from hrm_deploy.backends import open_runner

    return open_runner(path, memory="host", **options)


def test_step_engine_matches_reference_and_is_allocation_and_binding_free_after_warmup(tmp_path):
    path, s = make_engine(tmp_path, steps=4)
    x = feeds(5, s)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    with open_fake(path) as runner:
        assert (runner.mode, runner.steps, runner.max_batch) == ("step", 4, 16)
        first = runner.infer(x)  # plan + eager warm-up + capture
        memory, loop = runner.memory, runner.loop
        assert loop.plans[8].graph is not None  # 5 rows run in the bucket of 8
        before = (memory.allocations, dict(fake_trt.CALLS))
        for _ in range(3):
            out = runner.infer(x)
        calls = {k: fake_trt.CALLS[k] - before[1].get(k, 0) for k in fake_trt.CALLS}
        # 3 calls x 4 steps ran, replayed from the graph: no allocation, no binding, no enqueue call
        assert memory.allocations == before[0]
        assert calls.get("executed") == 12
        assert not any(
            calls.get(k)
            for k in (
                "set_tensor_address",
                "set_input_shape",
                "execute_async_v3",
                "create_execution_context",
                "set_device_memory",
            )
        )
    assert memory._live == 0 and not memory._by_ptr  # close() freed every buffer of every plan
    for result in (first, out):
        np.testing.assert_allclose(result["logits"], ref["logits"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(result["q_halt_logits"], ref["q_halt_logits"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(result["step_predictions"], ref["step_predictions"])
        np.testing.assert_array_equal(result["steps_used"], np.full(5, 4, np.int32))
    assert set(runner.last_timing) >= {"h2d_ms", "compute_ms", "d2h_ms", "wall_ms"}


def test_eager_loop_has_no_binding_calls_per_step_either(tmp_path):
    path, s = make_engine(tmp_path, steps=6)
    x = feeds(3, s)
    with open_fake(path, cuda_graph=False) as runner:
        runner.infer(x)
        before = dict(fake_trt.CALLS)
        out = runner.infer(x)
        assert fake_trt.CALLS["execute_async_v3"] - before["execute_async_v3"] == 6
        assert fake_trt.CALLS["set_tensor_address"] == before["set_tensor_address"]
        assert fake_trt.CALLS["set_input_shape"] == before["set_input_shape"]
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-6, atol=1e-6)


def test_steps_option_runs_that_many_steps_on_a_step_engine(tmp_path):
    path, s = make_engine(tmp_path, steps=4)
    x = feeds(2, s)
    with open_fake(path, steps=7) as runner:
        out = runner.infer(x)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"], steps=7)
    assert out["q_halt_logits"].shape == (2, 7)
    np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-6, atol=1e-6)


def test_unrolled_engine_refuses_steps_and_returns_step_predictions(tmp_path):
    path, s = make_engine(tmp_path, mode="unrolled", steps=3)
    with pytest.raises(ConfigError, match="always runs 3 ACT steps"):
        open_fake(path, steps=5).activate()
    x = feeds(4, s)
    with open_fake(path) as runner:
        out = runner.infer(x)
        with pytest.raises(ConfigError, match="needs a step engine"):
            runner.infer(x, halt=lambda k, h, c: np.ones(len(h), bool))
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    for key in ("logits", "q_halt_logits", "q_continue_logits"):
        np.testing.assert_allclose(out[key], ref[key], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["step_predictions"], ref["step_predictions"])
    path2, _ = make_engine(tmp_path, name="plain.engine", mode="unrolled", step_predictions=False)
    with open_fake(path2) as runner:
        assert "step_predictions" not in runner.infer(x)


@pytest.mark.parametrize("mode", ["step", "unrolled"])
def test_batches_above_the_profile_are_chunked_and_below_it_padded(tmp_path, mode):
    path, s = make_engine(tmp_path, mode=mode, batch=(2, 4), steps=3)
    x = feeds(11, s)  # 4 + 4 + 3
    with open_fake(path) as runner:
        out = runner.infer(x)
        assert sorted(runner.loop.plans) == [4]  # the last chunk of 3 runs in the bucket of 4
        assert runner.last_timing["chunks"] == 3
        one = runner.infer({k: v[:1] for k, v in x.items()})  # padded to the profile min of 2
        assert sorted(runner.loop.plans) == [2, 4]
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one["logits"], ref["logits"][:1], rtol=1e-6, atol=1e-6)
    assert out["steps_used"].shape == (11,) and one["logits"].shape[0] == 1


def test_engine_dtypes_are_read_from_the_engine(tmp_path):
    dtypes = {
        "inputs": "INT64",
        "puzzle_identifiers": "INT64",
        "z_H": "HALF",
        "z_L": "HALF",
        "z_H_out": "HALF",
        "z_L_out": "HALF",
        "logits": "HALF",
        "q_halt_logits": "BF16",
        "q_continue_logits": "HALF",
    }
    path, s = make_engine(tmp_path, dtypes=dtypes, steps=3)
    x = feeds(3, s)
    with open_fake(path) as runner:
        specs = runner.loop.adapter.tensors
        assert (specs["inputs"].dtype, specs["logits"].dtype, specs["q_halt_logits"].dtype) == (
            "int64",
            "float16",
            "bfloat16",
        )
        out = runner.infer(x)
        assert runner.loop.plans[4].device["inputs"].dtype == np.int64
    assert out["logits"].dtype == np.float32 and out["q_halt_logits"].dtype == np.float32
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    np.testing.assert_allclose(out["logits"], ref["logits"], atol=0.02)  # FP16 carry
    np.testing.assert_allclose(out["q_halt_logits"], ref["q_halt_logits"], atol=0.1, rtol=0.02)  # BF16


def test_unsupported_engine_dtype_is_one_engine_error(tmp_path):
    path, _ = make_engine(tmp_path, dtypes={"logits": "INT8"})
    with pytest.raises(EngineError, match="logits has dtype"):
        open_fake(path).activate()


def test_refused_input_shape_is_one_engine_error(tmp_path, monkeypatch):
    path, s = make_engine(tmp_path, batch=(1, 8))
    with open_fake(path) as runner:
        monkeypatch.setattr(fake_trt.IExecutionContext, "set_input_shape", lambda self, name, shape: False)
        with pytest.raises(EngineError, match="refused input inputs of shape \\(2, 6\\).*batch 1..8"):
            runner.infer(feeds(2, s))


def test_bad_feeds_and_inactive_runner_are_clear_errors(tmp_path):
    path, s = make_engine(tmp_path)
    runner = open_fake(path)
    with pytest.raises(EngineError, match="not active"):
        runner.infer(feeds(2, s))
    with runner:
        with pytest.raises(DataError, match="integer token ids"):
            runner.infer({"inputs": np.zeros((2, 6), np.float32), "puzzle_identifiers": np.zeros(2, np.int32)})
        with pytest.raises(DataError, match="sequence length 5"):
            runner.infer({"inputs": np.zeros((2, 5), np.int32), "puzzle_identifiers": np.zeros(2, np.int32)})
        with pytest.raises(DataError, match="at least one row"):
            runner.infer({"inputs": np.zeros((0, 6), np.int32), "puzzle_identifiers": np.zeros(0, np.int32)})


def test_halting_rows_keep_their_output_of_the_halting_step(tmp_path):
    path, s = make_engine(tmp_path, steps=6)
    x = feeds(8, s, seed=3)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    seen = []

    def halt(step, q_halt, q_continue):
        seen.append((step, q_halt.dtype, q_halt.shape))
        return q_halt > 0  # upstream's rule at evaluation time without the max-steps cap

    with open_fake(path) as runner:
        out = runner.infer(x, halt=halt)
        plain = runner.infer(x)
    expected_used = np.full(8, 6)
    for row in range(8):
        hits = np.flatnonzero(ref["q_halt_logits"][row] > 0)
        if len(hits):
            expected_used[row] = hits[0] + 1
    ran = int(expected_used.max())
    assert len(seen) == ran and seen[0] == (1, np.float32, (8,))
    assert 1 <= expected_used.min() < ran  # the fixture really halts rows at different steps
    np.testing.assert_array_equal(out["steps_used"], expected_used)
    for row in range(8):
        np.testing.assert_allclose(out["logits"][row], ref["per_step_logits"][row, expected_used[row] - 1], atol=1e-6)
    np.testing.assert_allclose(out["q_halt_logits"], ref["q_halt_logits"][:, :ran], atol=1e-6)
    assert out["step_predictions"].shape == (8, ran, s["S"])
    for row in range(8):  # per-step answers up to the halting step, then frozen at it
        used = expected_used[row]
        np.testing.assert_array_equal(out["step_predictions"][row, :used], ref["step_predictions"][row, :used])
        assert (out["step_predictions"][row, used:] == ref["step_predictions"][row, used - 1]).all()
    np.testing.assert_allclose(plain["logits"], ref["logits"], atol=1e-6)  # no halt: the full loop again
    with open_fake(path) as runner, pytest.raises(ConfigError, match="bool array of shape"):
        runner.infer(x, halt=lambda k, h, c: h > 0 if k < 2 else np.zeros(3, bool))


def test_the_backend_table_is_the_one_source(tmp_path):
    from hrm_deploy.artifacts import is_checkpoint, runner_name
    from hrm_deploy.backends import runner_class
    from hrm_deploy.engines.request import GraphInput, builder
    from hrm_deploy.registry import BACKENDS, engine_suffixes

    assert runner_name("a.onnx") == "ort" and runner_name("a.plan") == "tensorrt" and runner_name("a.pt2") == "torch"
    assert is_checkpoint("step_100") and is_checkpoint("model.pt")
    assert sorted(engine_suffixes()) == [".engine", ".onnx", ".plan", ".pt2"]
    for name, entry in BACKENDS.items():  # one name per backend: its package, its runner, its builder
        assert runner_class(name).name == name and entry.runner.startswith(f"hrm_deploy.backends.{name}")
        assert not entry.builds_for or entry.builds_for[0] == name
        for backend in entry.builds_for:
            assert callable(builder(backend).build) and builder(backend).takes in GraphInput
    with pytest.raises(ConfigError, match="no builder"):
        builder("nope")
    with pytest.raises(ConfigError, match="unknown"):
        runner_class("nope")


def test_auto_memory_falls_back_to_cuda_python_when_torch_has_no_cuda(monkeypatch):
    """A CPU-only torch (a Jetson with pip's torch) must not stop the engine runner."""
    import sys

    from hrm_deploy.errors import DependencyError
    from hrm_deploy.runtime import memory

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    tried = []

    class Probe:
        def __init__(self, device):
            tried.append(device)

    monkeypatch.setattr(memory, "CudaPythonMemory", Probe)
    assert isinstance(memory.device_memory(0, "auto"), Probe) and tried == [0]
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):  # no cuda-python either:
        monkeypatch.setitem(sys.modules, name, None)  # one clear error naming it (even where it is installed)
    with pytest.raises(DependencyError, match="cuda-python"):
        memory.device_memory(0, "auto")
    with pytest.raises(DependencyError, match="torch sees no CUDA GPU"):
        memory.device_memory(0, "torch")
    assert memory.device_memory("cpu").kind == "torch-cpu"


@pytest.mark.parametrize("mode", ["step", "unrolled"])
def test_external_table_engine_gathers_rows_on_the_host(tmp_path, mode):
    """An engine built from ``export --puzzle-emb external`` takes puzzle_emb_rows; the runner
    gathers them from the table its parent export wrote (here: named in its own manifest)."""
    from hrm_deploy.manifest import read_manifest
    from hrm_deploy.puzzle_table import PuzzleTable, table_path, write_table

    path, s = make_engine(tmp_path, mode=mode, rows_dim=3)
    table = write_table(table_path(path), np.stack([np.arange(5), np.full(5, 7), np.full(5, -1)], 1))
    write_manifest(
        path,
        **{k: v for k, v in read_manifest(path).items() if k in ("stage", "config", "backend", "mode", "steps")},
        precision="fp16",
        puzzle_emb=PuzzleTable.record(table, table_path(path).name),
    )
    x = feeds(11, s)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    with open_fake(path) as runner:
        out = runner.infer(x)
        assert runner.loop.feeds == ("inputs", "puzzle_emb_rows")
        with pytest.raises(DataError, match=r"puzzle identifier 5 is outside .*\(5 rows"):
            runner.infer({"inputs": x["inputs"][:1], "puzzle_identifiers": np.array([5])})
    np.testing.assert_allclose(out["logits"], ref["logits"], atol=2e-3)
    np.testing.assert_allclose(out["q_halt_logits"], ref["q_halt_logits"], atol=2e-2)
    table_path(path).unlink()
    with pytest.raises(ArtifactError, match="puzzle_emb.npy is missing"):
        open_fake(path).activate()


def test_an_engine_tensorrt_refuses_to_load_is_one_line_with_its_reason(tmp_path):
    """Every command opens engines through the runner: TensorRT's refusal (its reason, from its logger)
    is one line naming the file, not a bare "could not deserialize"."""
    path, _ = make_engine(tmp_path)
    from hrm_deploy.io import sha256_file
    from hrm_deploy.manifest import manifest_path, manifest_text, read_manifest

    path.write_bytes(b"not an engine")  # the bytes a build would never write, resealed as if it had
    data = read_manifest(path)
    data.update(sha256=sha256_file(path), size_bytes=path.stat().st_size)
    manifest_path(path).write_text(manifest_text(data))
    with pytest.raises(EngineError, match=r"cannot load .*fake\.engine: IRuntime::deserializeCudaEngine: .*magic tag"):
        open_fake(path).activate()
