"""The CLI shows the library's log records on stderr: plain info, ``warning:`` lines, and with
-v the module that spoke."""

from __future__ import annotations

import logging

from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.cli.logs import setup_logging


def test_library_records_reach_stderr_plainly_and_verbosely(capsys):
    log = logging.getLogger("hrm_deploy.runtime.device_loop")
    setup_logging(False)
    log.info("step loop captured")
    log.debug("not shown")
    log.warning("capture failed")
    assert capsys.readouterr().err.splitlines() == ["step loop captured", "warning: capture failed"]
    setup_logging(True)
    log.debug("plans: 3")
    assert capsys.readouterr().err.strip() == "debug [hrm_deploy.runtime.device_loop]: plans: 3"
    setup_logging(False)


def test_verbose_is_a_root_option():
    result = CliRunner().invoke(app, ["-v", "--help"])
    assert result.exit_code == 0 and "--verbose" in result.output
