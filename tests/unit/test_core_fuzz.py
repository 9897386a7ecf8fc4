"""Hypothesis fuzzing of the daemon's codec and pure core.

The codec: random bytes, truncated and mutated valid transmissions through ``decode`` must
either decode to messages that round-trip or raise :class:`DecodeError` — nothing else.

The core: arbitrary (type-correct, as the codec guarantees) messages of every kind, from
peers of every role and from unknown peers, in any order, duplicated, interleaved with
ticks, wakes, disconnects and worker exits.  After every step ``validate()`` holds, every
emitted message survives the codec (``Cluster.step`` in test_core.py), and no handler
raised: the core catches a handler's exception to keep the daemon alive and logs it with
its traceback, which this test counts as a failure.
"""

from __future__ import annotations

import logging
import os
import types
import typing
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from core_testing import CommandsCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from core_testing import CONFIG, hello, result, spec, tid

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import VERSION_FRAME, DecodeError, decode, encode
from scaler_executor.protocol.messages import MESSAGE_TAGS, Status
from scaler_executor.scheduler.core import (
    LocalWorkers,
    PeerUnreachable,
    Received,
    Tick,
    Wake,
    WorkerExited,
)

# ---------------------------------------------------------------------- strategies

# Ids the core is likely to know (tasks and functions of clients 1..4, peers' pids), mixed
# with edges of msgpack's integer range.
_KNOWN_IDS = [tid(c, n) for c in range(1, 5) for n in range(6)] + [tid(c, 1_000_001) for c in range(1, 5)]
_INTS = st.one_of(
    st.integers(-2, 6),
    st.sampled_from(_KNOWN_IDS),
    st.sampled_from([-(2**63), 2**63 - 1, 2**64 - 1, 2**40, 2**40 - 1]),
    st.integers(-(2**63), 2**64 - 1),
)
_FLOATS = st.one_of(
    st.sampled_from([0.0, -1.0, 1e-9, 1e300, float("inf"), float("-inf"), float("nan")]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 5),  # the codec accepts an int where a float is declared
)
_STRS = st.one_of(st.sampled_from(["", "gpu", "w1", "node-1", "x" * 300]), st.text(max_size=20))
_BYTES = st.one_of(
    st.sampled_from([b"", b"\x00" * 16, b"\xff" * 32]), st.binary(max_size=40)
)
_PRIMITIVES: dict[Any, st.SearchStrategy[Any]] = {
    int: _INTS,
    float: _FLOATS,
    str: _STRS,
    bytes: _BYTES,
    bool: st.booleans(),
}
_CACHE: dict[Any, st.SearchStrategy[Any]] = {}


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Any value the codec would accept for the declared field type ``tp``."""
    if tp in _CACHE:
        return _CACHE[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    result: st.SearchStrategy[Any]
    if tp in _PRIMITIVES:
        result = _PRIMITIVES[tp]
    elif getattr(tp, "__supertype__", None) is not None:  # NewType
        result = strategy_for(tp.__supertype__)
    elif origin in (typing.Union, types.UnionType):
        result = st.one_of(*[st.none() if a is type(None) else strategy_for(a) for a in args])
    elif origin is list:
        result = st.lists(st.deferred(lambda: strategy_for(args[0])), max_size=4)
    elif origin is dict:
        result = st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    elif isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):
        hints = typing.get_type_hints(tp)
        result = st.builds(tp, *[st.deferred(lambda t=hints[f]: strategy_for(t)) for f in tp._fields])
    else:
        raise TypeError(f"no strategy for {tp!r}")
    _CACHE[tp] = result
    return result


_ALL_MESSAGES = sorted(MESSAGE_TAGS, key=MESSAGE_TAGS.__getitem__)
any_message = st.one_of(*[strategy_for(cls) for cls in _ALL_MESSAGES])

# Peers: two clients, two workers, a monitor, and one that never says Hello properly.
PEERS = [b"c1", b"c2", b"w1", b"w2", b"m1", b"x"]
_ROLE_OF = {b"c1": m.Role.CLIENT, b"c2": m.Role.CLIENT, b"w1": m.Role.WORKER, b"w2": m.Role.WORKER, b"m1": m.Role.MONITOR}


@st.composite
def valid_hello(draw: st.DrawFn, peer: bytes) -> m.Hello:
    role = _ROLE_OF.get(peer) or draw(st.sampled_from(["admin", m.Role.CLIENT, m.Role.WORKER]))
    return hello(role, name=peer.decode(), pid=PEERS.index(peer) + 1, capacity=draw(st.integers(0, 3)))


def _plausible(peer: bytes) -> st.SearchStrategy[Any]:
    """Messages a peer of this role would send, with fuzzed fields (reaching deeper into
    the handlers than messages refused for the sender's role)."""
    role = _ROLE_OF.get(peer)
    kinds = sorted(m.ACCEPTED_FROM.get(role or "", frozenset()), key=MESSAGE_TAGS.__getitem__)
    return st.one_of(*[strategy_for(cls) for cls in kinds]) if kinds else any_message


@st.composite
def received(draw: st.DrawFn) -> Received:
    peer = draw(st.sampled_from(PEERS))
    messages = []
    for _ in range(draw(st.integers(0, 4))):
        roll = draw(st.integers(0, 9))
        if roll == 0:
            messages.append(draw(valid_hello(peer)))
        elif roll <= 6:
            messages.append(draw(_plausible(peer)))
        else:
            messages.append(draw(any_message))
    if messages and draw(st.booleans()):
        messages.append(messages[draw(st.integers(0, len(messages) - 1))])  # a duplicate
    return Received(peer, messages, 0.0)


@st.composite
def event(draw: st.DrawFn) -> Any:
    roll = draw(st.integers(0, 19))
    if roll < 14:
        return draw(received())
    if roll < 16:
        return Tick(0.0)
    if roll < 17:
        return Wake(0.0)
    if roll < 18:
        return PeerUnreachable(draw(st.sampled_from(PEERS)), 0.0)
    if roll < 19:
        return WorkerExited(draw(st.integers(0, 7)), "node-1", "killed by signal SIGKILL", 0.0)
    return LocalWorkers(frozenset(draw(st.lists(st.integers(0, 7), max_size=3))), "node-1", 0.0)


def _at(ev: Any, now: float) -> Any:
    return type(ev)(**{**{f: getattr(ev, f) for f in ev.__slots__}, "now": now})


# ---------------------------------------------------------------------- handler failures


class _Failures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@pytest.fixture
def failures() -> Iterator[_Failures]:
    handler = _Failures()
    logger = logging.getLogger("scaler_executor.daemon")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _describe(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter()
    return "\n".join(formatter.format(r) for r in records[:3])


# ---------------------------------------------------------------------- the core


def _run_core(events: list[Any], dts: list[float], failures: _Failures) -> None:
    cluster = CommandsCluster(CONFIG)
    # A populated start: both clients and one worker joined, a function registered.
    cluster.client(b"c1")
    cluster.client(b"c2")
    cluster.worker(b"w1", capacity=2, pid=3)
    cluster.send(b"c1", m.RegisterFunction(tid(cluster.ids[b"c1"], 1_000_001), b"fn"))
    for ev, dt in zip(events, dts, strict=True):
        cluster.now += dt
        cluster.step(_at(ev, cluster.now))
        assert not failures.records, _describe(failures.records)
    # Whatever happened, a long silence frees every peer and every task's record.
    cluster.now += CONFIG.client_timeout * 10 + 10
    cluster.step(Tick(cluster.now))
    assert not failures.records, _describe(failures.records)
    stats = cluster.scheduler.statistics()
    assert stats.get("clients", 0) == stats.get("workers", 0) == 0, stats
    assert not cluster.scheduler.tasks, list(cluster.scheduler.tasks.values())[:3]


# Examples per run: a quick pass by default; SCALER_FUZZ_EXAMPLES=N for a longer one.
EXAMPLES = int(os.environ.get("SCALER_FUZZ_EXAMPLES", "100"))
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 2))  # a longer pass may take longer

