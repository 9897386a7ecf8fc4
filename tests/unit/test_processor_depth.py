"""How the worker agent deals tasks to its processors (worker/dealing.py): how many a
processor may hold, by the mean task duration (of the task's callable, when this worker has
timed it); when one holding short tasks is topped up; when the tasks queued behind a running
one are recalled.  Time is a parameter: the agent passes how long the running task has run."""

from __future__ import annotations

import pytest

from scaler_executor.worker.dealing import (
    MAX_DEPTH,
    QUEUED_WORK_SECONDS,
    RECALL_AFTER,
    REFILL_AT,
    SHORT_DEPTH,
    SHORT_TASK_SECONDS,
    UNTIMED_DEPTH,
    processor_depth,
    recall_due,
    takes_more,
    task_depth,
)


@pytest.mark.parametrize(
    ("mean", "depth"),
    [(None, 1), (10.0, 1), (SHORT_TASK_SECONDS, 1), (0.004, 3), (0.001, 3), (0.0005, 5), (0.0001, 21), (0.00001, MAX_DEPTH), (0.0, MAX_DEPTH)],
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
    assert task_depth(0.00001, 10.0) == processor_depth(0.00001) == MAX_DEPTH
    assert task_depth(10.0, 0.0001) == 1
    assert task_depth(0.001, None) == processor_depth(0.001)


@pytest.mark.parametrize("worker_mean", [None, 0.0, 0.0001, 0.001, SHORT_TASK_SECONDS, 10.0])
def test_an_untimed_callable_gets_at_most_one_task_queued_behind_the_running_one(worker_mean: float | None) -> None:
    assert task_depth(None, worker_mean) == min(UNTIMED_DEPTH, processor_depth(worker_mean))
    assert task_depth(None, worker_mean) <= 2


AGES = [0.0, 1e-6, QUEUED_WORK_SECONDS, RECALL_AFTER / 2, RECALL_AFTER - 1e-9, RECALL_AFTER, RECALL_AFTER * 2, 10.0]


@pytest.mark.parametrize("age", AGES)
def test_a_processor_holding_nothing_is_dealt_to_whatever_its_last_head_age(age: float) -> None:
    assert takes_more(0, age)


def test_a_processor_is_topped_up_once_down_to_refill_at_and_not_before() -> None:
    for held in range(1, MAX_DEPTH + 1):
        assert takes_more(held, 0.0) is (held <= REFILL_AT), held


def test_nothing_more_goes_behind_a_running_task_once_it_has_run_recall_after() -> None:
    assert takes_more(REFILL_AT, RECALL_AFTER - 1e-9)
    assert not takes_more(REFILL_AT, RECALL_AFTER)
    assert not takes_more(REFILL_AT, 10.0)


def test_queued_tasks_are_recalled_once_the_running_one_has_run_recall_after() -> None:
    assert not recall_due(0.0)
    assert not recall_due(RECALL_AFTER - 1e-9)
    assert recall_due(RECALL_AFTER)
    assert recall_due(10.0)


@pytest.mark.parametrize("age", AGES)
def test_a_processor_is_never_topped_up_with_tasks_that_would_be_recalled(age: float) -> None:
    for held in range(1, MAX_DEPTH + 1):
        assert not (takes_more(held, age) and recall_due(age)), (held, age)


def test_a_running_task_that_turns_out_long_over_time() -> None:
    """One processor's view as the clock runs: dealt two short tasks at t=100 s."""
    head_since = 100.0
    held = 2
    assert not takes_more(held, 100.001 - head_since)  # full: no top-up yet
    assert not recall_due(100.001 - head_since)
    assert not recall_due(100.0 + RECALL_AFTER / 2 - head_since)  # not yet a straggler
    assert recall_due(100.0 + RECALL_AFTER * 1.5 - head_since)  # another idles: ask them back
    held = 1  # they were handed back; the long one still runs
    assert not takes_more(held, 100.0 + RECALL_AFTER * 1.5 - head_since)
    held, head_since = 0, 100.5  # it finished: idle, dealt to again at once
    assert takes_more(held, 100.5 - head_since)
