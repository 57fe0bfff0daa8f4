"""A ``.pt2`` is first loaded by a child process: a load that kills its process (a segmentation
fault in torch's C++ package loader, seen on GPUs) costs only the child. The parent warns in one
line and runs the exported program saved beside the engine, or fails in one line; the verdict is
cached per package, torch and device; ``build-engine`` probes its own result. Also: the unzip
folders loads leave, and the recorded TF32 choice."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.backends.torch.builder.options import TorchOptions
from hrm_deploy.errors import ConfigError, EngineError

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

# the "loader" of these tests: a child that reaches the load and dies of a segmentation fault
SEGFAULT = (
    "import os, signal; print('PROBE step loading the package', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
)


@pytest.fixture
def segfaulting_child(monkeypatch):
    from hrm_deploy.backends.torch import probe

    children = []

    def command(spec):
        children.append(spec)
        return [sys.executable, "-c", SEGFAULT]

    monkeypatch.setattr(probe, "child_command", command)
    return children


def _no_in_process_load(monkeypatch):
    """Any in-process load of the package fails the test (the runner's loader and torch's)."""
    from hrm_deploy.backends.torch import runner

    monkeypatch.setattr(runner, "load_aoti_package", lambda *a, **k: pytest.fail("loaded in-process"))
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda *a, **k: pytest.fail("loaded in-process"))


def _spec(path):
    from hrm_deploy.backends.torch.probe import ProbeSpec

    io = [{"name": "inputs", "is_input": True, "dtype": "int32", "shape": [-1, 4]}]
    return ProbeSpec(str(path), "cpu", -1, False, False, io)


def test_a_child_killed_by_a_signal_is_a_cached_verdict_and_the_parent_lives_on(cache, segfaulting_child, tmp_path):
    from hrm_deploy.backends.torch.probe import probe_load

    key = {"sha256": "ab" * 32, "torch_version": torch.__version__, "device_label": "cpu"}
    verdict = probe_load(_spec(tmp_path / "e.pt2"), **key)
    assert not verdict.ok and not verdict.cached
    assert verdict.reason == "the loading process died of SIGSEGV (while loading the package)"
    again = probe_load(_spec(tmp_path / "e.pt2"), **key)
    assert again.cached and again.reason == verdict.reason and len(segfaulting_child) == 1  # no second child
    # another torch (or device) is another verdict: probed again
    assert not probe_load(_spec(tmp_path / "e.pt2"), **{**key, "torch_version": "9.9"}).cached
    assert len(segfaulting_child) == 2
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("hrm-deploy-probe-*"))  # its TMPDIR is gone


@pytest.mark.slow
def test_a_probe_error_and_a_hang_are_reported_a_hang_is_not_cached(cache, tmp_path, monkeypatch):
    from hrm_deploy.backends.torch import probe

    key = {"sha256": "cd" * 32, "torch_version": "x", "device_label": "cpu"}
    code = "print('PROBE step loading the package'); print('PROBE error RuntimeError: bad zip'); raise SystemExit(3)"
    monkeypatch.setattr(probe, "child_command", lambda spec: [sys.executable, "-c", code])
    verdict = probe.probe_load(_spec(tmp_path / "e.pt2"), **key)
    assert verdict.reason == "the load failed (while loading the package): RuntimeError: bad zip"
    monkeypatch.setattr(probe, "child_command", lambda spec: [sys.executable, "-c", "import time; time.sleep(30)"])
    hung = probe.probe_load(_spec(tmp_path / "e.pt2"), **{**key, "sha256": "ef" * 32}, timeout=1.0)
    assert not hung.ok and hung.reason.startswith("no answer within 1 s")
    assert not probe.cache_file("ef" * 32, "x", "cpu", _spec(tmp_path / "e.pt2")).exists()


def _fake_engine(tmp_path, **fields):
    from hrm_deploy.manifest import write_manifest

    path = tmp_path / "e.pt2"
    path.write_bytes(b"an AOTInductor package")
    io = [{"name": "inputs", "is_input": True, "dtype": "int32", "shape": [-1, 81]}]
    write_manifest(
        path,
        stage="engine",
        config={},
        backend={"name": "torch", "version": torch.__version__},
        device="cpu",
        mode="step",
        compile_path="aoti",
        io=io,
        **fields,
    )
    return path


def test_an_unloadable_package_without_a_fallback_fails_in_one_line(cache, segfaulting_child, tmp_path, monkeypatch):
    from hrm_deploy.backends import open_runner

    _no_in_process_load(monkeypatch)
    engine = _fake_engine(tmp_path)
    with pytest.raises(EngineError) as info:
        open_runner(engine).activate()
    message = str(info.value)
    assert "\n" not in message and "e.pt2 cannot be loaded by torch" in message
    assert "SIGSEGV" in message and "rebuild it with `hrm-deploy build-engine --backend torch`" in message


@pytest.mark.slow
def test_build_reports_an_unloadable_package_and_the_runner_falls_back(
    trained_tiny, cache, segfaulting_child, tmp_path, monkeypatch, caplog
):
    """The build probes its package (here: the loader segfaults), says so in one warning line and
    records it; the runner then never loads the package in-process: it warns and runs the
    exported program saved beside it (torch.compile replaced by the identity: its compile time is
    not the test), with the reference's answers."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.reference import TorchRunner
    from hrm_deploy.backends.torch.builder import build_torch_engine
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.manifest import check_artifact

    def package(program, package_path):  # the compile itself is not the test: a package the probe "loads"
        Path(package_path).write_bytes(b"an AOTInductor package")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", package)
    with caplog.at_level(logging.WARNING):
        result = build_torch_engine(
            trained_tiny.checkpoint,
            EngineConfig(precision="fp32", backend="torch", max_batch=8, options=TorchOptions(device="cpu")),
            tmp_path / "e.pt2",
            quiet=True,
        )
    warned = [r.getMessage() for r in caplog.records if "cannot be loaded by a fresh process" in r.getMessage()]
    assert len(warned) == 1 and "SIGSEGV" in warned[0] and "e.pt2.program" in warned[0], caplog.text
    manifest = check_artifact(result.path)  # the companion's sha256 is checked with the engine
    assert manifest["compile_path"] == "aoti" and manifest["load_fallback"] == "e.pt2.program"
    assert manifest["load_check"]["ok"] is False and "SIGSEGV" in manifest["load_check"]["reason"]
    assert set(manifest["companions"]) == {"e.pt2.program"} and manifest["tf32"] is False
    assert result.build["load_check"]["ok"] is False and len(segfaulting_child) == 1

    _no_in_process_load(monkeypatch)
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    feeds = load_examples(trained_tiny.data, 8, split="test").feeds(0, 8)
    caplog.clear()
    with caplog.at_level(logging.WARNING), open_runner(result.path, steps=2) as runner:
        out = runner.infer(feeds)
        assert (
            runner.compile_path == "exported program (load fallback)"
            and "SIGSEGV" in runner.runtime_settings["load_fallback"]
        )
    assert len(segfaulting_child) == 1  # the build's verdict, read from the cache
    assert any("running its exported program instead" in r.getMessage() for r in caplog.records)
    with TorchRunner(trained_tiny.checkpoint, steps=2) as ref:
        expected = ref.infer(feeds)
    np.testing.assert_array_equal(out["logits"].argmax(-1), expected["logits"].argmax(-1))


