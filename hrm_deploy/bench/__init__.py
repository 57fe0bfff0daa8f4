"""bench: latency, throughput, memory, accuracy (and Jetson power) of artifacts side by side.

- :mod:`~hrm_deploy.bench.run`: ``bench()``, every artifact and the PyTorch reference measured in one
  run on one machine (ratios compare like with like), the report table (with each artifact's mean
  ACT steps) and plot;
- :mod:`~hrm_deploy.bench.profile`: ``profile()``, per-layer times folded into blocks per ACT step
  (ONNX Runtime's profiler, TensorRT's layer profiler, torch.profiler, a trtexec JSON);
- :mod:`~hrm_deploy.bench.blocks`: the block classification and tables the profiles share;
- :mod:`~hrm_deploy.bench.common`: what bench and profile share (batch bound, tiling, the machine,
  default data and artifacts): neither imports the other;
- :mod:`~hrm_deploy.bench.arc_tasks`: ARC tasks/s at each artifact's best batch when the data is an
  ARC dataset;
- :mod:`~hrm_deploy.bench.files`: a report folder published as one set under the artifact rule;
- :mod:`~hrm_deploy.bench.stats`: latency statistics of repeated timings;
- :mod:`~hrm_deploy.bench.jetson`: Jetson facts (JetPack, nvpmodel, clocks) and ``tegrastats`` power;
- :mod:`~hrm_deploy.bench.remote`: ``bench --host USER@HOST`` over ssh/scp.
"""
