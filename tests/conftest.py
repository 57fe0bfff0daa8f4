"""Shared fixtures: a tiny seeded HRM and upstream-format checkpoint folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# A test worker's share of the cores for torch's OpenMP threads (inherited by the commands its tests
# start): with every worker using every core they only contend (two workers on two cores: the whole
# suite 9:55 -> 9:40). Set before any test imports torch; an OMP_NUM_THREADS already set is kept.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))

TINY = dict(
    seq_len=81,
    vocab_size=11,
    num_puzzle_identifiers=1,
    hidden_size=64,
    num_heads=4,
    H_layers=2,
    L_layers=2,
    H_cycles=2,
    L_cycles=2,
    halt_max_steps=4,
    expansion=4.0,
    puzzle_emb_ndim=64,
    pos_encodings="rope",
)


@pytest.fixture
def tiny_config():
    from hrm_deploy.model.config import HRMConfig

    return HRMConfig(**TINY)


def make_tiny_model():
    """A seeded random tiny HRM with a non-zero Q head (upstream inits it to zero)."""
    import torch

    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model

    model = build_model(HRMConfig(**TINY), seed=0).eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        model.inner.q_head.weight.normal_(0, 0.05)
        model.inner.puzzle_emb.weights.normal_(0, 0.5)
    return model


@pytest.fixture
def tiny_model():
    """A seeded random tiny HRM with a non-zero Q head (:func:`make_tiny_model`)."""
    return make_tiny_model()


def write_dataset_json(data: Path, cfg, **extra) -> None:
    """``<data>/train/dataset.json`` as upstream's builders write it, for a model config ``cfg``."""
    meta_dir = data / "train"
    meta_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "pad_id": 0,
        "ignore_label_id": 0,
        "blank_identifier_id": 0,
        "vocab_size": cfg.vocab_size,
        "seq_len": cfg.seq_len,
        "num_puzzle_identifiers": cfg.num_puzzle_identifiers,
        "total_groups": 10,
        "mean_puzzle_examples": 1.0,
        **extra,
        "sets": ["all"],
    }
    (meta_dir / "dataset.json").write_text(json.dumps(meta))


def write_upstream_run(
    folder: Path,
    model,
    prefix: str = "_orig_mod.model.inner.",
    step: int = 100,
    with_config: bool = True,
    with_dataset: bool = True,
    data_rel: str = "data/sudoku-tiny",
) -> Path:
    """Write an upstream-style run: <folder>/checkpoints/<run>/step_N + all_config.yaml, dataset.json
    under <folder>/<data_rel>; data_path in the YAML is relative, as upstream writes it."""
    from hrm_deploy.model.checkpoint import upstream_state_dict, write_upstream_run

    cfg = model.inner.config
    run = folder / "checkpoints" / "Sudoku-tiny ACT-torch" / "HierarchicalReasoningModel_ACTV1 brave-otter"
    hyper = {
        "global_batch_size": 768,
        "epochs": 20000,
        "lr": 1e-4,
        "lr_min_ratio": 1.0,
        "lr_warmup_steps": 2000,
        "weight_decay": 0.1,
        "beta1": 0.9,
        "beta2": 0.95,
        "puzzle_emb_lr": 1e-2,
        "puzzle_emb_weight_decay": 0.1,
        "project_name": "Sudoku-tiny ACT-torch",
        "run_name": "brave-otter",
        "seed": 0,
        "checkpoint_every_eval": True,
        "eval_interval": 2000,
        "eval_save_outputs": [],
    }
    if with_config:
        write_upstream_run(run, model, step=step, data_path=data_rel, train_config=hyper, prefix=prefix)
    else:
        import torch

        run.mkdir(parents=True, exist_ok=True)
        torch.save(upstream_state_dict(model, prefix), run / f"step_{step}")
    if with_dataset:
        write_dataset_json(folder / data_rel, cfg)
    return run / f"step_{step}"


@pytest.fixture
def upstream_run(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)  # upstream's data_path is relative to where training ran
    return write_upstream_run(tmp_path, tiny_model)


