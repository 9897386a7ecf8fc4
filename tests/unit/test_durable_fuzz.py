"""Hypothesis fuzzing of the journaled core (scheduler/durable.py), as test_core_fuzz.py does
for the plain core.

A ``DurableScheduler`` gets arbitrary (type-correct, as the codec guarantees) messages of
every kind, the journal's own included (Resume with right and wrong tokens and peer ids,
ClientReport / WorkerReport naming unknown and duplicate tasks and attempts, ResultsAck
with any count), from peers of every role and from unknown peers, interleaved with ticks,
wakes and disconnects; and at random points it *crashes*: a fresh core is restored from
the live map of every ``JournalWrite`` emitted so far, and the fuzz goes on with it.
After every step ``validate()`` holds, every message sent survives the codec and goes to
a connection (never to a logical id), and no handler raised (the core logs a handler's
exception and drops the message: counted here as a failure).

A live map whose records are garbled (arbitrary bytes or msgpack values under known key
kinds, truncated, fields of the wrong type) is refused by ``restore`` with
``JournalRecordInvalid`` naming the key, or restores to a state ``validate()`` accepts.

``SCALER_DURABLE_FUZZ_EXAMPLES=N`` makes a longer pass (default: a quick one).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

import hypothesis
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_testing import live_after
from core_testing import CONFIG, hello, spec, tid
from test_core_fuzz import (
    _BYTES,
    _INTS,
    PEERS,
    _at,
    _describe,
    _Failures,
    event,
    strategy_for,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.scheduler.core import PeerUnreachable, Received, Send, Tick
from scaler_executor.scheduler.durable import DurableScheduler
from scaler_executor.scheduler.durable_records import LOGICAL, JournalWrite
from scaler_executor.scheduler.journal import JournalError, JournalRecordInvalid

EXAMPLES = int(os.environ.get("SCALER_DURABLE_FUZZ_EXAMPLES", "50"))
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 2))

_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def _config() -> Any:
    return dataclasses.replace(CONFIG, restart_grace=3.0)


@pytest.fixture
def failures() -> Iterator[_Failures]:
    """Handler exceptions the core logged (test_core_fuzz's: each counts as a failure)."""
    handler = _Failures()
    logger = logging.getLogger("scaler_executor.daemon")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def live_map(entries: list[tuple[bytes, bytes | None]]) -> dict[bytes, bytes]:
    """The live map of the entries (every ``JournalWrite``'s, in one list)."""
    return live_after([entries])


class DurableWorld:
    """A DurableScheduler on a fake clock, the journal entries it emitted, and the Welcomes
    it sent (a Resume may show one of them, right or wrong)."""

    def __init__(self) -> None:
        self.tokens = itertools.count(1)
        self.core = self._fresh()
        self.now = 1000.0
        self.entries: list[tuple[bytes, bytes | None]] = []
        self.welcomes: list[tuple[int, bytes]] = []
        self.crashes = 0
        self.resumed = 0  # Resumes welcomed after a crash
        self.claimed = 0  # UNCLAIMED tasks a worker's report claimed

    def _fresh(self) -> DurableScheduler:
        return DurableScheduler(_config(), token=lambda: b"token-%d" % next(self.tokens))

    def step(self, *events: Any) -> list[Send]:
        unclaimed = {t: self.core.tasks[t].attempt for t in self.core.unclaimed}
        commands = self.core.handle(*events)
        self.core.validate()
        for task_id, attempt in unclaimed.items():
            task = self.core.tasks.get(task_id)
            if task is not None and task.attempt == attempt and task.worker is not None:
                self.claimed += 1
        sends = []
        for i, command in enumerate(commands):
            if type(command) is JournalWrite:
                assert i == 0, "the journal write must come first"
                self.entries.extend(command.entries)
                continue
            peer = getattr(command, "peer", None)
            assert peer is None or not peer.startswith(LOGICAL), f"a command to a logical id: {command!r}"
            if type(command) is Send:
                sends.append(command)
                assert decode(encode(command.messages))[0] == command.messages
                for message in command.messages:
                    if type(message) is m.Welcome and message.token:
                        self.welcomes.append((message.peer_id, message.token))
        return sends

    def crash(self) -> None:
        """The daemon dies after its last journal write; a fresh one restores from it."""
        self.crashes += 1
        live = live_map(self.entries)
        self.core = self._fresh()
        self.now += 1.0
        self.core.restore(live, self.now)
        self.core.validate()
        # What restore found to delete goes out with its first turn.
        self.step(Tick(self.now))


# ---------------------------------------------------------------------- strategies

_TASK_IDS = st.one_of(st.sampled_from([tid(c, n) for c in range(1, 7) for n in range(1, 5)]), _INTS)
_ATTEMPTS = st.builds(m.TaskAttempt, _TASK_IDS, st.one_of(st.integers(-1, 3), _INTS))


def _attempts() -> st.SearchStrategy[list[m.TaskAttempt]]:
    return st.lists(_ATTEMPTS, max_size=5).flatmap(
        lambda xs: st.just(xs + xs[:1]) if xs else st.just(xs)  # a duplicate, sometimes
    )


# What w1 was dispatched in the run's prelude, as its report would list it: a report that
# claims an UNCLAIMED task must name it with its attempt, which arbitrary ids rarely do.
_TRUE_ATTEMPTS = st.lists(st.sampled_from([m.TaskAttempt(tid(1, n), 0) for n in (1, 3, 4)]), max_size=3, unique=True)

_journal_messages = st.one_of(
    st.builds(m.WorkerReport, _attempts(), _attempts()),
    st.builds(m.WorkerReport, _TRUE_ATTEMPTS, _TRUE_ATTEMPTS),
    st.builds(m.CancelTasks, st.just([tid(1, 1)]), st.booleans()),  # (held while it is UNCLAIMED)
    st.builds(
        m.ClientReport,
        st.lists(_TASK_IDS, max_size=5),
        st.lists(st.builds(m.FunctionBlob, _TASK_IDS, _BYTES), max_size=2),
        st.lists(strategy_for(m.RegisterOptions), max_size=2),
        st.lists(st.builds(lambda t, d: spec(t, deps=d), _TASK_IDS, st.lists(_TASK_IDS, max_size=2)), max_size=4),
        st.lists(_BYTES, max_size=2),
        st.lists(_TASK_IDS, max_size=3),
        st.lists(_TASK_IDS, max_size=2),
    ),
    st.builds(m.ResultsAck, st.one_of(st.integers(-1, 8), _INTS)),
    st.builds(m.Resume, st.one_of(st.integers(0, 8), _INTS), st.one_of(st.sampled_from([b"token-1", b"token-3"]), _BYTES)),
    strategy_for(m.ResultsJournaled),
)


class ResumeAs:
    """Resume with the i-th Welcome's (peer id, token) seen so far, the token possibly
    altered; then the messages that follow (a report, say)."""

    def __init__(self, conn: bytes, index: int, spoil: bool, then: list[Any], now: float = 0.0) -> None:
        self.conn, self.index, self.spoil, self.then, self.now = conn, index, spoil, then, now


class Crash:
    now = 0.0


@st.composite
def durable_event(draw: st.DrawFn) -> Any:
    roll = draw(st.integers(0, 19))
    if roll < 9:
        return draw(event())
    peer = draw(st.sampled_from([*PEERS, b"n1", b"n2"]))  # n1, n2: new connections after a crash
    if roll < 13:
        messages = draw(st.lists(_journal_messages, min_size=1, max_size=3))
        return Received(peer, messages, 0.0)
    if roll < 17:
        then = draw(st.lists(st.one_of(_journal_messages, st.builds(m.Heartbeat, st.integers(0, 2), st.integers(0, 2))), max_size=2))
        return ResumeAs(peer, draw(st.integers(0, 30)), draw(st.integers(0, 5)) == 0, then)
    if roll < 18:
        return PeerUnreachable(peer, 0.0)
    return Crash()


def _run(events: list[Any], dts: list[float], failures: _Failures) -> DurableWorld:
    world = DurableWorld()
    world.step(Received(b"c1", [hello(m.Role.CLIENT, name="c1")], world.now))
    world.step(Received(b"c2", [hello(m.Role.CLIENT, name="c2")], world.now))
    world.step(Received(b"c1", [m.RegisterFunction(tid(1, 1_000_001), b"fn")], world.now))
    # Written queued (no worker yet), dispatched in a later turn: task 1 gets no ``d`` record,
    # so a crash reloads it UNCLAIMED until w1's report (or the recovery's end); task 4 may run
    # at most once and gets one.
    world.step(Received(b"c1", [m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0))], world.now))
    specs = [spec(tid(1, 1)), spec(tid(1, 2), deps=[tid(1, 1)]), spec(tid(1, 4), options_id=1)]
    world.step(Received(b"c1", [m.SubmitTasks(specs)], world.now))
    world.step(Received(b"w1", [hello(m.Role.WORKER, name="w1", capacity=2, pid=3)], world.now))
    # Written and dispatched in one turn: its dispatch is in its ``t`` record.
    world.step(Received(b"c1", [m.SubmitTasks([spec(tid(1, 3))])], world.now))
    for ev, dt in zip(events, dts, strict=True):
        world.now += dt
        if type(ev) is Crash:
            world.crash()
        elif type(ev) is ResumeAs:
            if world.welcomes:
                peer_id, token = world.welcomes[ev.index % len(world.welcomes)]
                if ev.spoil:
                    token = token + b"x"
                sends = world.step(Received(ev.conn, [m.Resume(peer_id, token), *ev.then], world.now))
                if world.crashes and any(type(x) is m.Welcome for c in sends for x in c.messages):
                    world.resumed += 1
        else:
            world.step(_at(ev, world.now))
        assert not failures.records, _describe(failures.records)
    # Whatever happened, a long silence frees every peer, task and journal record but the
    # next peer id (a crash first, sometimes: then it is the restored core that forgets).
    world.now += CONFIG.client_timeout * 10 + 10
    world.step(Tick(world.now))
    world.now += CONFIG.client_timeout * 10 + 10
    world.step(Tick(world.now))
    assert not failures.records, _describe(failures.records)
    assert not world.core.clients and not world.core.workers
    assert not world.core.tasks, list(world.core.tasks.values())[:3]
    left = set(live_map(world.entries))
    assert left <= {b"n"}, sorted(left)[:5]
    hypothesis.event(f"crashes: {min(world.crashes, 3)}{'+' if world.crashes >= 3 else ''}")
    hypothesis.event(f"resumed after a crash: {'yes' if world.resumed else 'no'}")
    hypothesis.event(f"unclaimed tasks claimed: {'yes' if world.claimed else 'no'}")
    return world


