"""The ``cpu`` target: an ONNX graph ONNX Runtime's CPU provider runs fastest.

- :mod:`.target`: ``build_for_cpu``, the engine stage's entry point;
- :mod:`.int8`: the INT8 recipes (dynamic, blockwise; static in :mod:`.static`);
- :mod:`.cpu`: the build itself (fusions, quantization, accuracy check, manifest);
- :mod:`.fusion`: graph rewrites ORT fuses into its contrib kernels;
- :mod:`.static`: static INT8 (calibrated activations) and its accuracy-budget fit.
"""