# A tiny TRM (upstream TinyRecursiveModels) in both variants: attention + RoPE, and mlp_t with no
# positions (upstream's Sudoku recipe). puzzle_emb_len 4 > ceil(ndim / hidden) = 1 exercises the
# zero-padded prefix; 3 puzzle ids exercise the table.
TRM_TINY = dict(
    seq_len=81,
    vocab_size=11,
    num_puzzle_identifiers=3,
    hidden_size=64,
    num_heads=4,
    L_layers=2,
    H_cycles=2,
    L_cycles=3,
    halt_max_steps=3,
    expansion=4.0,
    puzzle_emb_ndim=64,
    puzzle_emb_len=4,
)
TRM_VARIANTS = {"attention": dict(pos_encodings="rope", mlp_t=False), "mlp_t": dict(pos_encodings="none", mlp_t=True)}


def make_trm(variant: str, seed: int = 0):
    """A seeded random tiny TRM with a non-zero Q head and puzzle table (upstream zero-inits both)."""
    import torch

    from hrm_deploy.model.hrm import build_model
    from hrm_deploy.model.trm_config import TRMConfig

    model = build_model(TRMConfig(**TRM_TINY, **TRM_VARIANTS[variant]), seed=seed).eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        model.inner.q_head.weight.normal_(0, 0.05)
        model.inner.q_head.bias.normal_(0, 1.0)
        model.inner.puzzle_emb.weights.normal_(0, 0.5)
    return model


def write_trm_upstream_run(
    folder: Path,
    model,
    prefix: str = "_orig_mod.model.inner.",
    step: int = 100,
    arch_overrides: dict | None = None,
    drop_arch: tuple[str, ...] = (),
    with_dataset: bool = True,
    data_rel: str = "data/sudoku-tiny",
) -> Path:
    """A run exactly as upstream TinyRecursiveModels' pretrain.py leaves it, written here without the
    toolkit's writer: ``step_N`` = torch.save of the (compiled) ACTLossHead's state dict (H_init/L_init
    bf16, the forward dtype's buffers), ``all_config.yaml`` = yaml.dump(PretrainConfig.model_dump())
    with arch/trm.yaml's fields and ``data_paths`` (a list), dataset.json from the data builder."""
    import torch
    import yaml

    cfg = model.inner.config
    run = folder / "checkpoints" / "Sudoku-tiny-ACT-torch" / "TinyRecursiveReasoningModel_ACTV1 calm-heron"
    run.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.inner.state_dict().items():
        state[prefix + k] = v.detach().to(torch.bfloat16) if k in ("H_init", "L_init") else v.detach().clone()
    torch.save(state, run / f"step_{step}")
    arch = {
        "name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
        "loss": {"name": "losses@ACTLossHead", "loss_type": "stablemax_cross_entropy"},
        "halt_exploration_prob": 0.1,
        "halt_max_steps": cfg.halt_max_steps,
        "H_cycles": cfg.H_cycles,
        "L_cycles": cfg.L_cycles,
        "H_layers": 0,
        "L_layers": cfg.L_layers,
        "hidden_size": cfg.hidden_size,
        "num_heads": cfg.num_heads,
        "expansion": cfg.expansion,
        "puzzle_emb_ndim": cfg.puzzle_emb_ndim,
        "pos_encodings": cfg.pos_encodings,
        "forward_dtype": "bfloat16",
        "mlp_t": cfg.mlp_t,
        "puzzle_emb_len": cfg.puzzle_emb_len,
        "no_ACT_continue": cfg.no_ACT_continue,
        **(arch_overrides or {}),
    }
    for key in drop_arch:
        arch.pop(key)
    all_config = {
        "arch": arch,
        "data_paths": [data_rel],
        "data_paths_test": [],
        "evaluators": [],
        "global_batch_size": 768,
        "epochs": 50000,
        "lr": 1e-4,
        "lr_min_ratio": 1.0,
        "lr_warmup_steps": 2000,
        "weight_decay": 1.0,
        "beta1": 0.9,
        "beta2": 0.95,
        "puzzle_emb_lr": 1e-4,
        "puzzle_emb_weight_decay": 1.0,
        "project_name": "Sudoku-tiny-ACT-torch",
        "run_name": "TinyRecursiveReasoningModel_ACTV1 calm-heron",
        "load_checkpoint": None,
        "checkpoint_path": str(run),
        "seed": 0,
        "checkpoint_every_eval": True,
        "eval_interval": 5000,
        "min_eval_interval": 0,
        "eval_save_outputs": [],
        "ema": True,
        "ema_rate": 0.999,
        "freeze_weights": False,
    }
    (run / "all_config.yaml").write_text(yaml.dump(all_config))
    if with_dataset:
        write_dataset_json(folder / data_rel, cfg, total_puzzles=10)
    return run / f"step_{step}"


