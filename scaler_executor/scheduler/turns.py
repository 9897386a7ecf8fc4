"""An always-on histogram of the daemon's turn durations: O(1) per turn, no allocation.

A *turn* is one pass of the loop that handled events: receive, ``core.handle``, send.
Durations are binned in microseconds, four bins per power of two (so a bin's bounds are
within 19 % of each other), from 1 µs to 2^26 µs; the counts travel in the daemon's
statistics (``Stats``) as ``turn_bins`` (``"lower:count,..."``, non-empty bins only, made
when a snapshot is asked for), ``turns`` and ``turn_max_us``.  ``percentile`` reads a
percentile back from such a snapshot (the upper bound of the bin it falls in).

``TurnBudget`` sizes a turn: how many tasks and results the loop reads before the core runs,
learnt from the turns before so that a loaded turn takes about a target duration.
"""

from __future__ import annotations

SUB_BITS = 2  # 4 bins per octave
_LINEAR = 1 << (SUB_BITS + 1)  # below 8 µs, one bin per microsecond
MAX_EXPONENT = 26  # ~67 s: anything longer lands in the last bin


def bin_of(us: int) -> int:
    if us < _LINEAR:
        return us
    e = us.bit_length() - 1 - SUB_BITS  # shift that leaves SUB_BITS + 1 significant bits
    if e > MAX_EXPONENT:
        return bin_of((1 << (MAX_EXPONENT + SUB_BITS + 1)) - 1)
    return (e << SUB_BITS) + (us >> e)


def bin_bounds(index: int) -> tuple[int, int]:
    """[lower, upper) in microseconds of bin ``index``."""
    if index < _LINEAR:
        return index, index + 1
    e = (index >> SUB_BITS) - 1
    mantissa = index - (e << SUB_BITS)
    return mantissa << e, (mantissa + 1) << e


NBINS = bin_of((1 << (MAX_EXPONENT + SUB_BITS + 1)) - 1) + 1


class TurnHistogram:
    __slots__ = ("bins", "count", "max_us")

    def __init__(self) -> None:
        self.bins = [0] * NBINS
        self.count = 0
        self.max_us = 0

    def record(self, ns: int) -> None:
        us = ns // 1000
        self.bins[bin_of(us)] += 1
        self.count += 1
        if us > self.max_us:
            self.max_us = us

    def snapshot(self) -> dict[str, int | float | str]:
        bins = ",".join(f"{bin_bounds(i)[0]}:{n}" for i, n in enumerate(self.bins) if n)
        return {"turns": self.count, "turn_max_us": self.max_us, "turn_bins": bins}


def parse_bins(text: str) -> dict[int, int]:
    """``turn_bins`` of a snapshot as {lower bound µs: count}."""
    out: dict[int, int] = {}
    for item in text.split(",") if text else ():
        lower, n = item.split(":")
        out[int(lower)] = int(n)
    return out


def percentile(bins: dict[int, int], q: float) -> int:
    """The upper bound (µs) of the bin holding the ``q`` quantile (0 < q <= 1) of ``bins``;
    0 for no turns.  ``bins`` may be the difference of two snapshots' ``parse_bins``."""
    total = sum(bins.values())
    if total <= 0:
        return 0
    rank = q * total
    seen = 0
    for lower in sorted(bins):
        seen += bins[lower]
        if seen >= rank:
            return bin_bounds(bin_of(lower))[1]
    return bin_bounds(bin_of(max(bins)))[1]


class TurnBudget:
    """How much a turn reads before the core runs, so that a loaded turn takes about
    ``target_ns``: the loop reads transmissions until what they carry (``units``: a task
    submitted or a result is one, any other message one) reaches ``units()``, then the
    core handles it all and the commands go out.

    Each loaded turn is observed (``observe``: the units it read, its duration) and the
    cost of a unit is a moving average of duration / units, so the budget is
    ``target_ns`` divided by it: turns whose fixed cost (polling, flushing to every peer
    touched) is a larger share get fewer units, and the fixed point is a turn of about
    ``target_ns``. Pure: no clock of its own, plain arithmetic (tests drive it with
    numbers). ``TURN_TARGET_NS`` in scheduler/loop.py; measured in docs/scaling.rst."""

    __slots__ = ("target_ns", "floor", "ceiling", "ns_per_unit")

    def __init__(self, target_ns: int, floor: int = 64, ceiling: int = 1 << 20) -> None:
        self.target_ns = target_ns
        self.floor = floor  # never fewer: a turn's fixed cost must not shrink turns to nothing
        self.ceiling = ceiling
        self.ns_per_unit = 0.0  # unknown until a loaded turn is seen: no bound but the ceiling

    def units(self) -> int:
        per = self.ns_per_unit
        if per <= 0.0:
            return self.ceiling
        return max(self.floor, min(self.ceiling, int(self.target_ns / per)))

    def observe(self, units: int, ns: int) -> None:
        """A turn that read ``units`` and took ``ns`` (receive, core, send). Turns that read
        little say more about the fixed cost than about a unit's and are not counted."""
        if units < self.floor // 2:
            return
        sample = ns / units
        per = self.ns_per_unit
        if per <= 0.0:
            self.ns_per_unit = sample
            return
        # One turn that cost far more than its units say (a large graph's submission, an
        # object put, the process preempted) moves the estimate by at most 1.75x: the next
        # turns are not starved for it; a cost that stays high is followed within a few turns.
        self.ns_per_unit = per + (min(sample, 4.0 * per) - per) * 0.25
