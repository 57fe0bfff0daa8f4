"""Engine compatibility before deserializing: exact releases, RTX validity, portable RTX engines."""

import enum

import pytest

from hrm_deploy.errors import EngineError
from hrm_deploy.runtime.compat import RTX_PORTABLE_CAPABILITIES, check_compatible


def trt_manifest(version="10.3.0.30", gpu="Orin", cc="8.7"):
    return {
        "backend": {"name": "tensorrt", "version": version},
        "compute_capability": None,
        "build_machine": {"gpu": gpu, "compute_capability": cc},
    }


def rtx_manifest(version="1.7.0.80", target=None):
    return {
        "backend": {"name": "tensorrt-rtx", "version": version},
        "compute_capability": target,
        "build_machine": {},
    }  # RTX AOT builds run on CPU-only machines too


@pytest.mark.parametrize(
    "manifest,backend,version,cc,gpu,error",
    [
        (rtx_manifest("1.7.0"), "tensorrt-rtx", "1.7.1", (12, 0), "RTX 5090", "1.7.0 but 1.7.1"),
        (rtx_manifest("1.7.0.80", "SM120"), "tensorrt-rtx", "1.7.1.116", None, None, "1.7.0.80 but 1.7.1.116"),
        (trt_manifest("10.3.0"), "tensorrt", "10.3.1", (8, 7), "Orin", "10.3.0 but 10.3.1.*patch level"),
        (trt_manifest("10.3.0"), "tensorrt", "10.4.0", (8, 7), "Orin", "10.3.0 but 10.4.0"),
        (trt_manifest(), "tensorrt", "10.3.0.30", (9, 0), "H100", "8.7 .*9.0"),
        (rtx_manifest("1.7.1", "SM120"), "tensorrt-rtx", "1.7.1", (8, 9), "RTX 4090", "--compute-capability SM89"),
        (rtx_manifest("1.7.1"), "tensorrt-rtx", "1.7.1", (9, 0), "H100", "portable .* 9.0"),
        (rtx_manifest("1.7.1"), "tensorrt-rtx", "1.7.1", (7, 5), "RTX 2080", "--compute-capability SM75"),
        (trt_manifest(), "tensorrt-rtx", "1.7.1", None, None, "built with tensorrt but tensorrt-rtx"),
    ],
)
def test_incompatible_engines_fail_naming_both_sides(manifest, backend, version, cc, gpu, error):
    with pytest.raises(EngineError, match=error):
        check_compatible(manifest, backend, version, cc, gpu)


def test_compatible_engines_pass_and_warn_where_it_matters():
    assert check_compatible(trt_manifest(), "tensorrt", "10.3.0.30", (8, 7), "Orin") == []
    same_cc = check_compatible(
        trt_manifest("10.3.0.30", "NVIDIA A100-SXM4-40GB", "8.0"),
        "tensorrt",
        "10.3.0.30",
        (8, 0),
        "NVIDIA A100-PCIE-40GB",
    )
    assert len(same_cc) == 1 and "A100-PCIE" in same_cc[0] and "rebuild here" in same_cc[0]
    build_number = check_compatible(trt_manifest("10.3.0.30"), "tensorrt", "10.3.0.26", (8, 7), "Orin")
    assert len(build_number) == 1 and "build number" in build_number[0]
    # a portable RTX engine (no SM target) is not pinned to the machine that built it
    portable = rtx_manifest("1.7.1.116")
    portable["build_machine"] = {"gpu": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}
    for cc in RTX_PORTABLE_CAPABILITIES:
        assert check_compatible(portable, "tensorrt-rtx", "1.7.1.116", cc, "some RTX") == []
    assert check_compatible(rtx_manifest("1.7.1", "SM89"), "tensorrt-rtx", "1.7.1", (8, 9), "RTX 4090") == []


class Validity(enum.Enum):
    VALID = 0
    SUBOPTIMAL = 1
    INVALID = 2


class FakeRuntime:
    """``Runtime.get_engine_validity(buffer) -> (EngineValidity, diagnostics bitmask)`` as in RTX 1.x."""

    def __init__(self, validity, diagnostics=0):
        self.answer = (validity, diagnostics)
        self.seen = []

    def get_engine_validity(self, buffer):
        self.seen.append(bytes(buffer))
        return self.answer


def test_rtx_runtime_validity_decides_when_available():
    blob = b"engine-bytes"
    # the runtime says valid: no version/CC guess from the manifest overrides it
    runtime = FakeRuntime(Validity.VALID)
    assert (
        check_compatible(
            rtx_manifest("1.7.1", "SM120"),
            "tensorrt-rtx",
            "1.7.1",
            (12, 0),
            "RTX 5090",
            engine_bytes=blob,
            runtime=runtime,
        )
        == []
    )
    assert runtime.seen == [blob]
    with pytest.raises(EngineError, match="version mismatch, unsupported compute capability"):
        check_compatible(
            rtx_manifest("1.7.0"),
            "tensorrt-rtx",
            "1.7.1",
            (12, 0),
            "RTX 5090",
            engine_bytes=blob,
            runtime=FakeRuntime(Validity.INVALID, 1 | 2),
        )
    warned = check_compatible(
        rtx_manifest("1.7.1"),
        "tensorrt-rtx",
        "1.7.1",
        (8, 6),
        "RTX 3080",
        engine_bytes=blob,
        runtime=FakeRuntime(Validity.SUBOPTIMAL, 4),
    )
    assert len(warned) == 1 and "CUDA driver too old" in warned[0]
    # without a GPU the validity check is not asked (it reports INVALID on a CPU-only machine)
    cpu = FakeRuntime(Validity.INVALID, 64)
    assert (
        check_compatible(rtx_manifest("1.7.1"), "tensorrt-rtx", "1.7.1", None, None, engine_bytes=blob, runtime=cpu)
        == []
        and cpu.seen == []
    )
    # a runtime without the API (TensorRT) falls back to exact versions
    with pytest.raises(EngineError, match="1.7.0 but 1.7.1"):
        check_compatible(
            rtx_manifest("1.7.0"), "tensorrt-rtx", "1.7.1", (12, 0), "RTX 5090", engine_bytes=blob, runtime=object()
        )


def test_real_rtx_validity_enum_matches_what_compat_reads():
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
    assert set(trt.EngineValidity.__members__) == {"VALID", "SUBOPTIMAL", "INVALID"}
    from hrm_deploy.runtime.compat import _DIAGNOSTICS

    assert {int(v) for v in trt.EngineInvalidityDiagnostics.__members__.values()} == set(_DIAGNOSTICS)
