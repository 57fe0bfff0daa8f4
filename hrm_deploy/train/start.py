"""Where a run of the trainer starts when it does not start from scratch (``hrm_deploy.arc.adapt``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hrm_deploy.model.hrm import HRMACT


@dataclass(frozen=True)
class Start:
    """Hooks of :func:`hrm_deploy.train.loop.train`: ``model`` replaces the fresh model of a new run
    (ignored on resume: the checkpoint has the weights); ``frozen_weights`` keeps every parameter as
    it is, so only the puzzle-embedding rows the batches look up learn (their sign-SGD);
    ``should_stop(step)`` ends the run early (a time budget) with a final checkpoint, as
    ``stop_after`` does."""

    model: HRMACT | None = None
    frozen_weights: bool = False
    should_stop: Callable[[int], bool] | None = None

    def over(self, position: int) -> bool:
        """True when ``should_stop`` says the run ends before step ``position + 1``."""
        return self.should_stop is not None and self.should_stop(position)