def test_unzip_folders_of_ended_processes_are_removed_others_kept(tmp_path):
    from hrm_deploy.backends.torch.package import _host, private_tmpdir, sweep_stale

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    root = tmp_path / "root"
    folders = {
        "ended": root / f"{_host()}-{ended.pid}" / "aotinductor_abcdef",
        "self": root / f"{_host()}-{os.getpid()}" / "aotinductor_ghijkl",
        "other host": root / f"{_host()}x-{ended.pid}" / "aotinductor_mnopqr",
        "not ours": root / "notes" / "keep.txt",
    }
    for folder in folders.values():
        folder.mkdir(parents=True)
    assert sweep_stale(root) == [folders["ended"].parent]
    assert [name for name, f in folders.items() if f.exists()] == ["self", "other host", "not ours"]
    before = os.environ.get("TMPDIR")
    (folders["self"] / "lib.so").write_bytes(b"")  # a model of this process is loaded from there
    with private_tmpdir(root) as own:
        assert own == root / f"{_host()}-{os.getpid()}" and os.environ["TMPDIR"] == str(own)
    assert os.environ.get("TMPDIR") == before and own.exists()  # kept while a model uses it
    shutil.rmtree(own)
    with private_tmpdir(root) as own:
        pass  # nothing unzipped (a failed load): no empty folder left behind
    assert not own.exists()


