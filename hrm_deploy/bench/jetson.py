"""Jetson facts and power: detection, JetPack/L4T/nvpmodel/clocks, and ``tegrastats`` sampling.

tegrastats lines look like (Orin Nano/NX; AGX adds rails such as VDD_GPU_SOC and VDD_CPU_CV):
``RAM 2785/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) CPU [2%@1510,...] EMC_FREQ 0%@2133
GR3D_FREQ 0%@[305] cpu@48.5C soc2@47.4C gpu@48.0C tj@49.2C VDD_IN 4820mW/4820mW
VDD_CPU_GPU_CV 561mW/561mW VDD_SOC 1402mW/1402mW``
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from hrm_deploy.system import TEGRA_RELEASE, jetson_model

_RAM = re.compile(r"RAM (\d+)/(\d+)MB")
_GR3D = re.compile(r"GR3D_FREQ (\d+)%(?:@\[?(\d+)(?:,\d+)*\]?)?")
_TEMP = re.compile(r"(\w+)@(-?[\d.]+)C")
_RAIL = re.compile(r"(VDD_\w+|VIN_\w+) (\d+)mW/(\d+)mW")


def parse_tegrastats(line: str) -> dict[str, Any]:
    """One tegrastats line -> RAM (MB), GPU load (%) and frequency (MHz), temperatures (C), rails (mW)."""
    out: dict[str, Any] = {}
    if m := _RAM.search(line):
        out["ram_used_mb"], out["ram_total_mb"] = int(m.group(1)), int(m.group(2))
    if m := _GR3D.search(line):
        out["gpu_load_pct"] = int(m.group(1))
        if m.group(2):
            out["gpu_freq_mhz"] = int(m.group(2))
    temps = {name: float(value) for name, value in _TEMP.findall(line) if not name.isdigit()}
    if temps:
        out["temps_c"] = temps
    rails = {name: int(now) for name, now, _avg in _RAIL.findall(line)}
    if rails:
        out["power_mw"] = rails
    return out


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and peak of each rail, RAM, GPU load/frequency and the hottest temperature."""
    summary: dict[str, Any] = {"samples": len(samples)}
    rails = sorted({r for s in samples for r in s.get("power_mw", {})})
    for rail in rails:
        values = [s["power_mw"][rail] for s in samples if rail in s.get("power_mw", {})]
        summary[f"{rail}_mean_mw"] = sum(values) / len(values)
        summary[f"{rail}_peak_mw"] = max(values)
    for key in ("ram_used_mb", "gpu_load_pct", "gpu_freq_mhz"):
        values = [s[key] for s in samples if key in s]
        if values:
            summary[f"{key}_mean"] = sum(values) / len(values)
            summary[f"{key}_peak"] = max(values)
    temps = [max(s["temps_c"].values()) for s in samples if s.get("temps_c")]
    if temps:
        summary["temp_peak_c"] = max(temps)
    return summary


class Tegrastats:
    """``with Tegrastats() as t: ...`` samples tegrastats every ``interval_ms`` during the block."""

    def __init__(self, interval_ms: int = 100):
        self.interval_ms = interval_ms
        self.samples: list[dict[str, Any]] = []

    def __enter__(self) -> Tegrastats:
        exe = shutil.which("tegrastats")
        if exe is None:
            raise FileNotFoundError("tegrastats not found (it ships with JetPack)")
        self._log = tempfile.NamedTemporaryFile("r", suffix=".log", delete=False)
        self._proc = subprocess.Popen(
            [exe, "--interval", str(self.interval_ms), "--logfile", self._log.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(self.interval_ms / 1000 * 2)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        lines = Path(self._log.name).read_text().splitlines()
        Path(self._log.name).unlink(missing_ok=True)
        self.samples = [parse_tegrastats(line) for line in lines if line.strip()]


def environment() -> dict[str, Any]:
    """JetPack/L4T release, nvpmodel mode and jetson_clocks state (what can be read without sudo)."""
    env: dict[str, Any] = {"model": jetson_model()}
    if TEGRA_RELEASE.is_file():
        env["l4t_release"] = TEGRA_RELEASE.read_text().splitlines()[0].strip()

    def run(cmd: list[str]) -> str | None:
        if shutil.which(cmd[0]) is None:
            return None
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    env["nvpmodel"] = run(["nvpmodel", "-q"])
    clocks = run(["jetson_clocks", "--show"])
    env["jetson_clocks_pinned"] = None if clocks is None else _clocks_pinned(clocks)
    return env


def _clocks_pinned(show: str) -> bool:
    """jetson_clocks --show prints per-cluster ``MinFreq=... MaxFreq=... CurrentFreq=...``;
    pinned means the GPU's current frequency equals its maximum."""
    for line in show.splitlines():
        if line.startswith("GPU"):
            freqs = dict(re.findall(r"(\w+Freq)=(\d+)", line))
            return bool(freqs) and freqs.get("CurrentFreq") == freqs.get("MaxFreq")
    return False
