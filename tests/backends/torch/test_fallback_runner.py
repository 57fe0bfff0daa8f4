"""The PyTorch engine's fallback and runner seams: the exported program runs eagerly until its
work pays for a compile (so a short verify never waits for one), on the runner's device; warm-up
covers every batch bucket; pinned host buffers go with their plan; the fresh-process load goes
through torch's C++ loader with the call spec parsed once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


def _slow_module(seconds):
    def module(*inputs):
        time.sleep(seconds)
        return ("eager", len(inputs))

    return module


def test_the_fallback_runs_eagerly_until_its_work_would_pay_for_a_compile(monkeypatch, capsys, caplog):
    from hrm_deploy.backends.torch.fallback import FallbackMode, FallbackProgram

    compiles = []

    def compile(module, **kw):
        compiles.append(kw)
        return lambda *inputs: ("compiled", len(inputs))

    monkeypatch.setattr(torch, "compile", compile)
    program = FallbackProgram(torch, _slow_module(0.02), FallbackMode.AUTO, compile_after_s=0.1)
    first = [program(1, 2) for _ in range(3)]
    assert first == [("eager", 2)] * 3 and program.path == "eager" and compiles == []
    while program.path == "eager":  # the eager work reaches the compile's cost: compiled once
        assert program.calls < 20
        program(1, 2)
    assert compiles == [{"dynamic": True}] and program(1, 2) == ("compiled", 2)
    assert "torch.compile of the exported program" in capsys.readouterr().err  # a progress display
    assert any("ran" in r.getMessage() and "eagerly" in r.getMessage() for r in caplog.records)


def test_the_fallback_mode_comes_from_the_environment(monkeypatch):
    from hrm_deploy.backends.torch.fallback import FallbackMode, FallbackProgram, fallback_mode

    compiles = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: compiles.append(kw) or module)
    assert fallback_mode() is FallbackMode.AUTO
    monkeypatch.setenv("HRM_DEPLOY_FALLBACK", "eager")
    eager = FallbackProgram(torch, _slow_module(0.01), fallback_mode(), compile_after_s=0.0)
    eager(1)
    eager(1)
    assert eager.path == "eager" and compiles == []
    monkeypatch.setenv("HRM_DEPLOY_FALLBACK", "compile")
    assert FallbackProgram(torch, _slow_module(0), fallback_mode()).path == "torch.compile"
    monkeypatch.setenv("HRM_DEPLOY_FALLBACK", "fast")
    with pytest.raises(ConfigError, match="HRM_DEPLOY_FALLBACK='fast': use one of auto, eager, compile"):
        fallback_mode()


@pytest.mark.slow
def test_retarget_moves_the_weights_and_the_devices_the_graph_names():
    """The exported program holds its build's device (cuda:0) in its weights and in the device
    arguments of tensors it creates; the runner's device index moves both (here cpu -> meta)."""
    from hrm_deploy.backends.torch.fallback import retarget

    root = torch.nn.Module()
    root.w = torch.nn.Parameter(torch.ones(3))
    graph = torch.fx.Graph()  # as torch.export writes it: aten.zeros([3], device=cpu) + w + x
    x, w = graph.placeholder("x"), graph.get_attr("w")
    zeros = graph.call_function(torch.ops.aten.zeros.default, ([3],), {"device": torch.device("cpu")})
    graph.output(graph.call_function(torch.add, (graph.call_function(torch.add, (x, w)), zeros)))
    module = torch.fx.GraphModule(root, graph)
    moved = retarget(torch, module, torch.device("meta"))
    assert moved.w.device.type == "meta"
    devices = [n.kwargs["device"] for n in moved.graph.nodes if "device" in n.kwargs]
    assert devices == [torch.device("meta")]
    assert moved(torch.ones(3, device="meta")).device.type == "meta"


def test_the_fallback_is_loaded_on_the_runner_device(tmp_path, monkeypatch):
    from hrm_deploy.backends.torch import runner as runner_module
    from hrm_deploy.manifest import write_manifest

    path = tmp_path / "e.pt2"
    path.write_bytes(b"an exported program")
    io = [{"name": "inputs", "is_input": True, "dtype": "int32", "shape": [-1, 4]}]
    write_manifest(
        path, stage="engine", config={}, backend={"name": "torch"}, device="cuda", compile_path="torch.compile", io=io
    )
    loads = []
    monkeypatch.setattr(runner_module, "load_program", lambda torch, p, device=None: loads.append(device) or "fn")
    runner = runner_module.TorchEngineRunner(path, device=1)
    assert runner._load(torch, on_cuda=True) == ("fn", True)
    assert loads == [torch.device("cuda", 1)]  # not the build's cuda:0


