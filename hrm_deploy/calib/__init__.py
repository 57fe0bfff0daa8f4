"""Precision transforms of exported graphs (to become ``precision/``, issue 12).

- :mod:`~hrm_deploy.calib.convert`: the precision stage, ``make_precision_graph`` (FP32 ONNX ->
  FP16 / BF16 / INT8 ONNX + manifest, with an accuracy check on held-out examples);
- :mod:`~hrm_deploy.calib.fp16`: FP16/BF16 graphs with float32 islands;
- :mod:`~hrm_deploy.calib.int8`: INT8 Q/DQ with calibration (TensorRT's convention);
- :mod:`~hrm_deploy.calib.data`: ``Examples``, K deterministic examples for calibration and evaluation;
- :mod:`~hrm_deploy.calib.accuracy`: exact and token accuracy of a runner's answers.
"""
