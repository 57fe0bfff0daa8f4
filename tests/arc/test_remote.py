"""``arc-eval http://host:port``: scoring through a running ``hrm-deploy serve``.

The live test serves the tiny ARC checkpoint in a child process (PyTriton's tritonserver) and
checks pass@k, the submission and every saved prediction against the checkpoint run in process.
The others stand a fake client in for the server, to reach what a real one rarely does."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.arc.evaluate import ArcEvalConfig, _record_dtype, arc_eval, output_paths
from hrm_deploy.errors import ConfigError, DataError, RemoteError
from tests.arc.conftest import SIDE
from tests.serve.helpers import ServeProcess, serving_unavailable

_WHY_NOT = serving_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")
def test_server_url_scores_like_the_checkpoint(arc_run):
    checkpoint, data, tmp = arc_run
    config = ArcEvalConfig(ks=(1, 2, 5), quiet=True)
    ref = arc_eval(checkpoint, data, tmp / "ref.json", config=config)
    server = ServeProcess(checkpoint, tmp / "serve.log", "--max-batch", "4")
    try:
        server.wait_ready()
        got = arc_eval(server.url, data, tmp / "url.json", against=checkpoint, config=config)
        assert got["pass_at"] == ref["pass_at"] and got["passed"] is True and got["pass2_difference_points"] == 0
        assert (tmp / "url.json").read_text() == (tmp / "ref.json").read_text()
        records = output_paths(tmp / "url.json")["preds"]
        saved = records.read_bytes()
        assert saved == output_paths(tmp / "ref.json")["preds"].read_bytes()  # every row's prediction and q_halt

        # resumed from a cut-short file: the rest is asked for, the file ends up the same
        record = _record_dtype(SIDE * SIDE).itemsize
        records.write_bytes(saved[: 5 * record + 3])
        assert arc_eval(server.url, data, tmp / "url.json", config=config)["pass_at"] == ref["pass_at"]
        assert records.read_bytes() == saved
        # saved rows the server answers differently: another model made them
        changed = np.frombuffer(saved, _record_dtype(SIDE * SIDE)).copy()
        changed["pred"][0] = (changed["pred"][0] + 1) % 12
        records.write_bytes(changed[:6].tobytes())
        with pytest.raises(ConfigError, match="another model"):
            arc_eval(server.url, data, tmp / "url.json", config=config)
    finally:
        if server.proc.poll() is None:
            assert server.stop() == 0, server.log.read_text()[-2000:]


class FakeServer:
    """Stands in for ``hrm_deploy.serve.client``: answers with the checkpoint's runner."""

    def __init__(self, checkpoint, *, act_steps=True, halt_at=None, table=None):
        from hrm_deploy.backends import open_runner

        self.runner = open_runner(checkpoint)
        self.runner.activate()
        self.act_steps, self.halt_at, self.table = act_steps, halt_at, table
        self.asked: list[list[str]] = []

    def model_config(self, url, model_name="hrm", *, timeout_s=30.0):
        outputs = [
            {"name": "answer", "dims": [str(SIDE * SIDE)]},
            {"name": "logits", "dims": [SIDE * SIDE, 12]},
            {"name": "q_halt_logits", "dims": [-1]},
            {"name": "steps", "dims": [1]},
        ]
        if self.act_steps:
            outputs.append({"name": "act_steps", "dims": [1]})
        inputs = [{"name": "inputs", "dims": [SIDE * SIDE]}, {"name": "puzzle_identifiers", "dims": [1]}]
        return {"max_batch_size": 8, "input": inputs, "output": outputs}

    def infer_remote(self, url, feeds, *, model_name="hrm", timeout_s=30.0, outputs=None):
        self.asked.append(list(outputs or []))
        ids = feeds["puzzle_identifiers"]
        if self.table is not None and ids.max() >= self.table:
            raise RemoteError(
                f"{url} model '{model_name}': request 0: puzzle identifier {ids.max()} is outside 0..{self.table - 1}"
            )
        out = self.runner.infer(feeds)
        q = out["q_halt_logits"].reshape(len(ids), -1)
        steps = np.full(len(ids), q.shape[1], np.int32)
        if self.halt_at is not None:
            q, steps = q[:, : self.halt_at], np.full(len(ids), self.halt_at, np.int32)
        got = {"answer": out["logits"].argmax(-1).astype(np.int32), "q_halt_logits": q, "steps": steps}
        if self.act_steps:
            got["act_steps"] = np.full(len(ids), out["q_halt_logits"].reshape(len(ids), -1).shape[1], np.int32)
        return {k: v for k, v in got.items() if k in outputs}


@pytest.fixture
def fake(arc_run, monkeypatch):
    import hrm_deploy.serve.client as client

    def install(**kwargs):
        server = FakeServer(arc_run[0], **kwargs)
        monkeypatch.setattr(client, "model_config", server.model_config)
        monkeypatch.setattr(client, "infer_remote", server.infer_remote)
        return server

    return install


@pytest.mark.slow
def test_url_without_logits_matches_checkpoint(arc_run, fake):
    checkpoint, data, tmp = arc_run
    config = ArcEvalConfig(ks=(1, 2), quiet=True)
    server = fake()
    got = arc_eval("http://127.0.0.1:9", data, tmp / "u.json", config=config)
    assert all("logits" not in asked and "act_steps" in asked for asked in server.asked)  # no [B, S, V] floats
    assert got["pass_at"] == arc_eval(checkpoint, data, tmp / "c.json", config=config)["pass_at"]
    assert got["artifact"] == "http://127.0.0.1:9"


def test_server_halting_early_is_refused(arc_run, fake):
    _, data, tmp = arc_run
    fake(halt_at=1)
    with pytest.raises(RemoteError, match=r"halts early \(rows ran 1 of 2 ACT steps\).*--halt off"):
        arc_eval("http://127.0.0.1:9", data, tmp / "u.json", config=ArcEvalConfig(quiet=True))


def test_server_without_act_steps_warns_and_runs(arc_run, fake, caplog):
    _, data, tmp = arc_run
    fake(act_steps=False)
    with caplog.at_level("WARNING"):
        arc_eval("http://127.0.0.1:9", data, tmp / "u.json", config=ArcEvalConfig(ks=(1,), quiet=True))
    assert "does not report its ACT step count" in caplog.text


def test_server_table_too_small_is_one_clear_error(arc_run, fake):
    _, data, tmp = arc_run
    fake(table=3)
    with pytest.raises(DataError, match=r"identifiers go up to 8 \(17 in the dataset\).*outside 0\.\.2"):
        arc_eval("http://127.0.0.1:9", data, tmp / "u.json", config=ArcEvalConfig(quiet=True))


def test_cli_takes_a_url(arc_run, fake):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    _, data, tmp = arc_run
    fake()
    args = ["arc-eval", "http://127.0.0.1:9", "--data", str(data), "-o", str(tmp / "u.json"), "--k", "1,2", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output and (tmp / "u.json").is_file()
