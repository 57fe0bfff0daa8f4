"""docs/published.md's Sudoku-Extreme commands work as written: run word for word (``hrm-deploy``
as ``python -m hrm_deploy``) against a Hugging Face cache, offline, that holds repositories of the
published names in the published layout, with a tiny model and a tiny benchmark in them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_cache import add_repo, published_checkpoint_files, sudoku_csv

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (pip install 'hrm-deploy[hub]')")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'hrm-deploy[onnx]')")


def _commands(section: str) -> list[list[str]]:
    """The hrm-deploy command lines of the first bash block under ``## <section>``."""
    text = (ROOT / "docs" / "published.md").read_text()
    block = re.search(rf"## {re.escape(section)}.*?```bash\n(.*?)```", text, re.S)
    assert block, f"no bash block under '## {section}'"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [words for words in lines if words and words[0] == "hrm-deploy"]


@pytest.mark.slow
def test_sudoku_extreme_commands_work_as_written(tmp_path, tiny_model):
    home = tmp_path / "hf"
    add_repo(home, "sapientinc/HRM-checkpoint-sudoku-extreme", published_checkpoint_files(tiny_model))
    add_repo(home, "sapientinc/sudoku-extreme", {"train.csv": sudoku_csv(4), "test.csv": sudoku_csv(12, 1)}, "dataset")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HRM_DEPLOY_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(ROOT)
    env.pop("HF_HUB_CACHE", None)
    commands = _commands("Sudoku-Extreme: download to verify")
    assert [c[1] for c in commands] == ["export", "build-engine", "verify", "inspect"]
    for words in commands:
        done = subprocess.run(
            [sys.executable, "-m", "hrm_deploy", *words[1:]],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{shlex.join(words)}: {done.stdout}{done.stderr}"
    assert '"repo": "sapientinc/HRM-checkpoint-sudoku-extreme"' in done.stdout
