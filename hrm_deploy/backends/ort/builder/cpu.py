"""The ``cpu`` target: an exported graph -> the graph ONNX Runtime's CPU provider runs fastest.

* Graph optimizations are applied offline (``SessionOptions.optimized_model_filepath``) at the
  ``extended`` level: fusions into ORT's CPU kernels (``SimplifiedLayerNormalization``,
  ``FusedMatMul``, ``DynamicQuantizeMatMul`` ...) are done once at build time, so starting a
  session is fast. The layout-dependent ``all`` level is left to session start (it is
  machine-specific and ORT does not recommend saving it).
* INT8 quantizes the weight MatMuls into integer GEMMs (:mod:`hrm_deploy.backends.ort.builder.int8`):
  ``static`` (default; :mod:`hrm_deploy.backends.ort.builder.static`: activation scales fixed by the
  project's calibration, answers independent of batching, measured against FP32 on held-out
  puzzles and kept within the accuracy budget by leaving the most sensitive weights FP32),
  ``dynamic`` (no data, activations scaled per call over the whole batch: answers can depend on
  batch-mates) or ``blockwise`` (no data, per-row blocks: batch-independent, slower). The Q/DQ
  graphs of the TensorRT targets stay as they are: on ORT CPU they are symmetric int8 and
  unfused, and are slower than FP32.
* FP32 and INT8 graphs then get HRM's attention (RoPE included) and RMSNorm fused into ORT's
  ``MultiHeadAttention`` / ``RotaryEmbedding`` / ``SimplifiedLayerNormalization`` CPU kernels,
  which ORT's optimizer does not do for these patterns (:mod:`hrm_deploy.backends.ort.builder.fusion`;
  the bundled model: 2,203 -> 859 nodes). Every fused block (a sample past 1 GiB of tapped
  tensors) is checked against the block it replaces on the inputs the unfused graph gave it;
  ``--no-fuse`` leaves them out.
* FP16 is the precision stage's FP16 graph, optimized the same way (on x86 ORT runs most FP16
  ops by casting, slower than FP32).

Output: ``engines/<name>.<precision>.cpu.ort.onnx`` + manifest (ORT version, optimization
level, intra-op threads, node counts), runnable by ``hrm_deploy.backends.open_runner``; ONNX Runtime
loads every graph before it is published (:func:`load_check`), or the build stops in one line.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.backends.ort.builder.int8 import INTEGER_MATMULS, RECIPES, quantize_weights
from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.contract import CARRY, PUZZLE_ROWS, RESET
from hrm_deploy.engines.config import EngineConfig
from hrm_deploy.errors import ArtifactError, ConfigError, EngineError, InternalError, require
from hrm_deploy.export.loop_body import all_nodes, find_loop, first_step_feeds, lift_body, seat_body
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import check_artifact, publish_artifact
from hrm_deploy.onnx_runtime import Optimization, load_onnx, ort_session
from hrm_deploy.progress import Stages

if TYPE_CHECKING:
    from onnx import ModelProto

log = logging.getLogger(__name__)

MAX_FUSED_BYTES = 1_900_000_000  # under protobuf's 2 GiB: graphs the fusion check can serialize
OPTIMIZATION = Optimization.EXTENDED
OPTIMIZATION_LEVEL = OPTIMIZATION.value  # as recorded in the manifest and the graph's metadata
# dynamic and blockwise INT8: weights per output channel, the heads left float (QuantConfig's default)
PER_CHANNEL = True


@dataclass
class CpuBuildResult:
    path: Path
    manifest: Path
    source_onnx: Path
    build: dict[str, Any] = field(default_factory=dict)


def optimize_offline(src: str, out: str, threads: int | None) -> float:
    """Apply ORT's graph optimizations to ``src`` and save the result to ``out``; returns seconds."""
    start = time.perf_counter()
    ort_session(src, threads=threads, optimization=OPTIMIZATION, optimized_model_path=out)
    return time.perf_counter() - start