@_SETTINGS
@given(events=st.lists(durable_event(), min_size=1, max_size=30), data=st.data())
def test_durable_core_survives_arbitrary_messages_and_crashes(events: list[Any], data: st.DataObject, failures: _Failures) -> None:
    dts = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.5, 2.0, 5.0]), min_size=len(events), max_size=len(events)))
    failures.records.clear()
    _run(events, dts, failures)


# ---------------------------------------------------------------------- garbled journals


def _populated_live_map() -> dict[bytes, bytes]:
    """A journal with a record of every kind: clients, a worker, a callable, tasks waiting,
    dispatched (in ``t`` and in ``d``), finished with a result kept for a dependent (``r``),
    a result sent and not acknowledged (``k``), an object held (``o``)."""
    world = DurableWorld()
    world.step(Received(b"c1", [hello(m.Role.CLIENT, name="c1")], world.now))
    world.step(Received(b"c1", [m.SubmitTasks([spec(tid(1, 1)), spec(tid(1, 2), deps=[tid(1, 1)])])], world.now))
    world.step(Received(b"w1", [hello(m.Role.WORKER, name="w1", capacity=1, pid=3)], world.now))
    world.step(Received(b"c1", [m.RegisterFunction(tid(1, 1_000_001), b"fn"), m.PinObjects([b"o" * 16])], world.now))
    # Task 4 may run at most once (``max_retries=0``), and is dispatched in a later turn than
    # its ``t`` record's: only such a task gets a ``d`` record.
    world.step(Received(b"c1", [m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0))], world.now))
    world.step(Received(b"c1", [m.SubmitTasks([spec(tid(1, 3), fn_id=tid(1, 1_000_001)), spec(tid(1, 4), options_id=1)])], world.now))
    result = m.TaskResult(tid(1, 1), 0, m.Status.OK, b"v", m.TaskFacts("w1", 1.0, 2.0, 0), [])
    world.step(Received(b"w1", [m.TaskResults([result])], world.now))
    world.step(Received(b"w2", [hello(m.Role.WORKER, name="w2", capacity=1, pid=4)], world.now))
    live = live_map(world.entries)
    kinds = {key[:1] for key in live}
    assert {b"n", b"c", b"w", b"f", b"t", b"d", b"r", b"k"} <= kinds, kinds
    return live


