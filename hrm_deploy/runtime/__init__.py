"""What every engine runner shares, below the backends.

- :mod:`~hrm_deploy.runtime.base`: the :class:`Runner` template (activate / infer / close) and
  :class:`LoopRunner` (step artifacts driven by the device loop);
- :mod:`~hrm_deploy.runtime.device_loop`: buffers per batch bucket, one stream, the captured ACT loop;
- :mod:`~hrm_deploy.runtime.device_step`: one ACT step per call on the device loop's plans, for
  in-flight batching (per-row reset, carry compacted by device copies, bucket moves);
- :mod:`~hrm_deploy.runtime.memory`: device memory backends (torch, cuda-python, host);
- :mod:`~hrm_deploy.runtime.adapter`: the engine interface the loop drives (one per backend);
- :mod:`~hrm_deploy.runtime.compat`: does an engine fit the runtime and GPU here;
- :mod:`~hrm_deploy.runtime.infer`: runners over examples;
- :mod:`~hrm_deploy.runtime.artifact`: what an artifact takes and gives (sizes, I/O, max batch), read
  from its manifest without running it.

Nothing here imports a backend, torch or onnx at module level.
"""
