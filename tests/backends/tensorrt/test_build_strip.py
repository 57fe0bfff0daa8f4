"""``build-engine --strip-weights`` on the build side: refused in one line where TensorRT-RTX has no GPU
(every refittable build fails its CUDA check on a CPU-only machine), the option reaching the builder,
the graph parsed as recorded (the refit reads it back), the NVIDIA command line. The worker's flags
are in test_worker.py; the refit on first run in test_refit.py."""

from __future__ import annotations

import pytest

from hrm_deploy.backends.tensorrt.api import Backend
from hrm_deploy.backends.tensorrt.builder.engine import _for_tensorrt
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions, reproduce_command
from hrm_deploy.errors import ConfigError
from hrm_deploy.system import gpu_identity


def test_rtx_without_a_gpu_refuses_before_any_work(tiny_onnx, tmp_path, monkeypatch):
    pytest.importorskip("tensorrt_rtx", reason="pip install 'hrm-deploy[rtx]'")
    if gpu_identity():
        pytest.skip("this machine has a GPU: TensorRT-RTX may build stripped engines here")
    from hrm_deploy.engines.build import EngineConfig, build_engine

    monkeypatch.chdir(tmp_path)
    config = EngineConfig("fp16", options=TensorRTOptions(strip_weights=True, timing_cache=None))
    with pytest.raises(
        ConfigError, match="--strip-weights: tensorrt-rtx .* only on a machine with an NVIDIA GPU"
    ) as err:
        build_engine(tiny_onnx.step, config, out=tmp_path / "s.engine", quiet=True)
    assert "\n" not in str(err.value) and not list(tmp_path.rglob("*.onnx"))  # refused before the precision graph


def test_the_flag_reaches_the_options_and_other_backends_refuse_it():
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    done = CliRunner().invoke(app, ["build-engine", "--target", "cpu", "--strip-weights"])
    assert done.exit_code == 2 and "--strip-weights" in done.output and "TensorRT build option" in done.output


def test_a_stripped_build_parses_the_graph_as_recorded():
    rewrites: dict = {}
    assert _for_tensorrt(b"graph bytes", None, rewrites, strip=True) == b"graph bytes"
    assert "refits from its recorded graph" in rewrites["slices_to_gathers"]


def test_trtexec_line_of_a_stripped_engine():
    import types

    trt = types.SimpleNamespace(__version__="10.3.0")
    line = reproduce_command(
        Backend("tensorrt", trt),
        onnx="m.onnx",
        engine="m.engine",
        shapes={"inputs": [[1, 81], [1, 81], [16, 81]]},
        workspace_mib=1024,
        optimization_level=3,
        strip_weights=True,
    )
    assert "--stripWeights" in line.split() and line.startswith("trtexec ")