_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@_SETTINGS
@given(
    events=st.lists(event(), min_size=1, max_size=25),
    data=st.data(),
)
def test_core_survives_arbitrary_messages(events: list[Any], data: st.DataObject, failures: _Failures) -> None:
    dts = data.draw(
        st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.5, 2.0, 5.0]), min_size=len(events), max_size=len(events))
    )
    failures.records.clear()
    _run_core(events, dts, failures)


@st.composite
def protocol_flow(draw: st.DrawFn) -> list[Any]:
    """A mostly well-formed conversation: submits of known task ids, results for them with
    fuzzed attempts and statuses, cancels, re-joins, duplicates and reorderings."""
    c1 = 1  # the Cluster fixture's c1 gets peer id 1
    tasks = [tid(c1, n) for n in range(1, 6)]
    fn = tid(c1, 1_000_001)
    flow: list[Any] = []
    for _ in range(draw(st.integers(1, 30))):
        roll = draw(st.integers(0, 11))
        t = draw(st.sampled_from(tasks))
        if roll < 3:
            deps = draw(st.lists(st.sampled_from([*tasks, tid(2, 1), 0, -1]), max_size=3))
            flags = draw(st.sampled_from([m.TaskFlags.INLINE_FN, m.TaskFlags.CALL, 0, 0xFFFF]))
            f = fn if flags == m.TaskFlags.CALL else draw(st.sampled_from([0, fn]))
            flow.append(Received(b"c1", [m.SubmitTasks([m.TaskSpec(t, f, 0, flags, b"a", deps, [], 0)])], 0.0))
        elif roll < 6:
            status = draw(st.sampled_from([Status.OK, Status.ERROR, Status.PROCESSOR_DIED, Status.TIMEOUT, Status.CANCELLED, 99]))
            attempt = draw(st.integers(-1, 3))
            worker = draw(st.sampled_from([b"w1", b"w2"]))
            res = m.TaskResult(t, attempt, status, b"v", m.TaskFacts("w", 1.0, 2.0, 0), [])
            flow.append(Received(worker, [m.TaskResults([res, res] if draw(st.booleans()) else [res])], 0.0))
        elif roll < 7:
            flow.append(Received(b"c1", [m.CancelTasks(draw(st.lists(st.sampled_from(tasks), max_size=3)), draw(st.booleans()))], 0.0))
        elif roll < 8:
            peer = draw(st.sampled_from([b"w1", b"w2", b"c1", b"c2"]))
            flow.append(Received(peer, [draw(valid_hello(peer))], 0.0))
        elif roll < 9:
            flow.append(Received(b"w1", [m.Seceded(draw(st.lists(st.sampled_from(tasks), max_size=2)))], 0.0))
        elif roll < 10:
            flow.append(draw(st.sampled_from([PeerUnreachable(b"w1", 0.0), Received(b"w2", [m.Goodbye("")], 0.0), WorkerExited(3, "node-1", "exit", 0.0)])))
        elif roll < 11:
            flow.append(Received(b"c1", [m.ReleaseFunctions([fn])], 0.0))
        else:
            flow.append(Tick(0.0))
    if draw(st.booleans()) and flow:  # reorder
        flow = draw(st.permutations(flow))
    return flow


