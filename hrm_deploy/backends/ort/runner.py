"""ONNX Runtime runner (CPU, CUDA or TensorRT execution provider) for both graph modes.

The session comes from :func:`hrm_deploy.onnx_runtime.ort_session`, which checks the provider
actually in use: ORT silently falls back to CPU when a GPU provider cannot load, and a benchmark
of that would be a lie."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.contract import PUZZLE_ROWS, HaltFn
from hrm_deploy.errors import ArtifactError, require
from hrm_deploy.onnx_runtime import SessionTuning, holds_fp4, load_onnx, ort_session, provider_name
from hrm_deploy.puzzle_table import PuzzleTable, RowsSession, given_table_error, rows_session
from hrm_deploy.runtime.base import Runner


class OrtRunner(Runner):
    name = "ort"
    supports_halt = True  # step graphs; an unrolled graph refuses a halt rule with one clear error

    def __init__(
        self,
        path: str | Path,
        provider: str = "cpu",
        threads: int | None = None,
        steps: int | None = None,
        table_of: str | Path | None = None,
        puzzle_table: PuzzleTable | None = None,
        tuning: SessionTuning | None = None,
        profile_prefix: str | Path | None = None,
        meta: dict[str, Any] | None = None,
    ):
        provider_name(provider)  # an unknown provider fails here, before any work
        self.path, self.provider, self.threads = Path(path), provider, threads
        # a graph staged by a builder (no manifest yet) of an external-table export: that export
        self.table_of = Path(table_of) if table_of is not None else None
        # a table given by the caller (an adapted one, `arc-eval --puzzle-table`), checked by it
        self.puzzle_table = puzzle_table
        self.requested_steps = steps
        # speed settings (spinning, arena, memory pattern) and ORT's per-node profiler (hrm_deploy.bench.profile)
        self.tuning, self.profile_prefix = tuning or SessionTuning(), profile_prefix
        self.precision, self.mode, self.steps = "fp32", "unrolled", steps or 1
        self.halt_rule = "off"
        self._session: Any = None
        # the graph's hrm_deploy.* metadata where a builder has parsed the graph already (its FP32
        # source: no second parse, and an FP32 graph holds no FP4)
        self.known_meta = meta

    def _activate(self) -> None:
        require("onnx", "onnx", "The ONNX Runtime runner")
        from hrm_deploy.export.metadata import graph_metadata, manifest_mismatch
        from hrm_deploy.manifest import check_artifact

        manifest = check_artifact(self.path)  # a graph whose manifest describes other bytes is refused
        meta = self.known_meta
        if meta is None:
            model = load_onnx(self.path)
            if holds_fp4(model):
                raise ArtifactError(
                    f"{self.path.name} is an NVFP4 graph and ONNX Runtime has no FP4 kernels: verify its TensorRT "
                    "engine on a Blackwell GPU (build-engine --nvfp4); its accuracy on CPU is measured through a "
                    "simulation (benchmarks/nvfp4_accuracy.py)"
                )
            meta = graph_metadata(model)
            del model
        wrong = manifest_mismatch(meta, manifest)
        if wrong:  # e.g. bf16 recorded for an fp32 graph: verify would judge it by looser thresholds
            raise ArtifactError(f"{self.path.name}: {wrong}")
        self.precision, self.mode = meta.get("precision", "fp32"), meta["mode"]
        self.halt_rule = meta.get("halt", "off")  # a loop graph's built-in rule
        self.steps = self.requested_steps or meta["steps"]
        # A cpu-target graph was built for a thread count (build-engine --target cpu --threads N);
        # it runs with that count unless the caller asks for another.
        built_for = ((manifest or {}).get("runtime") or {}).get("threads_requested")
        threads = self.threads or built_for
        try:
            self._session = ort_session(
                self.path,
                provider=self.provider,
                threads=threads,
                profile_prefix=self.profile_prefix,
                **asdict(self.tuning),
            )
        except Exception as exc:
            _explain_older_runtime(self.path, manifest, exc)
            raise
        # export --puzzle-emb external: the session gathers the rows of the ids it is fed
        if self.puzzle_table is not None:
            if not any(i.name == PUZZLE_ROWS for i in self._session.get_inputs()):
                raise given_table_error(self.path)
            self._session = RowsSession(self._session, self.puzzle_table)
        else:
            self._session = rows_session(self._session, self.table_of or self.path, None if self.table_of else manifest)
        options = self._session.get_session_options()
        self.runtime_settings = {
            "provider": self._session.get_providers()[0],
            "intra_op_num_threads": options.intra_op_num_threads or f"default ({os.cpu_count()} cores)",
            "threads_from": "caller" if self.threads else ("engine manifest" if built_for else "onnxruntime default"),
            "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1],
            **({} if self.tuning == SessionTuning() else asdict(self.tuning)),
        }
        self._per_step = any(o.name == "step_predictions" for o in self._session.get_outputs())

    def _infer(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        """Outputs for one batch; ``halt`` (e.g. ``HaltRule.should_halt``) stops rows early on
        a step graph (see hrm_deploy.halting); ``steps_used`` int32 [B] says where each stopped."""
        batch = len(feeds["inputs"])
        if self.mode == "loop":
            return self._infer_loop(feeds, halt)
        if self.mode != "step":
            if halt is not None:
                from hrm_deploy.errors import ConfigError

                raise ConfigError(
                    f"{self.path.name} is an unrolled graph: it always runs all {self.steps} ACT steps; "
                    "for --halt export the step graph (hrm-deploy export --mode step)"
                )
            names = ["logits", "q_halt_logits", "q_continue_logits"] + (["step_predictions"] if self._per_step else [])
            out = dict(zip(names, self._session.run(names, feeds)))
            return {**out, "steps_used": np.full(batch, self.steps, np.int32)}
        from hrm_deploy.backends.ort.step import OrtStep
        from hrm_deploy.halting import drive

        return drive(OrtStep(self._session, self.steps), feeds["inputs"], feeds["puzzle_identifiers"], halt)

    def _infer_loop(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        """A loop graph halts by the rule fixed at its export (``halt_rule``)."""
        if halt is not None:
            from hrm_deploy.errors import ConfigError

            raise ConfigError(
                f"{self.path.name} is a loop graph: it halts by its own rule ({self.halt_rule}, fixed at export); "
                "run it without --halt, or export --mode loop --halt RULE / --mode step for another rule"
            )
        names = ["logits", "q_halt_logits", "q_continue_logits", "steps_used"]
        return dict(zip(names, self._session.run(names, feeds)))

    def step_function(self):
        """The step graph as a :class:`hrm_deploy.contract.StepFunction` (continuous batching)."""
        from hrm_deploy.backends.ort.step import OrtStep

        if self.mode != "step":
            from hrm_deploy.errors import ConfigError

            raise ConfigError(
                f"{self.path.name} is an unrolled graph; continuous batching needs the step graph "
                "(hrm-deploy export --mode step)"
            )
        return OrtStep(self._session, self.steps)

    def end_profiling(self) -> Path:
        """Stop ORT's profiler (a runner made with ``profile_prefix``) and return its JSON file."""
        if self._session is None or self.profile_prefix is None:
            from hrm_deploy.errors import InternalError

            raise InternalError("end_profiling needs an active runner made with profile_prefix")
        return Path(self._session.end_profiling())  # an external-table wrapper passes it through

    def _close(self) -> None:
        self._session = None


def _explain_older_runtime(path: Path, manifest: dict | None, exc: Exception) -> None:
    """A cpu-target graph holds ORT contrib kernels (fused attention, MatMulNBits) of the
    onnxruntime that built it: an older one that cannot load it gets one clear line, not ORT's."""
    import onnxruntime

    built = ((manifest or {}).get("backend") or {}).get("version")
    if not built or (manifest or {}).get("target", {}).get("name") != "cpu":
        return
    from packaging.version import Version

    if Version(onnxruntime.__version__) < Version(built):
        from hrm_deploy.errors import DependencyError

        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DependencyError(
            f"{path.name} was built for onnxruntime {built} and this onnxruntime {onnxruntime.__version__} "
            f"cannot load it ({first}); pip install 'onnxruntime>={built}', or rebuild it here with "
            "build-engine --target cpu"
        ) from None
