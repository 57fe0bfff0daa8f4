"""The ``cpu`` target: an ONNX graph ONNX Runtime's CPU provider runs fastest.

- :mod:`.int8`: ``build_for_cpu`` (the target's entry point) and the dynamic INT8 recipes;
- :mod:`.cpu`: the build itself (fusions, quantization, accuracy check, manifest);
- :mod:`.fusion`: graph rewrites ORT fuses into its contrib kernels;
- :mod:`.static`: static INT8 (calibrated activations) and its accuracy-budget fit.
"""
