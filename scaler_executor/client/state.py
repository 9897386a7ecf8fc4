"""The client core: what the client knows of its tasks, with no I/O, no threads, no user code.

::

    Submitted ──► UNSENT (item in the outbox) ── Tick ──► SENT ── ResultIn ─► Settle
        │ Parked (PARKED: waits for a lane task)           │   (RunningIn: MarkRunning)
        │ lane open, alone: LANE (SendDownLane)            │
        └─► CancelRequested: UNSENT/PARKED taken back ◄────┘ CancelRequested: ask the
            at once (NotifyCancelled)                         daemon (AwaitAnswer), whose
                                                              CancelAnswered decides

Events in, commands out (``events.py``; the table is in ``docs/architecture.rst``):
``handle(event)`` applies an event and returns the commands the shell (``agent.py``,
``submit.py``, ``cancel.py``, ``completion.py``) executes; the shell decides nothing
about tasks.  The hot paths call ``handle_submit``, ``result_in`` and ``running_in``
directly: the same code, one command (or None) and no list per task.

One ``TaskRecord`` per outstanding task (``records``, by the task's number ``n``); the
outbox, the submit window and the registries of callables and options live here too;
time comes in with the events (``Submitted.now``, ``Tick.now``).

Threads: user threads (submit, cancel), the agent thread (tick, results, notices, lanes)
and completion threads (results) call the core.  Every event but ``ResultIn``,
``RunningIn``, ``Posted`` and ``FunctionReleased`` is handled under the agent's ``lock``
(the shell holds it); those four are lock-free: a claim is one ``dict.pop`` (atomic
under the GIL, so exactly one thread completes a task however many routes its result
takes) and a post one ``deque.append``.  ``validate()`` checks the invariants; the unit
tests (``tests/unit/test_client_state.py``, ``test_client_core_events.py``) call it
after every step.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from scaler_executor.client.events import (
    DISCARD,
    WAKE,
    Acknowledged,
    AnswerCancel,
    Answered,
    AwaitAnswer,
    Broken,
    CancelAnswered,
    CancelRequested,
    Command,
    DaemonLost,
    DaemonResults,
    Event,
    Fail,
    FailAll,
    FailTasks,
    ForceCancelRequested,
    FunctionReleased,
    GraphSubmitted,
    GraphTaskAdded,
    KillOnLane,
    LaneLost,
    LaneOpened,
    LaneRefused,
    MarkRunning,
    NotifyCancelled,
    Parked,
    Posted,
    ReleaseOnLane,
    Repickled,
    Resend,
    ResultIn,
    RunningIn,
    SendDownLane,
    SendToDaemon,
    SetFlushed,
    Settle,
    Submitted,
    TaskFailed,
    Tick,
    Welcomed,
)
from scaler_executor.client.pending import PendingLimit
from scaler_executor.client.resume import ClientResume
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
    (LANE, "refused"): UNSENT,  # the send down the lane failed: to the daemon
}


class IllegalTransition(RuntimeError):
    pass


# Outbox entries other than tasks: (kind, data).
REGISTER_FN, RELEASE_FN, REGISTER_OPTIONS, CANCEL, FORCE_CANCEL = range(5)
STATS, PIN_OBJECTS, RELEASE_OBJECTS, FETCH_OBJECTS, SUBMIT_BATCH, FLUSHED = range(5, 11)
HISTORY = 11
PARTS_TAKEN = 12  # credit for ObjectParts (protocol/chunks.py)
RESULT_PARTS_TAKEN = 13  # credit for ResultParts (client/pushed.py)


# How each other outbox entry becomes its message (base: the client's id, shifted).
_MESSAGE: dict[int, Callable[[int, Any], Any]] = {
    REGISTER_FN: lambda base, data: m.RegisterFunction(base | data[0], data[1]),
    RELEASE_FN: lambda base, data: m.ReleaseFunctions([base | data]),
    REGISTER_OPTIONS: lambda base, data: m.RegisterOptions(data[0], data[1]),
    STATS: lambda base, data: m.StatsRequest(data or {}),
    HISTORY: lambda base, data: m.HistoryRequest(),
    PIN_OBJECTS: lambda base, data: m.PinObjects(data),
    RELEASE_OBJECTS: lambda base, data: m.ReleaseObjects(data),
    FETCH_OBJECTS: lambda base, data: m.ObjectRequest(data),
    PARTS_TAKEN: lambda base, data: m.ObjectPartsTaken(data),
    RESULT_PARTS_TAKEN: lambda base, data: m.ResultPartsTaken(data),
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
        return m.make(m.TaskSpec, (base | self.n, fn_id, self.options_id, self.flags, self.payload, deps, self.objects, 0))


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
        # Tasks whose cancel was asked of the daemon and not answered yet (record.cancel set),
        # by number: the answer finds its waiter here even when the task's result came first
        # and took the record out of ``records``.
        self.cancelling: dict[int, TaskRecord] = {}
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
        # Requests awaiting the daemon's answer (answered in order, one answer each), asked
        # again of a restarted daemon, which never saw them or died before answering.
        self.asked: dict[int, deque[Any]] = {STATS: deque(), HISTORY: deque(), FETCH_OBJECTS: deque()}
        # Under a journaled daemon (client/resume.py): every task sent and not yet acknowledged
        # (SubmitAck), in order, to send again if the daemon restarts before it wrote them.
        self.sent_unacked: deque[m.TaskSpec] | None = None
        # ... and the store objects it holds at the daemon (pins sent, results with objects
        # received, minus releases sent): a restarted daemon may not have written them all.
        self.holds: dict[bytes, int] = {}
        self.resume = ClientResume()  # a journaled daemon's restart, and our ResultsAcks
        self.ack_interval = 0.0  # how often results are acknowledged (the heartbeat interval)
        self.pending: PendingLimit | None = None  # frees a charged task as its record leaves
        self.lane_open = False  # a worker's lane is connected (LaneOpened / LaneLost)
        self.broken: BaseException | None = None  # set by DaemonLost: nothing more is sent
        # Set on the futures of new tasks (opaque to the core): the shell's cancel hook, and
        # the pick-up hook of a sequential caller's future (None: no reply inbox).
        self.cancel_hook: Any = None
        self.pickup_hook: Any = None
        self._handlers: dict[type, Callable[[Any], list[Command]]] = {
            Submitted: self._on_submitted,
            Parked: self._on_parked,
            GraphTaskAdded: self._on_graph_task,
            GraphSubmitted: self._on_graph_submitted,
            Repickled: self._on_repickled,
            TaskFailed: self._on_task_failed,
            CancelRequested: self._on_cancel_requested,
            ForceCancelRequested: self._on_force_cancel,
            CancelAnswered: self._on_cancel_answered,
            ResultIn: self._on_result,
            DaemonResults: self._on_daemon_results,
            RunningIn: self._on_running,
            Acknowledged: self._on_acknowledged,
            Welcomed: self._on_welcomed,
            Tick: self._on_tick,
            LaneOpened: self._on_lane_opened,
            LaneLost: self._on_lane_lost,
            LaneRefused: self._on_lane_refused,
            Posted: self._on_posted,
            Answered: self._on_answered,
            FunctionReleased: self._on_function_released,
            DaemonLost: self._on_daemon_lost,
            Broken: self._on_broken,
        }

    def _left(self, record: TaskRecord) -> None:
        if record.charge >= 0 and self.pending is not None:
            self.pending.free(record.charge)
            record.charge = -1

    # ------------------------------------------------------------------ events in, commands out

    def handle(self, event: Event) -> list[Command]:
        """Apply ``event``; the commands the shell then executes, in order."""
        handler = self._handlers.get(type(event))
        if handler is None:
            raise TypeError(f"not a client core event: {event!r}")
        return handler(event)

    # ------------------------------------------------------------------ records

    def new_task(self, future: Any, where: str, submitted: float) -> TaskRecord:
        """A record for a new task (its item, if any, is queued by the caller)."""
        n = next(self._numbers)
        record = TaskRecord(n, future, where, submitted, self)
        self.records[n] = record
        if future is not None:
            future._record = record
        return record

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

    def _renumber(self, record: TaskRecord) -> int:
        """A new number for a task sent again after it left a lane (the worker may still
        hold the old one); the record stays the future's."""
        if self.records.get(record.n) is record:
            del self.records[record.n]
        record.n = n = next(self._numbers)
        self.records[n] = record
        return n

    def outstanding(self, n: int) -> bool:
        return n in self.records

    def owns(self, record: TaskRecord) -> bool:
        """``record`` is outstanding (not completed, cancelled or failed meanwhile)."""
        return self.records.get(record.n) is record

    # ------------------------------------------------------------------ submits

    def handle_submit(
        self, future: Any, fn_id: int, options_id: int, flags: int, payload: bytes, deps: list[int],
        objects: list[bytes], repack: tuple[Callable[[], Any], int] | None, charge: int, now: float,
    ) -> SendDownLane | None:
        """``Submitted``, called directly by the submit path (no event, no list): None (the
        task waits in the outbox: wake the agent), or SendDownLane for a task submitted alone while a
        lane is open (``LaneRefused`` if that send fails).  A task submitted alone is a
        sequential caller's: its result may come straight back (REPLY_DIRECT)."""
        alone = not self.records
        n = next(self._numbers)
        record = TaskRecord(n, future, UNSENT, now, self)
        self.records[n] = record
        future._record = record
        future._on_cancel = self.cancel_hook
        record.charge = charge
        if repack is not None:
            record.repack = repack
        if alone:
            flags |= TaskFlags.REPLY_DIRECT
            if self.pickup_hook is not None:
                future._pickup = self.pickup_hook
        item = m.make(TaskItem, (n, fn_id, options_id, flags, payload, deps, objects))
        if alone and self.lane_open and options_id == 0 and not deps and not objects:
            blob = self.fn_payloads.get(fn_id) if fn_id else None
            if blob is not None or not fn_id:  # (a released callable: the daemon's path)
                record.where = LANE
                record.item, record.blob = item, blob
                return SendDownLane(record, item)
        self.outbox.append(item)
        return None

    def _on_submitted(self, e: Submitted) -> list[Command]:
        command = self.handle_submit(
            e.future, e.fn_id, e.options_id, e.flags, e.payload, e.deps, e.objects, e.repack, e.charge, e.now
        )
        return [WAKE if command is None else command]

    def _on_parked(self, e: Parked) -> list[Command]:
        self.new_task(e.future, PARKED, e.now)
        e.future._on_cancel = self.cancel_hook
        return []

    def _on_graph_task(self, e: GraphTaskAdded) -> list[Command]:
        # SENT from the start: the batch goes whole, so a cancel asks the daemon (after
        # the batch, in the outbox's order) rather than taking one task back.
        self.graph_number(e.future, e.now)
        return []

    def graph_number(self, future: Any, now: float) -> int:
        """``GraphTaskAdded``, and the number it gave the task (the graph's items need it)."""
        n = next(self._numbers)
        if future is not None:
            self.records[n] = TaskRecord(n, future, SENT, now, self)
            future._record = self.records[n]
            future._on_cancel = self.cancel_hook
        return n

    def _on_graph_submitted(self, e: GraphSubmitted) -> list[Command]:
        self.outbox.append((SUBMIT_BATCH, e.items))
        return [WAKE]

    def _on_repickled(self, e: Repickled) -> list[Command]:
        """A parked task's argument is done, or a sent task lost a dependency (DEP_GONE):
        its new item joins the outbox, unless it was cancelled or completed meanwhile."""
        record = e.record
        if not self.owns(record) or record.where not in (PARKED, SENT):
            return [DISCARD]
        if record.cancel is not None:
            # Asked of the daemon, which gave it back unrun (DEP_GONE): it never ran and
            # is ours again, so the cancel is granted here (the daemon's own answer about
            # the old id then finds no record and is ignored).
            wait, record.cancel = record.cancel, None
            self.cancelling.pop(record.n, None)
            self.move(record, "cancelled")
            return [DISCARD, AnswerCancel(record, wait, True)]
        record.repack = e.repack
        self.move(record, "unpark" if record.where is PARKED else "resend")
        self.outbox.append(e.item._replace(n=record.n))
        return [WAKE]

    def _on_task_failed(self, e: TaskFailed) -> list[Command]:
        record = e.record
        return [Fail(record, e.error)] if self.claim(record.n) is record else []

    # ------------------------------------------------------------------ cancels

    def _on_cancel_requested(self, e: CancelRequested) -> list[Command]:
        """UNSENT/PARKED tasks are taken back (the daemon never had them): NotifyCancelled.
        SENT ones are asked of the daemon if the caller may wait (AwaitAnswer), or awaited
        if another caller asked already (``join``).  LANE ones run: nothing to do."""
        taken: list[TaskRecord] = []
        asked: list[TaskRecord] = []
        joined: Any = None
        for record in e.records:
            if not self.owns(record):
                continue  # completed (or being completed) meanwhile
            if record.where is UNSENT or record.where is PARKED:
                self.move(record, "cancel")
                taken.append(record)
            elif record.where is SENT:
                if record.cancel is None and e.wait is not None and self.broken is None:
                    record.cancel = e.wait
                    self.cancelling[record.n] = record
                    self.outbox.append((CANCEL, record.n))
                    asked.append(record)
                elif record.cancel is not None and e.join and e.wait is not None:
                    joined = record
        out: list[Command] = []
        if taken:
            out.append(NotifyCancelled(taken))
        if asked:
            out.append(WAKE)
            out.append(AwaitAnswer(asked, e.wait))
        elif joined is not None:
            out.append(AwaitAnswer([joined], joined.cancel))
        return out

    def _on_force_cancel(self, e: ForceCancelRequested) -> list[Command]:
        record = e.record
        if not self.owns(record):
            return []  # finished meanwhile
        if e.lane and record.where is LANE:
            return [KillOnLane(record)]
        self.outbox.append((FORCE_CANCEL, record.n))
        if self.resume.journal:  # named again when resuming: its daemon may be down now
            self.resume.force_cancelled(self, record.n)
        return [WAKE]

    def _on_cancel_answered(self, e: CancelAnswered) -> list[Command]:
        """Dropped tasks leave ``records``; refused ones stay (their results come).  A task
        whose result came first (a refused one's, usually) is answered not dropped: its
        canceller learns it now, not when its ``cancel_wait`` runs out."""
        out: list[Command] = []
        for dropped, task_ids in ((True, e.cancelled), (False, e.refused)):
            for task_id in task_ids:
                n = task_id & TASK_MASK
                record = self.cancelling.pop(n, None)
                if record is None or record.cancel is None:
                    continue  # answered already (a repeated answer after a restart)
                wait, record.cancel = record.cancel, None
                if self.records.get(n) is not record:
                    out.append(AnswerCancel(record, wait, False))  # completed meanwhile
                    continue
                if dropped:
                    self.move(record, "cancelled")
                out.append(AnswerCancel(record, wait, dropped))
        return out

    # ------------------------------------------------------------------ results and notices

    def result_in(self, result: m.TaskResult) -> Settle | Resend | None:
        """A result: Settle its task (claimed here: exactly one route's copy wins), Resend
        it (DEP_GONE), or None (a late duplicate, or its task was cancelled).  Lock-free:
        the claim is one ``dict.pop``."""
        n = result.task_id & TASK_MASK
        if result.status == m.Status.DEP_GONE:
            return Resend(n) if n in self.records else None
        record = self.claim(n)
        return None if record is None else Settle(record, result)

    def _on_result(self, e: ResultIn) -> list[Command]:
        command = self.result_in(e.result)
        return [] if command is None else [command]

    def _on_daemon_results(self, e: DaemonResults) -> list[Command]:
        if self.sent_unacked is None:
            self.resume.received += 1
            return []
        if not self.resume.refused(self, e.results):
            self.resume.received += 1  # (refusals for a full journal are not counted: never kept)
        for result in e.results:
            if result.objects and not result.delivered:  # held for us until we read it
                self.count_holds(result.objects, 1)
        return []

    def running_in(self, task_ids: list[int]) -> MarkRunning | None:
        """A running notice: the outstanding tasks among ``task_ids`` (completed ones are
        skipped; a result that comes first marks its future running itself)."""
        records = self.records
        found = [record for task_id in task_ids if (record := records.get(task_id & TASK_MASK)) is not None]
        return MarkRunning(found) if found else None

    def _on_running(self, e: RunningIn) -> list[Command]:
        running = self.running_in(e.task_ids)
        return [] if running is None else [running]

    def _on_acknowledged(self, e: Acknowledged) -> list[Command]:
        self.unacked -= e.tasks
        if self.sent_unacked is not None:
            self.resume.acknowledged(self.sent_unacked, e.tasks)
        return []

    def _on_welcomed(self, e: Welcomed) -> list[Command]:
        message = e.message
        resumed = self.resume.welcomed(message)
        self.ack_interval = e.interval
        if message.journal and self.sent_unacked is None:
            self.sent_unacked = deque()
        self.base = message.peer_id << m.TASK_ID_BITS  # (a resumed client keeps its id)
        if not resumed:
            return []
        return [SendToDaemon([self.resume.report(self), *self._ask_again()]), *self._unanswerable()]

    # ------------------------------------------------------------------ lanes

    def _on_lane_opened(self, e: LaneOpened) -> list[Command]:
        self.lane_open = True
        return []

    def _on_lane_refused(self, e: LaneRefused) -> list[Command]:
        record = e.record
        item = record.item
        if not self.owns(record) or item is None or record.where is not LANE:
            return []
        self.move(record, "refused")
        record.item = record.blob = None
        self.outbox.append(item)
        return [WAKE]

    def _on_lane_lost(self, e: LaneLost) -> list[Command]:
        """To the daemon, under a new number (the worker may still hold the old one),
        which retries it by the usual rules (LANE_RETRY: the attempt on the lane counts)."""
        if e.closed:
            self.lane_open = False
        for record in e.records:
            item = record.item
            if item is None or not self.owns(record) or record.where is not LANE:
                continue  # completed meanwhile (its result came straight)
            n = self._renumber(record)
            self.move(record, "lane-lost")
            flags = item.flags | TaskFlags.LANE_RETRY
            fn_id = item.fn_id
            if fn_id and fn_id not in self.fn_payloads and record.blob is not None:
                # Its callable was released meanwhile: registered again, for this task only.
                fn_id = self.register_function(record.blob)
                self.fn_payloads.pop(fn_id, None)
                self.outbox.append(item._replace(n=n, fn_id=fn_id, flags=flags))
                self.outbox.append((RELEASE_FN, fn_id))
            else:
                self.outbox.append(item._replace(n=n, flags=flags))
            record.item = record.blob = None
        return [WAKE] if e.records else []

    # ------------------------------------------------------------------ posts and the end

    def _on_posted(self, e: Posted) -> list[Command]:
        self.outbox.append((e.kind, e.data))
        asked = self.asked.get(e.kind)
        if asked is not None:
            asked.append(e.data)
        return [WAKE]

    def _on_answered(self, e: Answered) -> list[Command]:
        asked = self.asked[e.kind]
        if asked:
            asked.popleft()
        return []

    def _ask_again(self) -> list[Any]:
        """(A resumed Welcome) the requests still unanswered, as messages for the restarted
        daemon; taken out of the outbox, so that each is asked once and answers stay in order."""
        kinds = self.asked
        self.outbox = deque(x for x in self.outbox if not (type(x) is tuple and x[0] in kinds))
        return [_MESSAGE[kind](self.base, data) for kind, asked in kinds.items() for data in asked]

    def _on_function_released(self, e: FunctionReleased) -> list[Command]:
        self.fn_payloads.pop(e.fn_id, None)
        if e.closing and not self.records:
            return []  # the connection goes: the daemon forgets our callables with it
        self.outbox.append((RELEASE_FN, e.fn_id))
        return [WAKE]

    def _on_daemon_lost(self, e: DaemonLost) -> list[Command]:
        if self.broken is not None:
            return []
        self.broken = e.error
        self.outbox.clear()
        out = self._unanswerable()  # (the outstanding tasks' cancellers are FailAll's)
        out.append(FailAll(e.error))
        return out

    def _unanswerable(self) -> list[Command]:
        """Cancels of tasks that completed, which no daemon will answer now (it is gone, or
        restarted: the report names only outstanding tasks): their cancellers learn now."""
        records, out = self.records, list[Command]()
        for n, record in list(self.cancelling.items()):
            if records.get(n) is not record:
                del self.cancelling[n]
                wait, record.cancel = record.cancel, None
                out.append(AnswerCancel(record, wait, False))
        return out

    def _on_broken(self, e: Broken) -> list[Command]:
        return [FailTasks(self.forget_all(), e.error)]

    def forget_all(self) -> list[TaskRecord]:
        """Every outstanding task, taken out (the executor is broken)."""
        records = list(self.records.values())
        self.records.clear()
        self.cancelling.clear()
        self.outbox.clear()
        for record in records:
            self._left(record)
        if self.pending is not None:
            self.pending.close()
        return records

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

    def _on_tick(self, e: Tick) -> list[Command]:
        """The outbox's messages for the daemon, in order, in one transmission (the rest,
        if it is full, at the next tick: ``more_to_drain``), the lane's share of callable
        releases, the FLUSHED markers passed, and a ResultsAck when one is due."""
        out: list[Command] = []
        if self.outbox:
            batch, flushed = self.drain()
            for message in batch:
                if type(message) is m.ReleaseFunctions:
                    out.append(ReleaseOnLane(message.fn_ids[0] & TASK_MASK))
            if batch:
                out.append(SendToDaemon(batch))
            if flushed:
                out.append(SetFlushed(flushed))
        else:
            self.more_to_drain = False
        resume = self.resume
        if resume.journal and not self.more_to_drain and resume.ack_due(e.now, self.ack_interval):
            out.append(SendToDaemon([resume.ack(e.now)]))
        return out

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
                spec = item.spec(base)
                specs.append(spec)
                if retained is not None:  # kept until acknowledged, a sequential caller's too
                    retained.append(spec)
                    self.unacked += 1
                elif not item.flags & TaskFlags.REPLY_DIRECT:  # else a sequential caller's is never acked
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

    def has_tasks_to_send(self) -> bool:
        outbox = self.outbox
        return any(type(item) is TaskItem or item[0] == SUBMIT_BATCH for item in outbox)

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
            if record.where is UNSENT and self.broken is None:  # (broken: the outbox was dropped)
                assert queued.get(n, 0) == 1, f"{record!r} has {queued.get(n, 0)} items in the outbox"
            elif record.where is PARKED:
                assert queued.get(n, 0) == 0, f"{record!r} parked with an item in the outbox"
            if record.where is LANE:
                assert record.item is not None, f"{record!r} on a lane without its item"
                assert (record.blob is not None) == bool(record.item.fn_id), f"{record!r}: its callable's blob"
            if record.cancel is not None:
                assert record.where is SENT, f"{record!r}: a cancel asked of the daemon while {record.where}"
                assert self.cancelling.get(n) is record, f"{record!r}: a cancel asked without its entry"
            assert record.charge >= -1, f"{record!r} charged {record.charge}"
            if record.future is not None and self.cancel_hook is not None:
                assert record.future._on_cancel is self.cancel_hook, f"{record!r}: its future's cancel bypasses the core"
        for n, record in self.cancelling.items():
            assert record.cancel is not None and record.n == n, f"{record!r}: answered yet awaited"
        for item in self.outbox:
            if type(item) is not TaskItem and item[0] == CANCEL:
                asked = self.records.get(item[1])
                if asked is not None:  # (completed meanwhile: the daemon answers "refused")
                    assert asked.cancel is not None, f"{asked!r}: asked of the daemon without a waiter"
        assert self.unacked >= 0, f"unacked {self.unacked}"
        assert not self.more_to_drain or self.outbox, "more to drain from an empty outbox"
