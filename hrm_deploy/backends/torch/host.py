"""What a compiled package's loading depends on outside the package: the host CPU (its model and
instruction-set flags: the package's CPU code was compiled for some of them, and the AMX
permission question only arises on CPUs with AMX tiles), the NVIDIA driver, the AMX tile-data
permission of this process. The load probe keys its cached verdicts on these and records them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import platform
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# the instruction-set flags that AOTInductor's CPU code and the AMX question depend on
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
ARCH_GET_XCOMP_PERM = 0x1022
SYS_ARCH_PRCTL = 158  # x86-64
XFEATURE_XTILEDATA = 18


@functools.cache
def cpu_identity(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """``{"model", "flags_digest", "isa"}`` of this host's CPU: the model name, a digest of its whole
    flag list (any change of microcode-exposed features changes it) and the flags of
    :data:`ISA_FLAGS` it has. Without ``/proc/cpuinfo`` (not Linux): ``platform.processor()``."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    fields = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())]
    fallback = platform.processor() or platform.machine()
    model = next((v for k, v in fields if k in ("model name", "Model")), fallback)
    flags = next((v for k, v in fields if k in ("flags", "Features")), "")
    have = set(flags.split())
    digest = hashlib.sha256(" ".join(sorted(have)).encode()).hexdigest()[:16]
    return {"model": model, "flags_digest": digest, "isa": [f for f in ISA_FLAGS if f in have]}


def xcomp_permission_mask() -> int | None:
    """This process's permitted extended-state components (``arch_prctl(ARCH_GET_XCOMP_PERM)``): bit
    18 is AMX tile data. None where the call is not available (not x86-64 Linux)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_uint64(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
            return None
        return int(mask.value)
    except (OSError, AttributeError):
        return None


def amx_permitted(mask: int | None) -> bool | None:
    """Whether ``mask`` permits AMX tile data (None: unknown)."""
    return None if mask is None else bool(mask >> XFEATURE_XTILEDATA & 1)


@functools.cache
def driver_version() -> str | None:
    """The NVIDIA driver's version (``/proc/driver/nvidia/version``, else nvidia-smi); None without one."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        for word in first.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except (OSError, IndexError):
        pass
    from hrm_deploy.system import gpu_identity

    return gpu_identity().get("driver") or None
