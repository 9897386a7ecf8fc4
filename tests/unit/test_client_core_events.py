"""The client core (``client/state.py``) under random sequences of every event it takes.

Plain calls, a fake clock, no sockets or threads: hypothesis draws a sequence of events
(submits, parks and their unparking, ticks, acknowledgements, cancels of one task or
many, the daemon's answers, running notices, results by one or two routes, DEP_GONE,
lanes opened, refused and lost, posts, releases, the daemon's loss) and a small model
of the daemon, the lane and the workers plays the other side.  ``validate()`` runs after
every step, and the cancel contract is checked as it happens: a future notified
cancelled belongs to a task that never started, and every task ends at most once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler_executor.client.events import (
    DISCARD,
    WAKE,
    Acknowledged,
    AnswerCancel,
    AwaitAnswer,
    Broken,
    CancelAnswered,
    CancelRequested,
    DaemonLost,
    Fail,
    FailAll,
    FailTasks,
    FunctionReleased,
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
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.state import (
    FLUSHED,
    LANE,
    PIN_OBJECTS,
    TASK_MASK,
    ClientCore,
    TaskItem,
    TaskRecord,
)
from scaler_executor.protocol import messages as m

HOOK = object()  # the shell's cancel hook, as the core sets it on every future


def result_of(task_id: int, status: int = m.Status.OK) -> m.TaskResult:
    return m.TaskResult(task_id, 0, status, b"r", m.NO_FACTS, [])


class World:
    """The core, and a model of everything around it."""

    def __init__(self, window: int) -> None:
        self.core = ClientCore(window)
        self.core.cancel_hook = HOOK
        self.now = 100.0
        self.core.handle(Welcomed(m.Welcome(5, 0.5, 3, ""), 0.5))
        self.base = 5 << m.TASK_ID_BITS
        self.queued: dict[int, TaskRecord] = {}  # the daemon holds them, not started (by wire id)
        self.started: dict[int, TaskRecord] = {}  # at a worker: they run (by wire id)
        self.on_lane: dict[int, TaskRecord] = {}  # sent down the lane: they run (by number)
        self.ran: set[int] = set()  # id() of records whose task started
        self.asked: list[int] = []  # cancels sent to the daemon, not answered
        self.asked_for: dict[int, TaskRecord] = {}  # their records, by wire id
        self.awaiting: set[int] = set()  # id() of records whose canceller waits for an answer
        self.ended: dict[int, str] = {}  # id(record) -> how it ended
        self.seen: list[TaskRecord] = []  # every record, kept alive: an id() is never reused
        self.broken = False

    def step(self, commands: list[Any]) -> None:
        for command in commands:
            self.execute(command)
        self.core.validate()

    def end(self, record: TaskRecord, how: str) -> None:
        assert id(record) not in self.ended, f"{record!r} ended twice: {self.ended[id(record)]}, then {how}"
        self.ended[id(record)] = how
        if how == "cancelled":
            assert id(record) not in self.ran, f"{record!r} notified cancelled, but its task ran"

    def execute(self, command: Any) -> None:
        match command:
            case SendToDaemon(messages):
                for message in messages:
                    if type(message) is m.SubmitTasks:
                        for spec in message.tasks:
                            self.queued[spec.task_id] = self.core.records[spec.task_id & TASK_MASK]
                    elif type(message) is m.CancelTasks:
                        self.asked.extend(message.task_ids)
                        for wire in message.task_ids:
                            record = self.core.records.get(wire & TASK_MASK)
                            if record is not None:
                                self.asked_for[wire] = record
            case NotifyCancelled(records):
                for record in records:
                    self.end(record, "cancelled")
            case AnswerCancel(record, wait, dropped):
                assert wait is not None
                self.awaiting.discard(id(record))
                if dropped:
                    self.end(record, "cancelled")
            case Settle(record, result):
                assert result.task_id & TASK_MASK == record.n
                self.end(record, "result")
            case Fail(record, _):
                self.end(record, "failed")
            case FailTasks(records, _):
                for record in records:
                    self.end(record, "failed")
            case SendDownLane(record, item):
                assert record.where is LANE and item.n == record.n
            case AwaitAnswer(records, _):
                self.awaiting.update(id(record) for record in records)
            case FailAll():
                self.awaiting.clear()  # (no answer will come: every waiter is released)
            case Resend() | MarkRunning() | ReleaseOnLane() | SetFlushed():
                pass
            case _ if command is WAKE or command is DISCARD:
                pass
            case _:
                raise AssertionError(f"unexpected command {command!r}")

    # ------------------------------------------------------------------ what happens

    def submit(self, lane_ok: bool, fn: bool) -> None:
        fn_id = 0
        if fn:
            fn_id, _ = self.core.function_id(World.submit, b"fn")
        future: TaskFuture[Any] = TaskFuture()
        commands = self.core.handle(Submitted(future, fn_id, 0, 0, b"p", [], [], None, -1, self.now))
        record = future._record
        self.seen.append(record)
        assert future._on_cancel is HOOK
        self.step(commands)
        if type(commands[0]) is SendDownLane:
            if lane_ok:
                self.on_lane[record.n] = record
                self.ran.add(id(record))
            else:
                self.step(self.core.handle(LaneRefused(record)))

    def park(self) -> None:
        future: TaskFuture[Any] = TaskFuture()
        self.step(self.core.handle(Parked(future, self.now)))
        self.seen.append(future._record)

    def unpark(self, pick: int, fail: bool) -> None:
        parked = [r for r in self.core.records.values() if r.where == "parked"]
        if parked:
            record = parked[pick % len(parked)]
            if fail:
                self.step(self.core.handle(TaskFailed(record, ValueError("cannot pickle"))))
            else:
                self.step(self.core.handle(Repickled(record, TaskItem(record.n, 0, 0, 0, b"v", [], []), None)))

    def tick(self) -> None:
        self.now += 0.01
        self.step(self.core.handle(Tick(self.now)))

    def ack(self, count: int) -> None:
        self.step(self.core.handle(Acknowledged(min(count, self.core.unacked))))

    def cancel(self, pick: int, wait: bool, many: bool) -> None:
        records = list(self.core.records.values())
        if not records:
            return
        chosen = records[pick % len(records) :][:3] if many else [records[pick % len(records)]]
        self.step(self.core.handle(CancelRequested(chosen, "wait" if wait else None, not many)))

    def answer(self, pick: int) -> None:
        if not self.asked:
            return
        wire = self.asked.pop(pick % len(self.asked))
        dropped = wire in self.queued  # the daemon drops only what no worker has started
        if dropped:
            del self.queued[wire]
        self.step(self.core.handle(CancelAnswered([wire] if dropped else [], [] if dropped else [wire])))
        record = self.asked_for.pop(wire, None)
        if record is not None and wire not in self.asked:  # (the last of its asks, if asked twice)
            # The daemon answered: its canceller knows, also if the result came first.
            assert id(record) not in self.awaiting, f"{record!r}: the daemon answered, its canceller still waits"

    def start(self, pick: int) -> None:
        if self.queued:
            wire = list(self.queued)[pick % len(self.queued)]
            record = self.queued.pop(wire)
            self.started[wire] = record
            self.ran.add(id(record))
            self.step(self.core.handle(RunningIn([wire])))

    def finish(self, pick: int, routes: int, dep_gone: bool) -> None:
        if dep_gone and self.queued:
            wire = list(self.queued)[pick % len(self.queued)]
            record = self.queued.pop(wire)
            commands = self.core.handle(ResultIn(result_of(wire, m.Status.DEP_GONE)))
            self.step(commands)
            if commands:
                assert commands == [Resend(wire & TASK_MASK)]
                item = TaskItem(record.n, 0, 0, 0, b"inline", [], [])
                self.step(self.core.handle(Repickled(record, item, None)))
            return
        if self.started:
            wire = list(self.started)[pick % len(self.started)]
            del self.started[wire]
            for _ in range(routes):  # the daemon's copy, and the reply inbox's
                self.step(self.core.handle(ResultIn(result_of(wire))))

    def lane_result(self, pick: int) -> None:
        if self.on_lane:
            n = list(self.on_lane)[pick % len(self.on_lane)]
            del self.on_lane[n]
            self.step(self.core.handle(ResultIn(result_of(self.base | n))))

    def lane_lost(self, closed: bool) -> None:
        records = list(self.on_lane.values())
        self.on_lane.clear()
        for record in records:
            # Lost mid-run, it goes to the daemon again (LANE_RETRY) and waits in the outbox,
            # where a cancel takes it back: the contract as it stands (cancel.py) lets a
            # task that started on a lane whose processor died be cancelled; not checked.
            self.ran.discard(id(record))
        self.step(self.core.handle(LaneLost(records, closed)))

    def post(self, flushed: bool) -> None:
        self.step(self.core.handle(Posted(FLUSHED, object()) if flushed else Posted(PIN_OBJECTS, [b"o"])))

    def release(self, closing: bool) -> None:
        fn_id, _ = self.core.function_id(World.release, b"fn2")
        self.step(self.core.handle(FunctionReleased(fn_id, closing)))
        self.core.fn_cache.pop(World.release, None)

    def lose_daemon(self) -> None:
        error = ConnectionError("daemon lost")
        self.step(self.core.handle(DaemonLost(error)))
        assert not self.core.outbox
        self.step(self.core.handle(Broken(error)))
        assert not self.core.records
        self.broken = True


OPS = st.lists(
    st.tuples(st.integers(0, 16), st.integers(0, 1000), st.booleans(), st.booleans()), min_size=1, max_size=150
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window=st.sampled_from([1, 3, 50]), ops=OPS)
def test_random_event_sequences_keep_the_invariants_and_the_cancel_contract(
    window: int, ops: list[tuple[int, int, bool, bool]]
) -> None:
    play(window, ops)


@pytest.mark.parametrize("seed", range(40))
def test_long_random_walks(seed: int) -> None:
    """The same, with long uniform walks (hypothesis favours short lists; a cancel asked
    and then overtaken by DEP_GONE needed a longer one to show up)."""
    rng = random.Random(seed)
    ops = [(rng.randint(0, 16), rng.randint(0, 1000), rng.random() < 0.5, rng.random() < 0.5) for _ in range(400)]
    play(rng.choice([1, 3, 50]), ops)


def test_a_cancel_overtaken_by_dep_gone_is_granted_here() -> None:
    """The daemon gave back a task asked to be cancelled (DEP_GONE: it never ran): the
    cancel is granted by the core, the new pickle dropped."""
    w = World(10)
    w.submit(lane_ok=False, fn=False)
    w.submit(lane_ok=False, fn=False)
    w.tick()
    record = next(iter(w.queued.values()))
    w.step(w.core.handle(CancelRequested([record], "wait", True)))
    w.tick()
    wire = w.base | record.n
    del w.queued[wire]
    assert w.core.handle(ResultIn(result_of(wire, m.Status.DEP_GONE))) == [Resend(record.n)]
    commands = w.core.handle(Repickled(record, TaskItem(record.n, 0, 0, 0, b"v", [], []), None))
    assert commands == [DISCARD, AnswerCancel(record, "wait", True)]
    w.step(commands)
    assert record.n not in w.core.records
    w.step(w.core.handle(CancelAnswered([], [wire])))  # the daemon's answer about the old id: ignored


def play(window: int, ops: list[tuple[int, int, bool, bool]]) -> None:
    w = World(window)
    for op, pick, a, b in ops:
        if w.broken:
            break
        match op:
            case 0 | 1:
                w.submit(lane_ok=a, fn=b)
            case 2:
                w.park()
            case 3:
                w.unpark(pick, fail=a and b)
            case 4:
                w.tick()
            case 5:
                w.ack(pick % 4)
            case 6:
                w.cancel(pick, wait=a, many=b)
            case 7:
                w.answer(pick)
            case 8:
                w.start(pick)
            case 9:
                w.finish(pick, 2 if a else 1, dep_gone=b and pick % 3 == 0)
            case 10:
                w.step(w.core.handle(LaneOpened()))
            case 11:
                w.lane_result(pick)
            case 12:
                if pick % 5 == 0:
                    w.lane_lost(closed=a)
            case 13:
                w.post(flushed=a)
            case 14:
                w.release(closing=a)
            case 15:
                if pick % 40 == 0:
                    w.lose_daemon()
            case _:
                w.tick()
                w.ack(w.core.unacked)
    # Then everything runs to its end: every task that did not end otherwise gets its result.
    for _ in range(1000):
        if w.broken or not w.core.records:
            break
        w.tick()
        w.ack(w.core.unacked)
        for _ in list(w.asked):
            w.answer(0)
        for _ in list(w.queued):
            w.start(0)
        for _ in list(w.started):
            w.finish(0, 1, False)
        for _ in list(w.on_lane):
            w.lane_result(0)
        for record in [r for r in w.core.records.values() if r.where == "parked"]:
            w.step(w.core.handle(Repickled(record, TaskItem(record.n, 0, 0, 0, b"v", [], []), None)))
    assert not w.core.records, f"tasks never ended: {list(w.core.records.values())}"
    if not w.broken:
        w.tick()  # the items of tasks taken back are dropped unsent
        assert all(type(x) is not TaskItem for x in w.core.outbox), "a task left behind in the outbox"