def test_the_loader_parses_the_call_spec_once():
    from torch.utils import _pytree as pytree

    from hrm_deploy.backends.torch.package import LoadedPackage

    spec = ((torch.zeros(1), torch.zeros(1)), {})
    out = (torch.zeros(1), torch.zeros(1), torch.zeros(1))

    class Loader:
        calls = 0

        def get_call_spec(self):
            Loader.calls += 1
            return [
                pytree.treespec_dumps(pytree.tree_flatten(spec)[1]),
                pytree.treespec_dumps(pytree.tree_flatten(out)[1]),
            ]

        def boxed_run(self, inputs):
            return [x + 1 for x in inputs] + [inputs[0]]

    package = LoadedPackage(Loader())
    for _ in range(3):
        result = package(torch.zeros(1), torch.ones(1))
    assert isinstance(result, tuple) and len(result) == 3 and float(result[1]) == 2.0
    assert Loader.calls == 1 and package.num_inputs == 2
    with pytest.raises(RuntimeError, match="takes 2 inputs, not 1"):
        package(torch.zeros(1))


def test_cpu_isa_check_reads_the_cpu_flags_without_compiling(monkeypatch, caplog):
    from types import SimpleNamespace

    from hrm_deploy.backends.torch.package import check_cpu_isa

    fake = SimpleNamespace(cpu=SimpleNamespace(_is_avx2_supported=lambda: True, _is_avx512_supported=lambda: False))
    assert check_cpu_isa(fake, Path("e.pt2"), {"AOTI_CPU_ISA": "AVX2"})
    assert not check_cpu_isa(fake, Path("e.pt2"), {"AOTI_CPU_ISA": "AVX512"})
    assert "e.pt2 was compiled for AVX512; this CPU lacks avx512" in caplog.text


# -- on a real CPU engine ----------------------------------------------------------------------


@pytest.mark.slow
def test_warm_up_covers_every_bucket_and_evicted_plans_release_their_pinned_buffers(torch_engines):
    from hrm_deploy.backends import open_runner

    with open_runner(torch_engines.step, steps=2) as runner:
        assert runner.warm_up(8) == [1, 2, 4, 8] and sorted(runner.loop.plans) == [1, 2, 4, 8]
        step = runner.step_function()
        assert step.warm_up(4) == [1, 2, 4] and sorted(step.loop.plans) == [1, 2, 4]
        runner.loop.max_plans = 2
        for n in (3, 9, 17, 33, 5):
            runner.infer({"inputs": np.zeros((n, 81), np.int32), "puzzle_identifiers": np.zeros(n, np.int32)})
        staged = sum(len(p.stage) for loop in (runner.loop, step.loop) for p in loop.plans.values())
        assert len(runner.loop.plans) == 2 and len(runner.memory._pinned) == staged  # none left from evicted plans


def _plant_crashing_library(engine: Path, folder: Path) -> Path:
    """A copy of ``engine`` (and its exported program) whose compiled library kills whatever loads
    it (SIGSEGV in a static initialiser), its manifest resealed: everything else as built."""
    from hrm_deploy.manifest import SEAL_KEY, manifest_text, read_manifest

    source = folder / "boom.c"
    source.write_text("#include <signal.h>\n__attribute__((constructor)) static void boom(void) { raise(SIGSEGV); }\n")
    library = folder / "boom.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    planted = folder / engine.name
    with zipfile.ZipFile(engine) as zin, zipfile.ZipFile(planted, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item, library.read_bytes() if item.filename.endswith(".so") else zin.read(item.filename))
    manifest = read_manifest(engine)
    shutil.copy(engine.with_name(manifest["load_fallback"]), folder / manifest["load_fallback"])
    import hashlib

    manifest.pop(SEAL_KEY, None)
    manifest["sha256"] = hashlib.sha256(planted.read_bytes()).hexdigest()
    planted.with_name(planted.name + ".manifest.json").write_text(manifest_text(manifest))
    return planted


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the crashing library")
def test_verify_of_a_package_whose_library_crashes_runs_the_fallback_eagerly_within_minutes(torch_engines, tmp_path):
    planted = _plant_crashing_library(torch_engines.step, tmp_path)
    env = dict(os.environ, HRM_DEPLOY_CACHE=str(tmp_path / "cache"), HRM_DEPLOY_FALLBACK="auto")
    cmd = [sys.executable, "-m", "hrm_deploy", "verify", str(planted), "--samples", "20"]
    cmd += ["--data", str(torch_engines.data), "--against", str(torch_engines.checkpoint)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.perf_counter() - start < 120
    assert "SIGSEGV" in done.stderr and "running the exported program eagerly" in done.stderr
    assert "PASSED" in done.stdout  # the fallback's answers match the reference
