"""The error hierarchy: user errors print one line and exit with their code; bugs keep their traceback."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from hrm_deploy.cli.common import user_errors
from hrm_deploy.errors import HRMDeployError, InternalError, VerifyError


def _app_raising(exc: Exception) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @user_errors
    def run() -> None:
        raise exc

    return app


def test_verify_error_is_a_user_error_with_exit_code_3():
    assert issubclass(VerifyError, HRMDeployError) and VerifyError.exit_code == 3
    result = CliRunner().invoke(_app_raising(VerifyError("agreement 0.91 < 0.99; rebuild with --fp32")), [])
    assert result.exit_code == 3
    assert result.output.strip() == "error: agreement 0.91 < 0.99; rebuild with --fp32"


def test_internal_error_is_not_a_user_error():
    assert not issubclass(InternalError, HRMDeployError)
    result = CliRunner().invoke(_app_raising(InternalError("shape mismatch")), [])
    assert result.exit_code == 70 and "bug in hrm-deploy" in result.output


@pytest.mark.parametrize("code", [2, 3])
def test_exit_codes_follow_the_class(code):
    class Custom(HRMDeployError):
        exit_code = code

    assert CliRunner().invoke(_app_raising(Custom("x")), []).exit_code == code


def test_install_hints_name_this_installation(monkeypatch):
    """From a source checkout 'pip install hrm-deploy[x]' would fetch another copy: every hint of a
    missing extra comes from errors.install_hint (TensorRT-RTX, the Hub)."""
    import importlib
    import sys

    from hrm_deploy.backends.tensorrt import api
    from hrm_deploy.errors import DependencyError, install_hint
    from hrm_deploy.sources import fetch, parse_hub

    real = importlib.import_module

    def missing(name, *args):
        if name.startswith("tensorrt"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(api.importlib, "import_module", missing)
    with pytest.raises(DependencyError) as error:
        api.load_backend("tensorrt-rtx")
    assert install_hint("rtx") in str(error.value)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(DependencyError) as error:
        fetch(parse_hub("hf:acme/model"))
    assert install_hint("hub") in str(error.value)
