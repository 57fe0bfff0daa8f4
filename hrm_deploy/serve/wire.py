"""Requests and answers of the served model, shared by the Triton-bound function and the in-flight front.

- :func:`check_feeds`: one request's arrays against the model (shape, dtype, vocabulary, puzzle ids);
- :func:`split_outputs`: runner outputs of several requests -> one output dict per request;
- :func:`decode_request` / :func:`encode_response`: the KServe v2 HTTP wire form that tritonserver
  speaks (JSON data or the binary-data extension), so the in-flight front answers
  ``tritonclient`` and :func:`hrm_deploy.serve.client.infer_remote` exactly as Triton would.

Per request: ``inputs`` int32 [n, S], ``puzzle_identifiers`` int32 [n, 1]; outputs ``answer``
int32 [n, S], ``logits`` float32 [n, S, V], ``q_halt_logits`` float32 [n, T], ``steps`` int32
[n, 1], ``act_steps`` int32 [n, 1].
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hrm_deploy.errors import HRMDeployError

_NUMPY = {"INT32": np.dtype("<i4"), "FP32": np.dtype("<f4")}


class RequestError(HRMDeployError):
    """A request the model cannot answer (tokens out of vocabulary, empty, ...)."""


def check_feeds(
    index: int, tokens: np.ndarray, ids: np.ndarray, seq_len: int, vocab_size: int, num_puzzle_identifiers: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens int32 [n, S], ids int32 [n])`` of request ``index``, or :class:`RequestError` naming the problem."""
    if tokens.ndim != 2 or tokens.shape[1] != seq_len or tokens.shape[0] == 0:
        raise RequestError(
            f"request {index}: 'inputs' has shape {list(tokens.shape)}; send int32 [B, {seq_len}] with B >= 1"
        )
    ids = ids.reshape(len(ids), -1)[:, 0] if ids.ndim == 2 else ids
    if ids.shape != (tokens.shape[0],):
        raise RequestError(
            f"request {index}: 'puzzle_identifiers' has shape {list(ids.shape)}; send int32 "
            f"[B, 1] with the same B as 'inputs' ({tokens.shape[0]})"
        )
    if tokens.dtype != np.int32 or ids.dtype != np.int32:
        raise RequestError(f"request {index}: inputs must be int32, got {tokens.dtype} / {ids.dtype}")
    bad = (tokens < 0) | (tokens >= vocab_size)
    if bad.any():
        where = np.argwhere(bad)[0]
        raise RequestError(
            f"request {index}: token {int(tokens[tuple(where)])} at position {int(where[1])} is "
            f"outside the vocabulary 0..{vocab_size - 1}; encode puzzles as the model's data"
        )
    if ((ids < 0) | (ids >= num_puzzle_identifiers)).any():
        raise RequestError(
            f"request {index}: puzzle identifier {int(ids.max())} is outside 0..{num_puzzle_identifiers - 1}"
        )
    return tokens, ids


def check_requests(
    requests: list[Any], seq_len: int, vocab_size: int, num_puzzle_identifiers: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`check_feeds` of each request PyTriton hands over (a mapping input name -> array)."""
    checked = []
    for i, request in enumerate(requests):
        try:
            tokens, ids = np.asarray(request["inputs"]), np.asarray(request["puzzle_identifiers"])
        except KeyError as exc:
            raise RequestError(f"request {i}: missing input {exc}; send 'inputs' and 'puzzle_identifiers'") from None
        checked.append(check_feeds(i, tokens, ids, seq_len, vocab_size, num_puzzle_identifiers))
    return checked


def split_outputs(out: dict[str, np.ndarray], sizes: list[int], act_steps: int | None) -> list[dict[str, np.ndarray]]:
    """Runner outputs for ``sum(sizes)`` puzzles -> one response dict per request (sizes in order)."""
    logits = np.asarray(out["logits"], np.float32)
    q_halt = np.asarray(out["q_halt_logits"], np.float32).reshape(len(logits), -1)
    used = out.get("steps_used", out.get("steps"))
    if used is not None:  # a halting runner says how many steps each puzzle ran
        steps = np.asarray(used, np.int32).reshape(-1, 1)
    else:
        steps = np.full((len(logits), 1), q_halt.shape[1], np.int32)
    answer = logits.argmax(-1).astype(np.int32)
    responses, start = [], 0
    for n in sizes:
        sl = slice(start, start + n)
        response = {"answer": answer[sl], "logits": logits[sl], "q_halt_logits": q_halt[sl], "steps": steps[sl]}
        if act_steps is not None:
            response["act_steps"] = np.full((n, 1), act_steps, np.int32)
        responses.append(response)
        start += n
    return responses


def parameters(item: dict[str, Any]) -> dict[str, Any]:
    """An inference request's (or one input's / output's) ``parameters`` object; {} when absent or not an object."""
    value = item.get("parameters")
    return value if isinstance(value, dict) else {}


def decode_request(request: dict[str, Any], body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The input arrays of an inference request the front has checked (names, INT32, shapes, sizes).

    Binary inputs follow the JSON header in the order the inputs are listed."""
    arrays, offset = {}, header_length or len(body)
    for item in request["inputs"]:
        shape = item["shape"]
        size = parameters(item).get("binary_data_size")
        flat: np.ndarray
        if size is not None:
            flat = np.frombuffer(body, _NUMPY["INT32"], count=size // 4, offset=offset)
            offset += size
        else:
            flat = np.asarray(item["data"], np.int64).reshape(-1)
            if flat.size and (flat.min() < np.iinfo(np.int32).min or flat.max() > np.iinfo(np.int32).max):
                raise RequestError(f"input '{item['name']}' holds values outside int32")
        arrays[item["name"]] = flat.astype(np.int32).reshape(shape)
    return arrays


def encode_response(
    request: dict[str, Any], model_name: str, outputs: dict[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of an inference response, as tritonserver writes them: the outputs
    asked for (all when none are named), each as JSON data or binary after the JSON header."""
    binary_default = bool(parameters(request).get("binary_data_output", False))
    asked = request.get("outputs") or [{"name": name} for name in outputs]
    header: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": []}
    if isinstance(request.get("id"), str):
        header["id"] = request["id"]
    blobs = []
    for item in asked:
        name = item["name"]
        array = np.ascontiguousarray(outputs[name])
        datatype = "FP32" if array.dtype.kind == "f" else "INT32"
        array = array.astype(_NUMPY[datatype], copy=False)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if bool(parameters(item).get("binary_data", binary_default)):
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        header["outputs"].append(entry)
    head = json.dumps(header).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }
