"""Serving HRM and TRM behind NVIDIA Triton Inference Server.

- :mod:`~hrm_deploy.serve.server`: ``hrm-deploy serve``, orchestration only: checks, the runner, the
  batching mode, tritonserver behind the checking front, signals and drain;
- :mod:`~hrm_deploy.serve.binding`: everything that knows PyTriton (tensors, tritonserver's config,
  the proxy patch that turns a refused request into HTTP 400, the releases it was reviewed against);
- :mod:`~hrm_deploy.serve.front`: the HTTP front on the user's port (each request checked before Triton
  sees it), on :mod:`~hrm_deploy.serve.listener` (aiohttp's server: framing, bounds, deadlines);
- :mod:`~hrm_deploy.serve.wire`: one request's arrays checked against the model, the KServe v2 wire form;
- :mod:`~hrm_deploy.serve.inflight`: in-flight batching, one ACT loop that requests join and leave at
  step boundaries; :mod:`~hrm_deploy.serve.endpoint`: the front's in-flight endpoint over it;
- :mod:`~hrm_deploy.serve.repo`: ``hrm-deploy triton-repo``, a model repository for a stand-alone
  Triton (``tensorrt_plan`` / ``onnxruntime`` models, a Python-backend ACT driver for step models,
  in-flight by request rescheduling; a KServe manifest), whose Python-backend models are
  :mod:`~hrm_deploy.serve.triton_models` (the ACT driver, ONNX Runtime on the CPU: self-contained
  files copied into the repository);
- :mod:`~hrm_deploy.serve.client`: :func:`~hrm_deploy.serve.client.infer_remote` over HTTP.

An artifact's sizes and I/O come from :func:`hrm_deploy.runtime.artifact.read_contract`. Nothing here
imports torch, onnx, pytriton, tritonclient or aiohttp at module level.
"""
