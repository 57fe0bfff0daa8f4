"""Probe-loading an AOTInductor package in a child process before the user's process loads it.

On GPUs, loading some packages in a fresh process killed it with a segmentation fault inside
torch's C++ package loader, a crash no ``try`` can catch. So before a ``.pt2`` is loaded
in-process, a child process (a fresh ``python``, never a fork) does the same load with the same
options (the load fixes of :func:`~.package.prepare_load` first, before CUDA), runs batch 1 and
the largest batch, and, where the runner captures CUDA graphs, one capture and replay; the parent
reads how it ended. ``build-engine --backend torch`` probes its own result, so a package that
cannot be loaded is reported at build time.

The cache. A verdict is cached per key: package sha256, torch version, device, load options,
load fixes, host CPU (model and a digest of its flags) and NVIDIA driver (:func:`probe_key`),
in the user cache (:func:`hrm_deploy.io.cache_dir`), so the probe costs a child process once per
package and machine. Only a verdict about the package is cached: a child killed from outside
(SIGKILL: the OOM killer; SIGTERM, SIGINT, SIGHUP), out of memory or out of time says nothing
about the package and is probed again next time.

The seal. A cached "loads fine" lets the user's process load the package in-process, where a
crash kills it; so a cached verdict is honoured only with a seal: an HMAC-SHA256 of the key and
the verdict under a secret of this user (:func:`_seal_key`: 32 random bytes in a file of mode
0600 owned by this user, in a private folder beside the verdicts). A verdict without a seal,
with a bad one, with a key other than the current one, or edited (``ok`` flipped, a verdict of
another package copied over) is ignored and the package probed again. Whoever cannot read the
secret (another user of a shared ``$HRM_DEPLOY_CACHE``, a cache copied from another machine, a
disk error) therefore cannot make this process load in-process what no child of this user, host,
driver and torch has loaded; a forged "cannot load" only selects the fallback. (A process of the
same user can rewrite hrm-deploy itself: no seal helps there.)

The child runs ``python -m hrm_deploy.backends.torch.probe SPEC`` (:func:`child_command`); its
``TMPDIR`` is a folder removed after it ends, so a crashed child leaves no unzipped package.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0  # a CUDA load in a fresh process: import torch, CUDA init, unzip, first runs
CACHE_FOLDER = "torch-load-probe"
KEY_FOLDER = "torch-load-probe-seal"  # the seal's secret: a private folder, not the verdicts' one
RECORD_VERSION = 2
# ended by something outside the package: the OOM killer, a user, a shell: probed again next time
EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
OUT_OF_MEMORY = ("MemoryError", "OutOfMemoryError", "out of memory")


@dataclass(frozen=True)
class LoadVerdict:
    """How the child's load ended: ``ok``, or ``reason`` (one line: the signal or error and the
    step it reached); ``cached`` when read from the user cache; ``facts``: what the child set up
    and saw (load fixes, AMX permission and mask, host CPU, driver, torch)."""

    ok: bool
    reason: str = ""
    seconds: float = 0.0
    cached: bool = False
    facts: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The manifest's ``load_check`` entry."""
        return {"ok": self.ok, "reason": self.reason or None, "seconds": round(self.seconds, 1), **self.facts}


@dataclass(frozen=True)
class ProbeSpec:
    """What the child loads and how: exactly the options of the in-process load; ``max_batch``
    is run after batch 1, and ``capture`` captures and replays one call in a CUDA graph."""

    path: str
    device: str  # "cuda" or "cpu"
    device_index: int
    single_threaded: bool
    tf32: bool
    io: list[dict[str, Any]]
    max_batch: int = 1
    capture: bool = False


def probe_key(sha256: str, torch_version: str, device_label: str, spec: ProbeSpec) -> dict[str, Any]:
    """Everything a verdict depends on besides the child's luck: the package, torch, the device,
    the load options, the load fixes, the host CPU and the NVIDIA driver."""
    from hrm_deploy.backends.torch.host import cpu_identity, driver_version
    from hrm_deploy.backends.torch.package import load_fixes

    cpu = cpu_identity()
    return {
        "sha256": sha256,
        "torch": torch_version,
        "device": device_label,
        "single_threaded": spec.single_threaded,
        "tf32": spec.tf32,
        "max_batch": spec.max_batch,
        "capture": spec.capture,
        "fixes": [f.value for f in load_fixes()],
        "cpu": cpu["model"],
        "cpu_flags": cpu["flags_digest"],
        "driver": driver_version() if spec.device == "cuda" else None,
    }