def fuse_checked(path: Path, meta: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """Fuse ``path`` in place (:func:`~hrm_deploy.backends.ort.builder.fusion.fuse_for_cpu`) after checking
    every fused block against the unfused graph on one generated puzzle; returns the report."""
    import numpy as np
    import onnx

    from hrm_deploy.backends.ort.builder.fusion import FUSION_TOLERANCE, check_rewrites, fuse_for_cpu
    from hrm_deploy.backends.ort.builder.static import sink_quantize
    from hrm_deploy.model.families import config_from_dict

    whole = onnx.load(str(path))
    if whole.ByteSize() > MAX_FUSED_BYTES:  # one protobuf: the block check serializes the graph
        return {"skipped": f"graph of {whole.ByteSize() / 2**30:.1f} GiB, over the 2 GiB protobuf limit: not fused"}
    model_config = config_from_dict(meta["config"])
    # One puzzle of random tokens; a step graph gets its first step (reset, zero carry).
    rng = np.random.default_rng(0)
    feed: dict[str, Any] = {
        "inputs": rng.integers(0, model_config.vocab_size, (1, model_config.seq_len), dtype=np.int32),
        "puzzle_identifiers": np.zeros(1, np.int32),
    }
    if any(tensor.name == PUZZLE_ROWS for tensor in whole.graph.input):  # export --puzzle-emb external
        feed[PUZZLE_ROWS] = np.zeros((1, model_config.puzzle_emb_ndim), np.float32)
        del feed["puzzle_identifiers"]
    if any(tensor.name == CARRY[0] for tensor in whole.graph.input):  # a step graph
        carry = np.zeros((1, model_config.total_seq_len, model_config.hidden_size), np.float32)
        feed.update({CARRY[0]: carry, CARRY[1]: carry, RESET: np.ones(1, bool)})
    loop = find_loop(whole) is not None
    if loop:  # a loop graph: its body is fused, checked on the inputs of the loop's first step
        feed = first_step_feeds(whole, feed)
    unfused = lift_body(whole, check=False) if loop else whole  # ORT's own operators
    sink_quantize(unfused)  # static INT8: the attention output's Q back below its head merge (exact)
    fused = onnx.ModelProto()
    fused.CopyFrom(unfused)
    report, rewrites = fuse_for_cpu(fused, model_config.hidden_size)
    tensor_bytes = model_config.total_seq_len * model_config.hidden_size * 4  # one [1, positions, hidden] float32
    try:
        error, checked = check_rewrites(unfused, fused, rewrites, feed, threads, tensor_bytes)
    except Exception as exc:  # ORT refusing a fused node is our bug too
        raise InternalError(f"the fused graph does not run ({exc}); build with --no-fuse and report this") from exc
    if error > FUSION_TOLERANCE:
        raise InternalError(
            f"a fused block differs from the graph it replaces by {error:.2e} of its output scale "
            f"(limit {FUSION_TOLERANCE:.0e}); build with --no-fuse and report this"
        )
    del unfused
    onnx.save(seat_body(whole, fused, check=False) if loop else fused, str(path))
    return {**report.as_dict(), "checked_blocks": checked, "checked_max_error": float(f"{error:.3g}")}


def _restore_metadata(path: Path, props: dict[str, str], precision: str) -> None:
    """ORT's saved model may drop model metadata; the runners need ``hrm_deploy.*``."""
    import onnx

    model = onnx.load(str(path))
    have = {p.key: p.value for p in model.metadata_props}
    wanted = {
        **props,
        "hrm_deploy.precision": precision,
        "hrm_deploy.target": "cpu",
        "hrm_deploy.ort_optimization": OPTIMIZATION_LEVEL,
    }
    if all(have.get(k) == v for k, v in wanted.items()):
        return
    onnx.helper.set_model_props(model, {**have, **wanted})
    onnx.save(model, str(path))


def cpu_output_path(src: Path, precision: str, engines: str | Path = "engines") -> Path:
    stem = src.name[: -len(".onnx")] if src.name.endswith(".onnx") else src.stem
    for p in ("fp16", "bf16", "int8", "fp32"):
        if stem.endswith(f".{p}"):
            stem = stem[: -len(p) - 1]
    return Path(engines) / f"{stem}.{precision}.cpu.ort.onnx"


def unique_subgraph_names(path: Path) -> int:
    """Rename, in place, every tensor a subgraph (a ``Loop``'s body) produces under a name the outer
    graph already produces: ONNX Runtime's offline optimizer of an FP16 loop graph inserts a Cast
    named after its input in both scopes (``InsertedPrecisionFreeCast_embed/x``), and the saved graph
    then breaks single assignment, so ONNX Runtime refuses to load it. Returns how many it renamed."""
    import onnx

    from hrm_deploy.export.loop_body import find_loop, loop_body

    model = onnx.load(str(path))
    loop = find_loop(model)
    if loop is None:
        return 0
    outer = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.initializer}
    outer |= {i.name for i in model.graph.input}
    body = loop_body(model)
    clashes = {o for n in body.node for o in n.output if o in outer}
    if not clashes:
        return 0
    renamed = {name: f"{name}/in_loop" for name in clashes}
    for node in body.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
    for value in list(body.output) + list(body.value_info):
        value.name = renamed.get(value.name, value.name)
    onnx.save(model, str(path))
    return len(clashes)


