"""A graph ONNX Runtime refuses to load (here a ``Mod`` node mixing int32 and int64, as a hand edit or
another tool can leave it) is one line naming the file and the loader's reason in every command that
opens a graph, never a traceback: the refusal is translated where every session is made
(``onnx_runtime.ort_session``); an engine TensorRT refuses is tested in tests/runtime/test_device_loop.py
and tests/backends/tensorrt/test_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app

runner = CliRunner()
REASON = "Type parameter (T) of Optype (Mod) bound to different types"


def make_unloadable(graph: Path, out: Path) -> Path:
    """A copy of ``graph`` (with its manifest, resealed for the new bytes) holding a Mod of int32 and int64."""
    import onnx
    from onnx import TensorProto, helper

    from hrm_deploy.artifacts import find_reference
    from hrm_deploy.io import sha256_file
    from hrm_deploy.manifest import manifest_path, manifest_text, read_manifest

    model = onnx.load(str(graph))
    model.graph.initializer.extend(
        [
            helper.make_tensor("bad_a", TensorProto.INT32, [1], [3]),
            helper.make_tensor("bad_b", TensorProto.INT64, [1], [2]),
        ]
    )
    model.graph.node.append(helper.make_node("Mod", ["bad_a", "bad_b"], ["bad_out"], name="bad_mod"))
    model.graph.output.append(helper.make_tensor_value_info("bad_out", TensorProto.INT32, [1]))
    onnx.save(model, str(out))
    data = read_manifest(graph)
    data.update(artifact=out.name, sha256=sha256_file(out), size_bytes=out.stat().st_size)
    data["parent"] = {**data["parent"], "path": str(find_reference(graph))}
    manifest_path(out).write_text(manifest_text(data))
    return out


def _one_line(result, name: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and name in errors[0] and "cannot load" in errors[0] and REASON in errors[0], errors


@pytest.fixture(scope="module")
def bad(tiny_onnx, tmp_path_factory):
    return make_unloadable(tiny_onnx.unrolled, tmp_path_factory.mktemp("unloadable") / "bad.onnx")


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "{bad}", "--data", "{data}", "--samples", "4"],
        ["solve", "{data}", "{bad}"],
        ["profile", "{bad}", "--data", "{data}", "-o", "{tmp}/profile"],
        ["build-engine", "{bad}", "--target", "cpu", "-o", "{tmp}/bad.cpu.onnx"],
        ["build-engine", "{bad}", "--target", "cpu", "--int8", "--calib-data", "{data}", "-o", "{tmp}/bad.int8.onnx"],
    ],
    ids=["verify", "solve", "profile", "build-engine", "build-engine-int8"],
)
def test_every_command_names_the_graph_onnx_runtime_refuses(bad, tiny_onnx, tmp_path, command):
    argv = [part.format(bad=bad, data=tiny_onnx.data, tmp=tmp_path) for part in command]
    _one_line(runner.invoke(app, argv), "bad.onnx")


def test_bench_skips_the_graph_onnx_runtime_refuses_saying_why(bad, tiny_onnx, tmp_path):
    """bench measures what it can: the row is skipped with the one line, the others are measured."""
    argv = ["bench", str(bad), "--data", tiny_onnx.data, "--batch", "1", "--iters", "1", "--no-reference"]
    argv += ["-o", str(tmp_path / "b")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    skipped = next(line for line in result.output.splitlines() if line.startswith("- bad.onnx: skipped:"))
    assert "cannot load" in skipped and REASON in skipped, skipped


def test_serve_names_the_graph_onnx_runtime_refuses(bad, tmp_path):
    from tests.serve.helpers import free_ports

    http, grpc, metrics = free_ports(3)
    for batching in ("inflight", "dynamic"):
        argv = ["serve", str(bad), "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        _one_line(runner.invoke(app, [*argv, "--batching", batching]), "bad.onnx")


def test_arc_eval_names_the_graph_onnx_runtime_refuses(tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from tests.arc.conftest import random_arc_model

    checkpoint, data, _ = random_arc_model(tmp_path)
    graph = export_onnx(checkpoint, tmp_path / "arc.onnx", ExportConfig(parity=False), quiet=True).path
    bad = make_unloadable(graph, tmp_path / "bad.onnx")
    _one_line(
        runner.invoke(app, ["arc-eval", str(bad), "--data", str(data), "-o", str(tmp_path / "s.json")]), "bad.onnx"
    )


def test_a_graph_without_kernels_here_says_so(bad):
    """ONNX Runtime's NOT_IMPLEMENTED (e.g. a BF16 graph on a CPU) gets the fix for that case."""
    from hrm_deploy.onnx_runtime import load_failure

    class NotImplementedHere(Exception):
        pass

    exc = NotImplementedHere("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Mul(14)")
    line = str(load_failure(bad, exc))
    assert line.startswith("ONNX Runtime ") and f"cannot load {bad}: Could not find an implementation" in line
    assert "kernels this ONNX Runtime lacks" in line
