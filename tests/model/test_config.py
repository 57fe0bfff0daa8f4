import pytest

from hrm_deploy.errors import ConfigError
from hrm_deploy.model.config import HRMConfig


def test_sudoku_sizes_match_upstream():
    cfg = HRMConfig(seq_len=81, vocab_size=11, puzzle_emb_ndim=512)
    assert cfg.intermediate_size == 1536
    assert cfg.puzzle_emb_len == 1 and cfg.total_seq_len == 82
    assert cfg.parameter_count() == 27_275_266  # upstream's number (issue #12)
    assert cfg.blocks_per_step == 24


def test_prefix_length_is_ceil_of_ndim_over_hidden():
    assert HRMConfig(seq_len=4, vocab_size=5, hidden_size=64, num_heads=4, puzzle_emb_ndim=65).puzzle_emb_len == 2
    assert HRMConfig(seq_len=4, vocab_size=5, puzzle_emb_ndim=0).puzzle_emb_len == 0


@pytest.mark.parametrize(
    "bad",
    [dict(num_heads=7), dict(pos_encodings="alibi"), dict(seq_len=0), dict(forward_dtype="int8"), dict(version=99)],
)
def test_invalid_configs_are_config_errors(bad):
    with pytest.raises(ConfigError):
        HRMConfig(**{"seq_len": 81, "vocab_size": 11, **bad})


def test_from_dict_ignores_upstream_extras_and_coerces():
    cfg = HRMConfig.from_dict(
        {
            "seq_len": "81",
            "vocab_size": 11.0,
            "name": "hrm",
            "loss": {},
            "causal": False,
            "batch_size": 768,
            "expansion": 4,
        }
    )
    assert cfg.seq_len == 81 and isinstance(cfg.vocab_size, int) and cfg.expansion == 4.0
    with pytest.raises(ConfigError):
        HRMConfig.from_dict({"seq_len": 81.5, "vocab_size": 11})
    assert HRMConfig.from_dict(cfg.to_dict()) == cfg