@pytest.fixture(params=sorted(TRM_VARIANTS))
def trm_run(request, tmp_path, monkeypatch):
    """(step_N path, the model it holds) of an upstream-layout TRM run, for each variant."""
    monkeypatch.chdir(tmp_path)
    model = make_trm(request.param)
    return write_trm_upstream_run(tmp_path, model), model


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
    """The trained fixture: the bundled sudoku-tiny checkpoint (the preset's training run,
    cached in the package by scripts/refresh_bundled_checkpoint.py) and 200 held-out puzzles
    of the preset's difficulty from a seed its training data did not use (plus 200 in train/ for calibration)."""
    from types import SimpleNamespace

    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.train.presets import preset

    spec = preset("sudoku-tiny")["data"]
    data = tmp_path_factory.mktemp("heldout") / "sudoku-tiny-heldout"
    generate_sudoku(SudokuSpec(train=200, test=200, blanks=spec["blanks"], seed=12345), str(data))
    return SimpleNamespace(checkpoint=bundled_checkpoint("sudoku-tiny"), data=str(data))


@pytest.fixture(scope="session")
def trained_small(tmp_path_factory):
    """The ACT fixture: the bundled sudoku-small checkpoint (8 ACT steps of 2 H x 2 L cycles, the
    embedded default, made by scripts/refresh_bundled_checkpoint.py --preset sudoku-small) and 100
    held-out puzzles of its dataset spec from a seed its training data did not use (plus 100 in train/)."""
    from types import SimpleNamespace

    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.train.presets import preset

    spec = preset("sudoku-small")["data"]
    data = tmp_path_factory.mktemp("heldout") / "sudoku-small-heldout"
    generate_sudoku(SudokuSpec(**{**spec, "train": 100, "test": 100, "augment": 0, "seed": 54321}), str(data))
    return SimpleNamespace(checkpoint=bundled_checkpoint("sudoku-small"), data=str(data))


@pytest.fixture(scope="session")
def tiny_onnx(trained_tiny, tmp_path_factory):
    """FP32 exports of the trained fixture: the unroll (its one ACT step) and the single-step graph."""
    from types import SimpleNamespace

    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    folder = tmp_path_factory.mktemp("export")
    unrolled = export_onnx(trained_tiny.checkpoint, folder / "tiny.onnx", ExportConfig(parity=False), quiet=True)
    step = export_onnx(
        trained_tiny.checkpoint, folder / "tiny.step.onnx", ExportConfig(mode="step", parity=False), quiet=True
    )
    return SimpleNamespace(unrolled=unrolled.path, step=step.path, data=trained_tiny.data, folder=folder)


@pytest.fixture(scope="session")
def bundled_export(tmp_path_factory):
    """``bundled_export(model="sudoku-small", mode="unrolled", halt="off")``: the path of that bundled
    model's FP32 export (parity checked), made once per session for the tests that only read it (they
    write what they build elsewhere)."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import bundled_checkpoint

    folder = tmp_path_factory.mktemp("bundled_exports")
    made: dict[tuple[str, str, str], Path] = {}

    def get(model: str = "sudoku-small", mode: str = "unrolled", halt: str = "off") -> Path:
        if (model, mode, halt) not in made:
            out = folder / f"{model}.{mode}.{halt.replace(':', '_')}.onnx"
            config = ExportConfig(mode=mode, halt=halt)
            made[model, mode, halt] = export_onnx(bundled_checkpoint(model), out, config, quiet=True).path
        return made[model, mode, halt]

    return get


@pytest.fixture(scope="session")
def small_onnx(bundled_export):
    """The ACT fixture's (the bundled sudoku-small's) FP32 unrolled export, 8 steps: ``bundled_export()``."""
    return bundled_export()


@pytest.fixture(scope="session")
def tiny_loop(trained_tiny, tmp_path_factory):
    """The trained fixture's loop graph (``export --mode loop``, halting off; parity not checked here)."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    folder = tmp_path_factory.mktemp("export_loop")
    config = ExportConfig(mode="loop", parity=False)
    return export_onnx(trained_tiny.checkpoint, folder / "tiny.loop.onnx", config, quiet=True).path


