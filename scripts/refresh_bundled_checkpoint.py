"""Re-make the embedded default ``hrm_deploy/train/presets/sudoku-tiny.pt``: generate the
preset's dataset, train the ``sudoku-tiny`` preset on CPU, and keep weights + provenance
(model and train config, dataset spec, final metrics) without optimizer state.

    python scripts/refresh_bundled_checkpoint.py [--workdir /tmp/tiny-bundle]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.model.checkpoint import model_from_contents, read_checkpoint, save_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.train.loop import TrainConfig, train
from hrm_deploy.train.presets import preset

BUNDLED = Path(__file__).resolve().parents[1] / "hrm_deploy" / "train" / "presets" / "sudoku-tiny.pt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/tiny-bundle")
    args = parser.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    chosen = preset("sudoku-tiny")
    spec = SudokuSpec(**chosen["data"])
    generate_sudoku(spec, str(work / "data"))
    model_config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, **chosen["model"])
    config = TrainConfig(data_path=str(work / "data"), out_dir=str(work / "run"), device="cpu", **chosen["train"])
    result = train(model_config, config)
    contents = read_checkpoint(result.checkpoint)
    save_checkpoint(BUNDLED, model_from_contents(contents), step=contents.step or 0,
                    train_config=contents.train_config, metrics=result.metrics,
                    dataset={"generator": "sudoku", **dataclasses.asdict(spec)})
    print(f"wrote {BUNDLED}: test exact accuracy {result.metrics['eval']['exact_accuracy']:.3f}")


if __name__ == "__main__":
    main()
