"""The engine stage: an export (or a checkpoint) -> an engine for a target, by whichever backend builds it.

- :mod:`~hrm_deploy.engines.config`: :class:`~hrm_deploy.engines.config.EngineConfig` (the common
  fields and the building backend's options, every option checked once), the one config every
  builder reads;
- :mod:`~hrm_deploy.engines.build`: ``build_engine``, which composes the pipeline (source ->
  single-step graph where the builder prefers it -> precision graph) and hands the backend's
  builder a ready graph, and ``build_engine_from``, the same from what ``build-engine`` was given;
- :mod:`~hrm_deploy.engines.options`: :class:`~hrm_deploy.engines.options.BuildOptions`, the base of
  each backend's options class (its row's ``build_options``), the ``build-engine`` flags made from
  their fields, and the one-line refusal of an option given to a backend that does not take it;
- :mod:`~hrm_deploy.engines.request`: the :class:`~hrm_deploy.engines.request.BuildRequest` a
  builder gets, the :class:`~hrm_deploy.engines.request.Builder` protocol every builder follows and
  :func:`~hrm_deploy.engines.request.builder`, the typed lookup in the backend table;
- :mod:`~hrm_deploy.engines.targets`: deployment targets as frozen profiles, the precisions each
  GPU generation runs;
- :mod:`~hrm_deploy.engines.result`: what every builder returns, the newest export, the data fields
  an export recorded.

The builders themselves live with their backends: :mod:`hrm_deploy.backends.tensorrt.builder`
(TensorRT / TensorRT-RTX, in a child process), :mod:`hrm_deploy.backends.ort.builder` (the ``cpu``
target) and :mod:`hrm_deploy.backends.torch.builder` (AOTInductor ``.pt2``).
"""
