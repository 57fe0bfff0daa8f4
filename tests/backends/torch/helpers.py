"""Helpers of the PyTorch engine tests: held-out examples and the reference's answers."""

from __future__ import annotations


def examples(data, n=64):
    from hrm_deploy.data.examples import load_examples

    return load_examples(data, n, split="test")


def reference(checkpoint, feeds, steps):
    from hrm_deploy.backends.reference import TorchRunner

    with TorchRunner(checkpoint, steps=steps) as ref:
        return ref.infer(feeds)
