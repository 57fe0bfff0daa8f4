"""What ``arc-eval`` runs: a local artifact (through a runner) or a running ``hrm-deploy serve``.

Both give, per batch of test rows, the argmax prediction after the last ACT step (uint8 [B, S]),
that step's ``q_halt`` logit (float64 [B]) and the ACT steps each row ran (int [B]); every ACT
step runs, as upstream's evaluation does, unless a local artifact is given a per-row halting rule
(``arc-eval --halt``): then each row stops at its own halting step and its answer and ``q_halt``
are that step's. A source also checks the dataset against what it knows of the model and names
itself for the resumable predictions file (:func:`hrm_deploy.arc.evaluate.predict`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import numpy as np

from hrm_deploy.errors import ConfigError, DataError, RemoteError

log = logging.getLogger(__name__)

# Outputs asked of a server: no logits ([B, S, V] float32 is ten times the rest).
_REMOTE_OUTPUTS = ("answer", "q_halt_logits", "steps")
RESUME_CHECK_ROWS = 4  # saved rows a server must answer again, identically, before a run resumes


def is_url(artifact: str | Path) -> bool:
    """True for ``http://host:port`` (a running server) rather than a file."""
    return isinstance(artifact, str) and "://" in artifact


class Source(Protocol):
    """What :func:`hrm_deploy.arc.evaluate.predict` needs of an artifact or a server."""

    name: str
    seq_len: int
    vocab_size: int
    max_batch: int

    def fingerprint(self) -> dict[str, Any]: ...
    def check_ids(self, ids: np.ndarray, data: Path, num_in_dataset: int, inputs: np.ndarray) -> None: ...
    def open(self) -> None: ...
    def close(self) -> None: ...
    def run(self, inputs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def check_resumed(self, records: np.ndarray, inputs: np.ndarray, ids: np.ndarray) -> None: ...


class LocalSource:
    """A checkpoint, ONNX graph or engine, run in this process by :func:`hrm_deploy.backends.open_runner`.

    ``halt`` (a rule of :mod:`hrm_deploy.halting`: ``q``, ``threshold:X``, ``budget:P`` with a stored
    threshold; ``off``: every step) makes each row stop at its own halting step: the host/device loop
    drives a step graph, an engine of one or a checkpoint; a loop graph halts by its own rule (it must
    be the one asked for); an unrolled graph or engine cannot halt per row and is refused."""

    def __init__(self, artifact: Path, runner_options: dict[str, Any], halt: str = "off"):
        from hrm_deploy.runtime.artifact import read_contract

        self.path, self.runner_options = artifact, runner_options
        self.contract = read_contract(artifact)
        self.name = artifact.name
        self.seq_len, self.vocab_size = self.contract.seq_len, self.contract.vocab_size
        self.max_batch = self.contract.max_batch
        self.runner: Any = None
        self.halting, self.halt_fn = halting_plan(artifact, self.contract, halt)

    def fingerprint(self) -> dict[str, Any]:
        stat = self.path.stat()
        found = {
            "artifact": str(self.path.resolve()),
            "artifact_size": stat.st_size,
            "artifact_mtime_ns": stat.st_mtime_ns,
        }
        table = self.runner_options.get("puzzle_table")  # an adapted table: other rows, other answers
        if table is not None:
            where = Path(table.where)
            found["puzzle_table"] = [str(where.resolve()), where.stat().st_size, where.stat().st_mtime_ns]
        if self.halting is not None:  # other rows' answers: never mixed with another rule's (or all steps)
            found["halt"] = self.halting
        return found

    def check_ids(self, ids: np.ndarray, data: Path, num_in_dataset: int, inputs: np.ndarray) -> None:
        table = self.runner_options.get("puzzle_table")
        rows = table.rows if table is not None else self.contract.num_puzzle_identifiers
        if ids.size and int(ids.max()) >= rows:
            raise DataError(
                f"{data}: puzzle identifiers go up to {int(ids.max())} ({num_in_dataset} in the dataset) but "
                f"{self.name}'s puzzle-embedding table has {rows} rows; use the "
                "dataset the model was trained on (same task folders, seed and --num-aug)"
            )

    def open(self) -> None:
        from hrm_deploy.backends import open_runner

        self.runner = open_runner(self.path, **self.runner_options)
        self.runner.activate()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    def run(self, inputs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        halt = {"halt": self.halt_fn} if self.halt_fn is not None else {}
        out = self.runner.infer({"inputs": inputs, "puzzle_identifiers": ids}, **halt)
        q_halt = np.asarray(out["q_halt_logits"]).reshape(len(inputs), -1)  # [B, steps run]
        if self.halting is None:  # every step: the last one's q_halt
            return np.asarray(out["logits"]).argmax(-1), q_halt[:, -1], np.full(len(inputs), self.contract.steps)
        steps = np.asarray(out["steps_used"]).reshape(-1).astype(np.int64)  # [B], 1-based
        return np.asarray(out["logits"]).argmax(-1), q_halt[np.arange(len(inputs)), steps - 1], steps

    def check_resumed(self, records: np.ndarray, inputs: np.ndarray, ids: np.ndarray) -> None:
        """Nothing to do: the fingerprint (path, size, mtime) already ties the records to the file."""


def _dims(entry: dict[str, Any]) -> list[int]:
    return [int(d) for d in entry.get("dims", [])]


class RemoteSource:
    """The model of a running ``hrm-deploy serve`` (or a Triton ACT driver) at ``url``.

    Its sizes come from the served model's config; rows go in batches of its ``max_batch_size``.
    The server must run every ACT step (``serve --halt off``): a server that reports
    ``act_steps`` is checked against it, one that does not against the widest ``q_halt`` seen."""

    def __init__(self, url: str, model_name: str = "hrm", timeout_s: float = 300.0):
        from hrm_deploy.serve.client import host_port, model_config, shown_url

        self.url, self.model_name, self.timeout_s = url, model_name, timeout_s
        config = model_config(url, model_name, timeout_s=min(timeout_s, 30.0))
        self.name = f"{model_name} at {shown_url(url)}"
        inputs = {e.get("name"): _dims(e) for e in config.get("input", [])}
        outputs = {e.get("name"): _dims(e) for e in config.get("output", [])}
        missing = [n for n in ("inputs", "puzzle_identifiers") if n not in inputs]
        missing += [n for n in ("q_halt_logits",) if n not in outputs]
        if missing or not ({"answer", "logits"} & set(outputs)) or len(inputs.get("inputs", [])) != 1:
            raise RemoteError(
                f"{self.name} is not an HRM model as `hrm-deploy serve` serves it (inputs 'inputs' [S] and "
                f"'puzzle_identifiers', outputs 'answer' or 'logits' and 'q_halt_logits'); it has inputs "
                f"{sorted(inputs)} and outputs {sorted(outputs)}"
            )
        self.seq_len = inputs["inputs"][0]
        logits = outputs.get("logits")
        self.vocab_size = logits[-1] if logits and logits[-1] > 0 else -1  # -1: the server does not say
        self.max_batch = max(1, int(config.get("max_batch_size") or 1))
        wanted = [n for n in _REMOTE_OUTPUTS if n in outputs] + [n for n in ("act_steps",) if n in outputs]
        self.outputs = wanted if "answer" in wanted else [*wanted, "logits"]
        self.reports_act_steps = "act_steps" in outputs
        if not self.reports_act_steps:
            log.warning(
                "%s does not report its ACT step count (act_steps; `hrm-deploy serve` does): make sure it runs "
                "every step (--halt off), as upstream's ARC evaluation does",
                self.name,
            )
        self.widest = 0
        self.address = host_port(url)

    def fingerprint(self) -> dict[str, Any]:
        # A server has no file to stat: check_resumed asks it again for saved rows instead.
        return {"server": f"http://{self.address}", "model": self.model_name, "path": urlparse(self.url).path}

    def check_ids(self, ids: np.ndarray, data: Path, num_in_dataset: int, inputs: np.ndarray) -> None:
        """Ask for the row with the largest identifier once: the server refuses one its table lacks."""
        if not ids.size:
            return
        row = int(np.argmax(ids))
        try:
            self.run(inputs[row : row + 1], ids[row : row + 1])
        except RemoteError as exc:
            if "puzzle identifier" not in str(exc):
                raise
            raise DataError(
                f"{data}: puzzle identifiers go up to {int(ids.max())} ({num_in_dataset} in the dataset) but "
                f"{self.name} refuses them ({str(exc).rsplit(': ', 1)[-1]}); serve the model trained on this "
                "dataset, or use its dataset (same task folders, seed and --num-aug)"
            ) from None

    def open(self) -> None:
        """Nothing to open: every batch is one request."""

    def close(self) -> None:
        """Nothing to close."""

    def run(self, inputs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from hrm_deploy.serve.client import infer_remote

        feeds = {"inputs": inputs.astype(np.int32), "puzzle_identifiers": ids.astype(np.int32)}
        out = infer_remote(self.url, feeds, model_name=self.model_name, timeout_s=self.timeout_s, outputs=self.outputs)
        q_halt = np.asarray(out["q_halt_logits"]).reshape(len(inputs), -1)
        steps = np.asarray(out["steps"]).reshape(-1)
        full = int(out["act_steps"].reshape(-1)[0]) if "act_steps" in out else max(self.widest, q_halt.shape[1])
        self.widest = max(self.widest, q_halt.shape[1])
        if q_halt.shape[1] != full or (steps != full).any():
            raise RemoteError(
                f"{self.name} halts early (rows ran {int(steps.min())} of {full} ACT steps); upstream's ARC score "
                "runs every step: serve the model with --halt off"
            )
        return np.asarray(out["answer"]), q_halt[:, -1], np.full(len(inputs), full)

    def check_resumed(self, records: np.ndarray, inputs: np.ndarray, ids: np.ndarray) -> None:
        """The first saved rows, asked again, must come back as saved: else the server now runs
        another model than the one that made them."""
        n = min(len(records), RESUME_CHECK_ROWS, self.max_batch)
        rows = records["row"][:n]  # an early-stopped run saved its rows out of order
        pred, q_halt, _ = self.run(np.asarray(inputs[rows]), ids[rows])
        if not (np.array_equal(pred, records["pred"][:n]) and np.allclose(q_halt, records["q_halt"][:n], 1e-4, 1e-5)):
            raise ConfigError(
                f"{self.name} answers the saved rows differently: it serves another model than the one that made "
                "the saved predictions; pass --restart to discard them, or choose another --output"
            )


def halting_plan(artifact: Path, contract: Any, halt: str) -> tuple[str | None, Any]:
    """(the halting rule's text or None for every step, the halt function to pass the runner or None)
    for ``artifact`` asked to halt by ``halt``; refused in one line where it cannot halt that way."""
    from hrm_deploy.halting import HaltMode, HaltRule, resolve_rule
    from hrm_deploy.verify import builtin_halt_rule

    asked = HaltRule.parse(halt).text
    built_in = HaltRule.parse(builtin_halt_rule(artifact)).text  # a loop graph's rule, fixed at export
    if built_in != "off" or contract.mode == "loop":
        if asked != built_in:
            raise ConfigError(
                f"{artifact.name} is a loop graph: it halts by its own rule ({built_in}, fixed at export), and "
                f"arc-eval was asked for --halt {asked}; pass --halt {built_in}, or export --mode loop --halt "
                f"{asked} / --mode step (any rule at run time)"
            )
        return (None, None) if built_in == "off" else (built_in, None)
    if asked == "off":
        return None, None
    if contract.kind != "checkpoint" and contract.mode != "step":
        raise ConfigError(
            f"{artifact.name} is an unrolled {contract.kind}: every row runs all {contract.steps} ACT steps, it cannot "
            f"halt per row; for --halt {asked} give the checkpoint, or export the step graph (hrm-deploy export "
            f"CHECKPOINT --mode step, or --mode loop --halt {asked}) and run it or an engine built from it"
        )
    rule = resolve_rule(asked, str(artifact))
    if rule.mode is HaltMode.BUDGET and rule.threshold is None:
        raise ConfigError(
            f"--halt {asked}: {artifact.name} has no calibrated threshold for it; calibrate one with "
            f"`hrm-deploy verify {artifact.name} --halt {asked}` first, or use q or threshold:X"
        )
    return asked, rule.should_halt


def open_source(
    artifact: str | Path,
    runner_options: dict[str, Any],
    model_name: str = "hrm",
    timeout_s: float = 300.0,
    halt: str = "off",
) -> Source:
    """The :class:`Source` for a file (:class:`LocalSource`, halting by ``halt``) or a server URL
    (:class:`RemoteSource`: every step)."""
    if is_url(artifact):
        if runner_options:
            raise ConfigError(f"runner options {sorted(runner_options)} do not apply to a server ({artifact})")
        from hrm_deploy.halting import HaltRule

        if HaltRule.parse(halt).text != "off":
            raise ConfigError(
                f"--halt {halt}: a server halts by its own `serve --halt` rule and arc-eval scores servers that "
                "run every step; for per-row halting give the artifact itself (a checkpoint or a step graph)"
            )
        return RemoteSource(str(artifact), model_name, timeout_s)
    return LocalSource(Path(artifact), runner_options, halt)
