"""TensorRT and TensorRT-RTX: run ``.engine``/``.plan`` files through the device loop
(:mod:`.runner`, :mod:`.adapter`) and build them (:mod:`.builder`). :mod:`.api` hides the
differences between the two libraries (module, contexts, caches) for both sides.

The run side imports no torch or onnx: it is the light on-device path (Jetson)."""
