"""A report folder under the artifact rule (``bench -o`` and ``profile -o``).

One run's files are published together: the main file (``report.json`` or ``profile.json``) with
a manifest that names every other file of that run as a companion (``report.md``, ``latency.png``,
``halting.json`` ...). A later run replaces only files a run of ours wrote there; a user's own
``report.json`` or ``report.md`` in the folder is refused in one line before any work; a file an
earlier run wrote and this one does not (a ``halting.png``) is removed with the publication, so the
folder never mixes two runs. A kill leaves the old files or the new ones.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hrm_deploy.io import staging_dir
from hrm_deploy.manifest import manifest_path, read_manifest
from hrm_deploy.outputs import check_user_output, publish_output

BENCH_FILES = ("report.json", "report.md", "latency.png", "halting.json", "halting.png")
PROFILE_FILES = ("profile.json", "profile.md", "profile.png")


class ReportFolder:
    """The files ``names`` (the first is the main one) of one run in ``out``; :meth:`check` before
    the work, :meth:`writing` to write them into a staging folder that is published on success."""

    def __init__(self, out: str | os.PathLike, names: tuple[str, ...]):
        self.out, self.names = Path(out), names
        self.main = self.out / names[0]

    def check(self) -> None:
        """Refuse (one ArtifactError line) files of this run's names that hrm-deploy did not write."""
        check_user_output(self.main, companions=[self.out / n for n in self.names[1:]])

    def path(self, name: str) -> Path:
        """Where ``name`` will be once published (what reports record)."""
        return self.out / name

    @contextlib.contextmanager
    def writing(self, config: dict[str, Any]) -> Iterator[Path]:
        """A staging folder in ``out`` to write the run's files into (the main one included); on a
        normal exit they are published with one manifest (whose publication checks the main file once
        more), stale files of the last run removed."""
        with staging_dir(self.out, "stage") as stage:
            yield stage
            written = {p.name: p for p in stage.iterdir() if p.is_file()}
            unknown = set(written) - set(self.names)
            assert not unknown, f"report files outside {self.names}: {sorted(unknown)}"  # internal bug
            companions: dict[str | os.PathLike, str | bytes] = {
                self.out / n: written[n].read_bytes() for n in self.names[1:] if n in written
            }
            stale = [self.out / n for n in self._owned() if n not in written and (self.out / n).is_file()]
            publish_output(
                self.main,
                written[self.names[0]].read_bytes(),
                stage="report",
                config=config,
                companions=companions,
                remove=stale,
            )

    def _owned(self) -> list[str]:
        """The companions the last run's manifest names (files of ours that may go)."""
        if not manifest_path(self.main).is_file():
            return []
        return list(read_manifest(self.main).get("companions") or {})
