"""The run's history, for the report that outlives it (``ex.report``, ``scaler-daemon --report``).

Two bounded records, each O(1) per event, kept beside the :class:`~.stats.Recorder`:

* **Task runs**: the most recent :data:`RUNS` runs (worker, wall-clock start and end,
  status).  The daemon's loop records none itself: each worker keeps its own ring
  (protocol/runlog.py) and sends the runs since its last report as one blob beside its
  heartbeats (``TaskRuns``, lane tasks' included); the daemon keeps each blob as it came,
  in a queue of reports trimmed from the oldest while the rest still hold ``capacity``
  runs — O(1) per report, nothing per task — and decodes them only when a history is
  asked for.  So a live view lags by at most one heartbeat interval, and a worker that
  dies loses the runs it had not reported yet (at most one interval's); what it had sent
  stays.  Runs without times (a processor that died) are not in it.  Older runs are
  dropped; ``runs_seen`` says how many there were.  The config's ``history_runs`` sets the
  size (its default is :data:`RUNS`), and the daemon's Welcome tells each worker to keep
  as many per report; 0 turns it off: workers record no run at all (not even
  ``runs_seen``).
* **A coarse series over the whole run**: per bucket of :data:`BUCKET_SECONDS` (on the
  daemon's clock), tasks finished and failed, and the most memory (the workers' total,
  from their heartbeats) and workers connected seen in it.  Buckets in which nothing
  happened are not stored.  When :data:`MAX_BUCKETS` are stored the whole series is
  *merged pairwise*: neighbours become one bucket of twice the width (counts summed, the
  gauges' maxima kept), so the series always covers the whole run at the finest width
  that fits — 10 s for the first 24 h, 20 s up to 48 h, and so on.  A merge costs a pass
  over the buckets, once per doubling: amortised O(1) per bucket.

The daemon's clock is its own monotonic clock; the runs' times are the workers' wall clocks.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.runlog import unpack

if TYPE_CHECKING:
    from scaler_executor.scheduler.core_base import CoreBase

__all__ = ["BUCKET_SECONDS", "MAX_BUCKETS", "RUNS", "History", "history_message"]

RUNS = 20_000  # task runs kept for the stream: ~1 MB on the wire; in the daemon ~0.35 MB of reports (~3 MB if each held one run)
# (the default of the config's history_runs, which sets the ring's size per daemon)
BUCKET_SECONDS = 10.0  # the series' first bucket width
MAX_BUCKETS = 8_640  # 24 h of 10 s buckets; then merged pairwise (the width doubles)

# A stored bucket: [index (from the origin, in buckets of the current width), finished,
# failed, most memory, most workers].  Lists, changed in place: no allocation per event.
_INDEX, _FINISHED, _FAILED, _MEMORY, _WORKERS = range(5)


class _Report(NamedTuple):
    """A worker's TaskRuns as it came: decoded only when a history is asked for."""

    worker: str
    kept: int  # runs in blob
    blob: bytes


