"""The scaling policy, ``desired_workers(ScalingView(...))``: a pure function, tested as a table.

It answers "how many local workers should run now?": enough for every task (queued in the
daemon or held by workers) to have a processor, within [minimum, maximum].  Scale-up goes to
the target in one step; scale-down is decided elsewhere (idle time), so the policy never
counts idle workers against the target.
"""

from __future__ import annotations

import itertools

import pytest

from scaler_executor.scheduler.policies import ScalingView, desired_workers

# (demand, workers, per_worker, minimum, maximum) -> desired
TABLE = [
    # idle
    ((0, 0, 1, 0, 4), 0),
    ((0, 3, 1, 0, 4), 0),  # running workers do not keep themselves alive
    ((0, 0, 1, 2, 4), 2),  # the minimum stays
    ((0, 4, 1, 4, 4), 4),  # a fixed pool
    # one processor per worker: one worker per task, capped
    ((1, 0, 1, 0, 4), 1),
    ((3, 0, 1, 0, 4), 3),
    ((4, 0, 1, 0, 4), 4),
    ((40, 0, 1, 0, 4), 4),  # a burst: straight to the maximum, not one step at a time
    ((40, 2, 1, 0, 4), 4),
    ((200, 0, 1, 0, 8), 8),
    ((2, 0, 1, 3, 8), 3),  # below the minimum: the minimum wins
    # several processors per worker: round up
    ((1, 0, 4, 0, 8), 1),
    ((4, 0, 4, 0, 8), 1),
    ((5, 0, 4, 0, 8), 2),
    ((8, 0, 4, 0, 8), 2),
    ((9, 0, 4, 0, 8), 3),
    ((1000, 0, 4, 0, 8), 8),
    ((3, 0, 2, 0, 1), 1),  # capped by the maximum
    # a degenerate per_worker never divides by zero
    ((3, 0, 0, 0, 8), 3),
    # minimum == maximum: nothing to decide
    ((0, 0, 1, 3, 3), 3),
    ((100, 0, 1, 3, 3), 3),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("fields", "desired"), TABLE, ids=[str(f) for f, _ in TABLE])
def test_desired_workers_table(fields: tuple[int, int, int, int, int], desired: int) -> None:
    assert desired_workers(ScalingView(*fields)) == desired


@pytest.mark.timeout(10)
def test_desired_workers_properties_over_a_grid() -> None:
    """Within bounds, monotone in demand, never more processors than needed beyond the minimum."""
    for demand, workers, per_worker, minimum, extra in itertools.product(
        range(30), (0, 1, 5), (1, 2, 3, 8), range(4), range(6)
    ):
        maximum = minimum + extra
        view = ScalingView(demand, workers, per_worker, minimum, maximum)
        got = desired_workers(view)
        assert minimum <= got <= maximum, view
        if got > minimum:
            # Every worker above the minimum is needed: one fewer would leave a task waiting.
            assert (got - 1) * per_worker < demand, view
        if got < maximum:
            # Not capped: every task has a processor.
            assert got * per_worker >= demand, view
        more = desired_workers(view._replace(demand=demand + 1))
        assert more >= got, view
        # The policy is a function of demand and bounds only, not of how many run now.
        assert desired_workers(view._replace(workers=workers + 7)) == got, view


@pytest.mark.timeout(10)
def test_scaling_view_is_a_frozen_snapshot() -> None:
    view = ScalingView(demand=5, workers=1, per_worker=1, minimum=0, maximum=4)
    with pytest.raises(AttributeError):
        view.demand = 6  # type: ignore[misc]
    assert desired_workers(view) == 4
    assert view == ScalingView(5, 1, 1, 0, 4)


def test_the_local_manager_is_a_capacity_adapter() -> None:
    """The daemon loop types its manager as ``CapacityAdapter``; the shipped adapter has every
    method of that contract (a renamed or missing one fails here, not in a cluster)."""
    from scaler_executor.config import ClusterConfig
    from scaler_executor.scheduler.capacity import CapacityAdapter
    from scaler_executor.manager.local import LocalWorkerManager

    # minimum=0 (autoscaling): nothing starts until the core asks for workers.
    manager = LocalWorkerManager(ClusterConfig(), "ipc:///nonexistent", count=2, processors=1, minimum=0)
    assert isinstance(manager, CapacityAdapter)
    contract = {name for name in vars(CapacityAdapter) if not name.startswith("_")}
    assert contract == {"start", "pids", "poll", "start_more", "stop_some", "stop"}
    assert manager.pids() == frozenset() and manager.poll() == []  # nothing started yet
