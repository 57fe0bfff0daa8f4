"""The ``hrm_deploy.*`` metadata an export writes into an ONNX graph, read back.

The writer is :func:`hrm_deploy.export.onnx_export.export_onnx` (``metadata_props`` keys
``hrm_deploy.mode``, ``.steps``, ``.max_batch``, ``.seq_len``, ``.vocab_size``, ``.precision``,
``.config``...); runners, the precision converters and engine builders read it through here, so
the reader sits beside the writer, below every room that needs it."""

from __future__ import annotations

import json
from typing import Any

from hrm_deploy.errors import ArtifactError

PREFIX = "hrm_deploy."


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