def finish_graph(
    source: Path, out: Path, meta: dict[str, Any], props: dict[str, str], config: EngineConfig, stages: Stages
) -> dict[str, Any]:
    """A graph of the precision already written at ``source`` -> the engine graph at ``out``, as
    published: ORT's offline optimization, the checked fusions, names unique across a loop's scopes,
    the ``hrm_deploy.*`` metadata. Returns the build facts."""
    import onnxruntime as ort

    options = config.options_as(CpuOptions)
    build: dict[str, Any] = {}
    with stages.stage(f"ONNX Runtime {ort.__version__} graph optimizations ({OPTIMIZATION_LEVEL}), offline"):
        build["optimize_seconds"] = round(optimize_offline(str(source), str(out), options.threads), 3)
    renamed = unique_subgraph_names(out)
    if renamed:
        build["loop_names_made_unique"] = renamed
    if options.fuse and config.precision != "fp16":  # fp16's float32 islands break the patterns
        with stages.stage("fusing attention and RMSNorm into ORT's CPU kernels, each block checked"):
            build["fusions"] = fuse_checked(out, meta, options.threads)
    _restore_metadata(out, props, config.precision)
    return build


def _make_graph(
    src: Path, tmp: Path, meta: dict[str, Any], props: dict[str, str], config: EngineConfig, stages: Stages
) -> dict[str, Any]:
    """``src`` -> the engine graph at ``tmp`` for FP32, FP16 and the data-free INT8 recipes: the
    precision's rewrite, then :func:`finish_graph`. Returns build facts."""
    import onnx

    from hrm_deploy.precision.calibrate import QuantConfig

    recipe = config.options_as(CpuOptions).recipe
    build: dict[str, Any] = {}
    work = tmp.with_name(tmp.name + ".pre.onnx")
    try:
        source = src
        if config.precision == "int8":
            with stages.stage(f"{recipe} INT8 of the weight MatMuls: {RECIPES[recipe]}"):
                build["quantized_nodes"] = len(
                    quantize_weights(
                        str(src),
                        str(work),
                        recipe,
                        int(meta["config"].get("hidden_size", 0)),
                        PER_CHANNEL,
                        QuantConfig().exclude_patterns,
                    )
                )
            source = work
        elif config.precision == "fp16":
            from hrm_deploy.precision.fp16 import convert_half

            with stages.stage("converting to fp16 (float32 islands: norms, softmax, sigmoid)"):
                converted, _ = convert_half(onnx.load(str(src)), "fp16", True)
                onnx.save(converted, str(work))
            source = work
        build.update(finish_graph(source, tmp, meta, props, config, stages))
    finally:
        work.unlink(missing_ok=True)
    return build


