"""``diagnose``: what this machine can do, checked by doing it (not by trusting lists)."""

from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass
from pathlib import Path

from hrm_deploy.errors import install_hint
from hrm_deploy.system import jetson_model


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _version(module: str) -> str | None:
    """Version of an importable module; None when absent, broken, or only a namespace
    left behind by type stubs (``tensorrt-stubs`` makes ``import tensorrt`` succeed)."""
    try:
        found = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a broken install must not stop the doctor
        return None
    version = getattr(found, "__version__", None)
    return str(version) if version else None


def working_ort_providers() -> tuple[list[str], dict[str, str]]:
    """Providers that really run a graph: build a tiny session per provider and check
    which provider the session ended up with."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from hrm_deploy.onnx_runtime import LogSeverity, ort_session

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    blob = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(blob))
    working, failed = [], {}
    for provider in ort.get_available_providers():
        try:
            session = ort_session(blob, provider=provider, log_severity=LogSeverity.FATAL, allow_fallback=True)
            if session.get_providers()[0] == provider:
                working.append(provider)
            else:
                failed[provider] = f"fell back to {session.get_providers()[0]}"
        except Exception as exc:  # noqa: BLE001
            failed[provider] = str(exc).splitlines()[0][:120]
    return working, failed


def diagnose() -> list[Check]:
    """Run every capability check; never raises."""
    checks = [Check("python", True, f"{platform.python_version()} on {platform.machine()} {platform.system()}")]
    torch_v = _version("torch")
    if torch_v:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            cc = ".".join(map(str, torch.cuda.get_device_capability(0)))
            checks.append(Check("torch", True, f"{torch_v}, CUDA {torch.version.cuda}: {name} (sm {cc})"))
        else:
            checks.append(
                Check(
                    "torch",
                    True,
                    f"{torch_v}, no CUDA device (CPU only)",
                    "for GPU reference/bench runs install a CUDA build of torch",
                )
            )
    else:
        checks.append(Check("torch", False, "not installed", f"{install_hint('torch')} (export, verify, train)"))
    if _version("onnx"):
        checks.append(Check("onnx", True, _version("onnx") or ""))
    else:
        checks.append(Check("onnx", False, "not installed", install_hint("onnx")))
    if _version("onnxruntime"):
        try:
            working, failed = working_ort_providers()
            detail = f"{_version('onnxruntime')}; working providers: {', '.join(working) or 'none'}"
            if failed:
                detail += "; not working: " + "; ".join(f"{k} ({v})" for k, v in failed.items())
            checks.append(
                Check(
                    "onnxruntime",
                    bool(working),
                    detail,
                    "" if "CUDAExecutionProvider" in working else "GPU runs: pip install onnxruntime-gpu",
                )
            )
        except Exception as exc:  # noqa: BLE001
            checks.append(Check("onnxruntime", False, f"probe failed: {exc}", "reinstall onnxruntime"))
    else:
        checks.append(Check("onnxruntime", False, "not installed", install_hint("onnx")))
    for module, extra, what in (
        ("tensorrt", "trt", "TensorRT (desktop/datacenter; JetPack on Jetson)"),
        ("tensorrt_rtx", "rtx", "TensorRT-RTX (desktop RTX GPUs)"),
    ):
        v = _version(module)
        checks.append(
            Check(module, v is not None, v or "not importable", "" if v else f"{what}: {install_hint(extra)}")
        )
    return checks + jetson_checks()


def jetson_checks(root: Path = Path("/")) -> list[Check]:
    """The board, its JetPack line and the CUDA and TensorRT versions installed on it, read from the
    files under ``root`` (tests pass recorded files); one "not a Jetson" check elsewhere."""
    from hrm_deploy.jetpack import board_versions, detect

    model = jetson_model(root / "proc/device-tree/model", root / "etc/nv_tegra_release")
    if model is None:
        return [Check("jetson", False, "not a Jetson")]
    checks = [Check("jetson", True, model, "use JetPack's TensorRT: see jetson/README.md")]
    found = detect(root)
    if found is None or found.line is None:
        why = found.describe() if found is not None else "no JetPack release found"
        return checks + [Check("jetpack", False, why, "install JetPack 6 or 7: see docs/jetson.md")]
    versions = board_versions(root)
    detail = (
        f"{found.line.name} ({found.source}): CUDA {versions.get('cuda', 'not found')}, "
        f"TensorRT {versions.get('tensorrt') or _version('tensorrt') or 'not found'}"
    )
    cuda = versions.get("cuda", "")
    ok = bool(cuda) and cuda.split(".")[0] == found.line.cuda.split(".")[0]
    fix = (
        ""
        if ok
        else f"{found.line.name} ships CUDA {found.line.cuda}: reinstall JetPack (sudo apt install nvidia-jetpack)"
    )
    return checks + [Check("jetpack", ok, detail + f"; install with the '{found.line.extra}' extra", fix)]
