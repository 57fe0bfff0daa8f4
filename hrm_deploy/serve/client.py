"""Talk to a served HRM model (``hrm-deploy serve`` or a ``triton-repo`` driver) over HTTP."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np

from hrm_deploy.errors import RemoteError, require


def host_port(url: str) -> str:
    """``host:port`` of a server URL (port 8000 when none is given); anything but HTTP is a :class:`RemoteError`."""
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "") or not parsed.hostname:
        raise RemoteError(f"--url {shown_url(url)!r}: give the server's HTTP address, e.g. http://127.0.0.1:8000")
    return f"{parsed.hostname}:{parsed.port or 8000}"


def shown_url(url: str) -> str:
    """``url`` as messages may show it: a password in it (``user:pass@``) replaced by ``***``."""
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
    return parsed._replace(netloc=netloc).geturl() if "://" in url else parsed._replace(netloc=netloc).geturl()[7:]


def _server_message(exc: Exception) -> str:
    """The useful line of a server error: our RequestError's text rather than the stub's traceback."""
    text = str(getattr(exc, "message", lambda: "")() or exc)
    found = re.findall(r"RequestError: ([^\n]+)", text)
    return found[-1].strip() if found else text.strip().splitlines()[0]


# Triton's sequence batcher (the in-flight ACT driver of a ``triton-repo`` repository) takes one puzzle
# per request; its refusal of a larger request says so in this phrase.
_ONE_PUZZLE = "must specify batch-size 1"
_one_puzzle_models: set[tuple[str, str]] = set()  # (host:port, model) seen to refuse larger requests
MAX_SPLIT_CONCURRENCY = 64


def infer_remote(
    url: str,
    feeds: dict[str, np.ndarray],
    *,
    model_name: str = "hrm",
    timeout_s: float = 30.0,
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run one batch on a Triton server; same keys as ``Runner.infer`` plus the server's extras.

    ``feeds``: ``inputs`` int32 [B, S], ``puzzle_identifiers`` int32 [B]. Returns float32
    ``logits`` [B, S, V], ``q_halt_logits`` [B, steps], int32 ``answer`` [B, S] and ``steps`` [B]
    (also as ``steps_used``, Runner.infer's key), and ``act_steps`` [B] where the server reports
    it (``hrm-deploy serve``: the ACT steps its model runs without halting).
    ``outputs`` asks for those outputs only (e.g. ``answer``, ``q_halt_logits``, ``steps``
    without the logits, a tenth of the bytes); ``logits`` is then absent unless named.
    A model that takes one puzzle per request (the in-flight ACT driver of a ``triton-repo``
    repository) gets the B puzzles as B concurrent requests, answered as one batch.
    Any failure (connection refused, timeout, server-side error) raises :class:`RemoteError`
    with the server's message; nothing waits longer than ``timeout_s``.
    """
    httpclient = require("tritonclient.http", "serve", "Talking to a Triton server")
    from tritonclient.utils import InferenceServerException

    tokens = np.ascontiguousarray(feeds["inputs"], dtype=np.int32)
    ids = np.ascontiguousarray(np.asarray(feeds["puzzle_identifiers"], dtype=np.int32).reshape(-1, 1))
    address = host_port(url)
    split = len(tokens) > 1 and (address, model_name) in _one_puzzle_models
    try:
        client = httpclient.InferenceServerClient(
            address,
            connection_timeout=timeout_s,
            network_timeout=timeout_s,
            concurrency=min(len(tokens), MAX_SPLIT_CONCURRENCY) if split else 1,
        )
    except Exception as exc:  # noqa: BLE001 - tritonclient raises plain exceptions for bad addresses
        raise RemoteError(f"cannot reach {shown_url(url)}: {exc}") from None
    # No output list: the server returns all its outputs (serve's model and a triton-repo
    # driver have answer/steps, an unrolled graph served directly has logits/q_*).
    requested = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs] if outputs else None

    def request(rows: slice) -> list[Any]:
        inputs = [
            httpclient.InferInput("inputs", list(tokens[rows].shape), "INT32"),
            httpclient.InferInput("puzzle_identifiers", list(ids[rows].shape), "INT32"),
        ]
        inputs[0].set_data_from_numpy(tokens[rows])
        inputs[1].set_data_from_numpy(ids[rows])
        return inputs

    def one_per_puzzle() -> list[Any]:
        pending = [
            client.async_infer(model_name, request(slice(i, i + 1)), outputs=requested, timeout=int(timeout_s * 1e6))
            for i in range(len(tokens))
        ]
        return [p.get_result(timeout=timeout_s) for p in pending]

    try:
        try:
            results = (
                one_per_puzzle()
                if split
                else [client.infer(model_name, request(slice(None)), outputs=requested, timeout=int(timeout_s * 1e6))]
            )
        except InferenceServerException as exc:
            if split or len(tokens) == 1 or _ONE_PUZZLE not in str(exc):
                raise
            _one_puzzle_models.add((address, model_name))  # this and every later batch go out split
            return infer_remote(url, feeds, model_name=model_name, timeout_s=timeout_s, outputs=outputs)
    except InferenceServerException as exc:
        raise RemoteError(f"{shown_url(url)} model '{model_name}': {_server_message(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - connection refused / reset, socket timeouts (gevent/geventhttpclient types)
        raise RemoteError(
            f"{shown_url(url)} model '{model_name}': {type(exc).__name__}: {exc or 'no answer'}"
        ) from None
    finally:
        client.close()
    return _outputs(results, len(tokens), url, model_name)


def _outputs(results: list[Any], batch: int, url: str, model_name: str) -> dict[str, np.ndarray]:
    """The runner's keys from the server's answer(s) (one result, or one per puzzle in order)."""
    response = results[0].get_response() or {}
    names = [o.get("name") for o in response.get("outputs") or [] if isinstance(o, dict)]
    out = {name: np.concatenate([r.as_numpy(name) for r in results]) for name in names if name}
    missing = [n for n in ("q_halt_logits",) + (() if "answer" in out else ("logits",)) if n not in out]
    if missing:
        raise RemoteError(
            f"{shown_url(url)} model '{model_name}' answered without {' and '.join(repr(m) for m in missing)} "
            f"(it sent {sorted(out) or 'no outputs'}); serve the model with hrm-deploy serve or a triton-repo repository"
        )
    out["q_halt_logits"] = out["q_halt_logits"].reshape(batch, -1)
    for name in ("steps", "act_steps"):
        if name in out:
            out[name] = out[name].reshape(-1)
    if "answer" not in out:
        out["answer"] = out["logits"].argmax(-1).astype(np.int32)
    if "steps" not in out and "steps_used" in out:  # a loop graph served directly says it itself
        out["steps"] = out["steps_used"].reshape(-1)
    if "steps" not in out:
        out["steps"] = np.full(batch, out["q_halt_logits"].shape[1], np.int32)
    out["steps_used"] = out["steps"]  # Runner.infer's name for it
    return out


def server_max_batch(url: str, model_name: str = "hrm", *, timeout_s: float = 30.0) -> int:
    """The largest batch the served model takes (its config's ``max_batch_size``; 1 when the
    model does not batch). Unreachable servers and unknown models are :class:`RemoteError`."""
    return max(1, int(model_config(url, model_name, timeout_s=timeout_s).get("max_batch_size") or 1))


def model_config(url: str, model_name: str = "hrm", *, timeout_s: float = 30.0) -> dict[str, Any]:
    """The served model's Triton config as JSON (``max_batch_size``, ``input`` / ``output`` lists
    of ``name``, ``data_type``, ``dims`` without the batch axis). Unreachable servers and unknown
    models are :class:`RemoteError`."""
    httpclient = require("tritonclient.http", "serve", "Talking to a Triton server")
    from tritonclient.utils import InferenceServerException

    try:
        client = httpclient.InferenceServerClient(
            host_port(url), connection_timeout=timeout_s, network_timeout=timeout_s
        )
    except Exception as exc:  # noqa: BLE001 - tritonclient raises plain exceptions for bad addresses
        raise RemoteError(f"cannot reach {shown_url(url)}: {exc}") from None
    try:
        config = client.get_model_config(model_name)
    except InferenceServerException as exc:
        raise RemoteError(f"{shown_url(url)} model '{model_name}': {_server_message(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - connection refused / reset, socket timeouts
        raise RemoteError(
            f"{shown_url(url)} model '{model_name}': {type(exc).__name__}: {exc or 'no answer'}"
        ) from None
    finally:
        client.close()
    return dict(config)