_POPULATED = _populated_live_map()
_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=6) | st.binary(max_size=14),
    lambda inner: st.lists(inner, max_size=11) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=25,
)


@st.composite
def garbled(draw: st.DrawFn, value: bytes) -> bytes:
    how = draw(st.integers(0, 4))
    if how == 0:
        return draw(st.binary(max_size=30))
    if how == 1:
        return msgpack.packb(draw(_msgpack_values), use_bin_type=True)
    if how == 2 and value:
        return value[: draw(st.integers(0, len(value) - 1))]
    try:
        fields = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException):
        return draw(st.binary(max_size=12))
    if type(fields) is list and fields:  # one field replaced (a wrong type, or a right one)
        fields = list(fields)
        i = draw(st.integers(0, len(fields) - 1))
        fields[i] = draw(_msgpack_values)
        return msgpack.packb(fields, use_bin_type=True)
    return msgpack.packb(draw(_msgpack_values), use_bin_type=True)


@_SETTINGS
@given(data=st.data())
def test_garbled_journal_records_are_refused_naming_the_key(data: st.DataObject, failures: _Failures) -> None:
    live = dict(_POPULATED)
    keys = data.draw(st.lists(st.sampled_from(sorted(live)), min_size=1, max_size=3, unique=True))
    for key in keys:
        live[key] = data.draw(garbled(live[key]))
    core = DurableScheduler(_config(), token=lambda: b"t")
    try:
        core.restore(live, 1000.0)
    except JournalRecordInvalid as exc:
        assert exc.key in keys, (exc.key, keys)
        assert repr(exc.key[:64]) in str(exc) and "move the journal" in str(exc), str(exc)
        return
    # Accepted: the values are well formed (if not the ones written): a sound state.
    core.validate()
    world = DurableWorld()
    world.core = core
    world.entries = list(live.items())
    world.now = 1000.0
    world.step(Tick(1000.0))
    world.now += CONFIG.client_timeout * 10 + 10
    world.step(Tick(world.now))
    assert not failures.records, _describe(failures.records)
    assert not core.clients and not core.workers and not core.tasks


