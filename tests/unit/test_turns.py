"""The daemon's turn histogram (scheduler/turns.py): bins, percentiles, and the snapshot."""

from __future__ import annotations

import pytest

from scaler_executor.config import ClusterConfig
from scaler_executor.scheduler.core import Scheduler
from scaler_executor.scheduler.turns import (
    NBINS,
    TurnBudget,
    TurnHistogram,
    bin_bounds,
    bin_of,
    parse_bins,
    percentile,
)


def test_every_duration_falls_in_its_bin_and_bins_are_ordered() -> None:
    previous = -1
    for us in [*range(20_000), 10**6, 10**7]:
        index = bin_of(us)
        lower, upper = bin_bounds(index)
        assert lower <= us < upper, (us, index, lower, upper)
        assert index >= previous
        previous = index
    assert bin_of(10**12) == NBINS - 1  # beyond the last bound: the last bin


def test_bins_are_within_a_quarter_octave() -> None:
    for index in range(8, NBINS):
        lower, upper = bin_bounds(index)
        assert upper / lower <= 1.25 + 1e-9


def test_snapshot_round_trips_and_percentiles_read_back() -> None:
    h = TurnHistogram()
    for _ in range(98):
        h.record(3_000)  # 3 us
    h.record(1_000_000)  # 1 ms
    h.record(50_000_000)  # 50 ms
    snap = h.snapshot()
    assert snap["turns"] == 100 and snap["turn_max_us"] == 50_000
    bins = parse_bins(str(snap["turn_bins"]))
    assert sum(bins.values()) == 100
    assert percentile(bins, 0.5) == 4  # the 3 us bin's upper bound
    assert 1_000 < percentile(bins, 0.99) <= 1_250
    assert 50_000 < percentile(bins, 1.0) <= 62_500
    assert percentile({}, 0.99) == 0


def test_the_scheduler_reports_its_turns() -> None:
    core = Scheduler(ClusterConfig())
    core.turns.record(12_000)
    snap = core.statistics()
    assert snap["turns"] == 1 and snap["turn_max_us"] == 12 and parse_bins(str(snap["turn_bins"])) == {12: 1}


# ---------------------------------------------------------------- TurnBudget


def test_budget_is_unbounded_until_a_loaded_turn_is_seen() -> None:
    budget = TurnBudget(2_500_000, floor=64, ceiling=10_000)
    assert budget.units() == 10_000
    budget.observe(10, 9_000_000)  # too few units to say what one costs: not counted
    assert budget.units() == 10_000
    budget.observe(1_000, 5_000_000)  # 5 µs a unit
    assert budget.units() == 500


def test_budget_settles_where_a_turn_takes_its_target() -> None:
    """A turn costs a fixed part (polling, a transmission to each peer touched) plus a part
    per unit; reading as much as the budget allows, turns settle at about the target."""
    target, fixed, per_unit = 2_500_000, 400_000, 12_000
    budget = TurnBudget(target)
    offered = 100_000  # a flood: every turn could read far more than its budget
    took = 0
    for _ in range(60):
        units = min(offered, budget.units())
        took = fixed + per_unit * units
        budget.observe(units, took)
    assert abs(took - target) < 0.05 * target, took
    assert budget.units() == pytest.approx((target - fixed) / per_unit, rel=0.05)


def test_budget_shrugs_off_one_dear_turn_and_follows_a_lasting_change() -> None:
    budget = TurnBudget(2_500_000, floor=64)
    for _ in range(30):
        budget.observe(500, 2_500_000)  # 5 µs a unit
    assert budget.units() == 500
    budget.observe(100, 1_000_000_000)  # one turn of a second (a big graph, a preemption)
    assert budget.units() >= 500 / 1.75 - 1  # moved by at most 1.75x
    for _ in range(10):
        budget.observe(budget.units(), budget.units() * 5_000)
    assert budget.units() >= 470  # back within a few turns
    for _ in range(30):
        budget.observe(budget.units(), budget.units() * 10_000_000)  # a unit now costs 10 ms
    assert budget.units() == 64  # the floor: a turn always reads this much when it is there
    for _ in range(60):
        budget.observe(budget.units(), budget.units() * 1_000)  # cheap again: 1 µs a unit
    assert budget.units() == pytest.approx(2_500, rel=0.02)
