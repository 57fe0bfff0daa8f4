"""Choices of the ARC evaluation (no heavy imports: the CLI reads them at start-up)."""

from __future__ import annotations

import enum


class TaskScore(str, enum.Enum):
    """How a task with several test inputs scores."""

    FRACTION = "fraction"  # TRM's evaluators/arc.py: the fraction of its test inputs that pass
    ALL = "all"  # HRM's arc_eval.ipynb: 1 when every test input passes, else 0


class AdaptTrain(str, enum.Enum):
    """What ``adapt`` trains."""

    EMBEDDINGS = "embeddings"  # only the new puzzle-embedding rows (every weight frozen)
    ALL = "all"  # the new rows and every weight (the model changes: export it again)
