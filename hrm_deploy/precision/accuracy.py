"""Accuracy of an ONNX graph on held-out examples (the precision stage's check)."""

from __future__ import annotations

from hrm_deploy.data.examples import Examples
from hrm_deploy.metrics import accuracy


def onnx_accuracy(path: str, examples: Examples) -> dict[str, float]:
    """Accuracy of an ONNX graph (either mode) on ONNX Runtime CPU."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.runtime.infer import predict

    runner = open_runner(path, runner="ort")
    runner.activate()
    try:
        return accuracy(predict(runner, examples), examples.labels)
    finally:
        runner.close()
