"""The client core: what the client knows of its tasks, with no I/O, no threads, no user code.

::

    submit ──► new_task (UNSENT, item in the outbox)  ── drain ──► SENT ── result ─► claimed
                 │ park (PARKED: waits for a lane task)            │   (TasksRunning marks
                 │ send_down_lane (LANE)                           │    the future running)
                 └─► cancel: UNSENT/PARKED taken back at once ◄────┘ cancel: ASK the daemon
                                                                       (TasksCancelled)

One ``TaskRecord`` per outstanding task (``records``, by the task's number ``n``), in
place of the parallel dictionaries the agent used to keep; the outbox, the submit window
and the registries of callables and options live here too.  The agent (``agent.py``) owns
the sockets and the threads: it calls the core, then sends what ``drain`` returns and
settles futures through ``completion.py``.

Threads: user threads (submit, cancel), the agent thread (drain, results, notices) and
completion threads (results) call the core.  Every method that changes more than one
field runs under the agent's ``lock`` (its callers hold it, as each docstring says);
``claim`` is one ``dict.pop``, atomic under the GIL, so exactly one thread completes a
task however many paths its result takes.  Results, running notices and the breaking of
the executor are events (``handle``: ``ResultIn``, ``RunningIn``, ``Broken``), whose
commands (``Settle``, ``Resend``, ``MarkRunning``, ``FailTasks``) ``completion.py``
executes; submits, drains and cancels are still direct calls under the lock.
``validate()`` checks the invariants; the
unit tests (``tests/unit/test_client_state.py``) call it after every step.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from scaler_executor.client.pending import PendingLimit
from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TaskFlags, TaskOptions

TASK_MASK = (1 << m.TASK_ID_BITS) - 1
MAX_TASKS_PER_TRANSMISSION = 2000  # bounds the daemon's work per message, hence its turn time
# Messages in one transmission at most (the daemon refuses a batch of more than
# codec.MAX_BATCH_MESSAGES): room is kept for the two CancelTasks the drain appends last.
MAX_MESSAGES_PER_TRANSMISSION = codec.SEND_BATCH_MESSAGES - 3

# Where a task is, as far as the client knows.
UNSENT = "unsent"  # its item is in the outbox: the daemon has not heard of it
PARKED = "parked"  # held here until a lane task it takes as an argument is done
SENT = "sent"  # the daemon holds it (or a worker it gave it to)
LANE = "lane"  # sent straight to a worker's lane: running, the daemon never held it

# (where, event) -> where.  ``None``: the record leaves ``records``.
TRANSITIONS: dict[tuple[str, str], str | None] = {
    (UNSENT, "drain"): SENT,
    (UNSENT, "cancel"): None,
    (UNSENT, "result"): None,  # failed before it was sent (the executor broke)
    (PARKED, "unpark"): UNSENT,
    (PARKED, "cancel"): None,
    (PARKED, "result"): None,  # its argument failed: it fails without running
    (SENT, "result"): None,
    (SENT, "cancelled"): None,  # the daemon dropped it
    (SENT, "resend"): UNSENT,  # DEP_GONE: pickled again with the value inline
    (LANE, "result"): None,
    (LANE, "lane-lost"): UNSENT,  # its lane closed or its processor died: to the daemon
}


class IllegalTransition(RuntimeError):
    pass


# Events in (``ClientCore.handle``): what the routes and the agent report.
class ResultIn(NamedTuple):
    """A task's result came, by any route (the daemon, a lane, the reply inbox)."""

    result: m.TaskResult


class RunningIn(NamedTuple):
    """The daemon's running notice (``TasksRunning``) for these task ids."""

    task_ids: list[int]


class Broken(NamedTuple):
    """The executor is broken (the daemon lost, a bug): every outstanding task fails.
    (Under the agent's lock.)"""

    error: BaseException


# Commands out, executed by ``completion.py`` (the one module that settles futures).
class Settle(NamedTuple):
    """Complete ``record``'s future from ``result`` (its record has left the core)."""

    record: TaskRecord
    result: m.TaskResult


class Resend(NamedTuple):
    """DEP_GONE: a dependency finished before the daemon saw task ``n``: pickle it again,
    the value inlined (``submit.py``); its record stays."""

    n: int


