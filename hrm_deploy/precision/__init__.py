"""Precision transforms of exported graphs.

- :mod:`~hrm_deploy.precision.convert`: the precision stage, ``make_precision_graph`` (FP32 ONNX ->
  FP16 / BF16 / INT8 / FP8 / NVFP4 ONNX + manifest, with an accuracy check on held-out examples);
- :mod:`~hrm_deploy.precision.fp16`: FP16/BF16 graphs with float32 islands;
- :mod:`~hrm_deploy.precision.int8`: INT8 Q/DQ (TensorRT's convention; uint8 activations for ORT's CPU GEMMs);
- :mod:`~hrm_deploy.precision.fp8`: FP8 (E4M3) Q/DQ, Ada / Hopper / Blackwell;
- :mod:`~hrm_deploy.precision.nvfp4`: NVFP4 (E2M1 weights, E4M3 block scales), Blackwell, and its CPU simulation;
- :mod:`~hrm_deploy.precision.job`: ``QuantJob``, the FP32 graph parsed once and calibrated once, what every
  Q/DQ writer takes, and ``prepare_job``, the one preamble of every quantized build;
- :mod:`~hrm_deploy.precision.calibrate`: calibration (the activation ranges) and its cache, shared by every Q/DQ writer;
- :mod:`~hrm_deploy.precision.registry`: the precision table, one row per precision;
- :mod:`~hrm_deploy.precision.conductor`: ``conduct``, the one function every quantized build (every target)
  measures its candidates with, falls back with, and learns which graph to publish from;
- :mod:`~hrm_deploy.precision.rule`: the accuracy rule (non-finite outputs, paired flips, what verify judges at
  the row's thresholds, each with its margin);
- :mod:`~hrm_deploy.precision.holdout`: the puzzles a verdict is measured on, FP32 run once per puzzle;
- :mod:`~hrm_deploy.precision.fallback`: the fallback's search (weight groups, bisection over the ranking);
- :mod:`~hrm_deploy.precision.sensitivity`: the fallback's one-pass ranking (each weight's own output error);
- :mod:`~hrm_deploy.precision.accuracy`: holdout size and examples, graphs' outputs on ONNX Runtime CPU.

Examples come from :mod:`hrm_deploy.data.examples`; metrics from :mod:`hrm_deploy.metrics`.
"""