def _static_int8(
    src: Path,
    model: ModelProto,
    src_sha256: str,
    props: dict[str, str],
    config: EngineConfig,
    staging: Path,
    stages: Stages,
    quiet: bool,
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Static INT8 through the precision pipeline: the one job preamble, the ISA's activation type,
    and the conductor, which measures the candidates this target writes (:class:`StaticCandidates`)
    and names the one to publish (the one it measured last). Returns its path, the build facts and
    the recipe's record (calibration, activations, accuracy)."""
    from hrm_deploy.backends.ort.builder.isa import choose_activations
    from hrm_deploy.backends.ort.builder.static import StaticCandidates
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.conductor import Check, conduct
    from hrm_deploy.precision.job import JobRequest, prepare_job
    from hrm_deploy.precision.rule import Rule

    options = config.options_as(CpuOptions)
    quant = QuantConfig(method=config.calib_method, samples=config.calib_samples)
    request = JobRequest(
        "int8", config.calib_data, quant, config.calib_cache, config.accuracy_check, config.holdout_samples
    )
    job, data = prepare_job(src, model, src_sha256, request, stages, quiet)
    activations = choose_activations(options.activations, job.meta["mode"])
    config = replace(config, options=replace(options, activations=activations["activations"]))

    def finish(source: Path, out: Path, quiet_stages: bool) -> dict[str, Any]:
        return finish_graph(source, out, job.meta, props, config, Stages(True) if quiet_stages else stages)

    candidates = StaticCandidates(job, activations["activations"], finish, staging)
    with GraphRunner(job.meta, table_of=src, threads=options.threads) as runner:
        rule = Rule.of("int8", config.accuracy_budget)
        check = Check(rule, data, runner, config.holdout_samples, runner.streams) if config.accuracy_check else None
        verdict = conduct(job, candidates, check, staging, stages)
    record = dict(verdict.record)
    if check is not None:
        record["measured_with"] = {"streams": runner.streams, "threads_per_stream": runner.threads or "ORT's default"}
    recipe = {"calibration": job.report, "activations": activations, "accuracy": record}
    return verdict.path, candidates.facts[verdict.kept], recipe


def load_check(path: Path, threads: int | None, name: str) -> None:
    """ONNX Runtime loads the graph at ``path`` about to be published as ``name`` (the runtime it is
    built for), or the build stops in one line naming it and ONNX Runtime's reason: nothing is written."""
    try:
        ort_session(str(path), threads=threads)
    except Exception as exc:  # noqa: BLE001 - ORT's load failures are one family of many types
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise EngineError(
            f"ONNX Runtime cannot load {name}, the graph this build wrote ({first}); nothing was written. Build "
            "--fp32, or report this with the graph's export"
        ) from None


def build_cpu(
    onnx_path: str | os.PathLike,
    config: EngineConfig,
    out: str | os.PathLike | None = None,
    quiet: bool = False,
    model: ModelProto | None = None,
) -> CpuBuildResult:
    """Make ``engines/<name>.<precision>.cpu.ort.onnx`` (+ manifest) from an FP32 export, as
    ``config`` (``--target cpu``: its options a :class:`~.options.CpuOptions`) says (``model``:
    it already parsed, weights loaded for INT8; None parses it here, once). The graph published is
    loaded by ONNX Runtime first (static INT8's, measured by the conductor, already was)."""
    onnx = require("onnx", "onnx", "The cpu target")
    ort = require("onnxruntime", "onnx", "The cpu target")
    from hrm_deploy.export.metadata import graph_metadata

    src = Path(onnx_path)
    if not src.is_file():
        raise ArtifactError(f"{src} does not exist; run `hrm-deploy export` first or pass the ONNX path")
    src_sha256 = (check_artifact(src) or {}).get("sha256")  # the export is what its manifest says
    options = config.options_as(CpuOptions)
    static = config.precision == "int8" and options.recipe == "static"
    if model is None:
        model = load_onnx(src, weights=static)  # the one parse of the FP32 graph (static INT8's job keeps it)
    meta = graph_metadata(model)
    props = {p.key: p.value for p in model.metadata_props}
    nodes_in = len(model.graph.node)
    have = meta.get("precision", "fp32")
    if have != "fp32":
        raise ConfigError(f"{src} is a {have} graph; the cpu target starts from the FP32 export")
    if meta.get("mode") == "loop" and config.precision == "int8" and not static:
        raise ConfigError(
            f"--cpu-int8 {options.recipe} of a loop graph is not offered (its quantizer rewrites the outer graph "
            "only); build it with --cpu-int8 static (the default), or the step graph with this recipe"
        )
    target = Path(out) if out else cpu_output_path(src, config.precision)
    target.parent.mkdir(parents=True, exist_ok=True)
    stages = Stages(quiet)
    build: dict[str, Any] = {"onnx_nodes_in": nodes_in}
    recipe: dict[str, Any] = {}
    if config.precision == "int8":
        recipe = {"int8": options.recipe, "description": RECIPES[options.recipe]}
    start = time.perf_counter()
    with staging_dir(target.parent, "cpu-build") as staging:
        if static:
            sha = src_sha256 or sha256_file(src)
            graph, facts, measured = _static_int8(src, model, sha, props, config, staging, stages, quiet)
            build.update(facts)
            recipe.update(measured)
            options = replace(options, activations=measured["activations"]["activations"])
            config = replace(config, options=options)
            if not measured["accuracy"].get("checked"):
                load_check(graph, options.threads, target.name)
        else:
            graph = staging / target.name
            build.update(_make_graph(src, graph, meta, props, config, stages))
            load_check(graph, options.threads, target.name)
        del model  # the job held it where static INT8 needed it
        optimized = onnx.load(str(graph), load_external_data=False)
        ops: dict[str, int] = {}
        for node in all_nodes(optimized):  # a loop graph's body included
            key = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            ops[key] = ops.get(key, 0) + 1
        build.update(onnx_nodes_out=len(optimized.graph.node), op_types=dict(sorted(ops.items())))
        del optimized
        if config.precision == "int8" and not any(k.endswith(INTEGER_MATMULS) for k in ops):
            raise ConfigError(
                f"{options.recipe} quantization produced no integer MatMul; the engine was not written. "
                "Check the ONNX with `hrm-deploy inspect`"
            )
        build["build_seconds"] = round(time.perf_counter() - start, 3)
        build["engine_bytes"] = graph.stat().st_size
        manifest = publish_artifact(
            graph,
            target,
            stage="engine",
            parent=src,
            parent_sha256=src_sha256,
            config=config.record(),
            backend={"name": "onnxruntime", "version": ort.__version__, "provider": "CPUExecutionProvider"},
            target={"name": "cpu", "description": "ONNX Runtime CPU execution provider"},
            precision=config.precision,
            mode=meta["mode"],
            steps=meta["steps"],
            recipe=recipe,
            runtime={
                "graph_optimization_level": OPTIMIZATION_LEVEL,
                "saved_optimized": True,
                "intra_op_num_threads": options.threads or os.cpu_count(),
                "inter_op_num_threads": 1,
                "execution_mode": "sequential",
                "threads_requested": options.threads,
            },
            onnx_sha256=sha256_file(graph),
            build=build,
            timings=stages.timings,
        )
    return CpuBuildResult(target, manifest, src, build)