def cache_file(sha256: str, torch_version: str, device_label: str, spec: ProbeSpec) -> Path:
    """The verdict's file in the user cache for this package and the rest of its key."""
    from hrm_deploy.io import cache_dir

    key = _canonical(probe_key(sha256, torch_version, device_label, spec))
    return cache_dir(CACHE_FOLDER, f"{sha256[:16]}-{hashlib.sha256(key).hexdigest()[:16]}.json")


def child_command(spec: ProbeSpec) -> list[str]:
    """The child's command line (a fresh interpreter running :func:`child_main`)."""
    return [sys.executable, "-m", "hrm_deploy.backends.torch.probe", json.dumps(asdict(spec))]


def probe_load(
    spec: ProbeSpec, *, sha256: str, torch_version: str, device_label: str, timeout: float = PROBE_TIMEOUT_S
) -> LoadVerdict:
    """Load ``spec.path`` in a child process (or read the sealed cached verdict) and say how it ended."""
    key = probe_key(sha256, torch_version, device_label, spec)
    cached = cache_file(sha256, torch_version, device_label, spec)
    verdict = read_verdict(cached, key)
    if verdict is not None:
        return verdict
    verdict, final = _run_child(spec, timeout)
    if final:
        try:
            write_verdict(cached, key, verdict)
        except OSError as exc:  # an unwritable cache costs a probe per load, nothing else
            log.debug("load probe verdict not cached in %s (%s)", cached, exc)
    return verdict


def write_verdict(path: Path, key: dict[str, Any], verdict: LoadVerdict) -> None:
    """``path``: the key, the verdict and their seal (atomically)."""
    from hrm_deploy.io import write_json

    body = {"version": RECORD_VERSION, "key": key, "verdict": {**asdict(verdict), "cached": False}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {**body, "seal": _seal(body)})


def read_verdict(path: Path, key: dict[str, Any]) -> LoadVerdict | None:
    """The verdict cached in ``path`` for ``key``, or None (probe again) where there is none, it is
    unreadable, its key differs, or its seal is missing or does not match."""
    try:
        data = json.loads(path.read_text())
        body = {k: data[k] for k in ("version", "key", "verdict")}
        seal = data.get("seal")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if body["key"] != key or body["version"] != RECORD_VERSION:
        log.debug("cached load verdict %s is for another key: probing again", path)
        return None
    if not isinstance(seal, str) or not hmac.compare_digest(seal, _seal(body)):
        log.warning("the cached load verdict %s has a missing or bad seal: ignored, the package is probed again", path)
        return None
    v = body["verdict"]
    try:
        facts = dict(v.get("facts") or {})
        return LoadVerdict(v["ok"] is True, str(v.get("reason") or ""), float(v.get("seconds", 0)), True, facts)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()


def _seal(body: dict[str, Any]) -> str:
    return hmac.new(_seal_key(), _canonical(body), hashlib.sha256).hexdigest()


