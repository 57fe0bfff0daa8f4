"""``bench --host USER@HOST``: run the bench on another machine (a Jetson) over the system
``ssh``/``scp`` and bring the report back.

Copies the artifacts (with their manifests), the inputs as a small ``.npz`` (what the light
runtime reads) and, when the reference row is wanted, the checkpoint; runs
``<remote python> -m hrm_deploy bench`` there; fetches report.json/.md/.png. Arguments go to
``subprocess`` as lists (no local shell); the one string ssh sends to the remote shell is
built with ``shlex.quote`` on every part, so host names and paths cannot inject commands.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.bench.files import BENCH_FILES, ReportFolder
from hrm_deploy.errors import ConfigError, RemoteError
from hrm_deploy.manifest import check_artifact, manifest_path

_HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9._-]+$")
_SSH_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:=| ).+$")


def _check_host(host: str) -> None:
    if not _HOST.match(host) or host.startswith("-"):
        raise ConfigError(f"--host {host!r} is not USER@HOST (letters, digits, . _ - only)")


def ssh_options(options: Sequence[str]) -> list[str]:
    """``--ssh-option KEY=VALUE`` (repeatable) as ssh/scp arguments ``-o KEY=VALUE``.

    These are the user's own ssh configuration, passed through as documented (``man
    ssh_config``): anything ssh_config allows, ``ProxyCommand`` included, runs as the user.
    Only the form is checked, so an option cannot smuggle in another ssh flag."""
    out: list[str] = []
    for opt in options:
        if not _SSH_OPTION.match(opt) or "\n" in opt:
            raise ConfigError(f"--ssh-option {opt!r} is not an ssh_config option KEY=VALUE (e.g. Port=2222)")
        out += ["-o", opt]
    return out


class _Ssh:
    def __init__(self, host: str, options: Sequence[str]):
        self.host = host
        self.options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *options]

    def run(self, argv: list[str], check_reachable: bool = True) -> subprocess.CompletedProcess:
        remote = " ".join(shlex.quote(a) for a in argv)
        done = subprocess.run(["ssh", *self.options, "--", self.host, remote], capture_output=True, text=True)
        if done.returncode == 255 and check_reachable:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RemoteError(
                f"cannot reach {self.host} over SSH ({last}); check the address, that sshd runs "
                "there and that key-based login works (ssh-copy-id)"
            )
        return done

    def put(self, local: list[Path], remote_dir: str) -> None:
        done = subprocess.run(
            ["scp", "-q", *self.options, "--", *map(str, local), f"{self.host}:{remote_dir}/"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RemoteError(f"copying to {self.host}:{remote_dir} failed: {done.stderr.strip()[-300:]}")

    def get(self, remote_files: list[str], local_dir: Path) -> None:
        local_dir.mkdir(parents=True, exist_ok=True)
        sources = [f"{self.host}:{f}" for f in remote_files]
        done = subprocess.run(
            ["scp", "-q", *self.options, "--", *sources, str(local_dir) + "/"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RemoteError(f"fetching the report from {self.host} failed: {done.stderr.strip()[-300:]}")


def bench_remote(
    host: str,
    artifacts: list[str],
    config: Any,
    remote_python: str = "python3",
    ssh_options: Sequence[str] = (),
    quiet: bool = False,
) -> dict[str, Any]:
    """Run :func:`hrm_deploy.bench.run.bench` on ``host`` and return its report (also written
    to ``config.out_dir``). The upload and the remote run are shown as stages (elapsed time, and
    a heartbeat line in logs) unless ``quiet``: the remote bench's own output arrives at the end."""
    from hrm_deploy.artifacts import find_reference
    from hrm_deploy.bench.common import default_artifacts
    from hrm_deploy.bench.run import resolve_data
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.progress import Stages

    _check_host(host)
    folder = ReportFolder(config.out_dir, BENCH_FILES)  # what is fetched back, under the artifact rule
    folder.check()  # before the upload: no user's file in the output folder is replaced
    stages = Stages(quiet)
    paths = [Path(a) for a in artifacts] or default_artifacts()
    if not paths:
        raise ConfigError("--host needs the artifacts to copy: pass the engine paths (none in engines/)")
    ssh = _Ssh(host, ssh_options)
    for p in paths:
        if not p.is_file():
            raise ConfigError(f"{p} does not exist")
        check_artifact(p)  # only what its manifest describes is uploaded
    config = resolve_data(config, paths)
    examples = load_examples(config.data, config.accuracy_samples, split="test")
    made = ssh.run(["mktemp", "-d", "/tmp/hrm-deploy-bench.XXXXXX"])
    if made.returncode != 0:
        raise RemoteError(f"{host} could not make a work folder: {made.stderr.strip()[-300:]}")
    remote_dir = made.stdout.strip()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inputs = Path(tmp) / "inputs.npz"
            arrays: dict[str, np.ndarray] = {
                "inputs": examples.inputs,
                "puzzle_identifiers": examples.puzzle_identifiers,
            }
            if examples.labels is not None:
                arrays["labels"] = examples.labels
            np.savez(inputs, **arrays)  # type: ignore[arg-type]  # numpy 2's stub types **kwds as savez's flags
            files = [inputs, *paths, *[manifest_path(p) for p in paths if manifest_path(p).is_file()]]
            reference = None
            if config.include_reference:
                reference = Path(config.reference) if config.reference else find_reference(paths[0])
                files.append(reference)
            megabytes = sum(f.stat().st_size for f in files) / 1e6
            with stages.stage(f"copying {len(files)} files ({megabytes:.0f} MB) to {host}"):
                ssh.put(files, remote_dir)
        argv = [
            remote_python,
            "-m",
            "hrm_deploy",
            "bench",
            *[f"{remote_dir}/{p.name}" for p in paths],
            "--data",
            f"{remote_dir}/inputs.npz",
            "--target",
            config.target,
            "--batch",
            ",".join(map(str, config.batches)),
            *(["--iters", str(config.iters)] if config.iters is not None else ["--duration", str(config.duration_s)]),
            "--warmup",
            str(config.warmup),
            "--provider",
            config.provider,
            "--out",
            f"{remote_dir}/out",
        ]
        argv += ["--reference", f"{remote_dir}/{reference.name}"] if reference else ["--no-reference"]
        with stages.stage(f"bench on {host} ({len(paths)} artifacts, batches {config.batches})"):
            done = ssh.run(argv)
        if done.returncode != 0:
            text = done.stderr + done.stdout
            if "No module named" in text:
                raise RemoteError(
                    f"{host} has no hrm-deploy for {remote_python}; install it there (jetson/setup.sh) "
                    "or pass --remote-python"
                )
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            raise RemoteError(f"the bench on {host} failed: " + (errors[-1][7:] if errors else text.strip()[-300:]))
        listing = [n for n in ssh.run(["ls", f"{remote_dir}/out"]).stdout.split() if n in BENCH_FILES]
        with folder.writing({"host": host, "artifacts": [str(p) for p in paths]}) as stage:
            ssh.get([f"{remote_dir}/out/{name}" for name in listing], stage)
            try:
                report = json.loads((stage / "report.json").read_text())
            except (OSError, ValueError):
                raise RemoteError(f"the bench on {host} wrote no readable report.json") from None
    finally:
        ssh.run(["rm", "-rf", "--", remote_dir], check_reachable=False)
    report["remote_host"] = host
    return report
