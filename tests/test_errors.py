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