def test_a_garbled_record_is_a_journal_error_naming_the_key() -> None:
    live = dict(_POPULATED)
    key = next(k for k in live if k[:1] == b"w")
    live[key] = msgpack.packb(["w1", "two", {}, [], 3, "node", b"t"])  # capacity is not an int
    core = DurableScheduler(_config())
    with pytest.raises(JournalRecordInvalid) as caught:
        core.restore(live, 1000.0)
    assert isinstance(caught.value, JournalError)
    assert caught.value.key == key and repr(key) in str(caught.value) and "capacity" in str(caught.value)


# ---------------------------------------------------------------------- regressions found by the fuzzer


def _joined() -> DurableWorld:
    world = DurableWorld()
    world.step(Received(b"c1", [hello(m.Role.CLIENT, name="c1")], world.now))
    world.step(Received(b"w1", [hello(m.Role.WORKER, name="w1", capacity=1, pid=3)], world.now))
    return world


def test_a_refusal_of_a_bad_task_id_is_sent_and_not_journaled() -> None:
    """Found by the fuzz: a SubmitTasks (or a ClientReport awaiting) with a negative task id
    was refused, and the refusal kept for the client under a ``k`` key made of that id: the
    turn's end raised OverflowError (outside any handler: the daemon died).  Another
    client's id was journaled as this client's result."""
    world = _joined()
    for message in (
        m.SubmitTasks([spec(-(2**63)), spec(tid(2, 1))]),
        m.ClientReport([-(2**63), tid(2, 7)], [], [], [spec(-5)], [], [-1, tid(2, 7)], [-(2**63)]),
    ):
        sends = world.step(Received(b"c1", [message], world.now))
        answered = [r.task_id for s in sends for x in s.messages if type(x) is m.TaskResults for r in x.results]
        assert answered  # refused, to the client
    assert not [key for key in live_map(world.entries) if key[:1] in b"kt"]
    world.crash()


