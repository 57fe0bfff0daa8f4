"""Fixtures of the PyTorch engine tests: AOTInductor engines of the trained tiny model."""

from __future__ import annotations

import pytest

from hrm_deploy.backends.torch.builder.options import TorchOptions

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.fixture(scope="session")
def torch_engines(tiny_onnx, tmp_path_factory):
    """AOTInductor engines of the trained fixture for this machine: the single step (from the
    checkpoint) and the unroll (from the FP32 ONNX export, via its manifest's parent)."""
    from types import SimpleNamespace

    from hrm_deploy.artifacts import find_reference
    from hrm_deploy.engines.build import EngineConfig, build_engine

    folder = tmp_path_factory.mktemp("torch_engines")
    checkpoint = find_reference(tiny_onnx.unrolled)
    step = build_engine(
        checkpoint,
        EngineConfig(precision="fp32", backend="torch", max_batch=64, options=TorchOptions(device="cpu")),
        folder / "tiny.step.pt2",
        quiet=True,
    )
    unrolled = build_engine(
        tiny_onnx.unrolled,
        EngineConfig(precision="fp32", backend="torch", max_batch=64, options=TorchOptions(device="cpu")),
        folder / "tiny.unrolled.pt2",
        quiet=True,
    )
    return SimpleNamespace(step=step.path, unrolled=unrolled.path, checkpoint=checkpoint, data=tiny_onnx.data)


@pytest.fixture(scope="module")
def cuda_engine(trained_tiny, tmp_path_factory):
    from hrm_deploy.backends.torch.builder import build_torch_engine
    from hrm_deploy.backends.torch.builder.options import TorchOptions
    from hrm_deploy.engines.config import EngineConfig

    folder = tmp_path_factory.mktemp("cuda_engine")
    return build_torch_engine(
        trained_tiny.checkpoint,
        EngineConfig(precision="fp32", backend="torch", max_batch=256, options=TorchOptions(device="cuda")),
        folder / "tiny.step.cuda.pt2",
        quiet=True,
    ).path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A user cache of this test alone (probe verdicts, their seal key, regenerated data)."""
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
