"""The statistics snapshot: what ``ex.statistics()`` and monitors see.

::

    daemon core (core.py)                     the wire             a client or monitor
    ─────────────────────                     ────────             ───────────────────
    counters, state counts (kept anyway)  ┐
    Recorder: per-second buckets, a ring  ├─► stats_message() ─► Stats ─► Statistics.from_message
    of recent events (O(1) per event)     │   (built only when
    workers, clients, the host store      ┘    someone asks)

What the daemon keeps all the time is O(1) per event and bounded: ``Recorder`` adds a task's
end to the bucket of its second (``HORIZON`` buckets, reused in a ring) and appends notable
events (failures with their cause, lost workers and clients, retries, refusals) to a ring of
``RECENT_EVENTS``.  Everything else (the worker and client tables, windows, the store's
figures, decoding a failure's traceback) is computed when a snapshot is asked for.

``Statistics`` is a frozen dataclass and also a read-only ``Mapping`` over the counters, so
``ex.statistics()["finished"]`` and ``.get("tasks_pending", 0)`` read as they always did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.runlog import DURATION_BOUNDS  # the workers count run times into it

if TYPE_CHECKING:
    from scaler_executor.scheduler.core_base import CoreBase

__all__ = [
    "DURATION_BOUNDS",
    "ClientStatistics",
    "ManagerStatistics",
    "RecentEvent",
    "Recorder",
    "Statistics",
    "StoreUse",
    "TaskDurations",
    "TaskWindow",
    "WorkerStatistics",
    "stats_message",
]

RECENT_EVENTS = 64  # the ring of recent events: enough for a screen of failures, a few KB
HORIZON = 60  # one-second buckets of ended tasks kept: the longest window
WINDOWS = (10.0, 60.0)  # seconds: the windows a snapshot reports
MAX_KEPT_PAYLOAD = 64 * 1024  # a failure's payload larger than this is not kept for its traceback
DETAIL_CHARS = 2000  # the tail of a traceback a snapshot carries

STATUS_NAMES = {
    Status.OK: "ok",
    Status.ERROR: "error",
    Status.PROCESSOR_DIED: "processor died",
    Status.CANCELLED: "cancelled",
    Status.WORKER_LOST: "worker lost",
    Status.TIMEOUT: "timeout",
    Status.FORCE_CANCELLED: "force cancelled",
    Status.REJECTED: "rejected",
    Status.DEP_FAILED: "dependency failed",
    Status.DEP_GONE: "dependency gone",
}


# --------------------------------------------------------------------------- the daemon's side


class _Event(NamedTuple):
    when: float
    kind: str
    task_id: int
    where: str
    cause: str
    payload: bytes  # a failed task's error payload (decoded only for a snapshot), or b""
    status: int


class Recorder:
    """The daemon's only monitoring state: O(1) per event, bounded in size."""

    __slots__ = ("_buckets", "duration_counts", "duration_sum", "events", "peak_memory", "started")

    def __init__(self) -> None:
        # Every timed task's run time since the start, by DURATION_BOUNDS bucket (the last
        # one: longer than the largest bound): a histogram that only grows, as Prometheus wants.
        self.duration_counts = [0] * (len(DURATION_BOUNDS) + 1)
        self.duration_sum = 0.0
        # [second, finished, failed, timed, run seconds, max run seconds] per bucket
        self._buckets: list[list[Any]] = [[-1, 0, 0, 0, 0.0, 0.0] for _ in range(HORIZON)]
        self.events: deque[_Event] = deque(maxlen=RECENT_EVENTS)
        self.peak_memory: dict[bytes, int] = {}  # worker peer -> its last task's peak private memory
        self.started: float | None = None  # the core's first tick

    def ended(self, now: float, finished: int, failed: int, timed: int = 0, seconds: float = 0.0, longest: float = 0.0) -> None:
        """Tasks that ended at ``now``; ``timed`` of them ran ``seconds`` in all, the longest ``longest``."""
        second = int(now)
        bucket = self._buckets[second % HORIZON]
        if bucket[0] != second:
            bucket[:] = [second, 0, 0, 0, 0.0, 0.0]
        bucket[1] += finished
        bucket[2] += failed
        bucket[3] += timed
        bucket[4] += seconds
        if longest > bucket[5]:
            bucket[5] = longest

    def timed(self, counts: list[int], seconds: float) -> None:
        """Run times a worker counted into DURATION_BOUNDS' buckets (protocol/runlog.py),
        ``seconds`` in all: O(buckets) per report, nothing per task."""
        total = self.duration_counts
        for i, n in enumerate(counts):
            total[i] += n
        self.duration_sum += seconds

    def event(self, now: float, kind: str, cause: str, *, task_id: int = 0, where: str = "", payload: bytes = b"", status: int = -1) -> None:
        if len(payload) > MAX_KEPT_PAYLOAD:
            payload = b""  # the ring stays small whatever tasks raise
        self.events.append(_Event(now, kind, task_id, where, cause[:500], payload, status))

    def windows(self, now: float) -> list[m.StatWindow]:
        second = int(now)
        out = []
        for seconds in WINDOWS:
            finished = failed = timed = 0
            run = longest = 0.0
            for start, f, x, t, s, mx in self._buckets:
                if second - seconds < start <= second:
                    finished += f
                    failed += x
                    timed += t
                    run += s
                    longest = max(longest, mx)
            out.append(m.StatWindow(seconds, finished, failed, timed, run, longest))
        return out


