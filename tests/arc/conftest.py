"""Fixtures of the ARC tests: a tiny random HRM (or TRM) and a small-canvas dataset built from self-made tasks."""

from __future__ import annotations

import pytest

from tests.arc.test_data import make_tasks

SIDE = 5  # canvas 5x5: seq_len 25 keeps the model tiny


def small_arc_dataset(tmp_path):
    """(dataset folder, identifiers): the self-made tasks with 3 augmented copies each on a SIDE x SIDE canvas."""
    from hrm_deploy.data.arc import ArcSpec, build_arc

    data = tmp_path / "arc"
    _, identifiers = build_arc(ArcSpec(str(make_tasks(tmp_path / "src")), num_aug=3, max_grid=SIDE), data)
    return data, identifiers


def random_arc_model(tmp_path, family: str = "hrm"):
    """(checkpoint, dataset, tmp_path): a random tiny model of ``family`` sized for the dataset's identifiers."""
    import dataclasses

    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model

    data, identifiers = small_arc_dataset(tmp_path)
    sizes = dict(seq_len=SIDE * SIDE, vocab_size=12, num_puzzle_identifiers=len(identifiers))
    if family == "trm":
        from tests.train.test_trm_train import MICRO_TRM

        config = dataclasses.replace(MICRO_TRM, **sizes)
    else:
        config = HRMConfig(
            **sizes,
            hidden_size=32,
            num_heads=2,
            H_layers=1,
            L_layers=1,
            H_cycles=1,
            L_cycles=1,
            halt_max_steps=2,
            expansion=2.0,
            puzzle_emb_ndim=32,
            pos_encodings="rope",
        )
    name = "model.pt" if family == "hrm" else f"{family}.pt"
    checkpoint = save_checkpoint(tmp_path / name, build_model(config, seed=0).eval())
    return checkpoint, data, tmp_path


@pytest.fixture
def arc_run(tmp_path):
    """(checkpoint, dataset, tmp_path) of a random tiny HRM sized for the dataset's puzzle identifiers."""
    return random_arc_model(tmp_path)


@pytest.fixture
def trm_run(tmp_path):
    """The same with a random tiny TRM."""
    return random_arc_model(tmp_path, "trm")