# -- markers: gpu / jetson skip with an actionable reason; every skip's reason is summarised ----------


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# -- parallel runs: README's command runs the suite on pytest-xdist workers (pyproject's addopts) ------
# Tests are handed out by group: a module's tests go to one worker (its module-scoped fixtures are
# made once), except in the modules of SPREAD (independent cases: any worker takes any one); the
# tests of a folder in ONE_WORKER_FOLDERS go to one worker: tests/scale/ (one local Ray cluster at
# a time: those tests check the machine for Ray processes left behind) and tests/backends/torch/
# (its session's AOTInductor engines, the costliest fixture, compiled once).
SPREAD = {"tests/export/test_export_grid.py"}
ONE_WORKER_FOLDERS = {"tests/scale/": "ray", "tests/backends/torch/": "torch-engines"}
# The groups that take longest (CI's --durations), handed out first so that no worker is left
# running one of them alone at the end; the rest go by test count, most first (xdist's order).
FIRST = (
    "tests/engines/test_quantized_builds.py",
    "torch-engines",
    "ray",
    "tests/backends/test_trm_runners.py",
    "tests/serve/test_serve_inflight.py",
    "tests/precision/test_nvfp4.py",
    "tests/serve/test_serve.py",
    "tests/serve/test_triton_inflight.py",
    "tests/backends/ort/test_cpu_static.py",
    "tests/arc/test_adapt_ddp.py",
)


def xdist_group(nodeid: str) -> str:
    """The group of the test ``nodeid`` (``path::name[params]``): its worker runs the whole group."""
    path = nodeid.split("::")[0]
    for folder, group in ONE_WORKER_FOLDERS.items():
        if path.startswith(folder):
            return group
    return nodeid if path in SPREAD else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with :func:`xdist_group` as the scope, the groups of FIRST first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node) -> None:
            for group in FIRST:  # xdist hands out the work queue's first group next
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
                    break
            super()._assign_work_unit(node)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests skip without a CUDA GPU and ``@pytest.mark.jetson`` tests off a
    Jetson, each saying where to run them (the probes run only when such a test is collected)."""
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none): run on a GPU machine")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip_gpu)
    if any(item.get_closest_marker("jetson") for item in items):
        from hrm_deploy.system import jetson_model

        if jetson_model() is None:
            skip_jetson = pytest.mark.skip(reason="needs a Jetson: run on the device, or `hrm-deploy bench --host`")
            for item in items:
                if item.get_closest_marker("jetson"):
                    item.add_marker(skip_jetson)


_SKIPS: dict[str, list[str]] = {}


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        reason = reason.removeprefix("Skipped: ").strip()
        _SKIPS.setdefault(
            reason or "(no reason given: give this skip one that says what to install or where to run)", []
        ).append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    """Why tests skipped, one line per reason (with how many), so a skip never hides silently."""
    if not _SKIPS:
        return
    terminalreporter.section("why tests skipped")
    for reason, ids in sorted(_SKIPS.items(), key=lambda kv: -len(kv[1])):
        terminalreporter.write_line(f"{len(ids):3d} x {reason}  (e.g. {ids[0]})")


@pytest.fixture
def cli_logs():
    """The library's log records on stderr as the command line shows them (capsys sees them in
    order with the progress lines); the handler is removed afterwards."""
    import logging

    from hrm_deploy.cli.logs import setup_logging

    logger = logging.getLogger("hrm_deploy")
    before, level = list(logger.handlers), logger.level
    setup_logging(False)
    yield
    logger.handlers[:] = before
    logger.setLevel(level)


def mlp_weights(fp32) -> list[str]:
    """The FP32 export's L-level MLP weights (the initializers its L-level MLP MatMuls read)."""
    import onnx

    from hrm_deploy.export.loop_body import all_nodes

    model = onnx.load_model_from_string(Path(fp32).read_bytes())  # not onnx.load: tests count the builds' parses
    return sorted(
        {n.input[1] for n in all_nodes(model) if n.op_type == "MatMul" and "L_level" in n.name and "mlp" in n.name}
    )