class History:
    """Bounded, O(1) per event: a ring of recent task runs and the run's coarse series."""

    __slots__ = (
        "_buckets", "_kept", "_max", "_memory", "_reports", "_workers", "capacity", "origin", "runs_seen", "width",
    )  # fmt: skip

    def __init__(self, runs: int = RUNS, width: float = BUCKET_SECONDS, max_buckets: int = MAX_BUCKETS) -> None:
        if max_buckets < 2:
            raise ValueError("max_buckets must be at least 2 (a merge halves them)")
        if runs < 0:
            raise ValueError("runs must be at least 0")
        # The workers' reports of runs, oldest first, each kept as it came (one bytes object
        # and a small tuple per report, not per run): the ring of task runs the daemon's loop
        # once wrote per task (~3.5 % of its CPU per no-op task: docs/monitoring.rst).
        self.capacity = runs
        self._reports: deque[_Report] = deque()
        self._kept = 0  # runs in _reports
        self.runs_seen = 0
        self.width = width
        self.origin: float | None = None  # the clock at the first event
        self._buckets: list[list[int]] = []
        self._max = max_buckets
        self._memory = 0  # the gauges' current values, carried into each new bucket
        self._workers = 0

    def reported(self, worker: str, count: int, seen: int, blob: bytes) -> None:
        """A worker's TaskRuns: ``count`` runs in ``blob`` (protocol/runlog.py), ``seen`` since
        its last report.  O(1) amortised: reports no longer needed for the most recent
        ``capacity`` runs go, whole, from the oldest end."""
        if not self.capacity:
            return  # off: nothing recorded, whatever a worker sends
        self.runs_seen += seen
        if count:
            reports = self._reports
            reports.append(_Report(worker, count, blob))
            self._kept += count
            while self._kept - reports[0].kept >= self.capacity:
                self._kept -= reports.popleft().kept

    @property
    def runs(self) -> list[tuple[str, float, float, int]]:
        """The most recent ``capacity`` runs, in the order they were reported (each worker's
        oldest first), as (worker, started, finished, status): decoded on request."""
        out: list[tuple[str, float, float, int]] = []
        skip = max(0, self._kept - self.capacity)  # the oldest report may hold a few more
        for worker, count, blob in self._reports:
            starts, ends, statuses = unpack(blob, count)
            first = min(skip, count)
            skip -= first
            out.extend((worker, starts[i], ends[i], statuses[i]) for i in range(first, count))
        return out

    def ended(self, now: float, finished: int, failed: int) -> None:
        """Tasks that ended at ``now``."""
        bucket = self._bucket(now)
        bucket[_FINISHED] += finished
        bucket[_FAILED] += failed

    def gauge(self, now: float, workers: int, memory: int) -> None:
        """The workers connected and their total memory (bytes) now."""
        self._workers, self._memory = workers, memory
        bucket = self._bucket(now)
        if memory > bucket[_MEMORY]:
            bucket[_MEMORY] = memory
        if workers > bucket[_WORKERS]:
            bucket[_WORKERS] = workers

    def _bucket(self, now: float) -> list[int]:
        origin = self.origin
        if origin is None:
            origin = self.origin = now
        index = int((now - origin) // self.width)
        buckets = self._buckets
        if buckets:
            last = buckets[-1]
            if last[_INDEX] >= index:  # the current one (a clock never goes back: monotonic)
                return last
            if len(buckets) >= self._max:
                self._merge()
                index = int((now - origin) // self.width)
                last = buckets[-1]
                if last[_INDEX] >= index:
                    return last
        bucket = [index, 0, 0, self._memory, self._workers]  # the gauges carry on into it
        buckets.append(bucket)
        return bucket

    def _merge(self) -> None:
        """Halve the series: the width doubles, neighbouring buckets become one."""
        self.width *= 2
        merged: list[list[int]] = []
        for index, finished, failed, memory, workers in self._buckets:
            half = index // 2
            if merged and merged[-1][_INDEX] == half:
                into = merged[-1]
                into[_FINISHED] += finished
                into[_FAILED] += failed
                into[_MEMORY] = max(into[_MEMORY], memory)
                into[_WORKERS] = max(into[_WORKERS], workers)
            else:
                merged.append([half, finished, failed, memory, workers])
        self._buckets[:] = merged

    def series(self) -> list[m.SeriesBucket]:
        return [
            m.SeriesBucket(index * self.width, int(finished), int(failed), int(memory), int(workers))
            for index, finished, failed, memory, workers in self._buckets
        ]

    def __len__(self) -> int:
        """Buckets stored."""
        return len(self._buckets)


def history_message(core: CoreBase) -> m.History:
    """The daemon's history as it travels (built only on request)."""
    history = core.history
    runs = [m.TaskRun(*run) for run in history.runs]
    config = {name: "" if value is None else str(value) for name, value in core.config.to_dict().items()}
    uptime = 0.0 if core.recorder.started is None else core._now - core.recorder.started
    return m.History(runs, history.runs_seen, history.width, history.series(), config, uptime)
