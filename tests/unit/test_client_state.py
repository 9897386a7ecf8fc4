"""The client core (scaler_executor/client/state.py) driven by plain calls.

No sockets, no threads: each test calls the core the way the agent does and checks what
it returns and its invariants (``validate()``) after every step.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

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
    SUBMIT_BATCH,
    TASK_MASK,
    UNSENT,
    Broken,
    ClientCore,
    FailTasks,
    IllegalTransition,
    MarkRunning,
    Resend,
    ResultIn,
    RunningIn,
    Settle,
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

    def submit(self, flags: int = 0, fn_id: int = 0) -> TaskRecord:
        future: TaskFuture[Any] = TaskFuture()
        record = self.core.new_task(future, UNSENT, self.now)
        self.core.queue(record, TaskItem(record.n, fn_id, 0, flags, b"payload", [], []))
        self.check()
        return record

    def drain(self) -> list[Any]:
        batch, _ = self.core.drain()
        self.check()
        return batch

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
    c.core.acknowledged(2)
    c.check()
    assert c.sent_ids(c.drain()) == [r.n for r in records[3:]]


def test_a_sequential_callers_task_is_not_counted_in_the_window() -> None:
    c = Client(window=1)
    c.submit(flags=TaskFlags.REPLY_DIRECT)
    c.drain()
    assert c.core.unacked == 0


def test_one_transmission_carries_at_most_so_many_tasks() -> None:
    c = Client(window=10 * MAX_TASKS_PER_TRANSMISSION)
    for _ in range(MAX_TASKS_PER_TRANSMISSION + 5):
        c.core.queue(rec := c.core.new_task(TaskFuture(), UNSENT, 0.0), TaskItem(rec.n, 0, 0, 0, b"", [], []))
    assert len(c.sent_ids(c.drain())) == MAX_TASKS_PER_TRANSMISSION
    assert len(c.sent_ids(c.drain())) == 5
    c.check()


def test_one_transmission_carries_at_most_so_many_messages() -> None:
    # The daemon refuses a batch of more than codec.MAX_BATCH_MESSAGES; an outbox of many
    # small items (each release of objects is a message) goes in several transmissions.
    c = Client()
    n = MAX_MESSAGES_PER_TRANSMISSION + 10
    for i in range(n):
        c.core.outbox.append((PIN_OBJECTS, [b"%d" % i]))
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
    assert c.core.cancel(a) == "taken"
    c.check()
    assert a.n not in c.core.records
    assert c.sent_ids(c.drain()) == [b.n], "the daemon never hears of a cancelled unsent task"
    assert c.core.unacked == 1


def test_cancel_of_a_sent_task_asks_the_daemon_and_its_answer_decides() -> None:
    c = Client()
    a, b, keep = c.submit(), c.submit(), c.submit()
    c.drain()
    for record in (a, b):
        assert c.core.cancel(record) == "ask"
        c.core.ask_cancel(record, object())
        c.check()
    batch = c.drain()
    assert batch == [m.CancelTasks([BASE | a.n, BASE | b.n], False)], "concurrent cancels travel in one message"
    answers = c.core.cancel_answered(m.TasksCancelled([BASE | a.n], [BASE | b.n, BASE | 999]))
    c.check()
    assert answers == [(a, True), (b, False)]
    assert a.n not in c.core.records, "dropped by the daemon: forgotten"
    assert b.n in c.core.records and keep.n in c.core.records, "refused: its result comes"


def test_cancel_answers_for_tasks_completed_meanwhile_are_ignored() -> None:
    c = Client()
    a = c.submit()
    c.drain()
    c.core.ask_cancel(a, object())
    assert c.core.claim(a.n) is a  # its result came first
    assert c.core.cancel_answered(m.TasksCancelled([], [BASE | a.n])) == []
    c.check()


def test_cancel_of_a_lane_task_or_a_claimed_one_is_refused() -> None:
    c = Client()
    lane = c.core.new_task(TaskFuture(), LANE, c.now)
    lane.item = TaskItem(lane.n, 0, 0, 0, b"", [], [])
    c.check()
    assert c.core.cancel(lane) == "no"
    done = c.submit()
    c.drain()
    assert c.core.claim(done.n) is done
    assert c.core.claim(done.n) is None, "a second result finds nothing to complete"
    assert c.core.cancel(done) == "no"
    c.check()


def test_a_parked_task_is_cancelled_on_the_spot_and_unparks_into_the_outbox() -> None:
    c = Client()
    parked = c.core.new_task(TaskFuture(), PARKED, c.now)
    c.check()
    assert c.drain() == []
    c.core.move(parked, "unpark")
    c.core.outbox.append(TaskItem(parked.n, 0, 0, 0, b"", [], []))
    c.check()
    assert c.sent_ids(c.drain()) == [parked.n]
    other = c.core.new_task(TaskFuture(), PARKED, c.now)
    assert c.core.cancel(other) == "taken"
    c.check()


def test_a_lane_task_sent_again_gets_a_new_number_and_goes_through_the_daemon() -> None:
    c = Client()
    record = c.core.new_task(TaskFuture(), LANE, c.now)
    record.item = TaskItem(record.n, 3, 0, 0, b"x", [], [])
    old = record.n
    new = c.core.renumber(record)
    c.core.move(record, "lane-lost")
    c.core.outbox.append(record.item._replace(n=new, flags=TaskFlags.LANE_RETRY))
    c.check()
    assert new != old and old not in c.core.records and c.core.records[new] is record
    assert c.sent_ids(c.drain()) == [new]


def test_resend_after_dep_gone_puts_the_task_back_in_the_outbox() -> None:
    c = Client()
    record = c.submit()
    c.drain()
    c.core.move(record, "resend")
    c.core.outbox.append(TaskItem(record.n, 0, 0, 0, b"inline", [], []))
    c.check()
    assert c.sent_ids(c.drain()) == [record.n]


def test_illegal_transitions_raise_with_the_task_and_its_place() -> None:
    c = Client()
    record = c.submit()
    with pytest.raises(IllegalTransition, match=f"task {record.n}: 'unpark' while unsent"):
        c.core.move(record, "unpark")


def test_a_graph_goes_in_one_submit_and_its_tasks_are_sent_from_the_start() -> None:
    c = Client()
    a = c.core.new_task(TaskFuture(), SENT, c.now)
    mid = c.core.number()
    items = [TaskItem(mid, 1, 0, 0, b"", [], []), TaskItem(a.n, 1, 0, 0, b"", [mid], [])]
    c.core.outbox.append((SUBMIT_BATCH, items))
    c.check()
    assert c.core.cancel(a) == "ask", "a graph's task is never taken out of its batch"
    (message,) = c.drain()
    assert [s.task_id for s in message.tasks] == [BASE | mid, BASE | a.n]
    assert message.tasks[1].deps == [BASE | mid]
    assert c.core.unacked == 2


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
    c.core.outbox.append((PIN_OBJECTS, [b"o"]))
    marker = object()
    c.core.outbox.append((FLUSHED, marker))
    batch, flushed = c.core.drain()
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
    assert c.core.cancel(taken) == "taken"
    assert c.core.handle(ResultIn(result_of(BASE | taken.n))) == []
    c.check()


def test_a_result_for_an_unsent_or_parked_task_settles_it_too() -> None:
    """A task that fails before it was sent (its argument failed, the executor broke)."""
    c = Client()
    unsent = c.submit()
    parked = c.core.new_task(TaskFuture(), PARKED, c.now)
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
    c.core.outbox.append((PIN_OBJECTS, [b"o"]))
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
    """Submits, drains, acks, cancels (taken, asked, answered either way) and results in
    random order, with ``validate()`` after every step: every task ends exactly once
    (a result, or a cancel that took it back or that the daemon granted)."""
    rng = random.Random(seed)
    c = Client(window=rng.choice([1, 5, 50]))
    daemon: dict[int, TaskRecord] = {}  # what the daemon holds, by wire id
    asked: list[int] = []  # cancels the daemon has not answered yet
    ended: dict[int, str] = {}
    for _ in range(3000):
        roll = rng.random()
        if roll < 0.25:
            c.submit()
        elif roll < 0.45:
            for message in c.drain():
                if type(message) is m.SubmitTasks:
                    for spec in message.tasks:
                        daemon[spec.task_id] = c.core.records[spec.task_id & TASK_MASK]
                elif type(message) is m.CancelTasks:
                    asked.extend(message.task_ids)
            c.core.acknowledged(min(c.core.unacked, rng.randint(0, 5)))
        elif roll < 0.6 and c.core.records:
            record = rng.choice(list(c.core.records.values()))
            verdict = c.core.cancel(record)
            if verdict == "taken":
                ended[record.n] = "taken"
            elif verdict == "ask" and record.cancel is None:
                c.core.ask_cancel(record, object())
        elif roll < 0.75 and asked:
            wire = asked.pop(rng.randrange(len(asked)))
            dropped = wire in daemon and rng.random() < 0.5
            if dropped:
                del daemon[wire]
            answer = m.TasksCancelled([wire] if dropped else [], [] if dropped else [wire])
            for record, granted in c.core.cancel_answered(answer):
                record.cancel = None
                if granted:
                    assert record.n not in ended
                    ended[record.n] = "cancelled"
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
    c.core.acknowledged(c.core.unacked)
    while c.core.records:  # run everything still outstanding to its end
        for message in c.drain():
            if type(message) is m.SubmitTasks:
                for spec in message.tasks:
                    daemon[spec.task_id] = c.core.records[spec.task_id & TASK_MASK]
        c.core.acknowledged(c.core.unacked)
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