@_SETTINGS
@given(flow=protocol_flow(), data=st.data())
def test_core_survives_reordered_and_duplicated_flows(flow: list[Any], data: st.DataObject, failures: _Failures) -> None:
    dts = data.draw(st.lists(st.sampled_from([0.0, 0.01, 0.5, 4.0]), min_size=len(flow), max_size=len(flow)))
    failures.records.clear()
    _run_core(flow, dts, failures)


# ---------------------------------------------------------------------- the codec


def _decode_or_error(frames: list[bytes]) -> None:
    try:
        messages, _buffers = decode(frames)
    except DecodeError:
        return
    # What decodes is well-typed: it encodes again and decodes to the same messages.
    again, _ = decode(encode(messages))
    assert again == messages or _has_nan(messages)


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return value != value
    if isinstance(value, (list, tuple)):
        return any(_has_nan(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return False


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_decode_random_frames(frames: list[bytes]) -> None:
    _decode_or_error(frames)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.binary(max_size=200))
def test_decode_random_body(body: bytes) -> None:
    _decode_or_error([VERSION_FRAME, body])


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([*list(MESSAGE_TAGS.values()), 0, 99, -1]), _msgpack_values), max_size=3))
def test_decode_well_framed_garbage(batch: list[tuple[int, Any]]) -> None:
    """Valid msgpack, valid tags, fields of any shape."""
    _decode_or_error([VERSION_FRAME, msgpack.packb([list(x) for x in batch], use_bin_type=True)])


