"""The serve client against servers that answer oddly: a response without the outputs a model
must have is one RemoteError line naming what is missing, never a KeyError."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.errors import RemoteError

httpclient = pytest.importorskip("tritonclient.http", reason="the serve extra (tritonclient) is not installed")


class _Result:
    def __init__(self, outputs: dict[str, np.ndarray]):
        self.outputs = outputs

    def get_response(self):
        return {"outputs": [{"name": n} for n in self.outputs]}

    def as_numpy(self, name):
        return self.outputs[name]


def _server(outputs: dict[str, np.ndarray]):
    class Client:
        def __init__(self, *args, **kwargs):
            pass

        def infer(self, *args, **kwargs):
            return _Result(outputs)

        def close(self):
            pass

    return Client


@pytest.mark.parametrize(
    "outputs,missing",
    [
        ({}, "'q_halt_logits' and 'logits'"),
        ({"answer": np.zeros((1, 4), np.int32)}, "'q_halt_logits'"),
        ({"q_halt_logits": np.zeros((1, 2), np.float32)}, "'logits'"),
    ],
)
def test_a_response_without_expected_outputs_names_them(monkeypatch, outputs, missing):
    from hrm_deploy.serve.client import infer_remote

    monkeypatch.setattr(httpclient, "InferenceServerClient", _server(outputs))
    feeds = {"inputs": np.zeros((1, 4), np.int32), "puzzle_identifiers": np.zeros(1, np.int32)}
    with pytest.raises(RemoteError, match=f"answered without {missing}"):
        infer_remote("http://127.0.0.1:1", feeds)


def test_a_complete_response_is_read(monkeypatch):
    from hrm_deploy.serve.client import infer_remote

    logits = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    monkeypatch.setattr(
        httpclient, "InferenceServerClient", _server({"logits": logits, "q_halt_logits": np.zeros((2, 5), np.float32)})
    )
    feeds = {"inputs": np.zeros((2, 4), np.int32), "puzzle_identifiers": np.zeros(2, np.int32)}
    out = infer_remote("http://127.0.0.1:1", feeds)
    assert np.array_equal(out["answer"], logits.argmax(-1)) and list(out["steps"]) == [5, 5]
