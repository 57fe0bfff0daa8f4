"""GPU identity probes: what a Jetson's nvidia-smi does not say is read elsewhere."""

from __future__ import annotations

import sys
import types

from hrm_deploy import system


def test_jetson_compute_capability_when_nvidia_smi_says_na(monkeypatch):
    monkeypatch.setattr(system, "nvidia_smi", lambda fields: {"gpu": "Orin (nvgpu)", "compute_capability": "[N/A]"})
    monkeypatch.setattr(system, "jetson_model", lambda: "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit")
    monkeypatch.setattr(system, "_capability_from_runtime", lambda: None)
    assert system.gpu_identity()["compute_capability"] == "8.7"  # from the board, not "[N/A]"
    monkeypatch.setattr(system, "_capability_from_runtime", lambda: "8.7")
    assert system.gpu_identity() == {"gpu": "Orin (nvgpu)", "compute_capability": "8.7"}


def test_capability_from_an_imported_torch_and_none_without_a_gpu(monkeypatch):
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: True, get_device_capability=lambda i: (8, 9))
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(system, "nvidia_smi", lambda fields: {"gpu": "RTX 4090", "compute_capability": "N/A"})
    monkeypatch.setattr(system, "jetson_model", lambda: None)
    assert system.gpu_identity()["compute_capability"] == "8.9"
    monkeypatch.setattr(system, "nvidia_smi", lambda fields: {})
    assert system.gpu_identity() == {}
    monkeypatch.setattr(system, "nvidia_smi", lambda fields: {"gpu": "H100", "compute_capability": "9.0"})
    assert system.gpu_identity()["compute_capability"] == "9.0"