def all_weights(fp32) -> list[str]:
    """The FP32 export's weights of its quantizable MatMuls (every one the plan may quantize)."""
    import onnx

    from hrm_deploy.export.loop_body import all_nodes

    model = onnx.load_model_from_string(Path(fp32).read_bytes())
    inits = {t.name for t in model.graph.initializer}
    return sorted({n.input[1] for n in all_nodes(model) if n.op_type == "MatMul" and n.input[1] in inits})


def quantized_weights(path, weights) -> int:
    """How many of ``weights`` (FP32 initializer names) no node of the graph at ``path`` reads as
    float any more: quantized (any form: Q/DQ, fused integer GEMMs, FP4)."""
    import onnx

    from hrm_deploy.export.loop_body import all_nodes

    read = {name for node in all_nodes(onnx.load_model_from_string(Path(path).read_bytes())) for name in node.input}
    return sum(w not in read for w in weights)


@pytest.fixture
def harm_quantized(monkeypatch):
    """Real measurements with a known harm: ``harm_quantized(rate)`` makes every graph the builds'
    accuracy check runs (:class:`hrm_deploy.precision.accuracy.GraphRunner`) answer as it does,
    except that for each quantized L-level MLP weight (``every_weight``: each quantized weight) a
    further ``rate`` of the puzzles (chosen by their content, the same in every run) get their least
    sure cell wrong (its top two logits swapped: a flip where the model hesitated, as quantization
    flips, which verify's cell judgement excuses: the harm is the puzzles lost). The fallback's
    ranking puts those weights first where it has a signal (NVFP4 ranks by screens, which see the harm)."""
    import numpy as np

    import hrm_deploy.precision.sensitivity as sensitivity
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.rule import Outputs

    real_run, real_signal = GraphRunner.__call__, sensitivity.local_errors
    seen: dict = {}

    def install(rate: float = 0.05, every_weight: bool = False) -> None:
        """``every_weight``: every quantized weight harms, not only the L-level MLP's."""

        def run(self, path, examples, batch=64):
            out = real_run(self, path, examples, batch)
            pick = all_weights if every_weight else mlp_weights
            key = ("weights", str(self.table_of), every_weight)
            if key not in seen:
                seen[key] = pick(self.table_of)
            weights = seen[key]
            units_key = ("units", str(path), Path(path).stat().st_mtime_ns)
            if units_key not in seen:
                seen[units_key] = quantized_weights(path, weights)
            units = seen[units_key]
            share = (examples.inputs.astype(np.int64) * np.arange(1, examples.inputs.shape[1] + 1)).sum(1) % 997 / 997
            bad = share < rate * units
            if not bad.any():
                return out
            logits = out.logits.copy()
            rows = np.flatnonzero(bad)
            top2 = np.argsort(logits[rows], -1, kind="stable")[..., -2:]  # [b, S, 2]: second, first
            values = np.take_along_axis(logits[rows], top2, -1)
            cell = (values[..., 1] - values[..., 0]).argmin(-1)  # each puzzle's least sure cell
            first, second = top2[np.arange(len(rows)), cell, 1], top2[np.arange(len(rows)), cell, 0]
            logits[rows, cell, first], logits[rows, cell, second] = (
                logits[rows, cell, second],
                logits[rows, cell, first],
            )
            return Outputs(logits, out.q_halt, out.steps, out.nonfinite, out.q_steps)

        def signal(qdq, fp32, groups, examples, source, meta):  # a real signal where there is one, MLP weights first
            found = real_signal(qdq, fp32, groups, examples, source, meta)
            if not any(found.values()):
                return found  # NVFP4: the fallback ranks by screens (which see the harm)
            return {w: 1.0 if any("L_level" in n and "mlp" in n for n in groups[w]) else 0.1 for w in groups}

        monkeypatch.setattr(GraphRunner, "__call__", run)
        monkeypatch.setattr(sensitivity, "local_errors", signal)

    return install


@pytest.fixture
def mlp_costs_five_points(harm_quantized):
    """Every quantized L-level MLP weight answers a further 5 % of the puzzles wrong (so the
    fallback must keep each of them float to stay within a 1-point budget)."""
    harm_quantized(0.05)
