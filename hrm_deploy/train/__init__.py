"""Bundled trainer: upstream HRM's training semantics in plain PyTorch (runs on CPU too).

- :mod:`~hrm_deploy.train.loop`: ``train()``, the loop itself (read it first);
- :mod:`~hrm_deploy.train.config`: ``TrainConfig``, the hyper-parameters;
- :mod:`~hrm_deploy.train.setup`: what a run starts from (data, model, optimizers, a resumed state) and
  the caller's ``Start`` hooks;
- :mod:`~hrm_deploy.train.presets`: named presets and ``train_configs`` (what the CLI calls);
- :mod:`~hrm_deploy.train.sampler`: upstream-style epoch sampling and batches;
- :mod:`~hrm_deploy.train.checkpointer`: ``Checkpointer`` (periodic, on-signal, final), run-folder guard;
- :mod:`~hrm_deploy.train.state`: RNG and ACT-carry state saved in checkpoints;
- :mod:`~hrm_deploy.train.distributed`: torchrun/DDP helpers (no-ops on one process);
- :mod:`~hrm_deploy.train.losses`, :mod:`~hrm_deploy.train.optim`: ACT loss, AdamATan2, sign-SGD embeddings;
- :mod:`~hrm_deploy.train.sinks`: optional TensorBoard / W&B metric sinks.
"""
