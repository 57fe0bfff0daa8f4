"""Each backend's build options: one frozen dataclass per building backend, named by its row.

:class:`~hrm_deploy.engines.build.EngineConfig` holds what every build reads (precision, target,
backend, batch profile, calibration, accuracy); the options only one backend reads live in its
own :class:`BuildOptions` subclass, beside its builder (TensorRT: workspace, optimization level,
timing cache...; the cpu target: threads, fusions, INT8 recipe; PyTorch: device, TF32), each with
its own checks. The backend table names the class (``BackendEntry.build_options``, a
``"module:Class"`` string like its builder), so this module names no backend: an option given to a
backend that does not take it is refused in one line written by the class that does take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.registry import BACKENDS, build_entry, load

if TYPE_CHECKING:
    from hrm_deploy.engines.build import EngineConfig

# The batch profile: common fields of EngineConfig (field, flag), read only by some backends.
BATCH_FIELDS = (("min_batch", "--min-batch"), ("opt_batch", "--opt-batch"), ("max_batch", "--max-batch"))


def option(default: Any, flag: str | None, note: str = "") -> Any:
    """A field of a :class:`BuildOptions` class: its default, the command-line flag that sets it
    away from the default (``--no-fuse`` for a field that defaults to True; None for a field only
    the Python API sets) and a note a refusal may add."""
    return field(default=default, metadata={"flag": flag, "note": note})


class Given(NamedTuple):
    """One option set away from its default: field name, flag, value, and the class that takes it."""

    name: str
    flag: str
    value: Any
    owner: type[BuildOptions]

    @property
    def shown(self) -> str:
        """How a message names it: the flag alone for a switch, else flag and value (``--threads 4``);
        a field without a flag as the Python API spells it (``device='cuda'``)."""
        if not self.flag.startswith("--"):
            return f"{self.name}={self.value!r}"
        return self.flag if isinstance(self.value, bool) else f"{self.flag} {self.value}"

    @property
    def note(self) -> str:
        return next((f.metadata.get("note", "") for f in fields(self.owner) if f.name == self.name), "")


@dataclass(frozen=True)
class BuildOptions:
    """The options of a backend without any of its own; the base of every backend's options class.

    A subclass adds fields made by :func:`option`, checks their ranges in ``__post_init__`` and its
    checks against the common fields in :meth:`check`, and says how a refusal of its options reads
    (:meth:`refuse`)."""

    taker: ClassVar[str] = "this backend"  # who takes these options, as messages name it
    batch: ClassVar[tuple[str, ...]] = tuple(name for name, _ in BATCH_FIELDS)  # the batch fields it reads
    declines: ClassVar[str] = "this build does not read them"  # why another backend's options mean nothing here

    def given(self) -> list[Given]:
        """The options set away from their defaults, in field order."""
        return [
            Given(f.name, f.metadata.get("flag") or f.name, getattr(self, f.name), type(self))
            for f in fields(self)
            if f.default is not MISSING and getattr(self, f.name) != f.default
        ]

    def check(self, config: EngineConfig) -> None:
        """Checks against the common fields (e.g. an INT8 recipe needs --int8); none by default."""

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        """The one line for ``given`` (options of this class) given to a build for ``target`` by
        ``receiver``'s backend."""
        shown = ", ".join(g.shown for g in given)
        return f"{shown}: option{'s' if len(given) > 1 else ''} of {cls.taker}; {receiver.declines}: drop them"


def options_class(target: str, backend: str | None) -> type[BuildOptions]:
    """The options class of the row that builds for ``backend`` (None: ``target``'s default backend)."""
    from hrm_deploy.engines.targets import get_target

    return _load_class(build_entry(backend or get_target(target).backends[0]).build_options)


def _load_class(ref: str | None) -> type[BuildOptions]:
    cls = load(ref) if ref else BuildOptions
    if not (isinstance(cls, type) and issubclass(cls, BuildOptions)):
        raise InternalError(f"{ref} is not a BuildOptions class (hrm_deploy.engines.options)")
    return cls


def every_class() -> list[type[BuildOptions]]:
    """Each building row's options class, in table order (the order refusals are tried in)."""
    refs = dict.fromkeys(e.build_options for e in BACKENDS.values() if e.builder and e.build_options)
    return [_load_class(ref) for ref in refs]


def batch_given(receiver: type[BuildOptions], values: Mapping[str, Any]) -> list[Given]:
    """The batch profile fields in ``values`` (None: not given) that ``receiver``'s backend does not read,
    each owned by the first class that reads it."""
    found = []
    for name, flag in BATCH_FIELDS:
        if values.get(name) is not None and name not in receiver.batch:
            owner = next((c for c in every_class() if name in c.batch), BuildOptions)
            found.append(Given(name, flag, values[name], owner))
    return found


def refuse_foreign(given: list[Given], target: str, receiver: type[BuildOptions]) -> None:
    """One line when ``given`` holds options ``receiver``'s backend does not take: the first owner's
    refusal (table order), naming all of its options that were given."""
    if not given:
        return
    order = every_class()
    first = min({g.owner for g in given}, key=lambda c: order.index(c) if c in order else len(order))
    raise ConfigError(first.refuse([g for g in given if g.owner is first], target, receiver))


def split_values(receiver: type[BuildOptions], values: Mapping[str, Any]) -> tuple[BuildOptions, list[Given]]:
    """``values`` (every backend's options by field name, unset ones at their defaults, as the
    command line passes them) -> ``receiver``'s options and the other backends' options set away
    from their defaults."""
    own = {f.name for f in fields(receiver)}
    others = {f.name: (f, c) for c in reversed(every_class()) for f in fields(c)}  # name -> (field, class)
    foreign = []
    for name, value in values.items():
        if name in own:
            continue
        if name not in others:
            raise InternalError(f"no backend's build options have a field {name!r}")
        spec, owner = others[name]
        if value != spec.default:
            foreign.append(Given(name, spec.metadata.get("flag") or name, value, owner))
    return receiver(**{k: v for k, v in values.items() if k in own}), foreign
