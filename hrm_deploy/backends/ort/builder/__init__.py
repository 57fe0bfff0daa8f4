"""The ``cpu`` target: an ONNX graph ONNX Runtime's CPU provider runs fastest.

- :mod:`.target`: ``BUILDER`` (``build_for_cpu``), the build stage's entry point (it takes the FP32 export);
- :mod:`.options`: ``CpuOptions``, the cpu target's build options (threads, fusions, INT8 recipe, static INT8's
  activations), each a ``build-engine`` flag;
- :mod:`.int8`: the INT8 recipes (dynamic, blockwise; static in :mod:`.static`);
- :mod:`.cpu`: the build itself (fusions, quantization, the load check, manifest; static INT8 through the
  precision conductor);
- :mod:`.fusion`: graph rewrites ORT fuses into its contrib kernels;
- :mod:`.static`: static INT8's candidates (calibrated activations; a candidate keeping MatMuls float is the one Q/DQ graph edited, :func:`hrm_deploy.precision.fallback.keep_float`), handed to the precision conductor;
- :mod:`.isa`: the integer GEMM (U8S8 or S8S8) the CPU's ISA calls for.
"""
