"""The client core (scaler_executor/client/state.py) driven by plain calls.

No sockets, no threads: each test calls the core the way the agent does and checks what
it returns and its invariants (``validate()``) after every step.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

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
    DaemonResults,
    FailAll,
    FailTasks,
    GraphSubmitted,
    LaneLost,
    LaneOpened,
    MarkRunning,
    NotifyCancelled,
    Parked,
    Posted,
    Repickled,
    Resend,
    ResultIn,
    RunningIn,
    SendDownLane,
    SendToDaemon,
    SetFlushed,
    Settle,
    Submitted,
    Tick,
    Welcomed,
)
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.state import (
    CANCEL,
    FLUSHED,
    LANE,
    MAX_MESSAGES_PER_TRANSMISSION,
    MAX_TASKS_PER_TRANSMISSION,
    PARKED,
    PIN_OBJECTS,
    SENT,
    TASK_MASK,
    UNSENT,
    ClientCore,
    IllegalTransition,
    TaskItem,
    TaskRecord,
)
from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TaskFlags

BASE = 7 << m.TASK_ID_BITS


class Client:
    """A core, with helpers that do what the agent does around each call."""

    def __init__(self, window: int = 100) -> None:
        self.core = ClientCore(window)
        self.core.base = BASE
        self.now = 1000.0

    def check(self) -> None:
        self.core.validate()

    def submit(self, flags: int = 0, fn_id: int = 0, alone: bool = False) -> TaskRecord:
        """A Submitted event.  Unless ``alone``, as if another task were outstanding (a
        task submitted alone is a sequential caller's, REPLY_DIRECT: see the tests of it)."""
        future: TaskFuture[Any] = TaskFuture()
        other = None
        if not alone and not self.core.records:
            other = self.core.records[0] = TaskRecord(0, None, SENT, self.now, self.core)  # number 0: never a task's
        commands = self.core.handle(Submitted(future, fn_id, 0, flags, b"payload", [], [], None, -1, self.now))
        if other is not None:
            del self.core.records[0]
        assert commands == [WAKE]
        self.check()
        record: TaskRecord = future._record
        return record

    def cancel(self, record: TaskRecord, wait: Any = "wait", join: bool = True) -> list[Any]:
        commands = self.core.handle(CancelRequested([record], wait, join))
        self.check()
        return commands

    def answer(self, cancelled: list[int], refused: list[int]) -> list[Any]:
        commands = self.core.handle(CancelAnswered(cancelled, refused))
        self.check()
        return commands

    def ack(self, count: int) -> None:
        assert self.core.handle(Acknowledged(count)) == []
        self.check()

    def tick(self) -> list[Any]:
        commands = self.core.handle(Tick(self.now))
        self.check()
        return commands

    def drain(self) -> list[Any]:
        return [msg for c in self.tick() if type(c) is SendToDaemon for msg in c.messages]

    def sent_ids(self, batch: list[Any]) -> list[int]:
        return [spec.task_id & TASK_MASK for msg in batch if type(msg) is m.SubmitTasks for spec in msg.tasks]


def test_a_submitted_task_is_unsent_until_drained_then_sent() -> None:
    c = Client()
    record = c.submit()
    assert record.where is UNSENT and record.future._record is record
    batch = c.drain()
    assert c.sent_ids(batch) == [record.n]
    (spec,) = batch[0].tasks
    assert spec.task_id == BASE | record.n
    assert record.where is SENT and c.core.unacked == 1
    assert c.drain() == [], "nothing is sent twice"


def test_the_submit_window_holds_tasks_back_until_acknowledged() -> None:
    c = Client(window=3)
    records = [c.submit() for _ in range(5)]
    assert c.sent_ids(c.drain()) == [r.n for r in records[:3]]
    assert [r.where for r in records] == [SENT] * 3 + [UNSENT] * 2
    assert c.drain() == []
    c.ack(2)
    assert c.sent_ids(c.drain()) == [r.n for r in records[3:]]


def test_a_task_submitted_alone_is_a_sequential_callers_and_not_counted_in_the_window() -> None:
    c = Client(window=1)
    record = c.submit(alone=True)
    assert record.future._pickup is None, "no reply inbox: no pick-up hook"
    (message,) = c.drain()
    assert message.tasks[0].flags & TaskFlags.REPLY_DIRECT
    assert c.core.unacked == 0
    second = c.submit()
    (message,) = c.drain()
    assert not message.tasks[0].flags & TaskFlags.REPLY_DIRECT and c.core.unacked == 1
    assert second.where is SENT


def test_one_transmission_carries_at_most_so_many_tasks() -> None:
    c = Client(window=10 * MAX_TASKS_PER_TRANSMISSION)
    for _ in range(MAX_TASKS_PER_TRANSMISSION + 5):
        c.core.handle(Submitted(TaskFuture(), 0, 0, 0, b"", [], [], None, -1, 0.0))
    assert len(c.sent_ids(c.drain())) == MAX_TASKS_PER_TRANSMISSION
    assert len(c.sent_ids(c.drain())) == 5
    c.check()


def test_one_transmission_carries_at_most_so_many_messages() -> None:
    # The daemon refuses a batch of more than codec.MAX_BATCH_MESSAGES; an outbox of many
    # small items (each release of objects is a message) goes in several transmissions.
    c = Client()
    n = MAX_MESSAGES_PER_TRANSMISSION + 10
    for i in range(n):
        assert c.core.handle(Posted(PIN_OBJECTS, [b"%d" % i])) == [WAKE]
    record = c.submit()
    first = c.drain()
    assert len(first) == MAX_MESSAGES_PER_TRANSMISSION and c.core.more_to_drain
    second = c.drain()
    assert not c.core.more_to_drain
    assert [x.object_ids[0] for x in first + second if type(x) is m.PinObjects] == [b"%d" % i for i in range(n)]
    assert c.sent_ids(second) == [record.n]
    assert codec.MAX_BATCH_MESSAGES > MAX_MESSAGES_PER_TRANSMISSION + 3


def test_cancel_takes_back_an_unsent_task_and_the_drain_skips_it() -> None:
    c = Client()
    a, b = c.submit(), c.submit()
    assert c.cancel(a) == [NotifyCancelled([a])]
    assert a.n not in c.core.records
    assert c.sent_ids(c.drain()) == [b.n], "the daemon never hears of a cancelled unsent task"
    assert c.core.unacked == 1


def test_cancel_of_a_sent_task_asks_the_daemon_and_its_answer_decides() -> None:
    c = Client()
    a, b, keep = c.submit(), c.submit(), c.submit()
    c.drain()
    for record in (a, b):
        assert c.cancel(record, wait=f"wait-{record.n}") == [WAKE, AwaitAnswer([record], f"wait-{record.n}")]
    assert c.cancel(a, wait="late") == [AwaitAnswer([a], f"wait-{a.n}")], "a second canceller waits for the same answer"
    assert c.cancel(a, wait=None) == [], "a client thread neither asks nor waits"
    batch = c.drain()
    assert batch == [m.CancelTasks([BASE | a.n, BASE | b.n], False)], "concurrent cancels travel in one message"
    answers = c.answer([BASE | a.n], [BASE | b.n, BASE | 999])
    assert answers == [AnswerCancel(a, f"wait-{a.n}", True), AnswerCancel(b, f"wait-{b.n}", False)]
    assert a.n not in c.core.records, "dropped by the daemon: forgotten"
    assert b.n in c.core.records and keep.n in c.core.records, "refused: its result comes"
    assert b.cancel is None, "answered: a later cancel asks again"


def test_cancelling_many_asks_for_all_in_one_message_and_never_joins_another_ask() -> None:
    c = Client()
    sent = [c.submit() for _ in range(3)]
    c.drain()
    unsent = c.submit()
    assert c.cancel(sent[0], wait="single") == [WAKE, AwaitAnswer([sent[0]], "single")]
    commands = c.core.handle(CancelRequested([*sent, unsent], "group", False))
    c.check()
    assert commands == [NotifyCancelled([unsent]), WAKE, AwaitAnswer(sent[1:], "group")]
    assert c.drain() == [m.CancelTasks([BASE | r.n for r in sent], False)]


def test_a_broken_core_asks_the_daemon_nothing() -> None:
    c = Client()
    record = c.submit()
    c.drain()
    error = RuntimeError("lost")
    assert c.core.handle(DaemonLost(error)) == [FailAll(error)]
    c.check()
    assert c.core.handle(DaemonLost(RuntimeError("again"))) == [], "broken once"
    assert c.cancel(record) == [] and not c.core.outbox


def test_a_cancel_answer_for_a_task_completed_meanwhile_reaches_its_canceller_as_refused() -> None:
    """Its result came first and took the record: the canceller still learns (not dropped)
    when the answer comes, instead of waiting out cancel_wait; a second answer is ignored."""
    c = Client()
    a = c.submit()
    c.drain()
    (wait,) = [cmd.wait for cmd in c.cancel(a) if type(cmd) is AwaitAnswer]
    assert c.core.claim(a.n) is a  # its result came first
    assert c.answer([], [BASE | a.n]) == [AnswerCancel(a, wait, False)]
    assert c.answer([], [BASE | a.n]) == []
    c.check()


def test_cancel_of_a_lane_task_or_a_claimed_one_is_refused() -> None:
    c = Client()
    assert c.core.handle(LaneOpened()) == []
    future: TaskFuture[Any] = TaskFuture()
    (command,) = c.core.handle(Submitted(future, 0, 0, 0, b"x", [], [], None, -1, c.now))
    lane = future._record
    assert command == SendDownLane(lane, lane.item) and lane.where is LANE
    c.check()
    assert c.cancel(lane) == [], "running on the lane: it cannot be kept from running"
    done = c.submit()
    c.drain()
    assert c.core.claim(done.n) is done
    assert c.core.claim(done.n) is None, "a second result finds nothing to complete"
    assert c.cancel(done) == []


def test_a_parked_task_is_cancelled_on_the_spot_and_unparks_into_the_outbox() -> None:
    c = Client()
    future: TaskFuture[Any] = TaskFuture()
    assert c.core.handle(Parked(future, c.now)) == []
    parked = future._record
    c.check()
    assert parked.where is PARKED and c.drain() == []
    item = TaskItem(parked.n, 0, 0, 0, b"inline", [], [])
    assert c.core.handle(Repickled(parked, item, None)) == [WAKE]
    c.check()
    assert c.sent_ids(c.drain()) == [parked.n]
    other: TaskFuture[Any] = TaskFuture()
    c.core.handle(Parked(other, c.now))
    assert c.cancel(other._record) == [NotifyCancelled([other._record])]
    assert c.core.handle(Repickled(other._record, item, None)) == [DISCARD], "cancelled meanwhile"


def test_a_lane_task_sent_again_gets_a_new_number_and_goes_through_the_daemon() -> None:
    c = Client()
    c.core.handle(LaneOpened())
    fn_id, _ = c.core.function_id(test_a_lane_task_sent_again_gets_a_new_number_and_goes_through_the_daemon, b"f")
    c.drain()
    future: TaskFuture[Any] = TaskFuture()
    (command,) = c.core.handle(Submitted(future, fn_id, 0, 0, b"x", [], [], None, -1, c.now))
    record = future._record
    assert type(command) is SendDownLane and record.blob == b"f"
    old = record.n
    assert c.core.handle(LaneLost([record], True)) == [WAKE]
    c.check()
    new = record.n
    assert new != old and old not in c.core.records and c.core.records[new] is record
    (message,) = c.drain()
    assert [s.task_id for s in message.tasks] == [BASE | new]
    assert message.tasks[0].flags & TaskFlags.LANE_RETRY
    assert not c.core.lane_open
    (command,) = c.core.handle(Submitted(TaskFuture(), 0, 0, 0, b"y", [], [], None, -1, c.now))
    assert command == WAKE, "no lane: the daemon's path"
    c.check()


def test_resend_after_dep_gone_puts_the_task_back_in_the_outbox() -> None:
    c = Client()
    record = c.submit()
    c.drain()
    assert c.core.handle(Repickled(record, TaskItem(record.n, 0, 0, 0, b"inline", [], []), None)) == [WAKE]
    c.check()
    assert c.sent_ids(c.drain()) == [record.n]


def test_illegal_transitions_raise_with_the_task_and_its_place() -> None:
    c = Client()
    record = c.submit()
    with pytest.raises(IllegalTransition, match=f"task {record.n}: 'unpark' while unsent"):
        c.core.move(record, "unpark")


def test_a_graph_goes_in_one_submit_and_its_tasks_are_sent_from_the_start() -> None:
    c = Client()
    future: TaskFuture[Any] = TaskFuture()
    n = c.core.graph_number(future, c.now)
    a = future._record
    mid = c.core.graph_number(None, c.now)
    items = [TaskItem(mid, 1, 0, 0, b"", [], []), TaskItem(n, 1, 0, 0, b"", [mid], [])]
    assert c.core.handle(GraphSubmitted(items)) == [WAKE]
    c.check()
    (message,) = c.drain()
    assert [s.task_id for s in message.tasks] == [BASE | mid, BASE | a.n]
    assert message.tasks[1].deps == [BASE | mid]
    assert c.core.unacked == 2
    assert c.cancel(a) == [WAKE, AwaitAnswer([a], "wait")], "a graph's task is never taken out of its batch"


def test_registries_intern_callables_and_options_and_keep_the_outbox_order() -> None:
    c = Client()

    def f() -> None:
        pass

    fn_id, new = c.core.function_id(f, b"f")
    assert new and c.core.function_id(f, b"f") == (fn_id, False)
    options = m.TaskOptions({"gpu": 1.0}, ["a"], 0, None, None)
    options_id, new = c.core.options_id(options)
    assert new and c.core.options_id(m.TaskOptions({"gpu": 1.0}, ["a"], 0, None, None)) == (options_id, False)
    record = c.submit(fn_id=fn_id)
    c.core.handle(Posted(PIN_OBJECTS, [b"o"]))
    marker = object()
    c.core.handle(Posted(FLUSHED, marker))
    commands = c.tick()
    assert commands[-1] == SetFlushed([marker])
    batch = commands[0].messages
    flushed = commands[-1].events
    assert [type(x) for x in batch] == [m.RegisterFunction, m.RegisterOptions, m.SubmitTasks, m.PinObjects]
    assert batch[0] == m.RegisterFunction(BASE | fn_id, b"f")
    assert batch[2].tasks[0].fn_id == BASE | fn_id and record.where is SENT
    assert flushed == [marker]


def test_forget_all_empties_the_core() -> None:
    c = Client()
    records = [c.submit() for _ in range(3)]
    c.drain()
    c.submit()
    assert len(c.core.forget_all()) == 4 and records[0].n not in c.core.records
    assert not c.core.outbox
    c.check()


def test_validate_catches_a_broken_invariant() -> None:
    c = Client()
    record = c.submit()
    c.core.outbox.append(TaskItem(record.n, 0, 0, 0, b"", [], []))  # queued twice
    with pytest.raises(AssertionError, match="2 items in the outbox"):
        c.core.validate()


def result_of(task_id: int, status: int = m.Status.OK) -> m.TaskResult:
    return m.TaskResult(task_id, 0, status, b"r", m.NO_FACTS, [])


def test_a_result_in_settles_its_task_once_whichever_route_brings_it() -> None:
    """Events in, commands out: the first copy of a result is Settle (its record leaves
    the core), a second copy (the same result by another route) or one for a cancelled
    task is nothing."""
    c = Client()
    record = c.submit()
    c.drain()
    result = result_of(BASE | record.n)
    assert c.core.handle(ResultIn(result)) == [Settle(record, result)]
    c.check()
    assert record.n not in c.core.records
    assert c.core.handle(ResultIn(result)) == []
    c.check()
    taken = c.submit()
    assert c.cancel(taken) == [NotifyCancelled([taken])]
    assert c.core.handle(ResultIn(result_of(BASE | taken.n))) == []
    c.check()


def test_a_result_for_an_unsent_or_parked_task_settles_it_too() -> None:
    """A task that fails before it was sent (its argument failed, the executor broke)."""
    c = Client()
    unsent = c.submit()
    future: TaskFuture[Any] = TaskFuture()
    c.core.handle(Parked(future, c.now))
    parked = future._record
    for record in (unsent, parked):
        (command,) = c.core.handle(ResultIn(result_of(BASE | record.n, m.Status.ERROR)))
        assert command == Settle(record, result_of(BASE | record.n, m.Status.ERROR))
        c.check()
    assert not c.core.records
    assert c.drain() == [], "the unsent task's item is skipped"


def test_dep_gone_is_a_resend_and_the_task_stays_outstanding() -> None:
    c = Client()
    record = c.submit()
    c.drain()
    assert c.core.handle(ResultIn(result_of(BASE | record.n, m.Status.DEP_GONE))) == [Resend(record.n)]
    c.check()
    assert c.core.records[record.n] is record and record.where is SENT
    claimed = c.submit()
    c.core.claim(claimed.n)
    assert c.core.handle(ResultIn(result_of(BASE | claimed.n, m.Status.DEP_GONE))) == [], "completed meanwhile"


def test_a_running_notice_marks_only_outstanding_tasks() -> None:
    c = Client()
    a, b, done = c.submit(), c.submit(), c.submit()
    c.drain()
    c.core.handle(ResultIn(result_of(BASE | done.n)))
    assert c.core.handle(RunningIn([BASE | a.n, BASE | done.n, BASE | b.n])) == [MarkRunning([a, b])]
    assert c.core.handle(RunningIn([BASE | done.n])) == []
    c.check()
    assert c.core.records == {a.n: a, b.n: b}, "a running task stays outstanding"


def test_broken_fails_every_outstanding_task_and_empties_the_core() -> None:
    c = Client()
    records = [c.submit() for _ in range(3)]
    c.drain()
    records.append(c.submit())
    c.core.handle(Posted(PIN_OBJECTS, [b"o"]))
    error = RuntimeError("daemon lost")
    (command,) = c.core.handle(Broken(error))
    assert type(command) is FailTasks and command.error is error
    assert sorted(r.n for r in command.records) == sorted(r.n for r in records)
    assert not c.core.records and not c.core.outbox
    c.check()
    assert c.core.handle(Broken(error)) == [FailTasks([], error)]


def test_handle_refuses_what_is_not_an_event() -> None:
    with pytest.raises(TypeError, match="not a client core event"):
        Client().core.handle("result")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(5))
