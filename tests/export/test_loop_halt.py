"""The rule a loop graph fixes at export decides as the host loop's rule does, and refuses in one line
what it cannot fix."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError
from hrm_deploy.export.loop import LoopHalt
from hrm_deploy.halting import HaltRule


@pytest.mark.parametrize(
    ("text", "q_halt_only", "min_steps"),
    [("off", False, 1), ("q", False, 1), ("q", True, 1), ("threshold:0.7", False, 1), ("q", False, 3)],
)
def test_the_loop_rule_decides_as_the_host_rule(text: str, q_halt_only: bool, min_steps: int) -> None:
    loop = LoopHalt.parse(text, q_halt_only=q_halt_only, min_steps=min_steps)
    host = replace(HaltRule.parse(text, min_steps=min_steps), q_halt_only=q_halt_only and text == "q")
    rng = np.random.default_rng(0)
    for step in range(1, 9):
        q_halt, q_continue = rng.normal(size=64).astype(np.float32), rng.normal(size=64).astype(np.float32)
        assert np.array_equal(
            loop.should_halt(step, q_halt, q_continue, 8), host.should_halt(step, q_halt, q_continue, total_steps=8)
        ), (text, step)


@pytest.mark.parametrize(
    ("text", "match"), [("budget:1", "--mode step"), ("threshold:2", "0 < X < 1"), ("sometimes", "off, q")]
)
def test_rules_a_loop_graph_cannot_fix_are_one_line(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LoopHalt.parse(text, q_halt_only=False)