def test_a_resume_with_an_impossible_peer_id_is_refused() -> None:
    """Found by the fuzz: Resume(-2**63, ...) raised OverflowError making its logical id."""
    world = _joined()
    for peer_id in (-(2**63), 0, 2**64 - 1):
        sends = world.step(Received(b"n1", [m.Resume(peer_id, b"token-1")], world.now))
        assert [type(x) for s in sends for x in s.messages] == [m.Refused]


def test_an_empty_object_id_held_survives_a_restart() -> None:
    """Found by the fuzz: a pin of an empty object id was journaled under a 9-byte ``o``
    key, which restore refused as an unknown key: the daemon could not restart."""
    world = _joined()
    world.step(Received(b"c1", [m.PinObjects([b""])], world.now))
    world.crash()
    assert world.core.object_holds.get(b"") == 1


def test_a_lane_task_record_is_not_journaled() -> None:
    """Found by the fuzz: a LaneStarted made a task record the journal never wrote
    (validate: "not journaled as it is").  A lane task's record (ON_LANE) is the daemon's
    bookkeeping only: never journaled, and validate() knows it."""
    world = _joined()
    world.step(Received(b"w1", [m.LaneStarted([tid(1, 9)])], world.now))
    assert world.core.tasks[tid(1, 9)].flags & m.TaskFlags.ON_LANE
    assert not [key for key in live_map(world.entries) if key[:1] in b"td"]
    world.crash()
    assert tid(1, 9) not in world.core.tasks


def test_a_huge_hold_count_is_refused_not_allocated() -> None:
    """Found by the garbled-journal fuzz: an ``o`` count of 2**63 was restored by building
    a list of that many ids (memory exhausted)."""
    live = dict(_POPULATED)
    key = next(k for k in live if k[:1] == b"o")
    live[key] = (2**63).to_bytes(8, "big")
    with pytest.raises(JournalRecordInvalid, match="hold count"):
        DurableScheduler(_config()).restore(live, 1000.0)


def test_a_finished_record_without_its_result_is_refused() -> None:
    """Found by the garbled-journal fuzz: an ``r`` record of [nil, []] restored a finished
    task without a result (validate: "finished but kept for nothing"); its dependents would
    have been sent None."""
    live = dict(_POPULATED)
    key = next(k for k in live if k[:1] == b"r")
    live[key] = msgpack.packb([None, []])
    with pytest.raises(JournalRecordInvalid, match="finished record"):
        DurableScheduler(_config()).restore(live, 1000.0)


def test_a_kept_result_no_dependent_needs_is_forgotten_at_restore() -> None:
    """Found by the garbled-journal fuzz: a dependent's record without its dependency (its
    deps field replaced) left the ``r`` record's task finished and held by nothing
    (validate: "finished but kept for nothing").  It is forgotten, its records deleted."""
    live = dict(_POPULATED)
    key = b"t" + tid(1, 2).to_bytes(8, "big")  # the dependent of task 1, whose result is kept
    fields = msgpack.unpackb(live[key])
    fields[3] = []
    live[key] = msgpack.packb(fields)
    world = DurableWorld()
    world.entries = list(live.items())
    world.core.restore(live, world.now)
    world.core.validate()
    assert tid(1, 1) not in world.core.tasks
    world.step(Tick(world.now))
    left = live_map(world.entries)
    assert b"r" + tid(1, 1).to_bytes(8, "big") not in left and b"t" + tid(1, 1).to_bytes(8, "big") not in left