def test_randomized_every_task_ends_once(seed: int) -> None:
    """Submits, ticks, acks, cancels (taken, asked, answered either way) and results in
    random order, with ``validate()`` after every step: every task ends exactly once
    (a result, or a cancel that took it back or that the daemon granted)."""
    rng = random.Random(seed)
    c = Client(window=rng.choice([1, 5, 50]))
    daemon: dict[int, TaskRecord] = {}  # what the daemon holds, by wire id
    asked: list[int] = []  # cancels the daemon has not answered yet
    ended: dict[int, str] = {}

    def deliver(messages: list[Any]) -> None:
        for message in messages:
            if type(message) is m.SubmitTasks:
                for spec in message.tasks:
                    daemon[spec.task_id] = c.core.records[spec.task_id & TASK_MASK]
            elif type(message) is m.CancelTasks:
                asked.extend(message.task_ids)

    for _ in range(3000):
        roll = rng.random()
        if roll < 0.25:
            c.submit()
        elif roll < 0.45:
            deliver(c.drain())
            c.ack(min(c.core.unacked, rng.randint(0, 5)))
        elif roll < 0.6 and c.core.records:
            record = rng.choice(list(c.core.records.values()))
            for command in c.cancel(record, wait=rng.choice([None, "wait"])):
                if type(command) is NotifyCancelled:
                    ended[record.n] = "taken"
        elif roll < 0.75 and asked:
            wire = asked.pop(rng.randrange(len(asked)))
            dropped = wire in daemon and rng.random() < 0.5
            if dropped:
                del daemon[wire]
            for command in c.answer([wire] if dropped else [], [] if dropped else [wire]):
                assert type(command) is AnswerCancel
                if command.dropped:
                    assert command.record.n not in ended
                    ended[command.record.n] = "cancelled"
        elif daemon:
            wire = rng.choice(list(daemon))
            del daemon[wire]
            for _ in range(rng.choice([1, 1, 2])):  # sometimes by two routes (inbox and daemon)
                commands = c.core.handle(ResultIn(result_of(wire)))
                if commands:
                    (settle,) = commands
                    assert type(settle) is Settle and settle.result.task_id == wire
                    assert settle.record.n not in ended, "a task ended twice"
                    ended[settle.record.n] = "result"
        c.check()
    c.ack(c.core.unacked)
    while c.core.records:  # run everything still outstanding to its end
        deliver(c.drain())
        asked.clear()
        c.ack(c.core.unacked)
        for wire in list(daemon):
            record = c.core.claim(wire & TASK_MASK)
            del daemon[wire]
            if record is not None:
                assert record.n not in ended
                ended[record.n] = "result"
        c.check()
    assert c.core.records == {} and not daemon
    assert ended and set(ended.values()) <= {"taken", "cancelled", "result"}
    _ = CANCEL  # the outbox kind a cancel asked of the daemon travels as