class MarkRunning(NamedTuple):
    """Mark these records' futures running (no callback runs: any thread may do it)."""

    records: list[TaskRecord]


class FailTasks(NamedTuple):
    """Fail these records' futures (and wake their cancellers) with ``error``."""

    records: list[TaskRecord]
    error: BaseException


Event = ResultIn | RunningIn | Broken
Command = Settle | Resend | MarkRunning | FailTasks


# Outbox entries other than tasks: (kind, data).
REGISTER_FN, RELEASE_FN, REGISTER_OPTIONS, CANCEL, FORCE_CANCEL = range(5)
STATS, PIN_OBJECTS, RELEASE_OBJECTS, FETCH_OBJECTS, SUBMIT_BATCH, FLUSHED = range(5, 11)
HISTORY = 11
PARTS_TAKEN = 12  # credit for ObjectParts (protocol/chunks.py)


# How each other outbox entry becomes its message (base: the client's id, shifted).
_MESSAGE: dict[int, Callable[[int, Any], Any]] = {
    REGISTER_FN: lambda base, data: m.RegisterFunction(base | data[0], data[1]),
    RELEASE_FN: lambda base, data: m.ReleaseFunctions([base | data]),
    REGISTER_OPTIONS: lambda base, data: m.RegisterOptions(data[0], data[1]),
    STATS: lambda base, data: m.StatsRequest(),
    HISTORY: lambda base, data: m.HistoryRequest(),
    PIN_OBJECTS: lambda base, data: m.PinObjects(data),
    RELEASE_OBJECTS: lambda base, data: m.ReleaseObjects(data),
    FETCH_OBJECTS: lambda base, data: m.ObjectRequest(data),
    PARTS_TAKEN: lambda base, data: m.ObjectPartsTaken(data),
}


class TaskItem(NamedTuple):
    """A task as it waits in the outbox (ids without the client's base)."""

    n: int
    fn_id: int
    options_id: int
    flags: int
    payload: bytes
    deps: list[int]
    objects: list[bytes]

    def spec(self, base: int) -> m.TaskSpec:
        deps = [base | d for d in self.deps] if self.deps else []
        fn_id = base | self.fn_id if self.fn_id else 0
        return m.TaskSpec(base | self.n, fn_id, self.options_id, self.flags, self.payload, deps, self.objects, 0)


class TaskRecord:
    """One outstanding task: its future and what sending it again needs."""

    __slots__ = ("n", "future", "where", "submitted", "repack", "item", "blob", "cancel", "owner", "charge")

    def __init__(self, n: int, future: Any, where: str, submitted: float, owner: ClientCore) -> None:
        self.n = n
        self.future = future
        self.where = where
        self.submitted = submitted  # time.time() of the submit
        self.repack: tuple[Callable[[], Any], int] | None = None  # pickles it again (DEP_GONE)
        self.item: TaskItem | None = None  # as sent down a lane (to send it to the daemon later)
        self.blob: bytes | None = None  # its callable, for a lane task (it may be released meanwhile)
        self.cancel: Any = None  # the agent's wait for the daemon's answer to a cancel
        self.owner = owner  # which client's task: futures of other executors are not ours
        self.charge = -1  # bytes charged to the pending limit (client/pending.py); -1: not charged

    def __repr__(self) -> str:
        return f"<TaskRecord {self.n} {self.where}>"


