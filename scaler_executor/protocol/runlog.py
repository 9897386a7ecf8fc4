"""Task runs recorded where they happen: a worker's ring, shipped to the daemon in bulk.

::

    worker agent                          the wire                    daemon (scheduler/history.py)
    ────────────                          ────────                    ─────────────────────────────
    a task ends ─► RunLog.ran()           beside each heartbeat       History.reported(): the blob
      (start, end, status written  ─► RunLog.take() ─► TaskRuns ─►   kept as it came, per report
       in place in a ring)                (count, seen, one blob)     (O(1)); decoded by unpack()
                                                                      only when a history is asked

The daemon's history (the dashboard's task stream, ``ex.report``) used to be written by the
daemon's loop once per task: a few stores, but ~3.5 % of its CPU per no-op task
(docs/monitoring.rst).  The worker knows each run's times anyway, so it keeps them in a
preallocated ring (two C doubles and a byte per run: nothing allocated per run) and sends
the runs since its last report as one opaque blob beside its heartbeat.  The daemon stores
the blob and decodes it only when a history is asked for.

The ring holds ``capacity`` runs (the daemon's ``history_runs``, from its Welcome, at most
:data:`MAX_REPORT_RUNS`); more runs between two reports write over the oldest, which are
then only counted (``seen``).  Capacity 0 records nothing, not even the count.

Blob layout (``pack``/``unpack``): ``count`` starts, then ``count`` ends, as IEEE float64
little-endian (the workers' wall clocks), then ``count`` status bytes (``Status``).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left

from scaler_executor.protocol import messages as m

__all__ = ["DURATION_BOUNDS", "MAX_REPORT_RUNS", "RUN_BYTES", "RunLog", "pack", "unpack"]

# Upper bounds (seconds, inclusive) of the task run time histogram (the snapshot's
# ``durations``, Prometheus' scaler_task_duration_seconds): from a no-op's milliseconds to an
# hour, roughly 1-2.5-5 per decade, as Prometheus' defaults run.  Here, below both ends: the
# workers count their tasks into it and the daemon adds their counts up.
DURATION_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# Runs one report carries at most: a worker's ring's size.  A report goes every heartbeat
# interval (0.5 s by default); no Python worker ends 64 Ki tasks in one.  1.1 MB a blob.
MAX_REPORT_RUNS = 65_536
RUN_BYTES = 17  # two float64 and a status byte
_SWAP = sys.byteorder != "little"
_OK = m.Status.OK


def pack(starts: array[float], ends: array[float], statuses: bytes | bytearray) -> bytes:
    """The blob of runs given oldest first (three sequences of one length)."""
    if not len(starts) == len(ends) == len(statuses):
        raise ValueError("starts, ends and statuses differ in length")
    if _SWAP:  # pragma: no cover - no big-endian host in CI
        starts, ends = array("d", starts), array("d", ends)
        starts.byteswap()
        ends.byteswap()
    return starts.tobytes() + ends.tobytes() + bytes(statuses)


def unpack(blob: bytes, count: int) -> tuple[array[float], array[float], bytes]:
    """(starts, ends, statuses) of a blob of ``count`` runs; ValueError if it is not one."""
    if count < 0 or len(blob) != count * RUN_BYTES:
        raise ValueError(f"a blob of {count} runs must be {count * RUN_BYTES} bytes, not {len(blob)}")
    starts, ends = array("d"), array("d")
    starts.frombytes(blob[: 8 * count])
    ends.frombytes(blob[8 * count : 16 * count])
    if _SWAP:  # pragma: no cover
        starts.byteswap()
        ends.byteswap()
    return starts, ends, blob[16 * count :]


class RunLog:
    """A worker's ring of task runs since its last report (O(1) per run, nothing allocated),
    and the run times of its tasks since then, summed up for the daemon's figures."""

    __slots__ = ("_counts", "_ends", "_starts", "_statuses", "capacity", "longest", "peak", "seconds", "seen", "timed")

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError("capacity must be at least 0")
        self._allocate(capacity)
        self._reset_times()

    def _reset_times(self) -> None:
        # Tasks that ended well with a run time since the last take (run time histogram,
        # windows, peak memory): kept whatever the capacity, the snapshot needs them.
        self._counts: list[int] | None = None  # per DURATION_BOUNDS bucket; None: none yet
        self.timed = 0
        self.seconds = 0.0
        self.longest = 0.0
        self.peak = 0

    def _allocate(self, capacity: int) -> None:
        self.capacity = min(capacity, MAX_REPORT_RUNS)
        self._starts = array("d", bytes(8 * self.capacity))
        self._ends = array("d", bytes(8 * self.capacity))
        self._statuses = bytearray(self.capacity)
        self.seen = 0  # runs since the last take (the ring holds the last ``capacity`` of them)

    def resize(self, capacity: int) -> None:
        """A new capacity (a Welcome's); runs not taken yet are kept when it is unchanged."""
        if min(max(capacity, 0), MAX_REPORT_RUNS) != self.capacity:
            self._allocate(max(capacity, 0))  # reallocated: what was not sent is dropped

    def ran(self, started: float, finished: float, status: int) -> None:
        """A task run that ended (one without times, ``finished <= started``, is no run)."""
        capacity = self.capacity
        if capacity and finished > started > 0:
            i = self.seen % capacity
            self._starts[i] = started
            self._ends[i] = finished
            self._statuses[i] = status & 0xFF
            self.seen += 1

    def ended(self, started: float, finished: float, status: int, peak: int) -> None:
        """A task the daemon dispatched ended: its run (``ran``) and, if it ended well with a
        run time, that time and its peak private memory (bytes; 0: unknown)."""
        if finished <= started:
            return
        capacity = self.capacity
        if capacity and started > 0:  # ran(), inlined: this is once per task in every worker
            i = self.seen % capacity
            self._starts[i] = started
            self._ends[i] = finished
            self._statuses[i] = status & 0xFF
            self.seen += 1
        if status == _OK:
            seconds = finished - started
            counts = self._counts
            if counts is None:
                counts = self._counts = [0] * (len(DURATION_BOUNDS) + 1)
            counts[bisect_left(DURATION_BOUNDS, seconds)] += 1
            self.timed += 1
            self.seconds += seconds
            if seconds > self.longest:
                self.longest = seconds
            if peak:
                self.peak = peak

    @property
    def pending(self) -> bool:
        """Whether ``take`` has something to report."""
        return bool(self.seen or self.timed)

    def take(self) -> m.TaskRuns | None:
        """The runs and run times since the last take (runs oldest first), as a report; None
        when there are none."""
        seen = self.seen
        if not seen and not self.timed:
            return None
        times = (self.timed, self.seconds, self.longest, self._counts or [], self.peak)
        self._reset_times()
        self.seen = 0
        capacity = self.capacity
        if not seen:
            return m.TaskRuns(0, 0, b"", *times)
        if seen <= capacity:
            starts, ends, statuses = self._starts[:seen], self._ends[:seen], self._statuses[:seen]
        else:  # wrapped: the oldest kept is at seen % capacity
            i = seen % capacity
            starts = self._starts[i:] + self._starts[:i]
            ends = self._ends[i:] + self._ends[:i]
            statuses = self._statuses[i:] + self._statuses[:i]
        return m.TaskRuns(len(statuses), seen, pack(starts, ends, statuses), *times)