def test_a_journaled_daemons_client_keeps_submissions_till_acked_and_acks_results_on_ticks() -> None:
    """Welcomed(journal) → tasks kept until SubmitAck; DaemonResults counted and
    acknowledged (ResultsAck) by a Tick once the interval passed."""
    c = Client()
    welcome = m.Welcome(7, 0.5, 3, "", True, 10.0, b"token")
    assert c.core.handle(Welcomed(welcome, 0.5)) == []
    records = [c.submit() for _ in range(3)]
    c.drain()
    assert [s.task_id & TASK_MASK for s in c.core.sent_unacked or ()] == [r.n for r in records]
    c.ack(2)
    assert [s.task_id & TASK_MASK for s in c.core.sent_unacked or ()] == [records[2].n]
    held = m.TaskResult(BASE | records[0].n, 0, m.Status.OK, b"", m.NO_FACTS, [b"obj"])
    assert c.core.handle(DaemonResults([held])) == []
    c.check()
    assert c.core.holds == {b"obj": 1} and c.core.resume.received == 1
    assert c.tick() == [SendToDaemon([m.ResultsAck(1)])]
    assert c.tick() == [], "acknowledged once"
    c.core.handle(DaemonResults([held]))
    c.now += 0.1
    assert c.tick() == [], "not due yet: one result, less than the interval since the last"
    c.now += 1.0
    assert c.tick() == [SendToDaemon([m.ResultsAck(2)])]
