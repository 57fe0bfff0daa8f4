"""The Sudoku-size model several benchmarks measure: the ``sudoku`` preset's architecture
(hidden 512, 4 H + 4 L layers, 2 x 2 cycles, 16 ACT steps) for 81-cell Sudoku, float32, random
weights from a seed. Imported by the scripts beside it (``python benchmarks/<script>.py`` puts
this folder on ``sys.path``)."""

from __future__ import annotations


def sudoku_size_config():
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.train.presets import preset

    return HRMConfig(
        seq_len=81, vocab_size=11, num_puzzle_identifiers=1, **{**preset("sudoku")["model"], "forward_dtype": "float32"}
    )


def sudoku_size_model(seed: int = 0):
    """The random-weight Sudoku-size ``HRMACT``."""
    from hrm_deploy.model.hrm import build_model

    return build_model(sudoku_size_config(), seed=seed)
