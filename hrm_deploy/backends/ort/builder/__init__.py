"""The ``cpu`` target: an ONNX graph ONNX Runtime's CPU provider runs fastest.

- :mod:`.target`: ``BUILDER`` (``build_for_cpu``), the build stage's entry point (it takes the FP32 export);
- :mod:`.options`: ``CpuOptions``, the cpu target's build options (threads, fusions, INT8 recipe);
- :mod:`.int8`: the INT8 recipes (dynamic, blockwise; static in :mod:`.static`);
- :mod:`.cpu`: the build itself (fusions, quantization, accuracy check, manifest);
- :mod:`.fusion`: graph rewrites ORT fuses into its contrib kernels;
- :mod:`.static`: static INT8 (calibrated activations) and its accuracy-budget fit.
"""
