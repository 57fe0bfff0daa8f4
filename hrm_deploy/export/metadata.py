"""The ``hrm_deploy.*`` metadata an export writes into an ONNX graph, and its reader.

:func:`write_graph_metadata` (called by :func:`hrm_deploy.export.onnx_export.export_onnx`) sets the
``metadata_props`` keys ``hrm_deploy.mode``, ``.steps``, ``.max_batch``, ``.seq_len``,
``.vocab_size``, ``.precision``, ``.config``...; :func:`set_graph_precision` is how the precision
stage relabels a converted graph; runners, the precision converters and engine builders read it
through :func:`graph_metadata`, below every room that needs it."""

from __future__ import annotations

import json
from typing import Any

from hrm_deploy.errors import ArtifactError

PREFIX = "hrm_deploy."


def write_graph_metadata(
    graph,
    cfg,
    *,
    mode: str | None,
    steps: int,
    max_batch: int,
    puzzle_emb: str,
    precision: str = "fp32",
    halt: str | None = None,
) -> None:
    """Write the ``hrm_deploy.*`` metadata of an export of model config ``cfg`` into ``graph``
    (an ``onnx.ModelProto``, in place); ``halt``: a loop graph's built-in halting rule."""
    import onnx

    meta = {
        "mode": str(mode),  # the resolved mode (export_onnx fills it before writing)
        "steps": str(steps),
        "max_batch": str(max_batch),
        "seq_len": str(cfg.seq_len),
        "vocab_size": str(cfg.vocab_size),
        "puzzle_emb_len": str(cfg.puzzle_emb_len),
        "hidden_size": str(cfg.hidden_size),
        "precision": precision,
        "puzzle_emb": puzzle_emb,
        "config": json.dumps(cfg.to_dict(), sort_keys=True),
        **({"halt": halt} if halt is not None else {}),
    }
    onnx.helper.set_model_props(graph, {PREFIX + key: value for key, value in meta.items()})


def set_graph_precision(model, precision: str) -> None:
    """Relabel a converted graph's ``hrm_deploy.precision`` (in place)."""
    for prop in model.metadata_props:
        if prop.key == PREFIX + "precision":
            prop.value = precision


def graph_metadata(model) -> dict[str, Any]:
    """The ``hrm_deploy.*`` metadata an export wrote into the graph (mode, steps, config...).

    ``model`` is an ``onnx.ModelProto`` (weights need not be loaded). ``steps`` comes back as an
    int and ``config`` as a dict; a graph without the metadata is an :class:`ArtifactError`."""
    meta = {p.key[len(PREFIX) :]: p.value for p in model.metadata_props if p.key.startswith(PREFIX)}
    if "mode" not in meta:
        raise ArtifactError("this ONNX has no hrm_deploy metadata; use a graph written by `hrm-deploy export`")
    meta["steps"] = int(meta.get("steps", 1))
    meta["config"] = json.loads(meta.get("config", "{}"))
    return meta


# What a graph's manifest and its own metadata must both say (a manifest edited and resealed could
# say bf16 of an fp32 graph: verify's tolerances and every report would follow the manifest)
DESCRIBED = ("precision", "mode", "steps")


def manifest_mismatch(meta: dict[str, Any], manifest: dict[str, Any] | None) -> str | None:
    """The first field of :data:`DESCRIBED` on which ``manifest`` contradicts the graph's own
    ``meta`` (:func:`graph_metadata`), as one line; None when they agree (or a field is absent)."""
    for field in DESCRIBED:
        graph, recorded = meta.get(field, "fp32" if field == "precision" else None), (manifest or {}).get(field)
        if graph is not None and recorded is not None and str(graph) != str(recorded):
            return (
                f"its manifest says {field} {recorded} but the graph itself says {graph}: the manifest does not "
                "describe this graph (edited and resealed?); re-create the artifact"
            )
    return None
