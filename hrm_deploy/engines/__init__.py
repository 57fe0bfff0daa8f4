"""The engine stage: TensorRT / TensorRT-RTX engines and PyTorch AOTInductor engines.

- :mod:`~hrm_deploy.engines.build`: ``build_engine`` (precision ONNX -> engine + manifest + layers.json);
- :mod:`~hrm_deploy.backends.tensorrt.builder.worker`: the TensorRT build itself, in a child process (reports its phases);
- :mod:`~hrm_deploy.backends.ort.builder.cpu`: the ``cpu`` target (a graph ONNX Runtime's CPU provider runs fastest);
- :mod:`~hrm_deploy.backends.tensorrt.builder.cost`: what an unrolled build costs, and when it needs ``--allow-unrolled``;
- :mod:`~hrm_deploy.engines.targets`: deployment targets as frozen profiles;
- :mod:`~hrm_deploy.backends.tensorrt.builder.layers`: what the engine inspector says about precision;
- :mod:`~hrm_deploy.backends.torch.builder`: ``--backend torch`` (AOTInductor ``.pt2``).

File names it writes: ``engines/README.md``. Running an engine is :mod:`hrm_deploy.backends`, which
also holds what building and running share: :mod:`~hrm_deploy.backends.tensorrt.api` (TensorRT vs
TensorRT-RTX behind one interface) and :mod:`~hrm_deploy.runtime.compat` (does an engine fit the
TensorRT and GPU running now).
"""