def _failure_text(status: int, payload: bytes) -> tuple[str, str]:
    """(one line, traceback tail) of a failed result's payload, read without unpickling."""
    if status in (Status.ERROR,) and payload:
        try:
            # [pickled, type name, message, traceback text, traceback dict, rebuild]
            # (worker/processor.py dump_exception; main grew the sixth field after this was written)
            _pickled, type_name, message, tb_text = msgpack.unpackb(payload, raw=False)[:4]
            return f"{type_name}: {message}"[:500], str(tb_text)[-DETAIL_CHARS:]
        except Exception:  # noqa: BLE001 - a payload we cannot read still has its event
            return "error (unreadable payload)", ""
    if status in (Status.TIMEOUT, Status.FORCE_CANCELLED, Status.PROCESSOR_DIED):
        return payload.decode(errors="replace")[:500], ""
    return STATUS_NAMES.get(status, f"status {status}"), ""


def stats_message(core: CoreBase) -> m.Stats:
    """The snapshot of ``core``'s state, as it travels (built only on request)."""
    now = core._now
    recorder = core.recorder
    counters: dict[str, int | float | str] = {f"tasks_{state.value}": n for state, n in core.state_counts.items() if n}
    counters.update(core.counters)
    counters["tasks"] = len(core.tasks)
    counters["workers"] = len(core.workers)
    counters["processors"] = sum(w.capacity for w in core.workers.values())
    counters["clients"] = len(core.clients)
    counters["functions"] = len(core.functions)
    counters["objects"] = len(core.object_holds)
    counters["monitors"] = len(core._monitors)
    counters.update(core.no_worker.statistics(core.workers.values()))
    counters.update(core.placement.statistics())
    if core.managers.managers or core.managers.workers or core.managers.ended or core.managers.interrupted:
        counters.update(core.managers.statistics())
    counters.update(core.turns.snapshot())
    from scaler_executor.protocol.messages import TaskFlags

    # A row per worker (O(workers) per snapshot, ~5 us each at 1,000: docs/scaling.rst,
    # "Statistics at scale"): built as plain tuples (WorkerStat's own __new__ costs a call)
    # and with nothing walked for an idle worker.
    workers = []
    make, tasks, peaks, lane_flag = m.WorkerStat._make, core.tasks, recorder.peak_memory, TaskFlags.ON_LANE
    for w in core.workers.values():
        inflight = w.inflight
        if inflight:
            lane = sum(1 for t in inflight if (task := tasks.get(t)) is not None and task.flags & lane_flag)
            idle_for = 0.0
        else:
            lane = 0
            idle_for = max(0.0, now - w.idle_since)
        mean = w.mean_task_seconds
        maps = w.store
        workers.append(make((
            w.name, w.host, w.pid, w.capacity, len(inflight), lane, len(w.seceded), w.queued, w.running,
            -1.0 if mean is None else mean, peaks.get(w.peer, 0), max(0.0, now - w.last_seen), idle_for,
            w.draining, w.broken or "", w.memory, w.memory_limit, w.cpu, maps[0][:200], maps[1], maps[2], maps[3],
        )))
    clients = [
        m.ClientStat(c.name, c.host, len(c.tasks), len(c.functions), len(c.objects), max(0.0, now - c.last_seen))
        for c in core.clients.values()
    ]
    events = []
    for e in recorder.events:
        cause, detail = e.cause, ""
        if e.status >= 0:
            line, detail = _failure_text(e.status, e.payload)
            cause = f"{cause}: {line}" if cause else line
        events.append(m.StatEvent(max(0.0, now - e.when), e.kind, e.task_id, e.where, cause, detail))
    store = core.store_stats() if core.store_stats is not None else {}
    uptime = 0.0 if recorder.started is None else now - recorder.started
    return m.Stats(
        counters, uptime, workers, clients, events, recorder.windows(now), store,
        list(recorder.duration_counts), recorder.duration_sum, core.object_store if store else "",
        core.managers.manager_stats(now),
    )  # fmt: skip


