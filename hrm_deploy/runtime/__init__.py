"""What every engine runner shares, below the backends.

- :mod:`~hrm_deploy.runtime.base`: the :class:`Runner` template (activate / infer / close) and
  :class:`LoopRunner` (step artifacts driven by the device loop);
- :mod:`~hrm_deploy.runtime.device_loop`: buffers per batch bucket, one stream, the captured ACT loop;
- :mod:`~hrm_deploy.runtime.memory`: device memory backends (torch, cuda-python, host);
- :mod:`~hrm_deploy.runtime.adapter`: the engine interface the loop drives (one per backend);
- :mod:`~hrm_deploy.runtime.compat`: does an engine fit the runtime and GPU here;
- :mod:`~hrm_deploy.runtime.infer`: runners over examples.

Nothing here imports a backend, torch or onnx at module level.
"""
