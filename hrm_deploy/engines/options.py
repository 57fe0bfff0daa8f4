"""Each backend's build options: one frozen dataclass per building backend, named by its row.

:class:`~hrm_deploy.engines.config.EngineConfig` holds what every build reads (precision, target,
backend, batch profile, calibration, accuracy); the options only one backend reads live in its
own :class:`BuildOptions` subclass, beside its builder (TensorRT: workspace, optimization level,
timing cache...; the cpu target: threads, fusions, INT8 recipe; PyTorch: device, TF32, mode...),
each with its own checks. The backend table names the class (``BackendEntry.build_options``, a
``"module:Class"`` string like its builder), so this module names no backend: an option given to a
backend that does not take it is refused in one line written by the class that does take it.

Each field is also a ``build-engine`` flag: :func:`option` records the flag, its help and its
choices, :func:`command_line` lists the flags of every class for the command to offer, and
:func:`from_command_line` turns what the command parsed back into field values.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from hrm_deploy.engines.targets import get_target
from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.registry import BACKENDS, build_entry, load

if TYPE_CHECKING:
    from hrm_deploy.engines.config import EngineConfig

# The batch profile: common fields of EngineConfig (field, flag), read only by some backends.
BATCH_FIELDS = (("min_batch", "--min-batch"), ("opt_batch", "--opt-batch"), ("max_batch", "--max-batch"))


def option(
    default: Any,
    flag: str,
    help: str,
    *,
    note: str = "",
    choices: tuple[str, ...] = (),
    parse: Callable[[Any], Any] | None = None,
) -> Any:
    """A field of a :class:`BuildOptions` class, and with it a ``build-engine`` flag: its default, the
    flag that sets it away from the default (a bool field is a switch: ``--no-fuse`` for a field that
    defaults to True), the flag's ``help``, the values it takes (``choices``; none: any of the field's
    type), how the command line's text becomes the field's value (``parse``, e.g. ``none`` -> None)
    and a ``note`` a refusal may add. :func:`command_line` makes the flags of every class from these."""
    if not flag.startswith("--"):
        raise InternalError(f"a build option's flag starts with --, not {flag!r} (hrm_deploy.engines.options)")
    return field(
        default=default, metadata={"flag": flag, "help": help, "note": note, "choices": choices, "parse": parse}
    )


class Flag(NamedTuple):
    """One ``build-engine`` flag made from a build option: the field it sets (``name``, also the
    command's parameter name), the flag, the field's type and default, its help, the values it takes,
    whether it is a switch, and the class that owns it."""

    name: str
    flag: str
    kind: Any  # the field's type, resolved (int | None, str, bool ...)
    default: Any
    help: str
    choices: tuple[str, ...]
    owner: type[BuildOptions]

    @property
    def switch(self) -> bool:
        """A bool field: the flag alone flips the field's default."""
        return self.kind is bool

    def value(self, given: Any) -> Any:
        """The field's value for what the command line gave (a switch's on/off, the parsed text)."""
        if self.switch:
            return (not self.default) if given else self.default
        parse = _field(self.owner, self.name).metadata.get("parse")
        return parse(given) if parse and given is not None else given


class Given(NamedTuple):
    """One option set away from its default: field name, flag, value, and the class that takes it."""

    name: str
    flag: str
    value: Any
    owner: type[BuildOptions]

    @property
    def shown(self) -> str:
        """How a message names it: the flag alone for a switch, else flag and value (``--threads 4``)."""
        return self.flag if isinstance(self.value, bool) else f"{self.flag} {self.value}"

    @property
    def note(self) -> str:
        return _field(self.owner, self.name).metadata.get("note", "")


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
            Given(f.name, f.metadata["flag"], getattr(self, f.name), type(self))
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
            foreign.append(Given(name, spec.metadata["flag"], value, owner))
    return receiver(**{k: v for k, v in values.items() if k in own}), foreign


def _field(cls: type[BuildOptions], name: str) -> Field:
    return next(f for f in fields(cls) if f.name == name)


def command_line() -> list[Flag]:
    """The ``build-engine`` flags of every building backend's options, one per field, in table and
    field order: the command line is made from this, so a new options class's fields become flags
    with no edit to the command. Two classes may share a field only with the same flag."""
    made: dict[str, Flag] = {}
    for cls in every_class():
        kinds = typing.get_type_hints(cls)
        for f in fields(cls):
            meta = f.metadata
            flag = Flag(f.name, meta["flag"], kinds[f.name], f.default, meta["help"], meta["choices"], cls)
            seen = made.setdefault(f.name, flag)
            if seen.flag != flag.flag:
                raise InternalError(
                    f"{cls.__name__}.{f.name} is {flag.flag} but {seen.owner.__name__}'s is {seen.flag}"
                )
    return list(made.values())


def from_command_line(given: Mapping[str, Any]) -> dict[str, Any]:
    """What ``build-engine`` parsed (each of :func:`command_line`'s flags by field name) -> every
    backend's options by field name, as :meth:`EngineConfig.from_values` takes them."""
    return {flag.name: flag.value(given[flag.name]) for flag in command_line()}
