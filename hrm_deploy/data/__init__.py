"""Datasets in upstream HRM's on-disk format, and generators.

- :mod:`~hrm_deploy.data.format`: read and write upstream's format (``Split``, ``load_split``);
- :mod:`~hrm_deploy.data.sudoku`, :mod:`~hrm_deploy.data.maze`: generators in upstream's encodings;
- :mod:`~hrm_deploy.data.benchmarks`: upstream's Sudoku-Extreme and maze builders (CSV -> format), byte for
  byte, and ``prepare_dataset`` (a ``--data`` argument, Hub benchmarks included -> a dataset folder).
"""
