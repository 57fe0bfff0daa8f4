"""Serve's readiness warm-up runs every batch bucket of the served batch range (dynamic batching:
the runner's loop; in-flight: the step function), so no first request of a new size waits for a
plan, a capture or a fallback's compile."""

from __future__ import annotations

from types import SimpleNamespace


def test_readiness_warms_every_bucket_up_to_the_served_max_batch(caplog):
    from hrm_deploy.serve.server import _warm_buckets

    asked = []
    target = SimpleNamespace(warm_up=lambda max_batch: asked.append(max_batch) or [1, 2, 4, 8])
    with caplog.at_level("INFO"):
        _warm_buckets(target, 8)
    assert asked == [8] and "warmed up batch buckets [1, 2, 4, 8]" in caplog.text
    _warm_buckets(SimpleNamespace(), 8)  # runners without plans (ONNX Runtime, checkpoints): nothing to do
