"""Bundled trainer: upstream HRM's training semantics in plain PyTorch (runs on CPU too).

- :mod:`~hrm_deploy.train.loop`: ``TrainConfig`` and ``train()``, the loop itself (read it first);
- :mod:`~hrm_deploy.train.presets`: named presets and ``train_configs`` (what the CLI calls);
- :mod:`~hrm_deploy.train.sampler`: upstream-style epoch sampling and batches;
- :mod:`~hrm_deploy.train.checkpointer`: ``Checkpointer`` (periodic, on-signal, final), run-folder guard;
- :mod:`~hrm_deploy.train.state`: RNG and ACT-carry state saved in checkpoints;
- :mod:`~hrm_deploy.train.distributed`: torchrun/DDP helpers (no-ops on one process);
- :mod:`~hrm_deploy.train.losses`, :mod:`~hrm_deploy.train.optim`: ACT loss, AdamATan2, sign-SGD embeddings;
- :mod:`~hrm_deploy.train.sinks`: optional TensorBoard / W&B metric sinks.
"""
