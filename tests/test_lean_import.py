"""`import hrm_deploy` and `hrm-deploy --help` must not pull heavy libraries."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx")

PROBE = """
import sys
{body}
heavy = [m for m in {heavy!r} if m in sys.modules]
print(",".join(heavy))
"""


def _loaded_after(body: str) -> str:
    code = PROBE.format(body=body, heavy=HEAVY)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_package_is_lean():
    assert _loaded_after("import hrm_deploy, hrm_deploy.model, hrm_deploy.errors, hrm_deploy.manifest") == ""


@pytest.mark.slow
def test_cli_help_is_lean():
    body = (
        "from typer.testing import CliRunner\nfrom hrm_deploy.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "for c in ('export', 'inspect', 'doctor', 'data', 'train'):\n"
        "    assert CliRunner().invoke(app, [c, '--help']).exit_code == 0, c"
    )
    assert _loaded_after(body) == ""


@pytest.mark.slow
def test_console_script_help_runs():
    out = subprocess.run([sys.executable, "-m", "hrm_deploy", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "export" in out.stdout


def test_engine_runner_and_device_loop_are_light():
    """The TensorRT runner, the device loop, its adapter and memory backends import no torch/onnx/TensorRT
    (TensorRT is imported on activate; torch only by the torch memory backend when chosen)."""
    body = (
        "import hrm_deploy.backends, hrm_deploy.backends.tensorrt.runner, hrm_deploy.runtime.device_loop, "
        "hrm_deploy.runtime.memory, hrm_deploy.runtime.adapter, hrm_deploy.backends.tensorrt.adapter, hrm_deploy.runtime.base"
    )
    assert _loaded_after(body) == ""


@pytest.mark.slow
def test_every_backends_build_options_are_light():
    """The build options of every backend (read by EngineConfig and the command line) import no
    torch, onnx or TensorRT: a wrong option is refused before any heavy library loads."""
    body = (
        "from hrm_deploy.engines.build import EngineConfig\nfrom hrm_deploy.engines.options import every_class\n"
        "assert len(every_class()) == 3\nEngineConfig('int8', target='cpu')\nEngineConfig('fp32', backend='torch')"
    )
    assert _loaded_after(body) == ""
