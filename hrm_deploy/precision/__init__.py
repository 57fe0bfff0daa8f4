"""Precision transforms of exported graphs.

- :mod:`~hrm_deploy.precision.convert`: the precision stage, ``make_precision_graph`` (FP32 ONNX ->
  FP16 / BF16 / INT8 ONNX + manifest, with an accuracy check on held-out examples);
- :mod:`~hrm_deploy.precision.fp16`: FP16/BF16 graphs with float32 islands;
- :mod:`~hrm_deploy.precision.int8`: INT8 Q/DQ with calibration (TensorRT's convention) and its range cache;
- :mod:`~hrm_deploy.precision.accuracy`: the accuracy check of a graph on ONNX Runtime CPU.

Examples come from :mod:`hrm_deploy.data.examples`; metrics from :mod:`hrm_deploy.metrics`.
"""
