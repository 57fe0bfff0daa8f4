"""Building TensorRT / TensorRT-RTX engines.

- :mod:`.engine`: ``BUILDER``, the backend table's builder (precision ONNX -> engine + manifest + layers.json);
- :mod:`.worker`: the build itself, in a child process (reports its phases);
- :mod:`.options`: ``TensorRTOptions`` (each field a ``build-engine`` flag), the timing-cache file and the
  equivalent ``trtexec`` / ``tensorrt_rtx`` line;
- :mod:`.cost`: what an unrolled build costs, and when it needs ``--allow-unrolled``;
- :mod:`.layers`: what the engine inspector says about precision.
"""
