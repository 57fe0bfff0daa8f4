"""Serving HRM behind NVIDIA Triton Inference Server.

- :mod:`hrm_deploy.runtime.artifact`: what an artifact takes and gives (sizes, I/O from its manifest);
- :mod:`hrm_deploy.serve.server`: ``hrm-deploy serve`` on PyTriton (our runner inside Triton's
  dynamic batcher);
- :mod:`hrm_deploy.serve.repo`: ``hrm-deploy triton-repo``, a model repository for a stand-alone
  Triton (``tensorrt_plan`` / ``onnxruntime`` models, a Python-backend ACT driver for step models);
- :mod:`hrm_deploy.serve.client`: :func:`~hrm_deploy.serve.client.infer_remote` over HTTP.

Nothing here imports torch, onnx, pytriton or tritonclient at module level.
"""