# --------------------------------------------------------------------------- what users see


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    name: str
    host: str
    pid: int
    processors: int  # tasks it runs at once
    tasks: int  # the daemon's tasks at it (queued there or running), announced lane tasks included
    lane_tasks: int  # of ``tasks``, those its clients sent straight down a lane
    seceded: int  # of ``tasks``, those waiting on sub-tasks (not counted as load)
    queued: int  # tasks queued at it, as its last heartbeat said
    running: int  # tasks running, as its last heartbeat said
    mean_task_seconds: float | None  # its recent mean task run time; None until one is timed
    peak_memory: int | None  # bytes of private memory its last task peaked at; None unknown
    last_heard: float  # seconds since its last message
    idle_for: float  # seconds since it last held no task (0 while it holds some)
    draining: bool  # chosen to stop, or draining itself (WorkerDraining): gets no more tasks
    broken: str | None  # why it can run no task (its initializer failed), or None
    memory: int | None = None  # its processors' private memory now, bytes; None until reported
    memory_limit: int | None = None  # the worker's memory limit, bytes; None: none
    cpu: float | None = None  # cores its processors kept busy lately (1.0: one); None until reported
    # The host store it maps and that store's figures, as its last heartbeat said; None
    # when it maps none (another host: objects travel over the network) or until reported.
    # Every worker on one host maps the same store: these repeat on each (see ``stores``).
    store: str | None = None  # the store's name
    store_bytes: int | None = None  # bytes allocated in it (object data and block headers)
    store_capacity: int | None = None  # its capacity, bytes
    store_objects: int | None = None  # objects in it

    @property
    def load(self) -> float:
        """Tasks it holds (seceded ones excepted) per processor."""
        return (self.tasks - self.seceded) / self.processors if self.processors else 0.0


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    name: str
    host: str
    tasks: int  # its tasks the daemon holds
    functions: int  # callables it registered
    objects: int  # store objects it holds (pins, unread results)
    last_heard: float


@dataclass(frozen=True, slots=True)
class StoreUse:
    """One object store of the cluster, counted once however many workers map it."""

    name: str
    bytes: int  # allocated in it (object data and block headers): what counts against capacity
    capacity: int
    objects: int
    workers: tuple[str, ...]  # the workers that map it (their heartbeats report it)
    hosts: tuple[str, ...]  # their hosts
    daemon: bool  # the daemon's own host store (its figures are the daemon's, taken under the lock)


