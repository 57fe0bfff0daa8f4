"""Datasets in upstream HRM's on-disk format, and generators (Sudoku)."""
