"""The package's rooms are layered like the pipeline: no import goes up.

Every ``import``/``from ... import`` of ``hrm_deploy`` in every module is checked, including
imports inside functions (lazy imports are still dependencies). A module may import modules of
its own rank or lower ranks, nothing else: where a lower room needs something from a higher one,
that code moves down (engine compatibility checks into ``runtime.compat``, an artifact's contract
into ``runtime.artifact``, the artifact table and ``find_reference`` into the base ``artifacts``,
and ORT sessions into the base ``onnx_runtime``; there is no allow-list).

Rank  Rooms (first package level below ``hrm_deploy``)
----  -----------------------------------------------------------------------------------------
0     base: the package itself (``hrm_deploy/__init__``: lazy exports only), ``errors``, ``io``,
      ``manifest``, ``registry`` (the backend table, plain data), ``contract`` (the step / unrolled
      graphs' I/O names and shapes, the carry, the halting function type), ``artifacts``,
      ``onnx_runtime``, ``streams`` (independent ORT calls side by side, results in order), ``system``,
      ``progress``, ``metrics``, ``agreement`` (a candidate's outputs judged
      cell by cell against a reference's), ``puzzle_table`` (external puzzle-embedding
      tables), ``sources`` (where a checkpoint or dataset comes from: paths, run folders, the Hub), ``jetpack`` (the JetPack
      lines) -- used by everything, import only base
1     ``model`` (the network, configs, checkpoints), ``data`` (datasets in upstream's format),
      ``provenance`` (default data from a checkpoint's own dataset)
2     ``export`` (checkpoint -> ONNX, graph metadata, parity)
3     ``runtime`` (what every runner shares: Runner template, device loop, memory, adapters' interface)
4     ``backends`` run side (each backend's runner and step function; TensorRT's API wrapper),
      ``halting`` (rules, the step driver and continuous batching, thresholds from outputs; it
      imports no backend: the step functions come in through the step contract)
5     ``precision`` (FP16/INT8/FP8 conversion, calibration, accuracy on examples)
6     ``engines`` (the build stage: options, targets, dispatch), ``backends.<name>.builder`` (each
      backend's build side: it may use precision)
7     applications: ``verify`` and ``halting_report`` (halting reports, budget calibration), ``bench``, ``serve``, ``solve``, ``train``, ``doctor``, ``inspection``,
      ``arc`` (ARC evaluation)
8     ``cli``, ``__main__`` (thin Typer commands over the applications)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hrm_deploy"

RANKS: dict[str, int] = {
    "": 0,
    "errors": 0,
    "io": 0,
    "manifest": 0,
    "outputs": 0,
    "registry": 0,
    "contract": 0,
    "artifacts": 0,
    "onnx_runtime": 0,
    "streams": 0,
    "system": 0,
    "progress": 0,
    "metrics": 0,
    "agreement": 0,
    "puzzle_table": 0,
    "sources": 0,
    "jetpack": 0,
    "model": 1,
    "data": 1,
    "provenance": 1,
    "export": 2,
    "runtime": 3,
    "backends": 4,
    "halting": 4,
    "precision": 5,
    "engines": 6,
    "verify": 7,
    "halting_report": 7,
    "bench": 7,
    "serve": 7,
    "solve": 7,
    "train": 7,
    "doctor": 7,
    "inspection": 7,
    "arc": 7,
    "scale": 7,
    "cli": 8,
    "__main__": 8,
}
BUILD_SIDE = 6  # hrm_deploy.backends.<name>.builder[...]: a backend's build side ranks with the engine stage


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int:
    parts = module.split(".")
    if parts[1:2] == ["backends"] and parts[3:4] == ["builder"]:
        return BUILD_SIDE
    room = parts[1] if len(parts) > 1 else ""
    if room not in RANKS:
        pytest.fail(f"{module}: room {room!r} has no rank; add it to RANKS in tests/test_layering.py")
    return RANKS[room]


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the checks here."""
    return ast.parse(path.read_text(), str(path))


def _imports(path: Path) -> set[str]:
    """Every hrm_deploy module ``path`` imports, top-level or inside functions."""
    found: set[str] = set()
    module = _module_name(path)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "hrm_deploy")
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                name = ".".join([*base, name] if name else base)
            if name.split(".")[0] == "hrm_deploy":
                found.add(name)
    return found


@functools.cache
def _edges() -> list[tuple[str, str]]:
    return [(_module_name(p), target) for p in sorted(PACKAGE.rglob("*.py")) for target in sorted(_imports(p))]


def test_no_import_goes_up():
    upward = [(src, dst) for src, dst in _edges() if _rank(dst) > _rank(src)]
    assert not upward, "imports that go up the layering (see the table in tests/test_layering.py):\n" + "\n".join(
        f"  {src} (rank {_rank(src)}) imports {dst} (rank {_rank(dst)})" for src, dst in upward
    )


def test_the_checker_sees_function_level_imports():
    """Lazy imports count: the TensorRT adapter imports the TensorRT API only inside a method."""
    assert "hrm_deploy.backends.tensorrt.api" in _imports(PACKAGE / "backends" / "tensorrt" / "adapter.py")


