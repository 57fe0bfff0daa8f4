"""Nothing TensorRT 11 removed is reachable without a version gate.

TensorRT 11 removed weak typing (the precision builder flags, precision constraints, INT8
calibrators and calibration profiles, quantization flags, ``platform_has_fast_*``), the algorithm
selector, the cuBLAS/cuDNN tactic sources and ``ICudaEngine.device_memory_size`` (``_v2`` stays).
JetPack 6 stays on TensorRT 10.3, so code for 10.x alone may use them, but only inside a branch that
runs on TensorRT < 11 (``if backend.major < 11:`` or the ``else`` of ``>= 11``). This walks every
module of the package, the scripts and the benchmarks (attributes, names, and ``getattr``/``hasattr``
strings) and fails on any use outside such a branch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCANNED = [ROOT / "hrm_deploy", ROOT / "scripts", ROOT / "benchmarks"]

# (owner, name): a name removed only as a member of that owner (DataType.INT8 and .FP8 stay)
REMOVED_MEMBERS = {
    ("BuilderFlag", name)
    for name in (
        "FP16",
        "BF16",
        "INT8",
        "FP8",
        "INT4",
        "FP4",
        "OBEY_PRECISION_CONSTRAINTS",
        "PREFER_PRECISION_CONSTRAINTS",
    )
} | {("TacticSource", name) for name in ("CUBLAS", "CUBLAS_LT", "CUDNN")}
# names removed wherever they appear
REMOVED_NAMES = {
    "int8_calibrator",
    "IInt8Calibrator",
    "IInt8EntropyCalibrator",
    "IInt8EntropyCalibrator2",
    "IInt8MinMaxCalibrator",
    "IInt8LegacyCalibrator",
    "CalibrationAlgoType",
    "set_calibration_profile",
    "get_calibration_profile",
    "QuantizationFlag",
    "set_quantization_flag",
    "clear_quantization_flag",
    "get_quantization_flag",
    "quantization_flags",
    "platform_has_fast_fp16",
    "platform_has_fast_int8",
    "platform_has_tf32",
    "IAlgorithmSelector",
    "algorithm_selector",
    "device_memory_size",
}


def _gate(test: ast.expr) -> str | None:
    """ "old" for a test true only on TensorRT < 11 (``x.major < 11``), "new" for ``x.major >= 11``."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1):
        return None
    left, right = test.left, test.comparators[0]
    named = (isinstance(left, ast.Attribute) and left.attr == "major") or (
        isinstance(left, ast.Name) and left.id.endswith("major")
    )
    if not (named and isinstance(right, ast.Constant) and right.value == 11):
        return None
    op = test.ops[0]
    return "old" if isinstance(op, ast.Lt) else "new" if isinstance(op, ast.GtE) else None


def _uses(node: ast.AST) -> list[str]:
    """The removed names ``node`` itself uses."""
    if isinstance(node, ast.Attribute):
        owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        if node.attr in REMOVED_NAMES or (owner, node.attr) in REMOVED_MEMBERS:
            return [f"{owner}.{node.attr}"]
    if isinstance(node, ast.Name) and node.id in REMOVED_NAMES:
        return [node.id]
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") and len(node.args) >= 2:
        owner, name = node.args[0], node.args[1]
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if isinstance(name, ast.Constant) and (
            name.value in REMOVED_NAMES or (owner_name, name.value) in REMOVED_MEMBERS
        ):
            return [f"{owner_name}.{name.value}"]
    return []


def ungated_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every removed name outside a TensorRT < 11 branch."""
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, gated: bool) -> None:
        if isinstance(node, ast.If) and (gate := _gate(node.test)) is not None:
            walk(node.test, gated)
            for child in node.body:
                walk(child, gated or gate == "old")
            for child in node.orelse:
                walk(child, gated or gate == "new")
            return
        if not gated:
            found.extend((getattr(node, "lineno", 0), name) for name in _uses(node))
        for child in ast.iter_child_nodes(node):
            walk(child, gated)

    walk(tree, False)
    return found


def test_no_removed_name_outside_a_version_gate():
    offenders = []
    for folder in SCANNED:
        for path in sorted(folder.rglob("*.py")):
            for line, name in ungated_uses(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not offenders, "names TensorRT 11 removed, outside an `if ....major < 11:` branch:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source,found",
    [
        ("config.set_flag(trt.BuilderFlag.FP16)", ["BuilderFlag.FP16"]),
        ("config.int8_calibrator = c", ["config.int8_calibrator"]),
        ("n = engine.device_memory_size", ["engine.device_memory_size"]),
        ("f = getattr(trt.BuilderFlag, 'INT8', None)", ["BuilderFlag.INT8"]),
        ("class C(trt.IInt8EntropyCalibrator2): pass", ["trt.IInt8EntropyCalibrator2"]),
        ("if backend.major < 11:\n    config.set_flag(trt.BuilderFlag.INT8)", []),
        ("if backend.major >= 11:\n    pass\nelse:\n    config.set_flag(trt.BuilderFlag.INT8)", []),
        ("if backend.major >= 11:\n    config.set_flag(trt.BuilderFlag.INT8)", ["BuilderFlag.INT8"]),
        ("x = trt.DataType.INT8; y = engine.device_memory_size_v2", []),
    ],
)
def test_the_guard_sees_removed_names_and_honours_gates(source, found):
    assert [name for _, name in ungated_uses(ast.parse(source))] == found
