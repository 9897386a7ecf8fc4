"""Allocation policies as tables: (worker slots, ready tasks) -> tasks given to each worker.

Slots are ``WorkerSlot(capacity, inflight, mean_task_seconds)``.  With no observed task time
a worker's window is two tasks per processor (one running, one queued behind it).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler_executor.scheduler.policies import (
    DEFAULT_REFILL_SECONDS,
    POLICIES,
    AllocationPolicy,
    LeastLoaded,
    WorkerSlot,
    prefetch_window,
)

S = WorkerSlot
NEW = None  # no task time observed yet
SHORT = 0.0001  # 0.1 ms tasks: the refill round trip is 20 task times
LONG = 5.0  # far longer than the round trip


# ---------------------------------------------------------------------- prefetch window

WINDOWS = [
    # (slot, max_prefetch, window)
    ("new worker: two per processor", S(1, 0, NEW), 256, 2),
    ("new worker, 4 processors", S(4, 0, NEW), 256, 8),
    ("long tasks: still two per processor", S(4, 0, LONG), 256, 8),
    ("task time equal to the round trip", S(1, 0, DEFAULT_REFILL_SECONDS), 256, 1 + 1),
    ("short tasks: window grows (Little's law)", S(1, 0, SHORT), 256, 1 + 20),
    ("short tasks, 4 processors", S(4, 0, SHORT), 256, 4 + 4 * 20),
    ("short tasks capped by max_prefetch", S(1, 0, SHORT), 8, 1 + 8),
    ("cap is on the tasks beyond those running", S(4, 0, SHORT), 8, 4 + 8),
    ("zero task time does not divide by zero", S(2, 0, 0.0), 16, 2 + 16),
    ("cap below one per processor", S(4, 0, NEW), 1, 4 + 1),
    ("inflight does not change the window", S(2, 7, SHORT), 256, 2 + 2 * 20),
]


@pytest.mark.parametrize(
    "slot, max_prefetch, window", [w[1:] for w in WINDOWS], ids=[w[0] for w in WINDOWS]
)
def test_prefetch_window(slot: WorkerSlot, max_prefetch: int, window: int) -> None:
    assert prefetch_window(slot, max_prefetch) == window


def test_window_grows_as_tasks_get_shorter() -> None:
    windows = [
        prefetch_window(S(2, 0, t), 10_000) for t in (10.0, 0.01, 0.001, 0.0005, 0.0001, 0.00001)
    ]
    assert windows == sorted(windows)
    assert windows[0] == 4 and windows[-1] > windows[2]


@given(
    capacity=st.integers(1, 64),
    mean=st.none() | st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    max_prefetch=st.integers(1, 1000),
)
@settings(max_examples=100, deadline=None, database=None)
def test_window_bounds(capacity: int, mean: float | None, max_prefetch: int) -> None:
    window = prefetch_window(S(capacity, 0, mean), max_prefetch)
    assert window <= capacity + max_prefetch, "never more than the cap beyond the running tasks"
    assert window >= capacity + min(capacity, max_prefetch), (
        "at least two per processor unless capped"
    )


def test_window_uses_the_refill_round_trip() -> None:
    # Little's law: tasks in flight = round trip / task time, plus the one running.
    assert prefetch_window(S(1, 0, 0.001), 256, refill=0.01) == 1 + math.ceil(0.01 / 0.001)
    assert prefetch_window(S(1, 0, 0.001), 256, refill=0.0) == 2


# ---------------------------------------------------------------------- LeastLoaded tables

ALLOCATIONS = [
    # (name, slots, ready, max_prefetch, counts)
    ("no workers", [], 5, 256, []),
    ("nothing ready", [S(2, 0, NEW), S(2, 1, NEW)], 0, 256, [0, 0]),
    ("one worker, fewer tasks than room", [S(2, 0, NEW)], 3, 256, [3]),
    ("one worker, up to its window", [S(2, 0, NEW)], 10, 256, [4]),
    ("one worker, partly full", [S(2, 3, NEW)], 10, 256, [1]),
    ("two idle workers share evenly", [S(1, 0, NEW), S(1, 0, NEW)], 2, 256, [1, 1]),
    ("ties go to the first worker", [S(1, 0, NEW), S(1, 0, NEW)], 3, 256, [2, 1]),
    ("uneven loads: the idle one first", [S(2, 3, NEW), S(2, 0, NEW)], 3, 256, [0, 3]),
    ("uneven loads: levelled, then shared", [S(2, 2, NEW), S(2, 0, NEW)], 4, 256, [1, 3]),
    ("full worker gets nothing", [S(2, 4, NEW), S(2, 0, NEW)], 10, 256, [0, 4]),
    ("overfull worker gets nothing", [S(2, 9, NEW), S(2, 0, NEW)], 10, 256, [0, 4]),
    ("all full: nothing", [S(1, 2, NEW), S(3, 6, NEW)], 10, 256, [0, 0]),
    ("capacity-weighted", [S(4, 0, NEW), S(1, 0, NEW)], 5, 256, [4, 1]),
    ("capacity-weighted, to both windows", [S(4, 0, NEW), S(1, 0, NEW)], 100, 256, [8, 2]),
    ("capacity-weighted with load", [S(4, 4, NEW), S(1, 0, NEW)], 2, 256, [1, 1]),
    ("zero capacity gets nothing", [S(0, 0, NEW), S(1, 0, NEW)], 5, 256, [0, 2]),
    ("short tasks: deeper window", [S(1, 0, SHORT)], 100, 256, [21]),
    ("short tasks: window capped", [S(1, 0, SHORT)], 100, 8, [9]),
    ("long tasks: two per processor", [S(1, 0, LONG)], 100, 256, [2]),
    ("short-task worker takes the surplus", [S(1, 0, SHORT), S(1, 0, LONG)], 10, 256, [8, 2]),
    (
        "newly joined worker first",
        [S(2, 2, SHORT), S(2, 2, SHORT), S(2, 0, NEW)],
        2,
        256,
        [0, 0, 2],
    ),
    ("newly joined worker, then levelled", [S(2, 2, SHORT), S(2, 0, NEW)], 4, 256, [1, 3]),
    # Idle workers are filled to their processors in turn, not spread one task each.
    ("idle workers: filled in turn", [S(4, 0, NEW), S(4, 0, NEW)], 4, 256, [4, 0]),
    ("idle workers: the next one after", [S(4, 0, NEW), S(4, 0, NEW)], 6, 256, [4, 2]),
    ("idle ones filled, then least loaded", [S(2, 0, NEW), S(2, 0, NEW), S(2, 1, NEW)], 5, 256, [2, 2, 1]),
    ("a busy worker does not take an idle one's", [S(4, 1, NEW), S(4, 0, NEW)], 3, 256, [0, 3]),
    # One ready task (a sequential caller's) takes a path without the heap: same answers.
    ("one task: ties go to the first worker", [S(1, 0, NEW), S(1, 0, NEW)], 1, 256, [1, 0]),
    ("one task: the least loaded", [S(2, 3, NEW), S(2, 1, NEW), S(2, 2, NEW)], 1, 256, [0, 1, 0]),
    ("one task: load is per processor", [S(4, 2, NEW), S(1, 1, NEW)], 1, 256, [1, 0]),
    ("one task: a full worker is skipped", [S(1, 2, NEW), S(1, 3, SHORT)], 1, 256, [0, 1]),
    ("one task: zero capacity is skipped", [S(0, 0, NEW), S(1, 1, NEW)], 1, 256, [0, 1]),
    ("one task: all full", [S(1, 2, NEW), S(2, 4, NEW)], 1, 256, [0, 0]),
]


@pytest.mark.parametrize(
    "slots, ready, max_prefetch, counts",
    [a[1:] for a in ALLOCATIONS],
    ids=[a[0] for a in ALLOCATIONS],
)
def test_least_loaded(
    slots: list[WorkerSlot], ready: int, max_prefetch: int, counts: list[int]
) -> None:
    assert LeastLoaded(max_prefetch).allocate(ready, slots) == counts


def test_allocate_does_not_touch_its_inputs() -> None:
    slots = [S(2, 1, NEW), S(1, 0, SHORT)]
    before = list(slots)
    policy = LeastLoaded(4)
    first = policy.allocate(5, slots)
    assert slots == before
    assert policy.allocate(5, slots) == first, "pure: the same snapshot gives the same answer"


def test_least_loaded_is_an_allocation_policy_chosen_by_name() -> None:
    policy: AllocationPolicy = POLICIES["least-loaded"](16)
    assert isinstance(policy, LeastLoaded) and policy.max_prefetch == 16


slots_strategy = st.lists(
    st.builds(
        WorkerSlot,
        capacity=st.integers(0, 8),
        inflight=st.integers(0, 40),
        mean_task_seconds=st.none() | st.sampled_from([0.0, SHORT, 0.001, 0.1, LONG]),
    ),
    max_size=6,
)


@given(slots=slots_strategy, max_prefetch=st.integers(1, 64))
@settings(max_examples=150, deadline=None, database=None)
def test_one_ready_task_goes_where_the_heap_would_put_it(slots: list[WorkerSlot], max_prefetch: int) -> None:
    # The heap pops the lowest (load, index) among workers with room: the reference here.
    candidates = [
        (s.inflight / s.capacity, i)
        for i, s in enumerate(slots)
        if s.capacity > 0 and prefetch_window(s, max_prefetch) - s.inflight > 0
    ]
    expected = [0] * len(slots)
    if candidates:
        expected[min(candidates)[1]] = 1
    assert LeastLoaded(max_prefetch).allocate(1, slots) == expected


@given(slots=slots_strategy, ready=st.integers(0, 200), max_prefetch=st.integers(1, 64))
@settings(max_examples=150, deadline=None, database=None)
def test_least_loaded_properties(slots: list[WorkerSlot], ready: int, max_prefetch: int) -> None:
    counts = LeastLoaded(max_prefetch).allocate(ready, slots)
    assert len(counts) == len(slots)
    rooms = [
        max(0, prefetch_window(s, max_prefetch) - s.inflight) if s.capacity else 0 for s in slots
    ]
    # Never over a window, never a task to a worker without processors.
    assert all(0 <= c <= r for c, r in zip(counts, rooms))
    # Work-conserving: a task stays in the daemon only when every worker is full.
    assert sum(counts) == min(ready, sum(rooms))
    # Idle workers filled first: an idle worker (nothing held) left below its processors
    # means no idle worker after it got any.
    idle = [i for i, s in enumerate(slots) if s.inflight == 0 and s.capacity > 0]
    for k, i in enumerate(idle):
        if counts[i] < min(slots[i].capacity, rooms[i]) and ready > 1:
            assert not any(counts[j] for j in idle[k + 1 :]), "a later idle worker took tasks first"
    # Least loaded beyond that: no worker that got a task past filling an idle worker's
    # processors ends more loaded (before that task) than a worker with room left ends up.
    for i, (si, ci) in enumerate(zip(slots, counts)):
        if not ci or (si.inflight == 0 and ci <= si.capacity and ready > 1):
            continue
        load_before_last = (si.inflight + ci - 1) / si.capacity
        for j, (sj, cj) in enumerate(zip(slots, counts)):
            if j != i and cj < rooms[j]:
                assert load_before_last <= (sj.inflight + cj) / sj.capacity