@dataclass(frozen=True, slots=True)
class ManagerStatistics:
    """A worker manager: what it runs for the daemon and what its infrastructure cost.

    Listed while connected, and after it left while the daemon remembers its workers, ends,
    failures or interrupted tasks (kept by name: a restarted manager continues its line)."""

    name: str
    kind: str  # its adapter ("local", "slurm", ...); "" before its first offer
    connected: bool
    max_workers: int  # from its last offer; 0 before one
    requested: int  # workers asked for and not submitted yet
    starting: int  # workers pending: submitted, waiting for resources or starting up
    running: int
    draining: int  # finishing their tasks before they stop (scale-down, walltime, scancel)
    failed: int  # workers that ended without being asked to, and not by the infrastructure
    pending_keys: int  # worker keys admitted whose worker has not joined (yet, or again)
    pending_reason: str | None  # why its pending workers wait (the scheduler's reason), or None
    last_error: str | None  # its last refusal or failed worker, or None
    last_error_ago: float | None  # seconds before the snapshot; None without an error
    infrastructure_ends: int  # workers ended by the infrastructure (preemption, walltime)
    interrupted_tasks: int  # tasks interrupted on its workers and run again at no charge

    @classmethod
    def from_message(cls, s: m.ManagerStat) -> ManagerStatistics:
        return cls(
            s.name, s.kind, s.connected, s.max_workers, s.requested, s.starting, s.running, s.draining, s.failed,
            s.pending_keys, s.pending_reason or None, s.last_error or None,
            s.last_error_ago if s.last_error else None, s.infrastructure_ends, s.interrupted_tasks,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RecentEvent:
    """A failure, a lost worker or client, a retry or a refusal, from the daemon's ring."""

    ago: float  # seconds before the snapshot was taken
    # "failed", "timeout", "cancelled", "processor-died" (the task is retried or fails),
    # "retries-exhausted", "rejected", "worker-lost", "client-lost", "refused"
    kind: str
    task_id: int  # 0 when it concerns no task
    where: str  # the worker or client it concerns
    cause: str  # one line
    detail: str  # the tail of the remote traceback, or ""


@dataclass(frozen=True, slots=True)
class TaskWindow:
    """Tasks that ended in the last ``seconds`` (whole seconds of the daemon's clock)."""

    seconds: float
    finished: int
    failed: int
    timed: int  # of those, the ones whose run time the worker reported
    run_seconds: float  # their run time, summed
    max_seconds: float

    @property
    def throughput(self) -> float:
        """Tasks ended per second over the window."""
        return (self.finished + self.failed) / self.seconds

    @property
    def mean_seconds(self) -> float | None:
        return self.run_seconds / self.timed if self.timed else None


@dataclass(frozen=True, slots=True)
class TaskDurations:
    """Run times of every timed task since the daemon started, as a histogram."""

    bounds: tuple[float, ...]  # upper bounds in seconds, inclusive (DURATION_BOUNDS)
    counts: tuple[int, ...]  # tasks per bucket, not cumulative; one more than ``bounds``
    total_seconds: float  # their run times, summed

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, tasks that ran at most that long), the last bound ``inf``."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def _durations(counts: list[int], total: float) -> TaskDurations:
    if len(counts) != len(DURATION_BOUNDS) + 1:  # a daemon of another version: no histogram
        counts = [0] * (len(DURATION_BOUNDS) + 1)
    return TaskDurations(DURATION_BOUNDS, tuple(counts), total)


