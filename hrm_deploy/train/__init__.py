"""Bundled trainer: upstream HRM's training semantics in plain PyTorch (runs on CPU too)."""
