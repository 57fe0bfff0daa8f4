"""How the library's log records reach a person at the command line: one handler on the
``hrm_deploy`` logger writing to whatever ``sys.stderr`` is at the time (so test runners that swap
it see the lines), ``warning: ...`` for warnings, the plain message for information, and logger
names and debug records with ``-v``."""

from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - the current sys.stderr, looked up at each record
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _Formatter(logging.Formatter):
    def __init__(self, verbose: bool):
        super().__init__()
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if self.verbose:
            return f"{record.levelname.lower()} [{record.name}]: {message}"
        return f"{record.levelname.lower()}: {message}" if record.levelno >= logging.WARNING else message


def setup_logging(verbose: bool = False) -> None:
    """Show the library's info (or, ``verbose``, debug) records on stderr; idempotent."""
    logger = logging.getLogger("hrm_deploy")
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(_Formatter(verbose))
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