def _seal_key() -> bytes:
    """This user's secret for verdict seals: ``<cache>/torch-load-probe-seal/key``, created once
    (mode 0600 in a 0700 folder). A key file that is not a regular file of this user readable by
    it alone is replaced (the verdicts sealed with it are then probed again)."""
    from hrm_deploy.io import cache_dir

    path = cache_dir(KEY_FOLDER, "key")
    try:
        info = os.lstat(path)
        private = not hasattr(os, "getuid") or (info.st_uid == os.getuid() and info.st_mode & 0o077 == 0)
        if private and os.path.isfile(path) and not path.is_symlink():
            data = path.read_bytes()
            if len(data) == 32:
                return data
    except OSError:
        pass
    key = secrets.token_bytes(32)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_private(path, key)
    except OSError as exc:  # no place for a secret: this process's key (its verdicts die with it)
        log.debug("no seal key saved in %s (%s)", path, exc)
    return key


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path`` atomically, mode 0600 (mkstemp's) kept."""
    fd, tmp = tempfile.mkstemp(prefix=".key.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


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
        return LoadVerdict(
            False, f"no answer within {timeout:.0f} s ({_last_step(out)})", timeout, False, _facts(out)
        ), False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return judge(rc, out, err, time.perf_counter() - start)


def judge(rc: int, out: str, err: str, seconds: float) -> tuple[LoadVerdict, bool]:
    """The verdict of a child that ended with status ``rc`` and printed ``out``/``err``, and whether
    it says something about the package (cacheable): not a kill from outside, not out of memory."""
    facts = _facts(out)
    if rc == 0 and "PROBE ok" in out:
        return LoadVerdict(True, "", seconds, False, facts), True
    step = _last_step(out)
    if rc < 0 or rc in (128 + signal.SIGKILL, 128 + signal.SIGTERM):  # a signal (or a shell's report of one)
        number = -rc if rc < 0 else rc - 128
        try:
            sig = signal.Signals(number)
            name = sig.name
        except ValueError:
            sig, name = None, f"signal {number}"
        final = sig not in EXTERNAL_SIGNALS
        why = "" if final else ": killed from outside (the OOM killer?), probed again next time"
        return LoadVerdict(False, f"the loading process died of {name} ({step}){why}", seconds, False, facts), final
    error = next((ln[len("PROBE error ") :] for ln in out.splitlines() if ln.startswith("PROBE error ")), None)
    tail = error or (err.strip().splitlines() or [f"exit status {rc}"])[-1]
    final = not any(word in tail for word in OUT_OF_MEMORY)
    return LoadVerdict(False, f"the load failed ({step}): {tail[:240]}", seconds, False, facts), final


def _last_step(out: str) -> str:
    steps = [ln[len("PROBE step ") :] for ln in out.splitlines() if ln.startswith("PROBE step ")]
    return f"while {steps[-1]}" if steps else "before importing torch"


def _facts(out: str) -> dict[str, Any]:
    """The child's last ``PROBE facts {json}`` line ({} where none)."""
    for line in reversed(out.splitlines()):
        if line.startswith("PROBE facts "):
            try:
                data = json.loads(line[len("PROBE facts ") :])
                return data if isinstance(data, dict) else {}
            except ValueError:
                return {}
    return {}


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
    """The child: the load fixes, CUDA set up as the runner does, the package loaded with the
    runner's options, batch 1, the largest batch, a capture and replay where asked. Prints
    ``PROBE step ...`` as it goes, ``PROBE facts {...}`` and ``PROBE ok`` at the end."""

    def step(name: str) -> None:
        print(f"PROBE step {name}", flush=True)

    spec = ProbeSpec(**json.loads(raw))
    step("importing torch")
    import torch

    from hrm_deploy.backends.torch.host import cpu_identity, driver_version, xcomp_permission_mask
    from hrm_deploy.backends.torch.package import load_aoti_package, prepare_load, set_tf32

    step("applying the load fixes")
    facts = {**prepare_load(torch), "torch": torch.__version__, "cpu": cpu_identity()}
    cuda = spec.device == "cuda"
    if cuda:
        step("initialising CUDA")
        torch.cuda.init()
        torch.cuda.set_device(spec.device_index)
        set_tf32(torch, spec.tf32)
        facts["driver"] = driver_version()
    mask = xcomp_permission_mask()
    facts["xcomp_mask_at_load"] = None if mask is None else hex(mask)
    print(f"PROBE facts {json.dumps(facts)}", flush=True)  # before the load: a dying child still told
    step("loading the package")
    fn, _ = load_aoti_package(
        torch, Path(spec.path), single_threaded=spec.single_threaded, device_index=spec.device_index if cuda else -1
    )
    where = f"cuda:{spec.device_index}" if cuda else "cpu"
    with torch.no_grad():
        for batch in sorted({1, max(1, spec.max_batch)}):
            step(f"running batch {batch}")
            fn(*_feeds(torch, spec.io, batch, where))
            if cuda:
                torch.cuda.synchronize()
        if cuda and spec.capture:
            _capture_and_replay(torch, fn, _feeds(torch, spec.io, 1, where), step)
    step("releasing the package")
    del fn
    print("PROBE ok", flush=True)


def _capture_and_replay(torch: Any, fn: Any, feeds: list[Any], step: Any) -> None:
    """One call captured in a CUDA graph (on a side stream, after a warm-up call there, as the
    device loop does) and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*feeds)
    torch.cuda.current_stream().wait_stream(stream)
    step("capturing a CUDA graph")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*feeds)
    step("replaying the CUDA graph")
    graph.replay()
    torch.cuda.synchronize()


if __name__ == "__main__":
    try:
        child_main(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - any failure: one line for the parent
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        print(f"PROBE error {type(exc).__name__}: {first}", flush=True)
        sys.exit(3)
