"""How many tasks the worker agent lets a processor hold, by the mean task duration (of the
task's callable, when this worker has timed it)."""

from __future__ import annotations

import pytest

from scaler_executor.worker.agent import (
    MAX_DEPTH,
    QUEUED_WORK_SECONDS,
    SHORT_DEPTH,
    SHORT_TASK_SECONDS,
    UNTIMED_DEPTH,
    processor_depth,
    task_depth,
)


@pytest.mark.parametrize(
    ("mean", "depth"),
    [(None, 1), (10.0, 1), (SHORT_TASK_SECONDS, 1), (0.004, 3), (0.001, 3), (0.0005, 5), (0.0001, 8), (0.0, 8)],
)
def test_depth_by_mean_task_duration(mean: float | None, depth: int) -> None:
    assert processor_depth(mean) == depth


def test_deeper_than_short_depth_only_while_the_queued_work_fits_the_budget() -> None:
    for micros in range(0, int(SHORT_TASK_SECONDS * 1e6), 7):
        mean = micros / 1e6
        depth = processor_depth(mean)
        assert SHORT_DEPTH <= depth <= MAX_DEPTH
        if depth > SHORT_DEPTH:
            assert (depth - 1) * mean <= QUEUED_WORK_SECONDS, f"{depth} tasks of {mean * 1e3:.3f} ms"


def test_a_timed_callable_goes_by_its_own_mean_whatever_the_worker_saw() -> None:
    assert task_depth(0.0001, 10.0) == processor_depth(0.0001) == MAX_DEPTH
    assert task_depth(10.0, 0.0001) == 1
    assert task_depth(0.001, None) == processor_depth(0.001)


@pytest.mark.parametrize("worker_mean", [None, 0.0, 0.0001, 0.001, SHORT_TASK_SECONDS, 10.0])
def test_an_untimed_callable_gets_at_most_one_task_queued_behind_the_running_one(worker_mean: float | None) -> None:
    assert task_depth(None, worker_mean) == min(UNTIMED_DEPTH, processor_depth(worker_mean))
    assert task_depth(None, worker_mean) <= 2
