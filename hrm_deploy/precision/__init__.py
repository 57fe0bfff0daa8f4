"""Precision transforms of exported graphs.

- :mod:`~hrm_deploy.precision.convert`: the precision stage, ``make_precision_graph`` (FP32 ONNX ->
  FP16 / BF16 / INT8 ONNX + manifest, with an accuracy check on held-out examples);
- :mod:`~hrm_deploy.precision.fp16`: FP16/BF16 graphs with float32 islands;
- :mod:`~hrm_deploy.precision.int8`, `~.fp8`, `~.nvfp4`: the Q/DQ graph writers (TensorRT's convention);
- :mod:`~hrm_deploy.precision.calibrate`: calibration (the activation ranges) and its cache, shared by every Q/DQ writer;
- :mod:`~hrm_deploy.precision.registry`: the precision table, one row per precision;
- :mod:`~hrm_deploy.precision.fallback`: the accuracy-budget fallback (sensitive layers kept float);
- :mod:`~hrm_deploy.precision.accuracy`: the accuracy check of a graph on ONNX Runtime CPU.

Examples come from :mod:`hrm_deploy.data.examples`; metrics from :mod:`hrm_deploy.metrics`.
"""
