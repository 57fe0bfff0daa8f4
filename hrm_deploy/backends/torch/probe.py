"""Probe-loading an AOTInductor package in a child process before the user's process loads it.

On GPUs, loading some packages in a fresh process killed it with a segmentation fault inside
torch's C++ package loader, a crash no ``try`` can catch. So before a ``.pt2`` is loaded
in-process, a child process (a fresh ``python``, never a fork) does the same load with the same
options and runs one batch-1 forward; the parent reads how it ended. The verdict is cached per
(package sha256, torch version, device, load options) in the user cache
(:func:`hrm_deploy.io.cache_dir`), so the probe costs a child process once per package and
machine; a probe that ran out of time is not cached. ``build-engine --backend torch`` probes its
own result, so a package that cannot be loaded is reported at build time.

The child runs ``python -m hrm_deploy.backends.torch.probe SPEC`` (:func:`child_command`); its
``TMPDIR`` is a folder removed after it ends, so a crashed child leaves no unzipped package.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0  # a CUDA load in a fresh process: import torch, CUDA init, unzip, first run
CACHE_FOLDER = "torch-load-probe"
# what the loading process sets up before a load (package.load_aoti_package): part of the cache key,
# so verdicts cached before a change of that setup are probed again
LOAD_SETUP = "amx-permission"


@dataclass(frozen=True)
class LoadVerdict:
    """How the child's load ended: ``ok``, or ``reason`` (one line: the signal or error and the
    step it reached); ``cached`` when read from the user cache."""

    ok: bool
    reason: str = ""
    seconds: float = 0.0
    cached: bool = False

    def record(self) -> dict[str, Any]:
        """The manifest's ``load_check`` entry."""
        return {"ok": self.ok, "reason": self.reason or None, "seconds": round(self.seconds, 1)}


@dataclass(frozen=True)
class ProbeSpec:
    """What the child loads and how: exactly the options of the in-process load."""

    path: str
    device: str  # "cuda" or "cpu"
    device_index: int
    single_threaded: bool
    tf32: bool
    io: list[dict[str, Any]]


def cache_file(sha256: str, torch_version: str, device_label: str, spec: ProbeSpec) -> Path:
    """The verdict's file in the user cache for this package, torch, device and load options."""
    from hrm_deploy.io import cache_dir

    key = json.dumps([sha256, torch_version, device_label, spec.single_threaded, spec.tf32, LOAD_SETUP])
    return cache_dir(CACHE_FOLDER, f"{sha256[:16]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json")


def child_command(spec: ProbeSpec) -> list[str]:
    """The child's command line (a fresh interpreter running :func:`child_main`)."""
    return [sys.executable, "-m", "hrm_deploy.backends.torch.probe", json.dumps(asdict(spec))]


def probe_load(
    spec: ProbeSpec, *, sha256: str, torch_version: str, device_label: str, timeout: float = PROBE_TIMEOUT_S
) -> LoadVerdict:
    """Load ``spec.path`` in a child process (or read the cached verdict) and say how it ended."""
    cached = cache_file(sha256, torch_version, device_label, spec)
    try:
        data = json.loads(cached.read_text())
        return LoadVerdict(bool(data["ok"]), str(data.get("reason") or ""), float(data.get("seconds", 0)), True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    verdict, final = _run_child(spec, timeout)
    if final:
        from hrm_deploy.io import write_json

        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            write_json(cached, {**asdict(verdict), "sha256": sha256, "torch": torch_version, "device": device_label})
        except OSError as exc:  # an unwritable cache costs a probe per load, nothing else
            log.debug("load probe verdict not cached in %s (%s)", cached, exc)
    return verdict


def _run_child(spec: ProbeSpec, timeout: float) -> tuple[LoadVerdict, bool]:
    """(verdict, whether it is final: cacheable). The child's TMPDIR is removed afterwards."""
    scratch = tempfile.mkdtemp(prefix="hrm-deploy-probe-")
    root = str(Path(__file__).resolve().parents[3])  # the folder holding hrm_deploy (a source tree too)
    env = dict(os.environ, TMPDIR=scratch, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_dir())  # the parent's, not one under TMPDIR
    start = time.perf_counter()
    try:
        done = subprocess.run(child_command(spec), capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return LoadVerdict(False, f"no answer within {timeout:.0f} s ({_last_step(out)})", timeout), False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - start
    if rc == 0 and "PROBE ok" in out:
        return LoadVerdict(True, "", seconds), True
    step = _last_step(out)
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return LoadVerdict(False, f"the loading process died of {name} ({step})", seconds), True
    error = next((ln[len("PROBE error ") :] for ln in out.splitlines() if ln.startswith("PROBE error ")), None)
    tail = error or (err.strip().splitlines() or [f"exit status {rc}"])[-1]
    return LoadVerdict(False, f"the load failed ({step}): {tail[:240]}", seconds), True


def _last_step(out: str) -> str:
    steps = [ln[len("PROBE step ") :] for ln in out.splitlines() if ln.startswith("PROBE step ")]
    return f"while {steps[-1]}" if steps else "before importing torch"


def _inductor_cache_dir() -> str:
    """Inductor's cache folder as this process sees it (the child's TMPDIR differs)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return str(cache_dir())
    except Exception:  # noqa: BLE001 - an older torch: its default, from the same temp folder
        import getpass

        return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


def _feeds(torch: Any, io: list[dict[str, Any]], batch: int, device: str) -> list[Any]:
    """Inputs of the engine's contract at ``batch``: zeros, and True for boolean (reset) flags."""
    feeds = []
    for t in io:
        if t["is_input"]:
            shape = [batch if d == -1 else d for d in t["shape"]]
            dtype = getattr(torch, t["dtype"])
            make = torch.ones if t["dtype"] == "bool" else torch.zeros
            feeds.append(make(shape, dtype=dtype, device=device))
    return feeds


def child_main(raw: str) -> None:
    """The child: CUDA set up as the runner does, the package loaded with the runner's options,
    one forward at batch 1. Prints ``PROBE step ...`` as it goes and ``PROBE ok`` at the end."""

    def step(name: str) -> None:
        print(f"PROBE step {name}", flush=True)

    spec = ProbeSpec(**json.loads(raw))
    step("importing torch")
    import torch

    from hrm_deploy.backends.torch.package import load_aoti_package, set_tf32

    cuda = spec.device == "cuda"
    if cuda:
        step("initialising CUDA")
        torch.cuda.init()
        torch.cuda.set_device(spec.device_index)
        set_tf32(torch, spec.tf32)
    step("loading the package")
    fn, _ = load_aoti_package(
        torch, Path(spec.path), single_threaded=spec.single_threaded, device_index=spec.device_index if cuda else -1
    )
    step("running batch 1")
    with torch.no_grad():
        fn(*_feeds(torch, spec.io, 1, f"cuda:{spec.device_index}" if cuda else "cpu"))
    if cuda:
        torch.cuda.synchronize()
    step("releasing the package")
    del fn
    print("PROBE ok", flush=True)


if __name__ == "__main__":
    try:
        child_main(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - any failure: one line for the parent
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        print(f"PROBE error {type(exc).__name__}: {first}", flush=True)
        sys.exit(3)