@pytest.mark.slow
def test_loads_leave_no_unzip_folder_even_when_the_process_is_killed(torch_cpu_package, tmp_path):
    """A loaded package's unzip folder lives in this process's folder while the model does and
    goes with it; a process killed with a model loaded leaves its folder, which the next load removes."""
    from hrm_deploy.backends.torch.package import extraction_root, load_aoti_package, release_folder

    root = extraction_root()
    script = (
        "import os, signal, sys, torch; from pathlib import Path;"
        "from hrm_deploy.backends.torch.package import load_aoti_package;"
        "m = load_aoti_package(torch, Path(sys.argv[1]), single_threaded=False, device_index=-1);"
        "print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(torch_cpu_package)], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    left = [p for p in root.glob(f"*-{killed.stdout.strip()}") if list(p.glob("aotinductor_*"))]
    assert left, "the killed load left no folder: the test proves nothing"
    model, _ = load_aoti_package(torch, torch_cpu_package, single_threaded=False, device_index=-1)
    assert not any(p.exists() for p in left)  # swept by this load
    mine = [p for p in root.glob(f"*-{os.getpid()}")]
    assert len(mine) == 1 and len(list(mine[0].glob("aotinductor_*"))) == 1
    del model
    release_folder()
    assert not mine[0].exists()


@pytest.fixture(scope="module")
def torch_cpu_package(tmp_path_factory):
    """A tiny real AOTInductor package for the CPU (a linear layer; ~30 s to compile on 2 cores)."""
    folder = tmp_path_factory.mktemp("aoti")
    model = torch.nn.Linear(4, 2).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(model, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "linear.pt2")))


def test_tf32_is_an_option_of_cuda_torch_engines_and_restored_after_a_build():
    from hrm_deploy.backends.torch.package import tf32_matmuls
    from hrm_deploy.engines.config import EngineConfig

    assert EngineConfig(precision="fp32", backend="torch").options.tf32 is False  # exact float32 unless asked
    before = torch.backends.cuda.matmul.allow_tf32
    with tf32_matmuls(torch, not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before
    with pytest.raises(ConfigError, match="--tf32 is an option of --backend torch"):
        EngineConfig(precision="fp16", options=TorchOptions(tf32=True))
    assert EngineConfig(precision="fp32", backend="torch", options=TorchOptions(tf32=True)).options.tf32


def test_cli_refuses_tf32_for_a_cpu_engine(trained_tiny, tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    result = CliRunner().invoke(
        app,
        ["build-engine", str(trained_tiny.checkpoint), "--backend", "torch", "--tf32", "-o", str(tmp_path / "e.pt2")],
    )
    assert result.exit_code == 2 and "--tf32 applies to CUDA engines" in result.output, result.output
    assert not (tmp_path / "e.pt2").exists()


def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX (amx_tile)")
def test_a_load_asks_for_the_amx_permission_a_compiling_process_has():
    """Loading a package grants the process AMX tile data first (arch_prctl ARCH_GET_XCOMP_PERM bit
    18), as torch's compiler does while it builds one and onnxruntime's import does: a fresh
    process without it died creating a CUDA package's container on an H100 host."""
    code = (
        "import ctypes, torch\n"
        "from hrm_deploy.backends.torch.package import grant_amx\n"
        "libc = ctypes.CDLL(None)\n"
        "def tiles():\n"
        "    mask = ctypes.c_uint64(0)\n"
        "    assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0\n"  # SYS_arch_prctl, ARCH_GET_XCOMP_PERM
        "    return bool(mask.value >> 18 & 1)\n"
        "before = tiles()\n"
        "print(before, grant_amx(torch), tiles())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stdout + out.stderr


def test_every_load_asks_for_amx_first_and_old_verdicts_are_probed_again(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from hrm_deploy.backends.torch import package, probe

    order = []
    fake = SimpleNamespace(
        cpu=SimpleNamespace(_init_amx=lambda: order.append("amx") or True),
        _inductor=SimpleNamespace(aoti_load_package=lambda path, **kw: order.append("load") or "model"),
    )
    assert package.load_aoti_package(fake, tmp_path / "e.pt2", single_threaded=False, device_index=-1)[0] == "model"
    assert order == ["amx", "load"]
    assert package.grant_amx(SimpleNamespace()) is False  # a torch that cannot ask: the load goes on
    spec = probe.ProbeSpec("e.pt2", "cuda", 0, True, False, [])
    before = probe.cache_file("ab" * 32, "2.11", "cuda", spec)
    monkeypatch.setenv(package.FIX_ENV, "1")  # another set of load fixes: another verdict
    assert probe.cache_file("ab" * 32, "2.11", "cuda", spec) != before
