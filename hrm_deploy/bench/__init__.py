"""bench: latency, throughput, memory, accuracy (and Jetson power) of artifacts side by side.

- :mod:`~hrm_deploy.bench.run`: ``bench()``, every artifact and the PyTorch reference measured in one
  run on one machine (ratios compare like with like), the report table and plot;
- :mod:`~hrm_deploy.bench.stats`: latency statistics of repeated timings;
- :mod:`~hrm_deploy.bench.jetson`: Jetson facts (JetPack, nvpmodel, clocks) and ``tegrastats`` power;
- :mod:`~hrm_deploy.bench.remote`: ``bench --host USER@HOST`` over ssh/scp.
"""
