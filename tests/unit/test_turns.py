"""The daemon's turn histogram (scheduler/turns.py): bins, percentiles, and the snapshot."""

from __future__ import annotations

from scaler_executor.config import ClusterConfig
from scaler_executor.scheduler.core import Scheduler
from scaler_executor.scheduler.turns import (
    NBINS,
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
