"""Weight-stripped engines, refit on first boot.

``build-engine --strip-weights`` builds a TensorRT engine with ``STRIP_PLAN`` + ``REFIT_IDENTICAL``:
the plan holds no refittable weights (a fraction of the full engine's size, to ship or store), and the
weights it is refit with must be the ones it was built from. Those are the ONNX graph the build parsed,
which the engine's manifest names (``refit_source``: its path relative to the engine and its sha256).

On the first run the runner (:func:`refitted_engine`) checks that graph's sha256 against the manifest
before anything else, refits the engine from exactly those bytes (``OnnxParserRefitter.refit_from_bytes``),
refuses to run while ``get_missing_weights()`` names any weight, and saves the whole engine beside the
stripped one (``<name>.refitted.engine`` + its manifest, written atomically as one unit): later runs of
the stripped engine load that file, which is checked against the stripped engine's sha256. A folder that
cannot take it still runs, refitting each time (said once).

numpy-free and torch-free: the light on-device path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError, EngineError, MachineError
from hrm_deploy.io import sha256_bytes

log = logging.getLogger(__name__)

REFITTED_SUFFIX = ".refitted.engine"


def refitted_path(engine: str | Path) -> Path:
    """``m.engine`` -> ``m.refitted.engine``: the whole engine refit from a weight-stripped one."""
    engine = Path(engine)
    return engine.with_name(engine.name.removesuffix(".engine") + REFITTED_SUFFIX)


def refit_source(engine: Path, manifest: dict[str, Any]) -> tuple[Path, bytes]:
    """The graph a stripped engine refits from and its bytes, checked against the manifest's sha256
    (one line naming what to do when it is missing or is other bytes)."""
    record = manifest.get("refit_source") or {}
    if not record.get("path") or not record.get("sha256"):
        raise ArtifactError(
            f"{engine.name} is weight-stripped but its manifest names no graph to refit from; rebuild it"
        )
    # where the build left it, else beside the engine (an engine and its graph copied to a board together)
    places = [engine.parent / record["path"], engine.parent / Path(record["path"]).name]
    graph = next((p.resolve() for p in places if p.is_file()), None)
    if graph is None:
        raise ArtifactError(
            f"{engine.name} is weight-stripped and refits from {record['path']}, which is not there: copy that ONNX "
            "graph (the one it was built from) next to the engine"
        )
    data = graph.read_bytes()
    if sha256_bytes(data) != record["sha256"]:
        raise ArtifactError(
            f"{graph.name} is not the graph {engine.name} was built from (sha256 differs): a weight-stripped engine "
            "refits only from its own graph; copy that graph, or rebuild the engine"
        )
    return graph, data


def refit(trt: Any, logger: Any, engine: Any, graph: Path, data: bytes) -> bytes:
    """Refit ``engine`` (a deserialized weight-stripped engine) from the ONNX ``data`` read from
    ``graph``; returns the whole engine's serialized bytes. Never returns an engine with missing weights."""
    refitter = trt.Refitter(engine, logger)
    parser = trt.OnnxParserRefitter(refitter, logger)
    if not parser.refit_from_bytes(data, str(graph)):  # the path: where external weights are looked up
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise EngineError(
            f"TensorRT could not refit the engine from {graph.name}: {'; '.join(errors) or 'no reason given'}"
        )
    missing = list(refitter.get_missing_weights())
    if missing:
        raise EngineError(
            f"refitting from {graph.name} left {len(missing)} weights missing ({', '.join(missing[:3])}...): the "
            "engine will not run without them; rebuild it from this graph"
        )
    if not refitter.refit_cuda_engine():
        raise EngineError(f"TensorRT refused to refit the engine from {graph.name} (see its log above)")
    config = engine.create_serialization_config()
    config.clear_flag(trt.SerializationFlag.EXCLUDE_WEIGHTS)  # the whole engine, weights in
    return bytes(engine.serialize_with_config(config))


def save_refitted(engine_path: Path, manifest: dict[str, Any], blob: bytes, stripped_sha256: str) -> Path | None:
    """The refit engine beside the stripped one, with its own manifest (atomic, as one unit); None
    (said once) where the folder cannot take it."""
    from hrm_deploy.io import staging_dir
    from hrm_deploy.manifest import publish_artifact

    out = refitted_path(engine_path)
    kept = ("backend", "precision", "mode", "steps", "profile_shapes", "target", "compute_capability", "build_machine")
    try:
        with staging_dir(out.parent, "build") as work:
            staged = work / out.name
            staged.write_bytes(blob)
            publish_artifact(
                staged,
                out,
                stage="refit",
                parent=engine_path,
                parent_sha256=stripped_sha256,
                config={"refit_from": manifest.get("refit_source")},
                weights_stripped=False,
                **{k: manifest[k] for k in kept if k in manifest},
            )
    except (OSError, MachineError, ArtifactError) as exc:
        log.warning(
            "the refit engine could not be saved beside %s (%s): it is refit again on every run", engine_path, exc
        )
        return None
    log.info(
        "refit %s from %s and saved the whole engine as %s",
        engine_path.name,
        manifest["refit_source"]["path"],
        out.name,
    )
    return out


def saved_refit(engine_path: Path, stripped_sha256: str) -> bytes | None:
    """The bytes of an earlier refit of this stripped engine (its manifest's parent is these bytes), or None."""
    from hrm_deploy.manifest import manifest_path, read_manifest, read_verified

    out = refitted_path(engine_path)
    if not (out.is_file() and manifest_path(out).is_file()):
        return None
    if (read_manifest(out).get("parent") or {}).get("sha256") != stripped_sha256:
        log.info("%s was refit from another build of %s: refitting again", out.name, engine_path.name)
        return None
    blob, _ = read_verified(out, require_manifest=True)
    return blob
