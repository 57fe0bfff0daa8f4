"""Streams (hrm_deploy/streams.py): work run side by side comes back in the order it was handed out,
never more than ``streams`` at once; a consumer that stops early leaves nothing running and gets
nothing that ran ahead; a failure surfaces where it happened; and a graph runner's outputs from
concurrent calls are the same bits as from one call at a time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hrm_deploy.streams import in_order, stream_count


class Recorder:
    """Work whose later items finish first (item i sleeps (n - i) ms), recording what started and
    how many ran at once."""

    def __init__(self, n: int) -> None:
        self.n, self.running, self.most = n, 0, 0
        self.started: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, item: int) -> int:
        with self.lock:
            self.started.append(item)
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep((self.n - item) / 1000)
        with self.lock:
            self.running -= 1
        if item == 13:
            raise ValueError("item 13")
        return item * item


def test_results_come_in_the_order_handed_out_with_at_most_streams_at_once():
    work = Recorder(12)
    assert list(in_order(work, range(12), 3)) == [i * i for i in range(12)]
    assert sorted(work.started) == list(range(12)) and 1 < work.most <= 3


def test_one_stream_works_in_the_callers_thread_as_each_item_is_asked_for():
    threads: list[str] = []

    def work(item: int) -> int:
        threads.append(threading.current_thread().name)
        return item

    results = in_order(work, range(5), 1)
    assert next(results) == 0 and len(threads) == 1
    assert list(results) == [1, 2, 3, 4] and set(threads) == {threading.current_thread().name}


def test_stopping_early_leaves_nothing_running_and_nothing_started_past_what_ran_ahead():
    work = Recorder(40)
    results = in_order(work, range(40), 3)
    taken = [next(results) for _ in range(4)]
    results.close()
    assert taken == [0, 1, 4, 9]
    assert work.running == 0 and len(work.started) <= 4 + 3  # the four taken and at most three ahead
    assert not [t for t in threading.enumerate() if t.name.startswith("hrm-stream")]


def test_a_failure_surfaces_at_its_place_after_the_results_before_it():
    work = Recorder(20)
    got = []
    with pytest.raises(ValueError, match="item 13"):
        for value in in_order(work, range(20), 4):
            got.append(value)
    assert got == [i * i for i in range(13)]
    assert not [t for t in threading.enumerate() if t.name.startswith("hrm-stream")]


def test_the_streams_are_one_per_core_up_to_four_sharing_the_cores_beyond():
    from hrm_deploy.streams import threads_per_stream
    from hrm_deploy.system import usable_cores

    assert (stream_count(3), threads_per_stream(3)) == (3, 1)
    assert (stream_count(16), threads_per_stream(16)) == (4, 4)
    assert stream_count(None) == min(4, usable_cores()) >= 1 and threads_per_stream(None) >= 1


def test_a_graph_runners_concurrent_calls_give_the_same_bits_as_one_at_a_time(tiny_onnx):
    """The holdout's FP32 reference through a runner of 3 streams (single-thread sessions called
    from 3 threads) equals, bit for bit, the same through one stream of one thread, for the
    unroll and the single-step graph."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.holdout import Holdout

    examples = load_examples(tiny_onnx.data, 60, split="test")
    for graph in (tiny_onnx.unrolled, tiny_onnx.step):
        outputs = []
        for threads in (1, 3):
            with GraphRunner(graph_metadata(load_onnx(graph)), threads=threads) as runner:
                holdout = Holdout(graph, examples, runner, 60, 60, streams=runner.streams)
                outputs.append(holdout.reference(60))
                assert holdout.tally.fp32_puzzles == 60
        one, three = outputs
        assert np.array_equal(one.logits, three.logits) and np.array_equal(one.q_halt, three.q_halt)
