"""A PyTorch loop engine: ``export --mode loop`` built with ``--backend torch`` is one AOTInductor
package whose ACT loop is a ``torch.while_loop``; it answers as the host loop with the same rule."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.torch.builder.options import TorchOptions
from hrm_deploy.errors import ConfigError

pytestmark = pytest.mark.slow  # an AOTInductor compile and its load probe: a minute or two


def test_a_cpu_loop_engine_halts_each_row_where_the_host_loop_does(bundled_export, trained_small, tmp_path):
    from hrm_deploy.backends import open_runner
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.halting import resolve_rule
    from hrm_deploy.manifest import read_manifest
    from tests.serve.helpers import puzzles

    loop = bundled_export(mode="loop", halt="q")
    step = bundled_export(mode="step")
    engine = build_engine(
        loop,
        EngineConfig(precision="fp32", backend="torch", max_batch=64, options=TorchOptions(device="cpu")),
        tmp_path / "m.pt2",
        quiet=True,
    ).path
    manifest = read_manifest(engine)
    assert manifest["mode"] == "loop" and manifest["halt"]["rule"] == "q" and manifest["load_check"]["ok"]
    tokens, ids = puzzles(trained_small.data, 48)
    feeds = {"inputs": tokens, "puzzle_identifiers": ids}
    with open_runner(engine) as runner:
        got = runner.infer(feeds)
        with pytest.raises(ConfigError, match="loop engine"):
            runner.infer(feeds, halt=resolve_rule("q", str(step)).should_halt)
    with open_runner(step) as runner:
        host = runner.infer(feeds, halt=resolve_rule("q", str(step)).should_halt)
    assert got["steps_used"].min() < got["steps_used"].max()  # rows really halt at different steps
    assert np.array_equal(got["steps_used"], host["steps_used"])
    assert np.array_equal(got["logits"].argmax(-1), host["logits"].argmax(-1))
    np.testing.assert_allclose(got["logits"], host["logits"], atol=1e-2)
    np.testing.assert_allclose(got["q_halt_logits"], host["q_halt_logits"], atol=1e-3)  # NaN where NaN