@dataclass(frozen=True, slots=True)
class Statistics(Mapping[str, Any]):
    """A snapshot of the daemon: counters (also this mapping's items), tasks by state,
    workers (each with the host store it maps), clients, recent windows and events, the
    daemon's host store, each object store once (``stores``), and the worker managers.

    ``counters`` holds what ``ex.statistics()`` always held: ``tasks``, ``tasks_<state>``
    (present while non-zero), ``workers``, ``processors``, ``clients``, ``functions``,
    ``submitted``, ``finished``, ``failed``, ``cancelled``, ``retried``, ``workers_lost``,
    ``clients_lost``, ``clients_left``, ``refused``, ``dropped_messages``, ``lane``,
    ``delivered_direct``, the network object counters, the placement counters
    (``placement_scans``, ``placement_retries``, ``placement_stuck``: scheduler/placement.py),
    with managers ``managers`` and ``managed_<state>``, and, with security on, the
    ``security_refused_*`` counters.
    """

    counters: Mapping[str, int | float | str]
    tasks_by_state: Mapping[str, int]  # every state a recorded task may be in, zeros included
    uptime: float  # seconds since the daemon's first tick
    workers: tuple[WorkerStatistics, ...]
    clients: tuple[ClientStatistics, ...]
    windows: tuple[TaskWindow, ...]  # shortest first
    events: tuple[RecentEvent, ...]  # oldest first
    store: Mapping[str, int]  # the host store's figures (ObjectStoreStats' fields); empty without one
    durations: TaskDurations  # run times of every timed task since the start
    store_name: str = ""  # the host store's name ("" without one): workers mapping it report it so
    managers: tuple[ManagerStatistics, ...] = ()  # by name

    def __getitem__(self, key: str) -> Any:
        return self.counters[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.counters)

    def __len__(self) -> int:
        return len(self.counters)

    @property
    def failures(self) -> tuple[RecentEvent, ...]:
        """The recent events that are a task's failure."""
        return tuple(e for e in self.events if e.kind in ("failed", "timeout", "retries-exhausted", "rejected"))

    @property
    def stores(self) -> tuple[StoreUse, ...]:
        """Each object store once, by name: the daemon's host store (its own figures) and any
        other a worker reports. Several workers on one host map one store and each reports
        it: sum these, never the workers' figures, for a cluster total."""
        mapped: dict[str, list[WorkerStatistics]] = {}
        for w in self.workers:
            if w.store:
                mapped.setdefault(w.store, []).append(w)
        out = []
        if self.store_name and self.store:
            ws = sorted(mapped.pop(self.store_name, []), key=lambda w: w.name)
            out.append(
                StoreUse(
                    self.store_name, int(self.store.get("in_use", 0)), int(self.store.get("capacity", 0)),
                    int(self.store.get("objects", 0)), tuple(w.name for w in ws),
                    tuple(sorted({w.host for w in ws})), True,
                )
            )
        for name, ws in sorted(mapped.items()):
            ws.sort(key=lambda w: w.name)
            freshest = min(ws, key=lambda w: w.last_heard)
            out.append(
                StoreUse(
                    name, freshest.store_bytes or 0, freshest.store_capacity or 0, freshest.store_objects or 0,
                    tuple(w.name for w in ws), tuple(sorted({w.host for w in ws})), False,
                )
            )
        return tuple(out)

    @classmethod
    def from_message(cls, message: m.Stats) -> Statistics:
        from scaler_executor.scheduler.state import TaskState

        counters = dict(message.snapshot)
        states = {
            s.value: int(counters.get(f"tasks_{s.value}", 0)) for s in TaskState if s is not TaskState.DONE
        }
        return cls(
            MappingProxyType(counters),
            MappingProxyType(states),
            message.uptime,
            tuple(
                WorkerStatistics(
                    w.name, w.host, w.pid, w.processors, w.tasks, w.lane_tasks, w.seceded, w.queued, w.running,
                    None if w.mean_task_seconds < 0 else w.mean_task_seconds, w.peak_memory or None, w.last_heard,
                    w.idle_for, w.draining, w.broken or None, w.memory or None, w.memory_limit or None,
                    w.cpu if w.memory else None, w.store or None,
                    *((w.store_bytes, w.store_capacity, w.store_objects) if w.store else (None, None, None)),
                )
                for w in message.workers
            ),
            tuple(ClientStatistics(*c) for c in message.clients),
            tuple(TaskWindow(*w) for w in message.windows),
            tuple(RecentEvent(*e) for e in message.events),
            MappingProxyType(dict(message.store)),
            _durations(list(message.durations), message.duration_sum),
            message.store_name,
            tuple(ManagerStatistics.from_message(s) for s in message.managers),
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Picklable (a snapshot may be sent to a task or a logger process); mapping proxies are not.
        return _rebuild, (
            dict(self.counters), dict(self.tasks_by_state), self.uptime, self.workers, self.clients,
            self.windows, self.events, dict(self.store), self.durations, self.store_name, self.managers,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"Statistics(tasks={self.counters.get('tasks', 0)}, workers={len(self.workers)}, "
            f"clients={len(self.clients)}, counters={dict(self.counters)})"
        )


def _rebuild(
    counters: dict[str, Any], states: dict[str, int], uptime: float, *rest: Any
) -> Statistics:
    workers, clients, windows, events, store, durations, store_name, managers = rest
    return Statistics(
        MappingProxyType(counters), MappingProxyType(states), uptime, workers, clients, windows, events,
        MappingProxyType(store), durations, store_name, managers,
    )  # fmt: skip
