"""How many tasks the worker agent lets a processor hold, by the mean task duration."""

from __future__ import annotations

import pytest

from scaler_executor.worker.agent import (
    MAX_DEPTH,
    QUEUED_WORK_SECONDS,
    SHORT_DEPTH,
    SHORT_TASK_SECONDS,
    processor_depth,
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
