"""What the build stage hands a backend's builder: a ready graph and a typed :class:`BuildRequest`,
through one :class:`Builder` protocol.

The stage (:func:`hrm_deploy.engines.build.build_engine`) does the composing: it resolves the
source, exports the single-step graph where a builder prefers it, and makes the precision graph;
a builder only builds. Each backend's builder is one object named by its row of the backend
table (:data:`hrm_deploy.registry.BACKENDS`, ``builder``); :func:`builder` finds it there.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.engines.result import EngineResult
    from hrm_deploy.engines.targets import TargetProfile


class GraphInput(str, enum.Enum):
    """What graph a builder builds from (the stage makes it ready)."""

    PRECISION = (
        "precision"  # the precision stage's graph at the asked precision (TensorRT: precision lives in the ONNX)
    )
    FP32 = "fp32"  # the FP32 export; the backend writes its own precision format (the cpu target's integer GEMMs)
    SOURCE = "source"  # what was given, an export or a checkpoint (PyTorch compiles the model itself)


@dataclass(frozen=True)
class BuildRequest:
    """One build. ``graph`` is what the builder builds from (None until the stage resolved it);
    ``source`` what was given (before a single-step export or a precision conversion);
    ``backend`` the ``build-engine --backend`` name the target or the user chose; ``facts`` what
    the builder's preflight found (e.g. the GPU architectures) and what the stage did (e.g. built
    the single-step graph instead of an unroll), for the manifest."""

    config: EngineConfig
    target: TargetProfile
    backend: str
    out: Path | None = None
    quiet: bool = False
    graph: Path | None = None
    source: Path | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    # the FP32 graph at ``source`` as the stage parsed it (``onnx.ModelProto``, weights loaded), for a
    # builder to read instead of parsing that file again; None where the stage did not parse it
    model: Any = None

    @property
    def ready(self) -> Path:
        """The graph to build from (a builder is only called once the stage has set it)."""
        if self.graph is None:
            from hrm_deploy.errors import InternalError

            raise InternalError("a builder was called before the build stage resolved its graph")
        return self.graph


@dataclass(frozen=True)
class StepInstead:
    """A builder's reason to build the single-step graph of an unrolled one's checkpoint: ``why``
    (logged) and ``record`` (the manifest's ``step_instead_of_unrolled``)."""

    why: str
    record: dict[str, Any]


@runtime_checkable
class Builder(Protocol):
    """A backend's build side. ``takes`` says what graph the stage hands it. Every builder returns
    an :class:`~hrm_deploy.engines.result.EngineResult`."""

    takes: GraphInput

    def preflight(self, request: BuildRequest) -> BuildRequest:
        """Refuse what cannot build before any conversion work (a missing library, a GPU too old
        for the precision); returns the request with what it found added to ``facts``."""
        ...

    def step_instead(self, graph: Path, request: BuildRequest) -> StepInstead | None:
        """Whether the single-step graph should be built instead of ``graph`` (an unroll too
        costly to build); None: build ``graph``."""
        ...

    def build(self, request: BuildRequest) -> EngineResult:
        """Build ``request.ready`` into an engine + manifest."""
        ...


class SimpleBuilder:
    """A builder with nothing to check first and no preference for the step graph: a build
    function ``build(request) -> EngineResult`` plus what graph it takes."""

    def __init__(self, build: Callable[[BuildRequest], EngineResult], takes: GraphInput):
        self.takes, self._build = takes, build

    def preflight(self, request: BuildRequest) -> BuildRequest:
        return request

    def step_instead(self, graph: Path, request: BuildRequest) -> StepInstead | None:
        return None

    def build(self, request: BuildRequest) -> EngineResult:
        return self._build(request)


def builder(backend: str) -> Builder:
    """The builder of ``build-engine --backend BACKEND``, from the row that builds for it (one clear
    error when none does): the build stage reaches a backend only through the table."""
    from hrm_deploy.errors import InternalError
    from hrm_deploy.registry import build_entry, load

    ref = build_entry(backend).builder or ""
    found = load(ref)
    if not isinstance(found, Builder):
        raise InternalError(f"{ref} is not a Builder (takes, preflight, step_instead, build: engines/request.py)")
    return found
