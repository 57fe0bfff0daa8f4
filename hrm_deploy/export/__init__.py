"""The export stage: checkpoint -> FP32 ONNX (dynamic batch, parity-checked).

- :mod:`~hrm_deploy.export.unroll`: ACT unrolling into fixed-step modules (no data-dependent control flow);
- :mod:`~hrm_deploy.export.onnx_export`: ``export_onnx`` (trace, assemble, check, parity, manifest);
- :mod:`~hrm_deploy.export.graph`: ONNX graph assembly, folding and structural checks;
- :mod:`~hrm_deploy.export.slicing`: static ``Slice``/``Split`` as ``Gather`` (no shape layers in TensorRT);
- :mod:`~hrm_deploy.export.metadata`: the ``hrm_deploy.*`` graph metadata, read back (``graph_metadata``);
- :mod:`~hrm_deploy.export.parity`: parity against the PyTorch reference on ONNX Runtime.
"""
