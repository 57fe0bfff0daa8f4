"""Adding a model family is one module (its config class and its core) plus one row in the family
table (docs/architecture.md): a toy family registered that way is recognised in an upstream-format
run and loaded with its own config class and model by the checkpoint loader, which names no family."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import ClassVar

import pytest
import torch

from hrm_deploy.model import families
from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint
from hrm_deploy.model.config import TRMConfig
from hrm_deploy.model.trm import TRMACT, TRMCore
from tests.conftest import TRM_TINY, TRM_VARIANTS, write_trm_upstream_run


@dataclasses.dataclass(frozen=True)
class ToyConfig(TRMConfig):
    """The toy family's config: TRM's fields under its own family name."""

    family: ClassVar[str] = "toy"


class ToyCore(TRMCore):
    """TRM's networks plus a marker buffer, the toy family's key layout."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("toy_marker", torch.full((1,), 7.0))


class ToyACT(TRMACT):
    core_class = ToyCore


TRM = families.FAMILIES["trm"]
TOY = dataclasses.replace(
    TRM,
    name="toy",
    title="Toy Recursive Model",
    arch_names=("toy.toy@ToyACT",),
    config_class=ToyConfig,
    has_layout=lambda keys: "toy_marker" in set(keys),
    act_path="toy_family:ToyACT",
)


@pytest.fixture
def toy(monkeypatch):
    module = types.ModuleType("toy_family")
    module.ToyACT = ToyACT  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toy_family", module)
    monkeypatch.setitem(families.FAMILIES, "toy", TOY)
    return TOY


def test_a_toy_family_is_one_module_and_one_row(toy, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = ToyACT(ToyConfig(**TRM_TINY, **TRM_VARIANTS["mlp_t"])).eval()
    path = write_trm_upstream_run(tmp_path, model, arch_overrides={"name": "toy.toy@ToyACT"})

    contents = read_checkpoint(path)
    assert type(contents.config) is ToyConfig and contents.config.puzzle_emb_len == TRM_TINY["puzzle_emb_len"]
    assert contents.config.mlp_t  # the family's own field, read from its weights
    loaded, config = load_checkpoint(path)
    assert type(loaded) is ToyACT and config.family == "toy"
    assert torch.equal(loaded.inner.toy_marker, torch.full((1,), 7.0))
    for key, value in model.inner.state_dict().items():
        if key not in ("H_init", "L_init"):  # upstream stores those in bf16
            assert torch.equal(loaded.inner.state_dict()[key], value), key
    assert families.config_from_dict(config.to_dict()) == config  # a stored config finds its family


def test_the_toy_rows_arch_name_decides_between_matching_layouts(toy):
    keys = ["L_level.layers.0.self_attn.qkv_proj.weight", "toy_marker"]  # TRM's layout matches too
    assert families.detect_family(keys, "toy.toy@ToyACT", "run").name == "toy"
    assert families.detect_family(keys, TRM.arch_names[0], "run").name == "trm"
