"""PyTriton's binding: the patch of its proxy model must still apply to the installed PyTriton.

These tests read the installed PyTriton's source, so they fail (instead of ``serve`` silently
answering bad requests with HTTP 500) when an upgrade changes the text the patch replaces or brings a
release the patch was not reviewed against."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from hrm_deploy.serve import binding

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pytriton") is None, reason="pytriton not installed (pip install 'hrm-deploy[serve]')"
)


def test_the_installed_pytriton_is_a_release_the_patch_was_reviewed_against() -> None:
    assert binding.pytriton_version() in binding.TESTED_VERSIONS, (
        f"PyTriton {binding.pytriton_version()} is installed: review PROXY_ERROR in hrm_deploy/serve/binding.py "
        "against its proxy/model.py, then add the release to TESTED_VERSIONS"
    )


def test_the_patched_text_is_found_once_and_the_patched_proxy_compiles() -> None:
    text = binding.proxy_model_text()
    assert text.count(binding.PROXY_ERROR) == 1, "PyTriton's proxy model changed: the request-error patch is stale"
    patched = binding.patched_proxy_text(text)
    assert patched is not None and "RequestError: " in patched and binding.PROXY_ERROR not in patched
    compile(patched, "model.py", "exec")  # still valid Python after the replacement


def test_a_changed_proxy_is_not_patched_and_says_so(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from pytriton.models import model as pytriton_model

    monkeypatch.setattr(binding, "proxy_model_text", lambda: "a proxy model hrm-deploy has never seen\n")
    monkeypatch.setattr(pytriton_model.Model, "generate_model", pytriton_model.Model.generate_model)
    with caplog.at_level(logging.WARNING, logger="hrm_deploy.serve.binding"):
        assert binding.request_errors_as_400() is False
    assert "bad requests get HTTP 500" in caplog.text
    assert binding.patched_proxy_text("unrelated") is None


def test_a_refused_request_is_logged_as_its_one_line() -> None:
    record = logging.LogRecord(
        "pytriton.proxy.inference",
        logging.ERROR,
        __file__,
        1,
        "Traceback ...\nRequestError: token 12 >= vocab 11\n  more",
        None,
        None,
    )
    assert binding.OneLineRequestErrors().filter(record)
    assert record.getMessage() == "refused a request: token 12 >= vocab 11"
