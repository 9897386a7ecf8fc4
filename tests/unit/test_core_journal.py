"""The journaled core (scheduler/durable.py): crash at every journal record boundary.

Scenarios run through a ``DurableScheduler`` with model peers (a client that keeps what it
must send again and counts what it got, a worker that keeps results until they are
acknowledged).  Every turn's ``JournalWrite`` is collected; for *every* record boundary k, a
fresh core is restored from the live map of the first k records (the daemon was SIGKILLed
after writing record k, before sending that turn's messages: the peers are as they were
before it), ``validate()`` holds, the peers resume, and the run is driven to its end: every
future completes exactly once with the right value, and no task runs twice on a worker that
stayed.  No file: the live map is built here from the entries (first-insertion order).
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import cloudpickle
import msgpack
from journal_testing import (
    live_after as live_map,  # (the name test_core_reconcile and test_core_unclaimed import)
)

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.protocol.rejoin import is_unknown_peer
from scaler_executor.scheduler.core import DeleteObjects, Received, Send, Tick
from scaler_executor.scheduler.durable import DurableScheduler
from scaler_executor.scheduler.durable_records import JournalWrite
from scaler_executor.scheduler.state import TaskState

CONFIG = ClusterConfig(
    heartbeat_interval=1.0, heartbeat_liveness=3, client_timeout=3.0, max_retries=2, max_prefetch=4, restart_grace=10.0
)
T0 = 1000.0
#: Options with max_retries=0: a task that runs at most once.
ONCE = m.TaskOptions({}, [], 0, None, 0)


def hello(role: str, name: str, capacity: int = 0) -> m.Hello:
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 1, "node", capacity, {}, [])


def value_of(payload: bytes) -> bytes:
    return b"result-of-" + payload


class ClientModel:
    def __init__(self, conn: bytes) -> None:
        self.conn = conn
        self.peer_id = 0
        self.token = b""
        self.awaiting: set[int] = set()
        self.expected: dict[int, Any] = {}  # task id -> expected payload, or ("fail", text)
        self.unacked: deque[m.TaskSpec] = deque()
        self.functions: dict[int, bytes] = {}
        self.options: dict[int, m.TaskOptions] = {}
        self.got: dict[int, list[m.TaskResult]] = {}
        self.received = 0  # TaskResults messages since the last Welcome
        self.resuming = False
        self.pins: list[bytes] = []  # store objects it holds
        self.cancel_asked: set[int] = set()  # cancels asked, not answered yet
        self.forced: set[int] = set()  # cancels with force asked (never answered as such)
        self.cancelled: dict[int, int] = {}  # task id -> how many times the daemon said it dropped it

    def on(self, message: Any) -> list[Any]:
        kind = type(message)
        if kind is m.Welcome:
            self.received = 0
            if self.resuming:
                self.resuming = False
                return [m.ClientReport(
                    sorted(self.awaiting), [m.FunctionBlob(f, p) for f, p in self.functions.items()],
                    [m.RegisterOptions(i, o) for i, o in self.options.items()], list(self.unacked), list(self.pins),
                    sorted(self.cancel_asked & self.awaiting), sorted(self.forced & self.awaiting),
                )]
            self.peer_id, self.token = message.peer_id, message.token
        elif kind is m.TasksCancelled:
            for task_id in message.cancelled:
                if task_id in self.cancel_asked:
                    self.cancelled[task_id] = self.cancelled.get(task_id, 0) + 1
                    self.awaiting.discard(task_id)
            self.cancel_asked -= set(message.cancelled) | set(message.refused)
        elif kind is m.SubmitAck:
            for _ in range(message.count):
                self.unacked.popleft()
        elif kind is m.TaskResults:
            self.received += 1
            for result in message.results:
                self.got.setdefault(result.task_id, []).append(result)
                self.awaiting.discard(result.task_id)
        elif kind is m.Refused:
            assert is_unknown_peer(message.reason)
            if not self.resuming:
                self.resuming = True
                return [m.Resume(self.peer_id, self.token)]
        return []

    def tid(self, n: int) -> int:
        return (self.peer_id << TASK_ID_BITS) | n

    def submit(self, specs: list[m.TaskSpec], expected: dict[int, Any] | None = None) -> m.SubmitTasks:
        for spec in specs:
            self.unacked.append(spec)
            if not spec.flags & TaskFlags.NO_RESULT:
                self.awaiting.add(spec.task_id)
                self.expected[spec.task_id] = (expected or {}).get(spec.task_id, value_of(spec.payload))
        return m.SubmitTasks(specs)


class WorkerModel:
    def __init__(self, conn: bytes) -> None:
        self.conn = conn
        self.peer_id = 0
        self.token = b""
        self.held: dict[int, m.TaskDispatch] = {}
        self.unacked: deque[m.TaskResults] = deque()
        self.acked = 0  # of the messages sent since the last Welcome
        self.runs: dict[int, int] = {}
        self.resuming = False
        self.cancels = 0  # tasks it held that the daemon cancelled
        self.direct: ClientModel | None = None  # REPLY_DIRECT results go straight to it (a processor's reply)

    def on(self, message: Any) -> list[Any]:
        kind = type(message)
        if kind is m.Welcome:
            self.acked = 0
            if self.resuming:
                self.resuming = False
                finished = [m.TaskAttempt(r.task_id, r.attempt) for batch in self.unacked for r in batch.results]
                holding = [m.TaskAttempt(t.task_id, t.attempt) for t in self.held.values()]
                return [m.WorkerReport(holding, finished), *self.unacked]
            self.peer_id, self.token = message.peer_id, message.token
        elif kind is m.DispatchTasks:
            for task in message.tasks:
                self.held[task.task_id] = task
        elif kind is m.CancelTasks:
            dropped = []
            for task_id in message.task_ids:
                task = self.held.pop(task_id, None)
                if task is not None:  # not started (the model runs a task at once): dropped, and said so
                    self.cancels += 1
                    dropped.append(m.TaskResult(task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, []))
            if dropped:
                batch = m.TaskResults(dropped)
                self.unacked.append(batch)
                return [batch]
        elif kind is m.ResultsJournaled:
            while message.journaled > self.acked:
                self.unacked.popleft()
                self.acked += 1
        elif kind is m.Refused:
            assert is_unknown_peer(message.reason)
            if not self.resuming:
                self.resuming = True
                return [m.Resume(self.peer_id, self.token)]
        return []

    def run(self, limit: int | None = None) -> list[Any]:
        results = []
        for task in list(self.held.values())[:limit]:
            del self.held[task.task_id]
            self.runs[task.task_id] = self.runs.get(task.task_id, 0) + 1
            payload = value_of(task.payload if not task.deps else task.payload + b"+" + b"+".join(d.payload for d in task.deps))
            result = m.TaskResult(task.task_id, task.attempt, Status.OK, payload, m.TaskFacts("w", 1.0, 2.0, 0), [])
            if self.direct is not None and task.flags & TaskFlags.REPLY_DIRECT:
                self.direct.got.setdefault(task.task_id, []).append(result)  # its processor's reply
                self.direct.awaiting.discard(task.task_id)
                result = result._replace(delivered=True)  # then, to the daemon, marked so
            results.append(result)
        if not results:
            return []
        batch = m.TaskResults(results)
        self.unacked.append(batch)
        return [batch]


class World:
    """A durable core, its model peers, and the journal records written so far."""

    def __init__(self, core: DurableScheduler | None = None, records: list[Any] | None = None, now: float = T0) -> None:
        tokens = itertools.count(1)
        self.core = core or DurableScheduler(CONFIG, token=lambda: b"token-%d" % next(tokens))
        self.records: list[list[tuple[bytes, bytes | None]]] = records if records is not None else []
        self.now = now
        self.peers: dict[bytes, Any] = {}
        self.crash_points: list[tuple[int, dict[bytes, Any], float]] = []  # (records written, peers before the sends)
        self.deleted: list[bytes] = []  # store objects the core deleted (DeleteObjects)

    def step(self, *events: Any) -> None:
        commands = self.core.handle(*events)
        self.core.validate()
        if commands and type(commands[0]) is JournalWrite:
            self.records.append(list(commands[0].entries))
            self.crash_points.append((len(self.records), copy.deepcopy(self.peers), self.now))
            commands = commands[1:]
        replies: list[tuple[bytes, list[Any]]] = []
        for command in commands:
            if type(command) is DeleteObjects:
                self.deleted.extend(command.object_ids)
                continue
            assert type(command) is Send, command
            assert decode(encode(command.messages))[0] == command.messages
            peer = self.peers.get(command.peer)
            if peer is None:
                continue
            out = [reply for message in command.messages for reply in peer.on(message)]
            if out:
                replies.append((command.peer, out))
        for conn, out in replies:
            self.send(conn, out)

    def send(self, conn: bytes, messages: list[Any]) -> None:
        self.now += 0.001
        self.step(Received(conn, messages, self.now))

    def tick(self, seconds: float = 0.3) -> None:
        self.now += seconds
        self.step(Tick(self.now))

    def join_client(self, conn: bytes = b"\x00C1") -> ClientModel:
        client = self.peers[conn] = ClientModel(conn)
        self.send(conn, [hello(m.Role.CLIENT, "client")])
        assert client.peer_id
        return client

    def join_worker(self, conn: bytes, capacity: int = 2) -> WorkerModel:
        worker = self.peers[conn] = WorkerModel(conn)
        self.send(conn, [hello(m.Role.WORKER, conn.decode(errors="replace"), capacity)])
        assert worker.peer_id
        return worker

    def register(self, client: ClientModel, options_id: int, options: m.TaskOptions) -> None:
        """``client`` registers ``options`` (and keeps them, to send again on a resume)."""
        client.options[options_id] = options
        self.send(client.conn, [m.RegisterOptions(options_id, options)])

    def run_worker(self, worker: WorkerModel, limit: int | None = None) -> None:
        out = worker.run(limit)
        if out:
            self.send(worker.conn, out)

    def ack(self, client: ClientModel) -> None:
        self.send(client.conn, [m.ResultsAck(client.received)])


def restart(
    world: World,
    point: tuple[int, dict[bytes, Any], float],
    new_conns: bool = True,
    without_workers: bool = False,
    meanwhile: Callable[[World], None] | None = None,
    order: Callable[[Any], int] | None = None,
) -> World:
    """The daemon dies after record ``k``; a fresh one restores; the peers (as they were)
    reach it on new connections and resume when it refuses them.  ``meanwhile``: what the
    peers do while it is down (their messages go nowhere); ``order``: the peers resume in
    that order (sorted by it)."""
    count, peers, now = point
    tokens = itertools.count(1000)
    core = DurableScheduler(CONFIG, token=lambda: b"token-%d" % next(tokens))
    core.restore(live_map(world.records[:count]), now + 1.0)
    core.validate()
    after = World(core, list(world.records[:count]), now + 1.0)
    for old_conn, peer in copy.deepcopy(peers).items():
        if without_workers and isinstance(peer, WorkerModel):
            continue
        conn = b"\x00N" + old_conn if new_conns else old_conn
        peer.conn = conn
        after.peers[conn] = peer
    if meanwhile is not None:
        meanwhile(after)
    for conn in sorted(after.peers, key=lambda c: order(after.peers[c]) if order else 0):
        if after.peers[conn].peer_id:
            after.send(conn, [m.Heartbeat(0, 0)])  # answered UNKNOWN_PEER: the peer resumes
    return after


def finish(world: World, client: ClientModel, rounds: int = 50) -> None:
    """Drive workers and acks until the client awaits nothing (bounded)."""
    for _ in range(rounds):
        if not client.awaiting:
            break
        for peer in list(world.peers.values()):
            if isinstance(peer, WorkerModel):
                world.run_worker(peer)
        world.ack(client)
        world.tick()
    assert not client.awaiting, f"still awaited: {sorted(client.awaiting)}"
    world.ack(client)


def check_exactly_once(client: ClientModel) -> None:
    for task_id, expected in client.expected.items():
        got = client.got.get(task_id, [])
        assert len(got) == 1, f"task {task_id:#x} completed {len(got)} times: {got}"
        if isinstance(expected, tuple):
            assert got[0].status == Status.WORKER_LOST, got[0]
            text = msgpack.unpackb(got[0].payload)[0]
            assert expected[1] in text, text
        else:
            assert got[0].status == Status.OK and got[0].payload == expected, (got[0], expected)


def find(world: World, kind: type) -> Any:
    return next(p for p in world.peers.values() if isinstance(p, kind))


def check_every_crash_point(world: World, *, runs_at_most_once: bool = True) -> int:
    checked = 0
    for point in world.crash_points:
        after = restart(world, point)
        client = find(after, ClientModel)
        finish(after, client)
        check_exactly_once(client)
        if runs_at_most_once:
            for peer in after.peers.values():
                if isinstance(peer, WorkerModel):
                    twice = {t: n for t, n in peer.runs.items() if n > 1}
                    assert not twice, f"tasks ran twice on a worker that stayed: {twice}"
        after.core.validate()
        # Nothing is left journaled for a run that is over (but the peers themselves).
        left = {key[:1] for key in live_map(after.records)}
        assert left <= {b"n", b"c", b"w", b"f", b"o"}, left  # (o: a pin the client still holds)
        checked += 1
    return checked


# --------------------------------------------------------------------------- scenarios


def test_tasks_at_every_stage_survive_a_crash_at_every_record_boundary() -> None:
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=2)
    fn = client.tid(1)
    client.functions[fn] = b"fn-blob"
    world.send(client.conn, [m.RegisterFunction(fn, b"fn-blob")])
    specs = [m.TaskSpec(client.tid(n), fn, 0, TaskFlags.CALL, b"a%d" % n, [], [], 0) for n in range(1, 9)]
    world.send(client.conn, [client.submit(specs[:5])])
    world.run_worker(worker, 2)  # two results, not yet acknowledged by the client
    world.send(client.conn, [client.submit(specs[5:])])
    world.run_worker(worker, 3)
    world.ack(client)
    world.run_worker(worker, 1)
    world.tick()
    world.run_worker(worker)
    world.ack(client)
    assert not client.awaiting
    assert check_every_crash_point(world) == len(world.records) > 10


def test_a_graph_across_a_restart_keeps_results_for_its_dependents() -> None:
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=1)
    a, b, c = client.tid(1), client.tid(2), client.tid(3)
    specs = [
        m.TaskSpec(a, 0, 0, TaskFlags.INLINE_FN, b"a", [], [], 0),
        m.TaskSpec(b, 0, 0, TaskFlags.INLINE_FN, b"b", [a], [], 0),
        m.TaskSpec(c, 0, 0, TaskFlags.INLINE_FN, b"c", [b, a], [], 0),
    ]
    expected = {a: value_of(b"a"), b: value_of(b"b+" + value_of(b"a")), c: value_of(b"c+" + value_of(b"b+" + value_of(b"a")) + b"+" + value_of(b"a"))}
    world.send(client.conn, [client.submit(specs, expected)])
    for _ in range(3):
        world.run_worker(worker)
        world.tick()
    world.ack(client)
    assert not client.awaiting
    check_exactly_once(client)
    assert check_every_crash_point(world) == len(world.records)


def test_a_worker_that_never_returns_has_its_tasks_retried_and_at_most_once_tasks_fail() -> None:
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=2)
    world.register(client, 1, ONCE)
    plain = m.TaskSpec(client.tid(1), 0, 0, TaskFlags.INLINE_FN, b"p", [], [], 0)
    at_most_once = m.TaskSpec(client.tid(2), 0, 1, TaskFlags.INLINE_FN, b"q", [], [], 0)
    world.send(client.conn, [client.submit([plain, at_most_once])])
    dispatched = world.crash_points[-1]
    # The daemon dies once both were dispatched; the worker never comes back.
    after = restart(world, dispatched, without_workers=True)
    client = find(after, ClientModel)
    assert client.got == {}
    for _ in range(11):  # the grace period ends without it
        after.send(client.conn, [m.Heartbeat(0, 0)])
        after.tick(1.0)
    fresh = after.join_worker(b"\x00W2", capacity=2)
    after.run_worker(fresh)
    after.ack(client)
    assert not client.awaiting
    client.expected[at_most_once.task_id] = ("fail", "max_retries=0 lets a task run at most once")
    check_exactly_once(client)
    assert "did not come back within restart_grace" in msgpack.unpackb(client.got[at_most_once.task_id][0].payload)[0]
    assert fresh.runs == {plain.task_id: 1}


def test_a_task_whose_dispatch_never_reached_the_worker_runs_there_after_its_report() -> None:
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=2)
    world.register(client, 1, ONCE)
    spec = m.TaskSpec(client.tid(1), 0, 1, TaskFlags.INLINE_FN, b"x", [], [], 0)
    world.send(client.conn, [client.submit([spec])])
    count, peers, now = world.crash_points[-1]
    held = next(p for p in peers.values() if isinstance(p, WorkerModel))
    assert held.held == {}  # killed after writing the dispatch, before sending it
    after = restart(world, (count, peers, now))
    client = find(after, ClientModel)
    finish(after, client)
    check_exactly_once(client)  # max_retries=0, yet it never started: it runs, once


def test_objects_a_client_holds_and_tasks_use_are_held_across_every_crash_point() -> None:
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=1)
    obj = b"O" * 16
    client.pins.append(obj)
    world.send(client.conn, [m.PinObjects([obj])])
    spec = m.TaskSpec(client.tid(1), 0, 0, TaskFlags.INLINE_FN, b"o", [], [obj], 0)
    world.send(client.conn, [client.submit([spec])])
    world.run_worker(worker)
    world.ack(client)
    assert world.core.object_holds == {obj: 1}  # the client's pin; the task's hold ended with it
    for point in world.crash_points:
        after = restart(world, point)
        after.core.validate()
        model = find(after, ClientModel)
        if not model.peer_id:
            continue  # killed before its Welcome went out: that client is still waiting for one
        finish(after, model)
        expected = {obj: 1} if model.pins else {}  # pinned before the crash point, or not yet
        assert after.core.object_holds == expected, (point[0], after.core.object_holds)
    assert check_every_crash_point(world) == len(world.records)


def test_an_unknown_resume_is_refused_as_unknown_peer() -> None:
    world = World()
    world.join_client()
    world.step(Received(b"\x00X", [m.Resume(99, b"forged")], world.now))
    core = world.core
    assert not core.knows(b"\x00X")


def test_a_daemon_without_a_journal_refuses_a_resume_as_not_resumable() -> None:
    from scaler_executor.protocol.rejoin import is_not_resumable
    from scaler_executor.scheduler.core import Scheduler

    plain = Scheduler(CONFIG)
    commands = plain.handle(Received(b"\x00X", [m.Resume(3, b"t")], T0))
    (refusal,) = [msg for c in commands if isinstance(c, Send) for msg in c.messages]
    assert type(refusal) is m.Refused and is_not_resumable(refusal.reason)
    durable = World()
    durable.step(Received(b"\x00Y", [m.Resume(3, b"forged")], T0))
    assert not durable.core.knows(b"\x00Y")


# --------------------------------------------------------------------------- direct replies and lanes


def test_direct_replies_are_acknowledged_in_order_and_answered_once_across_every_crash_point() -> None:
    """A sequential caller's task (REPLY_DIRECT) is acknowledged like any under a journal,
    in order with the others (the client's model pops its kept specs by count: one
    acknowledgement too many raises); its result, sent straight to the client and then to
    the daemon marked delivered, is never sent again, wherever the daemon died: after its
    dispatch, after the direct reply but before the daemon wrote the result, or after."""
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=2)
    worker.direct = client
    direct = TaskFlags.INLINE_FN | TaskFlags.REPLY_DIRECT
    for n in (1, 2):
        world.send(client.conn, [client.submit([m.TaskSpec(client.tid(n), 0, 0, direct, b"d%d" % n, [], [], 0)])])
        world.run_worker(worker)  # the reply goes straight to the client, then to the daemon
        assert client.awaiting == set() and client.got[client.tid(n)]
    plain = [m.TaskSpec(client.tid(n), 0, 0, TaskFlags.INLINE_FN, b"p%d" % n, [], [], 0) for n in (3, 4)]
    world.send(client.conn, [client.submit(plain)])
    world.send(client.conn, [client.submit([m.TaskSpec(client.tid(5), 0, 0, direct, b"d5", [], [], 0)])])
    world.tick()  # the acknowledgements, due NOTICE_DELAY after the submissions
    assert not client.unacked, "every submission, the sequential ones too, is acknowledged"
    world.run_worker(worker)
    world.ack(client)
    world.tick()
    assert world.core.counters["delivered_direct"] == 3
    assert check_every_crash_point(world) == len(world.records) > 5


def test_a_lane_task_record_is_never_journaled_and_survives_no_restart() -> None:
    """A worker's LaneStarted is taken under a journal (its load and the task counts include
    the lane task) but never written: a lane task has no payload, and it is its client's to
    submit again if its lane is lost.  A resumed client that does not await it (it is on a
    lane) does not have it cancelled at its worker; a restarted daemon knows nothing of it."""
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=2)
    lane_task = client.tid(7)
    world.send(worker.conn, [m.LaneStarted([lane_task])])
    assert world.core.tasks[lane_task].flags & TaskFlags.ON_LANE
    assert not [k for entries in world.records for k, _ in entries if k[:1] in b"td" and k[1:] == lane_task.to_bytes(8, "big")]
    world.send(worker.conn, [m.LaneDone(1, 0, 0, 1, 0.5, [lane_task], [])])
    assert lane_task not in world.core.tasks
    world.send(worker.conn, [m.LaneStarted([client.tid(8)])])
    point = (len(world.records), copy.deepcopy(world.peers), world.now)
    # The daemon dies.  Its worker resumes first and announces a lane task still running;
    # then the client resumes: its report does not await the lane task.
    after = restart(world, point, meanwhile=lambda w: w.peers.pop(find(w, ClientModel).conn))
    assert client.tid(8) not in after.core.tasks and not after.core.unclaimed
    worker = find(after, WorkerModel)
    after.send(worker.conn, [m.LaneStarted([client.tid(9)])])
    assert after.core.tasks[client.tid(9)].flags & TaskFlags.ON_LANE
    client = copy.deepcopy(point[1][b"\x00C1"])
    client.conn = b"\x00NC1"
    after.peers[client.conn] = client
    after.send(client.conn, [m.Heartbeat(0, 0)])  # refused: the client resumes, awaiting nothing
    assert not client.resuming
    kept = after.core.tasks.get(client.tid(9))
    assert kept is not None and kept.state is TaskState.DISPATCHED and kept.client in after.core.clients, kept
    after.core.validate()


def test_a_lane_task_submitted_again_is_journaled_with_its_lane_attempt() -> None:
    """A lane task whose lane was lost comes to the daemon (LANE_RETRY): journaled like any
    submission, with the attempt on the lane counted, so a restart keeps that count."""
    world = World()
    client = world.join_client()
    retry = TaskFlags.INLINE_FN | TaskFlags.LANE_RETRY | TaskFlags.REPLY_DIRECT
    world.send(client.conn, [client.submit([m.TaskSpec(client.tid(1), 0, 0, retry, b"r", [], [], 0)])])
    world.tick()
    assert not client.unacked
    after = restart(world, (len(world.records), copy.deepcopy(world.peers), world.now))
    task = after.core.tasks[client.tid(1)]
    assert task.attempt == 1 and task.failures and "lane" in task.failures[0]
    worker = after.join_worker(b"\x00W2")
    client = find(after, ClientModel)
    finish(after, client)
    check_exactly_once(client)
    assert worker.runs == {client.tid(1): 1}