class ClientCore:
    """Tasks, the outbox and the registries of one client; see the module doc."""

    def __init__(self, window: int) -> None:
        self.records: dict[int, TaskRecord] = {}
        self.outbox: deque[Any] = deque()  # TaskItem, or (kind, data)
        self.more_to_drain = False  # the last drain stopped at MAX_MESSAGES_PER_TRANSMISSION
        self.window = window  # most tasks sent and not yet acknowledged
        self.unacked = 0
        self.base = 0  # the client's id, shifted: the high bits of every id on the wire
        self._numbers = itertools.count(1)
        self._fn_numbers = itertools.count(1)
        self.fn_payloads: dict[int, bytes] = {}  # registered callables (a lane's first task needs one)
        self.fn_cache: weakref.WeakKeyDictionary[Callable[..., Any], int] = weakref.WeakKeyDictionary()
        self.options: dict[tuple[Any, ...], int] = {}
        self.option_records: dict[int, TaskOptions] = {}  # by id: sent again to a restarted daemon
        # Under a journaled daemon (client/resume.py): every task sent and not yet acknowledged
        # (SubmitAck), in order, to send again if the daemon restarts before it wrote them.
        self.sent_unacked: deque[m.TaskSpec] | None = None
        # ... and the store objects it holds at the daemon (pins sent, results with objects
        # received, minus releases sent): a restarted daemon may not have written them all.
        self.holds: dict[bytes, int] = {}
        self.pending: PendingLimit | None = None  # frees a charged task as its record leaves

    def _left(self, record: TaskRecord) -> None:
        if record.charge >= 0 and self.pending is not None:
            self.pending.free(record.charge)
            record.charge = -1

    # ------------------------------------------------------------------ tasks

    def new_task(self, future: Any, where: str, submitted: float) -> TaskRecord:
        """(Under the lock) a record for a new task; the caller queues its item (``queue``)."""
        n = next(self._numbers)
        record = TaskRecord(n, future, where, submitted, self)
        self.records[n] = record
        if future is not None:
            future._record = record
        return record

    def number(self) -> int:
        """(Under the lock) a number for a task with no future (a graph's intermediate)."""
        return next(self._numbers)

    def queue(self, record: TaskRecord, item: TaskItem) -> None:
        """(Under the lock) the task's item joins the outbox; it is UNSENT until drained."""
        record.where = UNSENT
        self.outbox.append(item)

    def move(self, record: TaskRecord, event: str) -> str | None:
        """Apply ``event`` to ``record`` by the transition table; raises on an illegal one."""
        try:
            where = TRANSITIONS[(record.where, event)]
        except KeyError:
            raise IllegalTransition(f"task {record.n}: {event!r} while {record.where}") from None
        if where is None:
            if self.records.get(record.n) is record:
                del self.records[record.n]
                self._left(record)
        else:
            record.where = where
        return where

    def claim(self, n: int) -> TaskRecord | None:
        """Take task ``n`` out to complete it; None if another path got it first (its result
        came twice, or it was cancelled).  One ``dict.pop``: atomic, no lock needed."""
        record = self.records.pop(n, None)
        if record is not None and record.charge >= 0:
            self._left(record)
        return record

    def renumber(self, record: TaskRecord) -> int:
        """(Under the lock) a new number for a task sent again after it left a lane (the
        worker may still hold the old one); the record stays the future's."""
        if self.records.get(record.n) is record:
            del self.records[record.n]
        record.n = n = next(self._numbers)
        self.records[n] = record
        return n

    def outstanding(self, n: int) -> bool:
        return n in self.records

    # ------------------------------------------------------------------ cancel

    def cancel(self, record: TaskRecord) -> str:
        """(Under the lock) what a ``cancel()`` can do: "taken" (the daemon never had it;
        the record is gone), "ask" (only the daemon knows) or "no" (running, or being
        completed)."""
        if self.records.get(record.n) is not record:
            return "no"
        if record.where in (UNSENT, PARKED):
            self.move(record, "cancel")
            return "taken"
        if record.where is SENT:
            return "ask"
        return "no"

    def ask_cancel(self, record: TaskRecord, wait: Any) -> None:
        """(Under the lock) ask the daemon to drop the task; ``wait`` hears its answer."""
        record.cancel = wait
        self.outbox.append((CANCEL, record.n))

    def cancel_answered(self, message: m.TasksCancelled) -> list[tuple[TaskRecord, bool]]:
        """(Under the lock) the daemon's answer: (record, dropped?) for each task asked
        about; dropped tasks leave ``records``, refused ones stay (their results come)."""
        out = []
        for verdict, task_ids in ((True, message.cancelled), (False, message.refused)):
            for task_id in task_ids:
                record = self.records.get(task_id & TASK_MASK)
                if record is None or record.cancel is None:
                    continue  # completed meanwhile (a refused task's result came first)
                if verdict:
                    self.move(record, "cancelled")
                out.append((record, verdict))
        return out

    # ------------------------------------------------------------------ events in, commands out

    def handle(self, event: Event) -> list[Command]:
        """Apply ``event``; the commands the agent and ``completion.py`` then execute.
        (The hot paths call ``result_in`` and ``running_in`` directly: same code, no list.)"""
        match event:
            case ResultIn(result):
                command = self.result_in(result)
                return [] if command is None else [command]
            case RunningIn(task_ids):
                running = self.running_in(task_ids)
                return [] if running is None else [running]
            case Broken(error):
                return [FailTasks(self.forget_all(), error)]
        raise TypeError(f"not a client core event: {event!r}")

    def result_in(self, result: m.TaskResult) -> Settle | Resend | None:
        """A result: Settle its task (claimed here: exactly one route's copy wins), Resend
        it (DEP_GONE), or None (a late duplicate, or its task was cancelled).  Lock-free:
        the claim is one ``dict.pop``."""
        n = result.task_id & TASK_MASK
        if result.status == m.Status.DEP_GONE:
            return Resend(n) if n in self.records else None
        record = self.claim(n)
        return None if record is None else Settle(record, result)

    def running_in(self, task_ids: list[int]) -> MarkRunning | None:
        """A running notice: the outstanding tasks among ``task_ids`` (completed ones are
        skipped; a result that comes first marks its future running itself)."""
        records = self.records
        found = [record for task_id in task_ids if (record := records.get(task_id & TASK_MASK)) is not None]
        return MarkRunning(found) if found else None

    # ------------------------------------------------------------------ registries

    def function_id(self, fn: Callable[..., Any], payload: bytes) -> tuple[int, bool]:
        """(Under the lock) the id of a cached callable; True if it is new (registered now)."""
        fn_id = self.fn_cache.get(fn)
        if fn_id is not None:
            return fn_id, False
        fn_id = self.register_function(payload)
        self.fn_cache[fn] = fn_id
        return fn_id, True

    def register_function(self, payload: bytes) -> int:
        """(Under the lock) register a callable with the cluster."""
        fn_id = next(self._fn_numbers)
        self.outbox.append((REGISTER_FN, (fn_id, payload)))
        self.fn_payloads[fn_id] = payload
        return fn_id

    def options_id(self, options: TaskOptions) -> tuple[int, bool]:
        """(Under the lock) the interned id of an options record; True if it is new."""
        key = (tuple(sorted(options.resources.items())), tuple(sorted(options.tags)), *options[2:])
        options_id = self.options.get(key)
        if options_id is not None:
            return options_id, False
        options_id = len(self.options) + 1
        self.outbox.append((REGISTER_OPTIONS, (options_id, options)))
        self.options[key] = options_id
        self.option_records[options_id] = options
        return options_id, True

    # ------------------------------------------------------------------ the outbox

    def drain(self) -> tuple[list[Any], list[Any]]:
        """(Under the lock) the messages the outbox holds for the daemon, in order, and the
        FLUSHED markers among them.  Tasks beyond the submit window stay, and so do the
        items beyond MAX_MESSAGES_PER_TRANSMISSION messages (``more_to_drain`` then says
        so); a task taken back by a cancel is skipped."""
        outbox, base, records = self.outbox, self.base, self.records
        retained = self.sent_unacked
        batch: list[Any] = []
        specs: list[m.TaskSpec] = []
        cancels: list[int] = []
        forced: list[int] = []
        flushed: list[Any] = []
        self.more_to_drain = False
        while outbox:
            if len(batch) >= MAX_MESSAGES_PER_TRANSMISSION:
                self.more_to_drain = True
                break
            item = outbox[0]
            if type(item) is TaskItem:
                record = records.get(item.n)
                if record is None or record.where is not UNSENT:
                    outbox.popleft()  # cancelled on the spot: the daemon never hears of it
                    continue
                if self.unacked >= self.window or len(specs) >= MAX_TASKS_PER_TRANSMISSION:
                    break
                outbox.popleft()
                record.where = SENT
                specs.append(item.spec(base) if retained is None else self._retain(item, retained))
                if not item.flags & TaskFlags.REPLY_DIRECT:  # a sequential caller's is never acked
                    self.unacked += 1
                continue
            outbox.popleft()
            if specs:
                batch.append(m.SubmitTasks(specs))
                specs = []
            kind, data = item
            if kind == CANCEL:
                cancels.append(base | data)
            elif kind == FORCE_CANCEL:
                forced.append(base | data)
            elif kind == FLUSHED:
                flushed.append(data)
            elif kind == SUBMIT_BATCH:
                batch.append(self._graph(data))
            else:
                if retained is not None and kind in (PIN_OBJECTS, RELEASE_OBJECTS):
                    self.count_holds(data, 1 if kind == PIN_OBJECTS else -1)
                batch.append(_MESSAGE[kind](base, data))
        if specs:
            batch.append(m.SubmitTasks(specs))
        if cancels:
            batch.append(m.CancelTasks(cancels, False))
        if forced:
            batch.append(m.CancelTasks(forced, True))
        return batch, flushed

    def _retain(self, item: TaskItem, retained: deque[m.TaskSpec]) -> m.TaskSpec:
        """A task's spec, kept until acknowledged (under a journaled daemon: resume.py)."""
        if item.flags & TaskFlags.REPLY_DIRECT:  # acknowledged, to be kept till then
            item = item._replace(flags=item.flags & ~TaskFlags.REPLY_DIRECT)
        spec = item.spec(self.base)
        retained.append(spec)
        return spec

    def _graph(self, tasks: list[TaskItem]) -> m.SubmitTasks:
        """A graph: all its tasks in one SubmitTasks, so that the daemon links every
        dependency before any result can release an intermediate."""
        records, base = self.records, self.base
        for task in tasks:
            record = records.get(task.n)
            if record is not None:
                record.where = SENT
        self.unacked += len(tasks)
        specs = [task.spec(base) for task in tasks]
        if self.sent_unacked is not None:
            self.sent_unacked.extend(specs)
        return m.SubmitTasks(specs)

    def count_holds(self, object_ids: list[bytes], delta: int) -> None:
        holds = self.holds
        for object_id in object_ids:
            left = holds.get(object_id, 0) + delta
            if left > 0:
                holds[object_id] = left
            else:
                holds.pop(object_id, None)

    def acknowledged(self, count: int) -> None:
        self.unacked -= count
        retained = self.sent_unacked
        if retained is not None:
            for _ in range(min(count, len(retained))):
                retained.popleft()

    def has_tasks_to_send(self) -> bool:
        outbox = self.outbox
        return any(type(item) is TaskItem or item[0] == SUBMIT_BATCH for item in outbox)

    # ------------------------------------------------------------------ the end

    def forget_all(self) -> list[TaskRecord]:
        """(Under the lock) every outstanding task, taken out (the executor is broken)."""
        records = list(self.records.values())
        self.records.clear()
        self.outbox.clear()
        for record in records:
            self._left(record)
        if self.pending is not None:
            self.pending.close()
        return records

    def validate(self) -> None:
        """Check the invariants; raises AssertionError naming the first that fails."""
        queued: dict[int, int] = {}
        for item in self.outbox:
            if type(item) is TaskItem:
                queued[item.n] = queued.get(item.n, 0) + 1
            else:
                assert isinstance(item, tuple) and len(item) == 2, f"bad outbox entry {item!r}"
        for n, record in self.records.items():
            assert record.n == n, f"{record!r} filed under {n}"
            assert record.owner is self, f"{record!r} belongs to another client"
            assert record.where in (UNSENT, PARKED, SENT, LANE), f"{record!r}: unknown place"
            if record.future is not None:
                assert getattr(record.future, "_record", None) is record, f"{record!r}: its future lost it"
            if record.where is UNSENT:
                assert queued.get(n, 0) == 1, f"{record!r} has {queued.get(n, 0)} items in the outbox"
            elif record.where is PARKED:
                assert queued.get(n, 0) == 0, f"{record!r} parked with an item in the outbox"
            if record.where is LANE:
                assert record.item is not None, f"{record!r} on a lane without its item"
            if record.cancel is not None:
                assert record.where is SENT, f"{record!r}: a cancel asked of the daemon while {record.where}"
        assert self.unacked >= 0, f"unacked {self.unacked}"