@settings(max_examples=EXAMPLES * 5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(any_message, min_size=1, max_size=3), st.data())
def test_decode_mutated_transmissions(batch: list[Any], data: st.DataObject) -> None:
    frames = encode(batch)
    assert decode(frames)[0] == batch or _has_nan(batch)
    body = bytearray(frames[1])
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "delete", "version"]))
    if how == "truncate":
        body = body[: data.draw(st.integers(0, len(body) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] = data.draw(st.integers(0, 255))
    elif how == "insert":
        i = data.draw(st.integers(0, len(body)))
        body[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    elif how == "delete":
        i = data.draw(st.integers(0, len(body) - 1))
        del body[i : i + data.draw(st.integers(1, 8))]
    else:
        _decode_or_error([data.draw(st.binary(max_size=8)), bytes(body)])
        return
    _decode_or_error([VERSION_FRAME, bytes(body), *data.draw(st.lists(st.binary(max_size=4), max_size=2))])


# ---------------------------------------------------------------------- regressions found by the fuzzer


def test_rejoined_client_does_not_inherit_its_old_sessions_task() -> None:
    """Found by test_core_survives_reordered_and_duplicated_flows: a client that sends Hello
    again on the same connection while one of its tasks is at a worker was recorded as that
    task's owner (validate: "missing from its client"), and would have got its result."""
    cluster = CommandsCluster(CONFIG)
    cid = cluster.client(b"c1")
    cluster.worker(b"w1")
    task = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(task)]))
    assert cluster.scheduler.tasks[task].worker == b"w1"
    out = cluster.send(b"c1", hello(m.Role.CLIENT, name="c1"))  # joins again: a new session
    assert out.of(b"c1", m.Welcome)
    assert cluster.scheduler.tasks[task].client != b"c1"
    # The new session may not cancel the old session's task, and does not get its result.
    cluster.send(b"c1", m.CancelTasks([task], False))
    out = cluster.send(b"w1", m.TaskResults([result(task)]))
    assert not out.results(b"c1")
    assert task not in cluster.scheduler.tasks


def test_client_may_not_submit_an_on_lane_task() -> None:
    """Found by test_core_survives_reordered_and_duplicated_flows: a submitted task flagged
    ON_LANE (the daemon's own record of a lane task) was never dispatched nor answered; a
    dependent of it then outlived it and validate() failed with a KeyError."""
    cluster = CommandsCluster(CONFIG)
    cid = cluster.client(b"c1")
    cluster.worker(b"w1")
    lane, plain = tid(cid, 1), tid(cid, 2)
    bad = spec(lane)._replace(flags=m.TaskFlags.ON_LANE | m.TaskFlags.INLINE_FN)
    out = cluster.send(b"c1", m.SubmitTasks([bad, spec(plain, deps=[lane])]))
    statuses = {r.task_id: r.status for r in out.results(b"c1")}
    assert statuses[lane] == Status.REJECTED
    assert lane not in cluster.scheduler.tasks
    cluster.step(PeerUnreachable(b"w1", cluster.now))
    assert not cluster.scheduler.tasks or all(t.task_id != lane for t in cluster.scheduler.tasks.values())