def test_a_builder_ranks_above_its_runner():
    assert _rank("hrm_deploy.backends.ort.builder.static") == BUILD_SIDE > _rank("hrm_deploy.backends.ort.runner")
    assert _rank("hrm_deploy.backends.torch.builder") == BUILD_SIDE > _rank("hrm_deploy.backends.torch.runner")


def test_every_room_has_a_rank():
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    missing = sorted(r.removesuffix(".py") for r in rooms if r.removesuffix(".py") not in RANKS | {"__init__": 0})
    assert not missing, f"give these rooms a rank in tests/test_layering.py: {missing}"


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """hrm_deploy modules imported at module level (function bodies and TYPE_CHECKING blocks aside)."""
    tree = _tree(path)
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        for sub in [node] if not isinstance(node, (ast.If, ast.Try)) else ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("hrm_deploy"):
                names = [f"{sub.module}.{a.name}" for a in sub.names]
                found |= {n for n in names if n in known} or {sub.module}
            elif isinstance(sub, ast.Import):
                found |= {a.name for a in sub.names if a.name.startswith("hrm_deploy")}
    return {m for m in found if m in known}


@pytest.mark.slow
def test_no_module_level_import_circle():
    """Module-level imports between hrm_deploy modules form no cycle (lazy imports inside
    functions are how a lower room reaches an optional higher one)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _top_level_imports(path, set(files)) for name, path in files.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_stages_look_backends_up_in_the_table():
    """verify, bench, solve, serve, arc-eval, halting and precision reach a backend only through
    hrm_deploy.backends (open_runner, reference_runner, builder), never by importing its package."""
    stages = ("verify", "bench", "solve", "serve", "arc", "scale", "halting", "precision", "engines", "cli", "doctor")
    by_name = [
        (src, dst) for src, dst in _edges() if src.split(".")[1] in stages and dst.startswith("hrm_deploy.backends.")
    ]
    assert not by_name, by_name


@pytest.mark.slow
def test_the_stages_below_the_applications_import_no_backend():
    """engines, precision and halting reach a backend only through the tables: the halting scheduler
    drives any step function of the step contract (contract.StepFunction; the ORT and reference
    steps live with their backends), budget calibration, which opens runners, sits beside verify
    (halting_report), the precision stage runs graphs through the base's ONNX Runtime session, and
    the build stage finds builders in the backend table (engines.request.builder)."""
    rooms = ("hrm_deploy.halting", "hrm_deploy.engines", "hrm_deploy.precision")
    reaching = [
        (src, dst)
        for src, dst in _edges()
        if any(src == room or src.startswith(room + ".") for room in rooms)
        if dst == "hrm_deploy.backends" or dst.startswith("hrm_deploy.backends.")
    ]
    assert not reaching, f"a stage below the applications imports a backend: {reaching}"


def _runtime_imports(path: Path, known: set[str]) -> set[str]:
    """The hrm_deploy modules ``path`` imports when it runs, at module level or inside functions
    (``from package import module`` counts as the module); ``if TYPE_CHECKING:`` blocks aside."""
    tree = _tree(path)
    module = _module_name(path)
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                name = ".".join([*base, name] if name else base)
            found.update(f"{name}.{a.name}" if f"{name}.{a.name}" in known else name for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in known and m != module}


@functools.cache
def _runtime_graph() -> dict[str, set[str]]:
    """Each module -> the modules it imports when it runs (:func:`_runtime_imports`)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _runtime_imports(path, set(files)) for name, path in files.items()}


def _siblings(files: dict[str, Path]) -> dict[str, str]:
    """Each module that is not a package's ``__init__`` -> its package."""
    return {name: name.rpartition(".")[0] for name, path in files.items() if path.name != "__init__.py"}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import one another round a circle (strongly connected, 2 or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            ring = []
            while True:
                member = stack.pop()
                ring.append(member)
                if member == node:
                    break
            if len(ring) > 1:
                found.append(sorted(ring))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_sees_a_lazy_circle() -> None:
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_a_package():
    """The modules of one package import one another round no circle, lazy imports included: where
    two modules need each other, what they share moves down into a module both import (the export's
    INITIAL_CARRY into export.trace, TensorDiff into export.parity_limits). Type-only imports
    (``if TYPE_CHECKING:``) run nothing and are left aside, and so is a package's ``__init__``, which
    imports its own modules to present them (the command line registers its commands there); a
    module-level circle through it is test_no_module_level_import_circle's."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    package = _siblings(files)
    graph = {
        name: {dst for dst in _runtime_graph()[name] if package.get(dst) == home} for name, home in package.items()
    }
    circles = import_circles(graph)
    assert not circles, "import circles inside a package:\n" + "\n".join(f"  {' <-> '.join(c)}" for c in circles)


def test_the_fake_tensorrt_is_imported_by_nothing_in_the_package():
    """backends.tensorrt.fake_trt is for tests and benchmarks: no module of the package reaches it."""
    fake = "hrm_deploy.backends.tensorrt.fake_trt"
    assert fake in _runtime_graph()
    assert not [name for name, imported in _runtime_graph().items() if fake in imported]
