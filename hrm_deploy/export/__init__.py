"""The export stage: checkpoint -> FP32 ONNX (dynamic batch, parity-checked).

- :mod:`~hrm_deploy.export.unroll`: ACT unrolling into fixed-step modules (no data-dependent control flow);
- :mod:`~hrm_deploy.export.onnx_export`: ``export_onnx`` (the stages below in order, checks, manifest);
- :mod:`~hrm_deploy.export.trace`: the two traced pieces (embedding + initial carry, one ACT segment);
- :mod:`~hrm_deploy.export.assemble`: the step and unrolled graphs from the pieces;
- :mod:`~hrm_deploy.export.loop`: the loop graph (``--mode loop``), its halting rule and parity;
  :mod:`~hrm_deploy.export.loop_body` edits its body;
- :mod:`~hrm_deploy.export.graph`: ONNX graph assembly, folding and structural checks;
- :mod:`~hrm_deploy.export.slicing`: static ``Slice``/``Split`` as ``Gather`` (no shape layers in TensorRT);
- :mod:`~hrm_deploy.export.metadata`: the ``hrm_deploy.*`` graph metadata, read back (``graph_metadata``);
- :mod:`~hrm_deploy.export.parity`: parity against the PyTorch reference on ONNX Runtime;
  :mod:`~hrm_deploy.export.parity_limits`: what float32 may differ by (and ``TensorDiff``).
"""
