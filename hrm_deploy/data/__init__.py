"""Datasets in upstream HRM's on-disk format, and generators.

- :mod:`~hrm_deploy.data.format`: read and write upstream's format (``Split``, ``load_split``);
- :mod:`~hrm_deploy.data.sudoku`, :mod:`~hrm_deploy.data.maze`: generators in upstream's encodings.
"""
