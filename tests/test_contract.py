"""The graphs' contract is one module: exported graphs, the PyTorch engine's I/O and the Triton
driver follow it, and model-specific names live only in model/ and the contract."""

from __future__ import annotations

import re
from pathlib import Path

import onnx

from hrm_deploy.contract import CARRY, STEP_INPUTS, STEP_OUTPUTS, graph_io
from hrm_deploy.export.metadata import graph_metadata
from hrm_deploy.model.checkpoint import load_checkpoint

PACKAGE = Path(__file__).resolve().parents[1] / "hrm_deploy"
ONNX_TYPES = {onnx.TensorProto.INT32: "int32", onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.BOOL: "bool"}


def _io(path: Path) -> list[tuple[str, bool, str, tuple]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    rows = []
    for is_input, values in ((True, graph.input), (False, graph.output)):
        for v in values:
            dims = tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim)
            rows.append((v.name, is_input, ONNX_TYPES[v.type.tensor_type.elem_type], dims))
    return rows


def test_exported_graphs_follow_the_contract(tiny_onnx, trained_tiny):
    _, config = load_checkpoint(trained_tiny.checkpoint)
    sizes = (config.seq_len, config.total_seq_len, config.hidden_size, config.vocab_size)
    for path in (tiny_onnx.step, tiny_onnx.unrolled):
        meta = graph_metadata(onnx.load(str(path), load_external_data=False))
        steps = int(meta["steps"])
        got = _io(path)
        predictions = any(name == "step_predictions" for name, *_ in got)
        expected = [tuple(t) for t in graph_io(meta["mode"], *sizes, steps, predictions)]
        assert got == expected, path.name
    assert [name for name, is_input, *_ in _io(tiny_onnx.step) if is_input] == list(STEP_INPUTS)
    assert [name for name, is_input, *_ in _io(tiny_onnx.step) if not is_input] == list(STEP_OUTPUTS)


def test_the_pytorch_engine_io_is_the_contract(trained_tiny):
    from hrm_deploy.backends.torch.builder import io_specs

    _, config = load_checkpoint(trained_tiny.checkpoint)
    specs = io_specs("step", config, 4)
    assert [s["name"] for s in specs] == [*STEP_INPUTS, *STEP_OUTPUTS]
    assert all(s["shape"][0] == -1 for s in specs)


def test_model_names_live_only_in_model_and_the_contract():
    """The carry's names are spelled in model/ and contract.py; everything else imports them."""
    pattern = re.compile("[\"'](" + "|".join(CARRY) + ")(_out)?[\"']")
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "model" not in path.relative_to(PACKAGE).parts[:1] and path.name != "contract.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders
