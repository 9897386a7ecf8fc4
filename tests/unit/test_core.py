"""The daemon's pure core, driven by plain calls with a fake clock.

Every step goes through :meth:`Cluster.step`, which calls ``Scheduler.handle``, then
``validate()``, and checks that the commands are one batch per peer and that every message
the core emits survives the codec (so core and protocol agree on field types).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import msgpack
import pytest

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.protocol.rejoin import is_unknown_peer
from scaler_executor.scheduler.core import (
    PeerUnreachable,
    Received,
    Scheduler,
    Send,
    Tick,
    Wake,
    WorkerExited,
)
from scaler_executor.scheduler.core_events import NOTICE_DELAY
from scaler_executor.scheduler.state import TaskState

INTERVAL = 1.0
LIVENESS = 3
DEADLINE = INTERVAL * LIVENESS  # silence after which a peer is lost
CONFIG = ClusterConfig(
    heartbeat_interval=INTERVAL,
    heartbeat_liveness=LIVENESS,
    client_timeout=DEADLINE,
    max_retries=2,
    max_prefetch=4,
)
T0 = 1000.0


def hello(role: str = m.Role.CLIENT, **changes: Any) -> m.Hello:
    base = m.Hello(
        role=role,
        protocol=m.PROTOCOL_VERSION,
        python=python_version(),
        cloudpickle=cloudpickle.__version__,
        package=__version__,
        name=f"{role}-x",
        pid=4242,
        host="node-1",
        capacity=1 if role == m.Role.WORKER else 0,
        resources={},
        tags=[],
    )
    return base._replace(**changes)


def tid(client_id: int, n: int) -> int:
    return (client_id << TASK_ID_BITS) | n


def spec(
    task_id: int, fn_id: int = 0, options_id: int = 0, deps: list[int] | None = None
) -> m.TaskSpec:
    flags = TaskFlags.CALL if fn_id else TaskFlags.INLINE_FN
    return m.TaskSpec(task_id, fn_id, options_id, flags, b"args-%d" % task_id, deps or [], [], 0)


def result(
    task_id: int, attempt: int = 0, status: int = Status.OK, payload: bytes = b"value"
) -> m.TaskResult:
    return m.TaskResult(task_id, attempt, status, payload, m.TaskFacts("w", 10.0, 10.5, 0), [])


class Out:
    """The commands of one step, by peer."""

    def __init__(self, commands: list[Send]) -> None:
        self.by_peer: dict[bytes, list[Any]] = {}
        for command in commands:
            assert type(command) is Send
            assert command.peer not in self.by_peer, f"two batches for {command.peer!r} in one step"
            self.by_peer[command.peer] = list(command.messages)

    def to(self, peer: bytes) -> list[Any]:
        return self.by_peer.get(peer, [])

    def of(self, peer: bytes, cls: type) -> list[Any]:
        return [x for x in self.to(peer) if type(x) is cls]

    def one(self, peer: bytes, cls: type) -> Any:
        found = self.of(peer, cls)
        assert len(found) == 1, f"expected one {cls.__name__} to {peer!r}, got {self.to(peer)}"
        return found[0]

    def dispatched(self, peer: bytes) -> list[m.TaskDispatch]:
        return [t for d in self.of(peer, m.DispatchTasks) for t in d.tasks]

    def blobs(self, peer: bytes) -> list[m.FunctionBlob]:
        return [b for d in self.of(peer, m.DispatchTasks) for b in d.functions]

    def results(self, peer: bytes) -> list[m.TaskResult]:
        return [r for x in self.of(peer, m.TaskResults) for r in x.results]

    def running(self, peer: bytes) -> list[int]:
        return [t for x in self.of(peer, m.TasksRunning) for t in x.task_ids]

    def acked(self, peer: bytes) -> int:
        return sum(x.count for x in self.of(peer, m.SubmitAck))

    @property
    def peers(self) -> set[bytes]:
        return set(self.by_peer)


class Cluster:
    """A Scheduler with a fake clock; every step is checked with ``validate()``."""

    def __init__(self, config: ClusterConfig = CONFIG) -> None:
        self.scheduler = Scheduler(config)
        self.now = T0
        self.ids: dict[bytes, int] = {}

    def step(self, *events: Any) -> Out:
        commands = self.scheduler.handle(*events)
        self.scheduler.validate()
        for command in commands:
            # What the core emits must be valid on the wire.
            assert decode(encode(command.messages))[0] == command.messages
        return Out(commands)

    def send(self, peer: bytes, *messages: Any, dt: float = 0.0) -> Out:
        self.now += dt
        return self.step(Received(peer, list(messages), self.now))

    def tick(self, dt: float = 0.0) -> Out:
        self.now += dt
        return self.step(Tick(self.now))

    def notices(self) -> Out:
        """Let NOTICE_DELAY pass: deferred submit acks and running notices go out."""
        self.now += NOTICE_DELAY
        assert self.scheduler.wakeup_at() is not None, "no notice was waiting"
        assert self.scheduler.wakeup_at() <= self.now  # type: ignore[operator]
        out = self.step(Wake(self.now))
        assert self.scheduler.wakeup_at() is None
        return out

    def keepalive(self, *peers: bytes) -> Out:
        return self.step(*[Received(p, [m.Heartbeat(0, 0)], self.now) for p in peers])

    def join(self, peer: bytes, message: m.Hello) -> Out:
        out = self.send(peer, message)
        welcome = out.one(peer, m.Welcome)
        self.ids[peer] = welcome.peer_id
        return out

    def client(self, peer: bytes = b"c1") -> int:
        self.join(peer, hello(m.Role.CLIENT, name=peer.decode()))
        return self.ids[peer]

    def worker(
        self, peer: bytes = b"w1", capacity: int = 1, pid: int = 4242, host: str = "node-1"
    ) -> Out:
        return self.join(
            peer, hello(m.Role.WORKER, name=peer.decode(), capacity=capacity, pid=pid, host=host)
        )

    def stat(self, key: str) -> Any:
        return self.scheduler.statistics().get(key, 0)


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def client_with_function(cluster: Cluster, peer: bytes = b"c1") -> tuple[int, int]:
    cid = cluster.client(peer)
    fn = tid(cid, 1)
    assert not cluster.send(peer, m.RegisterFunction(fn, b"pickled-fn")).to(peer)
    return cid, fn


# ====================================================================== handshake


@pytest.mark.parametrize("role", [m.Role.CLIENT, m.Role.WORKER, m.Role.MONITOR])
def test_welcome_for_each_role(cluster: Cluster, role: str) -> None:
    out = cluster.send(b"p", hello(role))
    # A worker is told how many task runs to keep for the history (the daemon's history_runs).
    runs = cluster.scheduler.config.history_runs if role == m.Role.WORKER else 0
    assert out.to(b"p") == [m.Welcome(1, INTERVAL, LIVENESS, "", runs=runs)]
    assert (cluster.stat("clients"), cluster.stat("workers")) == {
        m.Role.CLIENT: (1, 0),
        m.Role.WORKER: (0, 1),
        m.Role.MONITOR: (0, 0),
    }[role]
    assert not cluster.send(b"p", m.Heartbeat(0, 0)).peers, "a welcomed peer is known"


def test_peer_ids_are_distinct(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.client(b"c2")
    assert len(set(cluster.ids.values())) == 4


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"python": "2.7"}, "Python 2.7"),
        ({"cloudpickle": "0.0.1"}, "cloudpickle 0.0.1"),
        ({"package": "9.9.9"}, "scaler-executor 9.9.9"),
        ({"protocol": m.PROTOCOL_VERSION + 1}, f"protocol {m.PROTOCOL_VERSION + 1}"),
    ],
    ids=["python", "cloudpickle", "package", "protocol"],
)
@pytest.mark.parametrize("role", [m.Role.CLIENT, m.Role.WORKER])
def test_refused_for_version_mismatch(
    cluster: Cluster, role: str, changes: dict[str, Any], expected: str
) -> None:
    out = cluster.send(b"p", hello(role, **changes))
    refused = out.one(b"p", m.Refused)
    assert out.to(b"p") == [refused]
    assert expected in refused.reason
    assert cluster.stat("clients") == cluster.stat("workers") == 0
    # A refused peer stays unknown.
    again = cluster.send(b"p", m.Heartbeat(0, 0))
    assert "send Hello first" in again.one(b"p", m.Refused).reason


def test_version_refusal_names_daemon_versions_and_fix(cluster: Cluster) -> None:
    reason = cluster.send(b"p", hello(python="2.7", package="9.9.9")).one(b"p", m.Refused).reason
    assert python_version() in reason and __version__ in reason
    assert "install the same versions" in reason


def test_refused_for_bad_role(cluster: Cluster) -> None:
    reason = cluster.send(b"p", hello(role="admin")).one(b"p", m.Refused).reason
    assert "'admin'" in reason and "client" in reason


def test_refused_worker_without_capacity(cluster: Cluster) -> None:
    reason = cluster.send(b"w", hello(m.Role.WORKER, capacity=0)).one(b"w", m.Refused).reason
    assert "capacity 0" in reason
    assert cluster.stat("workers") == 0


def test_a_hello_beyond_max_peers_is_refused_and_a_place_that_frees_is_taken() -> None:
    cluster = Cluster(CONFIG.replace(max_peers=3))
    cluster.join(b"c1", hello(m.Role.CLIENT))
    cluster.join(b"w1", hello(m.Role.WORKER))
    cluster.join(b"m1", hello(m.Role.MONITOR))
    reason = cluster.send(b"w2", hello(m.Role.WORKER)).one(b"w2", m.Refused).reason
    assert "max_peers" in reason and "3" in reason
    assert cluster.stat("workers") == 1 and not cluster.scheduler.knows(b"w2")
    cluster.join(b"c1", hello(m.Role.CLIENT))  # a peer that joined may say Hello again
    cluster.send(b"c1", m.Goodbye("done"))
    cluster.join(b"w2", hello(m.Role.WORKER))
    assert cluster.scheduler.peer_count() == 3


def test_client_needs_no_capacity(cluster: Cluster) -> None:
    cluster.join(b"c", hello(m.Role.CLIENT, capacity=0))


def test_unknown_peer_must_send_hello_first(cluster: Cluster) -> None:
    out = cluster.send(b"stranger", m.SubmitTasks([spec(1)]), m.Heartbeat(0, 0))
    reason = out.one(b"stranger", m.Refused).reason
    assert "send Hello first" in reason and is_unknown_peer(reason)  # what peers act on (protocol/rejoin.py)
    assert cluster.stat("dropped_messages") == 2
    assert cluster.stat("tasks") == 0


def test_unknown_peer_saying_goodbye_gets_no_answer(cluster: Cluster) -> None:
    assert not cluster.send(b"stranger", m.Goodbye("bye")).peers


def test_messages_after_hello_in_the_same_batch(cluster: Cluster) -> None:
    out = cluster.send(b"mon", hello(m.Role.MONITOR), m.StatsRequest())
    assert [type(x) for x in out.to(b"mon")] == [m.Welcome, m.Stats]


def test_refused_hello_drops_the_rest_of_the_batch(cluster: Cluster) -> None:
    out = cluster.send(b"c", hello(python="2.7"), m.SubmitTasks([spec(tid(1, 1))]))
    assert [type(x) for x in out.to(b"c")] == [m.Refused]
    assert cluster.stat("tasks") == 0


def test_worker_saying_hello_again_is_welcomed_afresh(cluster: Cluster) -> None:
    """A worker that heard nothing from the daemon for its liveness period forgets what it held
    and says Hello again on the same connection (worker/agent.py ``_forget_daemon_state``).
    The daemon must answer, and must not leave the tasks it sent that worker waiting there."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 10), fn), spec(tid(cid, 11), fn)]))
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=1))
    assert out.of(b"w1", m.Welcome), "a rejoining worker gets no Welcome: it waits forever"
    redispatched = {t.task_id for t in out.dispatched(b"w1")}
    assert redispatched == {tid(cid, 10), tid(cid, 11)}, (
        "the tasks the worker dropped are never run"
    )
    assert [b.fn_id for b in out.blobs(b"w1")] == [fn], "the worker forgot its functions"


def test_rejoining_worker_is_not_handed_the_same_attempt_again(cluster: Cluster) -> None:
    """The rejoining worker may still be running what it held: it marks those runs unwanted
    and, when one finishes, answers CANCELLED with the *old* attempt number
    (worker/agent.py ``_forget_daemon_state`` and ``_on_processor_message``).  If the daemon
    hands it the same (task, attempt) again, that late answer settles the new hand-out and the
    client sees a cancellation it never asked for."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    t = tid(cid, 1)
    assert [d.attempt for d in cluster.send(b"c1", m.SubmitTasks([spec(t)])).dispatched(b"w1")] == [
        0
    ]
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=1))
    (again,) = out.dispatched(b"w1")
    late = result(t, 0, Status.CANCELLED, b"")
    out = cluster.send(b"w1", m.TaskResults([late]))
    assert not out.results(b"c1"), (
        f"the abandoned run's answer (attempt 0) settled the new hand-out (attempt {again.attempt})"
    )
    answer = result(t, again.attempt)
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"c1") == [answer]


# ====================================================================== submit → result


def test_notices_travel_with_results_and_skip_finished_tasks(cluster: Cluster) -> None:
    """A short task's result carries its ack, and no running notice is ever sent for it."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    short, long_ = tid(cid, 1), tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(short, fn), spec(long_, fn)]))
    assert len(out.dispatched(b"w1")) == 2 and not out.to(b"c1")
    assert cluster.scheduler.wakeup_at() == cluster.now + NOTICE_DELAY
    assert not cluster.step(Wake(cluster.now)).peers, "a Wake before the delay sends nothing"
    answer = result(short)
    out = cluster.send(b"w1", m.TaskResults([answer]), dt=NOTICE_DELAY / 2)
    assert out.to(b"c1") == [m.SubmitAck(2), m.TasksRunning([long_]), m.TaskResults([answer])]
    assert cluster.scheduler.wakeup_at() is None


def test_a_client_leaving_with_notices_pending_leaves_no_wakeup(cluster: Cluster) -> None:
    """Otherwise the loop would be asked to wake at a past time, forever: a busy spin."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]))
    assert cluster.scheduler.wakeup_at() is not None
    cluster.send(b"c1", m.Goodbye("done"))
    assert cluster.scheduler.wakeup_at() is None


def test_running_notice_of_a_long_task_comes_after_the_delay(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]))
    assert cluster.notices().to(b"c1") == [m.SubmitAck(1), m.TasksRunning([t])]
    answer = result(t)
    assert cluster.send(b"w1", m.TaskResults([answer]), dt=1.0).to(b"c1") == [m.TaskResults([answer])]


def test_a_graph_intermediate_gets_no_running_notice(cluster: Cluster) -> None:
    """Its client keeps no future for a NO_RESULT task (client/graph.py): a notice that it
    runs would cost a transmission and a wake-up of the client for nothing."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    middle, top = tid(cid, 2), tid(cid, 3)
    graph = [spec(middle, fn)._replace(flags=TaskFlags.CALL | TaskFlags.NO_RESULT), spec(top, fn, deps=[middle])]
    out = cluster.send(b"c1", m.SubmitTasks(graph))
    assert [d.task_id for d in out.dispatched(b"w1")] == [middle]
    assert cluster.notices().to(b"c1") == [m.SubmitAck(2)]  # middle runs: no notice of it
    out = cluster.send(b"w1", m.TaskResults([result(middle)]), dt=1.0)
    assert [d.task_id for d in out.dispatched(b"w1")] == [top] and not out.to(b"c1")
    assert cluster.notices().to(b"c1") == [m.TasksRunning([top])]


def test_submit_dispatch_result_forget(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 7)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]))
    assert out.to(b"w1") == [
        m.DispatchTasks(
            [m.FunctionBlob(fn, b"pickled-fn")],
            [m.TaskDispatch(t, 0, fn, TaskFlags.CALL, b"args-%d" % t, [], None, [])],
        )
    ]
    assert out.to(b"c1") == [], "acks and running notices wait for results or NOTICE_DELAY"
    assert cluster.notices().to(b"c1") == [m.SubmitAck(1), m.TasksRunning([t])]
    assert cluster.scheduler.tasks[t].state is TaskState.DISPATCHED

    answer = result(t)
    out = cluster.send(b"w1", m.TaskResults([answer]))
    assert out.to(b"c1") == [m.TaskResults([answer])]
    assert out.peers == {b"c1"}
    assert t not in cluster.scheduler.tasks
    assert cluster.stat("finished") == 1 and cluster.stat("tasks") == 0


def test_error_results_are_forwarded_and_counted_as_failed(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=4)
    ids = [tid(cid, n) for n in range(1, 5)]
    cluster.send(b"c1", m.SubmitTasks([spec(t) for t in ids]))
    answers = [
        result(ids[0], status=Status.ERROR, payload=b"exc"),
        result(ids[1], status=Status.TIMEOUT, payload=b"took too long"),
        result(ids[2], status=Status.FORCE_CANCELLED, payload=b"killed"),
        result(ids[3]),
    ]
    out = cluster.send(b"w1", m.TaskResults(answers))
    assert out.results(b"c1") == answers
    assert cluster.stat("failed") == 3 and cluster.stat("finished") == 1


REPLY_SOCKET = "/tmp/scaler-1-x/reply.sock"
DIRECT = TaskFlags.INLINE_FN | TaskFlags.REPLY_DIRECT


@pytest.mark.parametrize(
    "client_reply, worker_host, flags, expected",
    [
        (REPLY_SOCKET, "node-1", DIRECT, REPLY_SOCKET),
        (REPLY_SOCKET, "node-2", DIRECT, ""),  # another host cannot reach the client's socket
        (REPLY_SOCKET, "node-1", TaskFlags.INLINE_FN, ""),  # not a sequential caller's task
        ("", "node-1", DIRECT, ""),  # a client without a reply socket
    ],
    ids=["same-host", "other-host", "no-flag", "no-socket"],
)
def test_a_dispatch_names_the_reply_socket_only_for_direct_tasks_on_the_clients_host(
    client_reply: str, worker_host: str, flags: int, expected: str
) -> None:
    cluster = Cluster()
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", host="node-1", reply_to=client_reply))
    cluster.worker(b"w1", host=worker_host)
    t = tid(cluster.ids[b"c1"], 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)._replace(flags=flags)]))
    assert [d.reply_to for d in out.dispatched(b"w1")] == [expected]


def test_a_delivered_result_is_not_forwarded_but_is_kept_for_a_dependent(cluster: Cluster) -> None:
    """A result the processor already sent to the client is bookkeeping only: finished,
    counted, never sent again; and a dependent linked while it ran still gets its value."""
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", reply_to=REPLY_SOCKET))
    cid = cluster.ids[b"c1"]
    cluster.worker(b"w1", capacity=4)
    a, b, c = tid(cid, 1), tid(cid, 2), tid(cid, 3)
    cluster.send(b"c1", m.SubmitTasks([spec(a)._replace(flags=DIRECT), spec(c)._replace(flags=DIRECT)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))  # a future passed as an argument
    out = cluster.send(
        b"w1", m.TaskResults([result(a, payload=b"va")._replace(delivered=True), result(c)._replace(delivered=True)])
    )
    assert out.results(b"c1") == [], "the client has both results already"
    assert cluster.stat("delivered_direct") == 2 and cluster.stat("finished") == 2
    assert c not in cluster.scheduler.tasks
    (dependent,) = out.dispatched(b"w1")
    assert dependent.task_id == b and dependent.deps == [m.DepValue(a, b"va", [])]
    out = cluster.send(b"w1", m.TaskResults([result(b)]))
    assert out.results(b"c1") == [result(b)], "an undelivered result still goes to the client"
    assert cluster.stat("tasks") == 0


def test_a_delivered_lone_task_leaves_nothing_due_to_its_client(cluster: Cluster) -> None:
    """A sequential caller's task is outside the submit window (no SubmitAck), and once its
    result was delivered straight, no running notice is due: the client is not woken."""
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", reply_to=REPLY_SOCKET))
    cluster.worker(b"w1")
    t = tid(cluster.ids[b"c1"], 1)
    assert cluster.send(b"c1", m.SubmitTasks([spec(t)._replace(flags=DIRECT)])).to(b"c1") == []
    assert cluster.scheduler.wakeup_at() is not None, "its running notice is deferred"
    out = cluster.send(b"w1", m.TaskResults([result(t)._replace(delivered=True)]))
    assert out.to(b"c1") == []
    assert cluster.scheduler.wakeup_at() is None, "nothing is left to tell the client"
    # Not delivered (too large, say): the result travels, still with no ack.
    t2 = tid(cluster.ids[b"c1"], 2)
    cluster.send(b"c1", m.SubmitTasks([spec(t2)._replace(flags=DIRECT)]))
    out = cluster.send(b"w1", m.TaskResults([result(t2)]))
    assert out.to(b"c1") == [m.TaskResults([result(t2)])]
    # Still running NOTICE_DELAY after its dispatch: the client hears it runs, once.
    t3 = tid(cluster.ids[b"c1"], 3)
    cluster.send(b"c1", m.SubmitTasks([spec(t3)._replace(flags=DIRECT)]))
    assert cluster.notices().to(b"c1") == [m.TasksRunning([t3])]
    assert cluster.send(b"w1", m.TaskResults([result(t3)._replace(delivered=True)])).to(b"c1") == []


def test_submit_ack_counts_every_spec_of_the_step(cluster: Cluster) -> None:
    cid = cluster.client()
    out = cluster.send(
        b"c1",
        m.SubmitTasks([spec(tid(cid, 1)), spec(tid(cid, 2)), spec(tid(cid, 3))]),
        m.SubmitTasks(
            [spec(tid(cid, 4)), spec(tid(cid, 5), fn_id=tid(cid, 99))]
        ),  # the last is rejected
    )
    assert out.of(b"c1", m.SubmitAck) == [m.SubmitAck(5)], (
        "one ack per step, counting rejected specs too"
    )
    assert out.running(b"c1") == []  # no worker yet
    assert cluster.stat("tasks_pending") == 4


def test_tasks_wait_for_a_worker(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 4)]))
    out = cluster.worker(b"w1", capacity=2)
    assert [type(x) for x in out.to(b"w1")] == [m.Welcome, m.DispatchTasks]
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 1), tid(cid, 2), tid(cid, 3)]
    assert cluster.notices().running(b"c1") == [tid(cid, 1), tid(cid, 2), tid(cid, 3)]


def test_prefetch_window_limits_dispatch(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)  # window 2 before any task time is known
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 6)]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 1), tid(cid, 2)]
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1))]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 3)]
    assert cluster.stat("tasks_pending") == 2


def test_new_worker_takes_queued_work(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 6)]))
    out = cluster.worker(b"w2", capacity=1)
    assert [t.task_id for t in out.dispatched(b"w2")] == [tid(cid, 3), tid(cid, 4)]
    assert not out.of(b"w1", m.DispatchTasks)


def test_options_travel_with_the_task(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    options = m.TaskOptions({}, [], 0, 12.5, None)
    out = cluster.send(
        b"c1", m.RegisterOptions(3, options), m.SubmitTasks([spec(tid(cid, 1), options_id=3)])
    )
    assert out.dispatched(b"w1")[0].task_timeout == 12.5


# ====================================================================== functions


def test_function_sent_to_each_worker_once(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(1, 4)]))
    assert out.blobs(b"w1") == [m.FunctionBlob(fn, b"pickled-fn")]
    assert len(out.dispatched(b"w1")) == 2
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1))]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 3)]
    assert out.blobs(b"w1") == [], "the worker already has the function"
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(4, 7)]))
    out = cluster.worker(b"w2", capacity=1)
    assert out.blobs(b"w2") == [m.FunctionBlob(fn, b"pickled-fn")], "each worker gets it once"


def test_inline_functions_need_no_blob(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    assert out.blobs(b"w1") == []
    assert out.dispatched(b"w1")[0].flags == TaskFlags.INLINE_FN


def test_function_released_after_its_last_task(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    cluster.worker(b"w2", capacity=1)
    cluster.worker(b"w3", capacity=1)
    t1, t2 = tid(cid, 1), tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t1, fn), spec(t2, fn)]))
    holders = {p for p in (b"w1", b"w2", b"w3") if out.blobs(p)}
    assert len(holders) == 2
    where = {t.task_id: p for p in holders for t in out.dispatched(p)}

    out = cluster.send(b"c1", m.ReleaseFunctions([fn]))
    assert not out.peers, "tasks still refer to it: nothing released yet"
    assert fn in cluster.scheduler.functions

    out = cluster.send(where[t1], m.TaskResults([result(t1)]))
    assert not out.of(where[t1], m.ReleaseFunctions)
    assert fn in cluster.scheduler.functions

    out = cluster.send(where[t2], m.TaskResults([result(t2)]))
    assert {p for p in out.peers if out.of(p, m.ReleaseFunctions)} == holders
    assert all(out.of(p, m.ReleaseFunctions) == [m.ReleaseFunctions([fn])] for p in holders)
    assert fn not in cluster.scheduler.functions

    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 3), fn)]))
    (rejected,) = out.results(b"c1")
    assert rejected.status == Status.REJECTED and b"released" in rejected.payload


def test_function_released_at_once_when_no_task_refers(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.worker(b"w2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]))
    holder = next(p for p in (b"w1", b"w2") if fn in cluster.scheduler.workers[p].functions)
    cluster.send(holder, m.TaskResults([result(tid(cid, 1))]))
    assert fn in cluster.scheduler.functions, "kept while the client caches it"
    out = cluster.send(b"c1", m.ReleaseFunctions([fn]))
    assert out.to(holder) == [m.ReleaseFunctions([fn])]
    assert out.peers == {holder}, "only workers that had it hear of it"
    assert fn not in cluster.scheduler.functions


def test_function_of_a_cancelled_task_is_released(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]), m.ReleaseFunctions([fn]))
    assert fn in cluster.scheduler.functions
    cluster.send(b"c1", m.CancelTasks([tid(cid, 1)], False))
    assert fn not in cluster.scheduler.functions


def test_released_function_still_reaches_the_worker_a_retry_goes_to(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]), m.ReleaseFunctions([fn]))
    cluster.worker(b"w2")
    out = lose(cluster, b"w1", "unreachable")
    assert out.blobs(b"w2") == [m.FunctionBlob(fn, b"pickled-fn")]
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w2")] == [(t, 1)]
    out = cluster.send(b"w2", m.TaskResults([result(t, 1)]))
    assert out.to(b"w2") == [m.ReleaseFunctions([fn])]
    assert fn not in cluster.scheduler.functions


def test_release_of_a_function_the_client_never_registered_is_ignored(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.send(b"c2", m.ReleaseFunctions([fn, tid(other, 5)]))
    assert fn in cluster.scheduler.functions
    assert cluster.stat("refused") == 1  # another client's function: refused; an unknown id: ignored


def test_a_client_cannot_cancel_another_clients_task(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.client(b"c2")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn_id=fn)]))  # queued: no worker yet
    out = cluster.send(b"c2", m.CancelTasks([t], False))
    assert out.to(b"c2") == [m.TasksCancelled([], [t])]
    cluster.send(b"c2", m.CancelTasks([t], True))
    assert t in cluster.scheduler.tasks and cluster.stat("refused") == 2  # still c1's, still queued


def test_a_client_cannot_register_over_another_clients_function(cluster: Cluster) -> None:
    """The hijack of issue 22: c2 registers c1's function id with its own payload."""
    cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    for fn_id in (fn, tid(cid, 2), tid(other, 0)):
        cluster.send(b"c2", m.RegisterFunction(fn_id, b"HIJACKED"))
    assert cluster.scheduler.functions == {fn: b"pickled-fn"}
    assert cluster.stat("refused") == 3
    cluster.worker(b"w1")
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn_id=fn)]))
    assert [b.payload for b in out.blobs(b"w1")] == [b"pickled-fn"]


def test_a_client_cannot_register_its_own_function_id_twice(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    cluster.send(b"c1", m.RegisterFunction(fn, b"other"))
    assert cluster.scheduler.functions == {fn: b"pickled-fn"}
    assert cluster.stat("refused") == 1


def test_a_task_may_call_only_a_function_its_own_client_registered(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.worker(b"w1")
    out = cluster.send(b"c2", m.SubmitTasks([spec(tid(other, 1), fn_id=fn)]))
    [rejected] = out.results(b"c2")
    assert rejected.status == Status.REJECTED and b"never registered by this client" in rejected.payload
    assert not out.dispatched(b"w1")


def test_refusals_are_logged_once_per_peer_and_kind_per_minute(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cid, fn = client_with_function(cluster)
    cluster.client(b"c2")
    caplog.set_level("WARNING", logger="scaler_executor")
    for _ in range(100):
        cluster.send(b"c2", m.RegisterFunction(fn, b"x"), dt=0.1)
    assert cluster.stat("refused") == 100
    assert len([r for r in caplog.records if "refused register-function" in r.getMessage()]) == 1
    cluster.send(b"c2", m.RegisterFunction(fn, b"x"), dt=60.0)
    assert len([r for r in caplog.records if "refused register-function" in r.getMessage()]) == 2


@pytest.mark.parametrize("status", [Status.REJECTED, Status.WORKER_LOST, Status.DEP_FAILED, Status.DEP_GONE, 99])
def test_a_worker_cannot_send_a_status_only_the_daemon_may_give(cluster: Cluster, status: int) -> None:
    """A DEP_GONE from a worker would make the client resend, a WORKER_LOST carry a payload
    the client decodes as the daemon's: the core treats it as the processor's failure."""
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1), status=status, payload=b"\x93forged")]))
    assert cluster.stat("refused") == 1
    assert not out.results(b"c1")  # retried (PROCESSOR_DIED), not forwarded
    assert cluster.scheduler.tasks[tid(cid, 1)].attempt == 1


def test_a_hello_with_a_huge_name_is_refused_briefly_and_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="scaler_executor")
    for i in range(50):
        out = cluster.send(b"rogue", hello(name="\x1b[31mERROR forged\n" + "x" * 100_000), dt=0.01)
        [refused] = out.of(b"rogue", m.Refused)
        assert len(refused.reason) < 200 and "at most 256 characters" in refused.reason
    lines = [r.getMessage() for r in caplog.records if "refused hello" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0]) < 800 and "\n" not in lines[0] and "\x1b" not in lines[0], lines
    assert cluster.stat("refused") == 50
    assert not cluster.scheduler.knows(b"rogue")


# ====================================================================== priorities


def test_higher_priority_first(cluster: Cluster) -> None:
    cid = cluster.client()
    levels = {1: 0, 2: 5, 3: 1, 4: 5, 5: -2, 6: 3}
    registers = [
        m.RegisterOptions(10 + p, m.TaskOptions({}, [], p, None, None))
        for p in set(levels.values())
    ]
    cluster.send(
        b"c1",
        *registers,
        m.SubmitTasks([spec(tid(cid, n), options_id=10 + p) for n, p in levels.items()]),
    )
    out = cluster.worker(b"w1", capacity=1)
    order = [t.task_id for t in out.dispatched(b"w1")]
    held = list(order)
    while held:
        out = cluster.send(b"w1", m.TaskResults([result(held.pop(0))]))
        got = [t.task_id for t in out.dispatched(b"w1")]
        order += got
        held += got
    assert [n & ((1 << TASK_ID_BITS) - 1) for n in order] == [2, 4, 6, 3, 1, 5], (
        "priority, then FIFO"
    )


# ====================================================================== cancel


def test_cancel_pending(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1)), spec(tid(cid, 2))]))
    out = cluster.send(b"c1", m.CancelTasks([tid(cid, 1)], False))
    assert out.to(b"c1") == [m.TasksCancelled([tid(cid, 1)], [])], "dropped, and the client told so"
    assert out.peers == {b"c1"}
    assert tid(cid, 1) not in cluster.scheduler.tasks
    out = cluster.worker(b"w1", capacity=4)
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 2)]
    assert cluster.stat("cancelled") == 1


def test_cancel_dispatched(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    out = cluster.send(b"c1", m.CancelTasks([t], True))
    assert out.to(b"w1") == [m.CancelTasks([t], True)]
    assert cluster.scheduler.tasks[t].state is TaskState.CANCELLING
    assert cluster.stat("tasks_cancelling") == 1
    # Cancelling again is harmless: a task a worker holds is not dropped without force.
    out = cluster.send(b"c1", m.CancelTasks([t], False))
    assert out.to(b"c1") == [m.TasksCancelled([], [t])]
    answer = result(t, status=Status.CANCELLED, payload=b"")
    out = cluster.send(b"w1", m.TaskResults([answer]))
    assert out.results(b"c1") == [answer]
    assert t not in cluster.scheduler.tasks


def test_cancel_of_someone_elses_or_unknown_task_is_ignored(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.client(b"c2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    out = cluster.send(b"c2", m.CancelTasks([tid(cid, 1), tid(cid, 999), 12345], False))
    assert out.to(b"c2") == [m.TasksCancelled([], [tid(cid, 1), tid(cid, 999), 12345])]
    assert out.peers == {b"c2"}
    out = cluster.send(b"c2", m.CancelTasks([tid(cid, 1)], True))
    assert not out.peers
    assert cluster.scheduler.tasks[tid(cid, 1)].state is TaskState.PENDING


# ====================================================================== late results


def test_late_results_are_dropped(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.worker(b"w2")
    t = tid(cid, 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    (first,) = [p for p in (b"w1", b"w2") if out.dispatched(p)]
    other = b"w2" if first == b"w1" else b"w1"
    # The processor died: the task is retried (on the least loaded worker).
    out = cluster.send(
        first, m.TaskResults([result(t, status=Status.PROCESSOR_DIED, payload=b"SIGSEGV")])
    )
    (retried,) = [d for p in (b"w1", b"w2") for d in out.dispatched(p)]
    assert retried.attempt == 1
    holder = cluster.scheduler.tasks[t].worker
    assert holder is not None
    stranger = first if holder == other else other

    for late in (
        (holder, result(t, attempt=0)),  # an earlier attempt
        (holder, result(t, attempt=2)),  # an attempt never made
        (stranger, result(t, attempt=1)),  # another worker
        (holder, result(tid(cid, 999), attempt=0)),  # an unknown task
    ):
        out = cluster.send(late[0], m.TaskResults([late[1]]))
        assert not out.results(b"c1"), f"late result {late} was forwarded"
        assert cluster.scheduler.tasks[t].worker == holder

    answer = result(t, attempt=1)
    assert cluster.send(holder, m.TaskResults([answer])).results(b"c1") == [answer]
    # A duplicate of the result that settled it is late too.
    assert not cluster.send(holder, m.TaskResults([answer])).results(b"c1")


# ====================================================================== worker loss


def test_worker_lost_by_missed_heartbeats(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    assert out.dispatched(b"w1")
    cluster.worker(b"w2")
    cluster.now += DEADLINE
    cluster.keepalive(b"c1", b"w2")
    out = cluster.tick()
    assert cluster.stat("workers") == 2, "exactly at the deadline is not yet lost"
    cluster.now += 0.01
    cluster.keepalive(b"c1", b"w2")
    out = cluster.tick()
    assert cluster.stat("workers") == 1 and cluster.stat("workers_lost") == 1
    (retry,) = out.dispatched(b"w2")
    assert (retry.task_id, retry.attempt) == (t, 1)
    assert b"w1" not in out.peers, "nothing is sent to a lost worker"
    assert cluster.notices().running(b"c1") == [t]
    assert cluster.stat("retried") == 1


def test_heartbeats_and_any_message_keep_a_worker(cluster: Cluster) -> None:
    cluster.client()
    cluster.worker(b"w1")
    for _ in range(10):
        cluster.now += DEADLINE * 0.9
        cluster.send(b"c1", m.Heartbeat(0, 0))
        cluster.send(b"w1", m.TaskResults([]))  # any message counts
        cluster.tick()
    assert cluster.stat("workers") == 1 and cluster.stat("clients") == 1


def lose(cluster: Cluster, peer: bytes, how: str) -> Out:
    if how == "silence":
        cluster.now += DEADLINE + 0.1
        others = [
            p
            for p in list(cluster.scheduler.clients) + list(cluster.scheduler.workers)
            if p != peer
        ]
        cluster.keepalive(*others)
        return cluster.tick()
    if how == "exited":
        worker = cluster.scheduler.workers[peer]
        return cluster.step(
            WorkerExited(worker.pid, worker.host, "killed by signal SIGKILL", cluster.now)
        )
    if how == "unreachable":
        return cluster.step(PeerUnreachable(peer, cluster.now))
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["silence", "exited", "unreachable"])
def test_retries_until_max_retries_then_worker_lost(cluster: Cluster, how: str) -> None:
    cid = cluster.client()
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    names = []
    for attempt in range(CONFIG.max_retries + 1):
        peer = b"w%d" % attempt
        out = cluster.worker(peer, pid=1000 + attempt)
        names.append(peer.decode())
        assert [(d.task_id, d.attempt) for d in out.dispatched(peer)] == [(t, attempt)]
        if attempt:
            assert cluster.scheduler.tasks[t].attempt == attempt
        out = lose(cluster, peer, how)
        if attempt < CONFIG.max_retries:
            assert cluster.scheduler.tasks[t].state is TaskState.RETRYING
            assert not out.results(b"c1")
    (lost,) = out.results(b"c1")
    assert (lost.task_id, lost.attempt, lost.status) == (t, CONFIG.max_retries, Status.WORKER_LOST)
    text, lines = msgpack.unpackb(lost.payload)
    assert f"{t:#x}" in text and f"{CONFIG.max_retries + 1} attempt" in text
    assert f"max_retries={CONFIG.max_retries}" in text
    assert len(lines) == CONFIG.max_retries + 1
    for n, (line, name) in enumerate(zip(lines, names), start=1):
        assert line.startswith(f"attempt {n}: worker {name}: ")
        cause = {
            "silence": "missed heartbeats",
            "exited": "exited: killed by signal SIGKILL",
            "unreachable": "unreachable",
        }[how]
        assert cause in line
    assert t not in cluster.scheduler.tasks
    assert cluster.stat("failed") == 1 and cluster.stat("retried") == CONFIG.max_retries


@pytest.mark.parametrize("max_retries, attempts", [(0, 1), (1, 2), (4, 5)])
def test_per_task_max_retries(cluster: Cluster, max_retries: int, attempts: int) -> None:
    cid = cluster.client()
    t = tid(cid, 1)
    options = m.TaskOptions({}, [], 0, None, max_retries)
    cluster.send(b"c1", m.RegisterOptions(1, options), m.SubmitTasks([spec(t, options_id=1)]))
    for attempt in range(attempts):
        peer = b"w%d" % attempt
        out = cluster.worker(peer)
        assert out.dispatched(peer)[0].attempt == attempt
        out = lose(cluster, peer, "unreachable")
        assert bool(out.results(b"c1")) == (attempt == attempts - 1)
    (lost,) = out.results(b"c1")
    assert lost.status == Status.WORKER_LOST
    assert len(msgpack.unpackb(lost.payload)[1]) == attempts


def test_config_max_retries_zero(cluster: Cluster) -> None:
    cluster = Cluster(CONFIG.replace(max_retries=0))
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    (lost,) = lose(cluster, b"w1", "exited").results(b"c1")
    assert lost.status == Status.WORKER_LOST


def test_processor_died_is_retried(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    for attempt in range(CONFIG.max_retries):
        out = cluster.send(
            b"w1", m.TaskResults([result(t, attempt, Status.PROCESSOR_DIED, b"killed by SIGSEGV")])
        )
        assert not out.results(b"c1"), "PROCESSOR_DIED is for the daemon, never a client"
        assert [(d.task_id, d.attempt) for d in out.dispatched(b"w1")] == [(t, attempt + 1)]
    out = cluster.send(
        b"w1",
        m.TaskResults([result(t, CONFIG.max_retries, Status.PROCESSOR_DIED, b"killed by SIGSEGV")]),
    )
    (lost,) = out.results(b"c1")
    assert lost.status == Status.WORKER_LOST
    _text, lines = msgpack.unpackb(lost.payload)
    assert lines == [
        f"attempt {n}: worker w1: killed by SIGSEGV" for n in range(1, CONFIG.max_retries + 2)
    ]
    assert cluster.stat("workers") == 1, "a processor death does not lose the worker"


def test_worker_exited_matches_pid_and_host(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", pid=11, host="a")
    cluster.worker(b"w2", pid=11, host="b")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    assert not cluster.step(WorkerExited(12, "a", "exit code 1", cluster.now)).peers
    assert cluster.stat("workers") == 2
    cluster.step(WorkerExited(11, "a", "exit code 1", cluster.now))
    assert set(cluster.scheduler.workers) == {b"w2"}


def test_worker_goodbye_returns_tasks_without_an_attempt(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    ids = [tid(cid, n) for n in (1, 2)]
    cluster.send(b"c1", m.SubmitTasks([spec(t) for t in ids]))
    cluster.send(b"c1", m.CancelTasks([ids[1]], True))  # CANCELLING when the worker leaves
    cluster.worker(b"w2", capacity=1)
    out = cluster.send(b"w1", m.Goodbye("scaling down"))
    # A fresh attempt number (a late answer to the old hand-out cannot settle it), but no
    # failure recorded: it does not count against max_retries.
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w2")] == [(ids[0], 1)]
    assert b"w1" not in out.peers
    assert ids[1] not in cluster.scheduler.tasks
    assert cluster.stat("workers_lost") == 0 and cluster.stat("retried") == 0
    assert cluster.scheduler.tasks[ids[0]].failures is None


def test_worker_goodbye_requeues_for_free_only_what_it_vouches_never_started(cluster: Cluster) -> None:
    """At most once (max_retries=0) holds through an orderly leave (SIGTERM, scancel): the
    worker's Goodbye lists the tasks it hands back never given to a processor, and only those
    run again, at another worker, for free. Any other task may have started: an at-most-once
    one fails naming the worker; an ordinary one goes back without a charge (no crash)."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=4)
    started, unstarted, ordinary, stale = (tid(cid, n) for n in (1, 2, 3, 4))
    out = cluster.send(
        b"c1",
        m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)),
        m.SubmitTasks([spec(started, options_id=1), spec(unstarted, options_id=1), spec(ordinary), spec(stale, options_id=1)]),
    )
    assert sorted(d.task_id for d in out.dispatched(b"w1")) == [started, unstarted, ordinary, stale]
    # ``stale`` is vouched for under another attempt than the one it holds, and the last
    # is no task of the worker's: neither says anything of what the worker holds.
    listed = [m.TaskAttempt(unstarted, 0), m.TaskAttempt(stale, 1), m.TaskAttempt(tid(cid, 99), 0)]
    out = cluster.send(b"w1", m.Goodbye("worker stopping", listed))
    lost = {r.task_id: r for r in out.results(b"c1")}
    assert set(lost) == {started, stale}
    for r in lost.values():
        assert r.status == Status.WORKER_LOST
        text, lines = msgpack.unpackb(r.payload)
        assert "may have started on worker w1" in text and "max_retries=0" in text, text
        assert lines == ["attempt 1: worker w1: left: worker stopping"]
    tasks = cluster.scheduler.tasks
    assert set(tasks) == {unstarted, ordinary}
    assert tasks[unstarted].failures is None and tasks[ordinary].failures is None
    assert cluster.stat("workers_lost") == 0 and cluster.stat("retried") == 0
    out = cluster.worker(b"w2", capacity=2)
    assert sorted((d.task_id, d.attempt) for d in out.dispatched(b"w2")) == [(unstarted, 1), (ordinary, 1)]


def test_a_draining_worker_hands_back_its_unstarted_tasks_for_free_and_finishes_the_rest(cluster: Cluster) -> None:
    """Walltime without loss: a worker told its job ends soon (SIGTERM with --drain-seconds)
    says WorkerDraining, listing the tasks it never started.  Those run elsewhere at once,
    for free; nothing more is dispatched to it; the tasks it runs stay its own, and their
    results (an at-most-once task's too) are accepted and delivered once."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    once, running, queued1, queued2 = (tid(cid, n) for n in (1, 2, 3, 4))
    out = cluster.send(
        b"c1",
        m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)),
        m.SubmitTasks([spec(once, options_id=1), spec(running), spec(queued1, options_id=1), spec(queued2)]),
    )
    assert sorted(d.task_id for d in out.dispatched(b"w1")) == [once, running, queued1, queued2]
    cluster.worker(b"w2", capacity=4)
    # A stale attempt and a task that is not the worker's say nothing of what it holds.
    listed = [m.TaskAttempt(queued1, 0), m.TaskAttempt(queued2, 0), m.TaskAttempt(running, 1), m.TaskAttempt(tid(cid, 99), 0)]
    out = cluster.send(b"w1", m.WorkerDraining(listed))
    assert sorted((d.task_id, d.attempt) for d in out.dispatched(b"w2")) == [(queued1, 1), (queued2, 1)]
    assert not out.results(b"c1") and b"w1" not in out.peers
    w1 = cluster.scheduler.workers[b"w1"]
    assert w1.draining and set(w1.inflight) == {once, running}
    tasks = cluster.scheduler.tasks
    assert tasks[queued1].failures is None and tasks[queued2].failures is None
    assert cluster.stat("retried") == 0 and cluster.stat("workers_lost") == 0
    # New work never lands on it, even with its slots free and nowhere else to go.
    later = tid(cid, 5)
    cluster.send(b"w2", m.TaskResults([result(queued1, 1), result(queued2, 1)]))
    out = cluster.send(b"c1", m.SubmitTasks([spec(later)]))
    assert [d.task_id for d in out.dispatched(b"w2")] == [later] and not out.dispatched(b"w1")
    # Its running tasks' results count as usual: each delivered once.
    out = cluster.send(b"w1", m.TaskResults([result(once, 0), result(running, 0), result(queued1, 0)]))
    delivered = [(r.task_id, r.status) for r in out.results(b"c1")]
    assert sorted(delivered) == sorted([(once, Status.OK), (running, Status.OK)])
    assert not w1.inflight and not out.dispatched(b"w1")
    # Its Goodbye, holding nothing, changes nothing.
    out = cluster.send(b"w1", m.Goodbye("worker stopping", []))
    assert not out.results(b"c1") and cluster.stat("workers_lost") == 0 and cluster.stat("failed") == 0
    assert set(cluster.scheduler.tasks) == {later}


def test_a_draining_workers_goodbye_follows_the_usual_rules(cluster: Cluster) -> None:
    """The drain ran out (or the worker was stopped at once): what it still held when it
    said Goodbye may have started, so an at-most-once task fails as before; a draining
    worker alone gets nothing even with tasks waiting, which wait for another."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    once = tid(cid, 1)
    cluster.send(b"c1", m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)), m.SubmitTasks([spec(once, options_id=1)]))
    cluster.send(b"w1", m.WorkerDraining([]))
    waiting = tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(waiting)]))
    assert not out.dispatched(b"w1")
    out = cluster.send(b"w1", m.WorkerDraining([m.TaskAttempt(once, 3)]))  # not its attempt: nothing
    assert set(cluster.scheduler.workers[b"w1"].inflight) == {once} and not out.peers - {b"w1"}
    out = cluster.send(b"w1", m.Goodbye("worker stopping", []))
    (lost,) = out.results(b"c1")
    assert lost.task_id == once and lost.status == Status.WORKER_LOST
    out = cluster.worker(b"w2")
    assert [d.task_id for d in out.dispatched(b"w2")] == [waiting]


def test_a_worker_that_drains_shows_as_draining_in_statistics(cluster: Cluster) -> None:
    cluster.worker(b"w1")
    cluster.send(b"w1", m.WorkerDraining([]))
    (worker,) = cluster.scheduler.statistics().workers
    assert worker.name == "w1" and worker.draining


def test_a_worker_joining_again_interrupts_what_it_held(cluster: Cluster) -> None:
    """A worker's repeated Hello means it forgot (and killed) what it held: nothing it held
    is vouched for, so an at-most-once task fails, an ordinary one goes back for free."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    once, ordinary = tid(cid, 1), tid(cid, 2)
    cluster.send(
        b"c1", m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)), m.SubmitTasks([spec(once, options_id=1), spec(ordinary)])
    )
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=2))
    (lost,) = out.results(b"c1")
    assert lost.task_id == once and lost.status == Status.WORKER_LOST
    assert msgpack.unpackb(lost.payload)[1] == ["attempt 1: worker w1: left: joined again"]
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w1")] == [(ordinary, 1)]
    assert cluster.scheduler.tasks[ordinary].failures is None


def test_lost_worker_with_a_cancelling_task(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    cluster.send(b"c1", m.CancelTasks([t], True))
    out = lose(cluster, b"w1", "unreachable")
    assert t not in cluster.scheduler.tasks, "a cancelled task is not retried"
    # Its worker's answer will never come: the daemon gives it (the future would hang).
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(t, Status.CANCELLED)]
    cluster.worker(b"w2")
    assert not cluster.scheduler.workers[b"w2"].inflight



def test_a_force_cancelled_task_whose_worker_is_lost_ends_its_dependents(cluster: Cluster) -> None:
    """Found by the core fuzz: the dependent waited on a task that was gone."""
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([a], True))
    out = lose(cluster, b"w1", "unreachable")
    assert sorted((r.task_id, r.status) for r in out.results(b"c1")) == [(a, Status.CANCELLED), (b, Status.CANCELLED)]
    assert not cluster.scheduler.tasks


def test_a_force_cancelled_task_that_ended_first_ends_its_dependents(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([a], True))
    out = cluster.send(b"w1", m.TaskResults([result(a)]))  # it ended before the kill
    assert sorted((r.task_id, r.status) for r in out.results(b"c1")) == [(a, Status.OK), (b, Status.CANCELLED)]
    assert not cluster.scheduler.tasks


def test_a_task_id_used_again_after_a_cancel_is_not_a_dependent(cluster: Cluster) -> None:
    """Found by the core fuzz: a dependent cancelled while waiting stayed on its dependency's
    list, so a task submitted later under the same id counted as its dependent."""
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([b], False))
    cluster.send(b"c1", m.SubmitTasks([spec(b)]))  # validate() runs after each step
    out = cluster.send(b"w1", m.TaskResults([result(a)]))
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(a, Status.OK)]
    assert cluster.scheduler.tasks[b].waiting == 0


def test_a_task_that_depends_on_itself_is_rejected_and_twice_on_one_counts_once(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    a, b, c = tid(cid, 1), tid(cid, 2), tid(cid, 3)
    out = cluster.send(b"c1", m.SubmitTasks([spec(a, deps=[a])]))
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(a, Status.REJECTED)]
    assert b"depends on itself" in out.results(b"c1")[0].payload
    cluster.send(b"c1", m.SubmitTasks([spec(b), spec(c, deps=[b, b])]))
    assert cluster.scheduler.tasks[c].deps == [b] and cluster.scheduler.tasks[b].holds == 1
    out = cluster.send(b"w1", m.TaskResults([result(b)]))
    assert [d.task_id for d in out.dispatched(b"w1")] == [c]

# ====================================================================== client loss


@pytest.mark.parametrize("how", ["goodbye", "silence", "unreachable"])
def test_client_lost(cluster: Cluster, how: str) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    ids = [tid(cid, n) for n in range(1, 5)]
    out = cluster.send(b"c1", m.SubmitTasks([spec(t, fn) for t in ids]))
    at_worker = [d.task_id for d in out.dispatched(b"w1")]
    assert len(at_worker) == 2
    if how == "goodbye":
        out = cluster.send(b"c1", m.Goodbye("done"))
    elif how == "silence":
        cluster.now += DEADLINE + 0.1
        cluster.keepalive(b"w1")
        out = cluster.tick()
    else:
        out = cluster.step(PeerUnreachable(b"c1", cluster.now))
    assert cluster.stat("clients") == 0
    # A client that said Goodbye left; one that went silent or unreachable was lost.
    assert (cluster.stat("clients_left"), cluster.stat("clients_lost")) == ((1, 0) if how == "goodbye" else (0, 1))
    assert {type(x) for x in out.to(b"w1")} == {m.CancelTasks}
    assert sorted(t for c in out.of(b"w1", m.CancelTasks) for t in c.task_ids) == sorted(at_worker)
    assert not out.dispatched(b"w1")
    assert b"c1" not in out.peers
    assert set(cluster.scheduler.tasks) == set(at_worker), "its pending tasks are dropped"
    # Results that come later go nowhere, and the function goes with the last of them.
    out = cluster.send(b"w1", m.TaskResults([result(at_worker[0])]))
    assert b"c1" not in out.peers and not out.of(b"w1", m.ReleaseFunctions)
    out = cluster.send(
        b"w1", m.TaskResults([result(at_worker[1], status=Status.CANCELLED, payload=b"")])
    )
    assert out.to(b"w1") == [m.ReleaseFunctions([fn])]
    assert b"c1" not in out.peers
    assert cluster.stat("tasks") == 0 and cluster.stat("functions") == 0


def test_client_lost_does_not_touch_other_clients(cluster: Cluster) -> None:
    a = cluster.client(b"a")
    b = cluster.client(b"b")
    cluster.worker(b"w1", capacity=4)
    cluster.send(b"a", m.SubmitTasks([spec(tid(a, 1))]))
    cluster.send(b"b", m.SubmitTasks([spec(tid(b, 1))]))
    out = cluster.send(b"a", m.Goodbye("done"))
    assert out.to(b"w1") == [m.CancelTasks([tid(a, 1)], False)]
    answer = result(tid(b, 1))
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"b") == [answer]


# ====================================================================== heartbeats


def test_heartbeats_to_silent_peers(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1", capacity=1)
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.send(
        b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 5)])
    )  # 2 dispatched, 2 queued
    assert cluster.notices().peers == {b"c1"}  # its acks, NOTICE_DELAY later
    out = cluster.tick(INTERVAL / 2)
    assert not out.peers, "nobody has been silent for an interval yet"
    out = cluster.tick(INTERVAL / 2)
    assert out.peers == {b"c1", b"w1", b"m1"}
    for peer in out.peers:
        assert out.to(peer) == [m.Heartbeat(2, 2)]
    # Just heard from the daemon: no heartbeat until another interval of silence.
    assert not cluster.tick(INTERVAL / 2).peers


def test_no_heartbeat_where_a_message_is_going_anyway(cluster: Cluster) -> None:
    cluster.client()
    cluster.worker(b"w1")
    cluster.now += INTERVAL
    out = cluster.step(Received(b"c1", [m.StatsRequest()], cluster.now), Tick(cluster.now))
    assert [type(x) for x in out.to(b"c1")] == [m.Stats]
    assert out.to(b"w1") == [m.Heartbeat(0, 0)]


def test_workers_hear_from_the_daemon_four_times_a_liveness_limit_not_every_interval() -> None:
    """protocol/rejoin.py's idle_heartbeat: a worker judges the daemon's silence by at least
    the daemon's interval × liveness (its Welcome), so the daemon beats to a quiet worker a
    quarter of that; clients and monitors, which judge it by their own settings, still get one
    every interval."""
    cluster = Cluster(CONFIG.replace(heartbeat_liveness=10, client_timeout=10.0))
    quiet = 10 * INTERVAL / 4
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    beats: dict[bytes, list[float]] = {b"c1": [], b"w1": [], b"m1": []}
    start = cluster.now
    while cluster.now < start + 5 * quiet:
        out = cluster.tick(INTERVAL / 8)
        for peer in out.peers:
            assert out.to(peer) == [m.Heartbeat(0, 0)]
            beats[peer].append(round(cluster.now - start, 6))
        cluster.keepalive(b"c1", b"w1", b"m1")  # they beat too: none is lost meanwhile
    assert beats[b"w1"] == [quiet * k for k in range(1, 6)]
    for peer in (b"c1", b"m1"):
        assert beats[peer] == [INTERVAL * k for k in range(1, 13)], peer


def test_refused_peers_get_no_heartbeats(cluster: Cluster) -> None:
    cluster.send(b"p", hello(python="2.7"))
    assert not cluster.tick(INTERVAL * 2).peers


def test_silent_monitor_is_forgotten(cluster: Cluster) -> None:
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.tick(DEADLINE + 0.1)
    out = cluster.send(b"m1", m.StatsRequest())
    assert "send Hello first" in out.one(b"m1", m.Refused).reason


# ====================================================================== broken cluster


def test_cluster_broken_is_forwarded_and_the_worker_gets_no_more_tasks(cluster: Cluster) -> None:
    a = cluster.client(b"a")
    cluster.client(b"b")
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"a", m.SubmitTasks([spec(tid(a, 1))]))
    broken = m.ClusterBroken("initializer failed: ImportError", b"pickled-exc")
    out = cluster.send(b"w1", broken)
    assert out.to(b"a") == [broken] and out.to(b"b") == [broken]
    out = cluster.send(b"a", m.SubmitTasks([spec(tid(a, n)) for n in range(2, 5)]))
    assert not out.dispatched(b"w1"), "a broken worker gets no more tasks"
    assert cluster.stat("tasks_pending") == 3
    # What it already held still settles.
    answer = result(tid(a, 1), status=Status.ERROR, payload=b"exc")
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"a") == [answer]
    assert not cluster.tick().dispatched(b"w1")
    out = cluster.worker(b"w2", capacity=2)
    assert len(out.dispatched(b"w2")) == 3


# ====================================================================== rejection


@pytest.mark.parametrize(
    "case", ["unknown-fn", "foreign-id", "reused-id", "unknown-options"]
)
def test_rejected_tasks(cluster: Cluster, case: str) -> None:
    cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.worker(b"w1", capacity=4)
    live = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(live, fn)]))
    cluster.notices()
    bad, reason = {
        "unknown-fn": (spec(tid(cid, 2), tid(cid, 77)), b"never registered"),
        "foreign-id": (spec(tid(other, 2), fn), b"not this client's"),
        "reused-id": (spec(live, fn), b"reused"),
        "unknown-options": (spec(tid(cid, 2), fn, options_id=5), b"options record 5"),
    }[case]
    out = cluster.send(b"c1", m.SubmitTasks([bad]))
    (rejected,) = out.results(b"c1")
    assert (rejected.task_id, rejected.status) == (bad.task_id, Status.REJECTED)
    assert reason in rejected.payload
    assert out.acked(b"c1") == 1
    assert not out.dispatched(b"w1")
    assert set(cluster.scheduler.tasks) == {live}
    assert cluster.scheduler.tasks[live].state is TaskState.DISPATCHED
    assert not out.to(b"c2")
    assert cluster.stat("failed") == 1


# ====================================================================== statistics, roles, faults


def test_stats(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 4)]))
    for peer in (b"c1", b"m1"):
        stats = cluster.send(peer, m.StatsRequest()).one(peer, m.Stats).snapshot
        assert (
            stats["tasks"] == 3 and stats["tasks_dispatched"] == 2 and stats["tasks_pending"] == 1
        )
        assert stats["workers"] == 1 and stats["processors"] == 1 and stats["clients"] == 1
        assert stats["submitted"] == 3


@pytest.mark.parametrize(
    "role, message",
    [
        (m.Role.CLIENT, m.TaskResults([result(1)])),
        (m.Role.CLIENT, m.ClusterBroken("x", b"")),
        (m.Role.CLIENT, m.DispatchTasks([], [])),
        (m.Role.WORKER, m.SubmitTasks([spec(1)])),
        (m.Role.WORKER, m.StatsRequest()),
        (m.Role.MONITOR, m.SubmitTasks([spec(1)])),
        (m.Role.MONITOR, m.CancelTasks([1], True)),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else x,
)
def test_message_not_accepted_from_role_is_refused_and_counted(
    cluster: Cluster, role: str, message: Any
) -> None:
    cluster.join(b"p", hello(role))
    before = cluster.scheduler.statistics()
    out = cluster.send(b"p", message, m.Heartbeat(0, 0))
    assert not out.peers
    after = cluster.scheduler.statistics()
    assert after["refused"] == int(before["refused"]) + 1
    assert {k: v for k, v in after.items() if k != "refused"} == {
        k: v for k, v in before.items() if k != "refused"
    }


def test_an_exception_in_a_handler_costs_one_message(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    # A message that passed the codec cannot be malformed; one built by a buggy peer
    # library in-process can.  The handler fails on it; the next message still counts.
    out = cluster.send(b"c1", m.CancelTasks(None, False), m.SubmitTasks([spec(tid(cid, 1))]))  # type: ignore[arg-type]
    assert out.dispatched(b"w1") and cluster.notices().acked(b"c1") == 1
    assert cluster.stat("dropped_messages") == 1
    assert "failed to handle CancelTasks" in caplog.text
    answer = result(tid(cid, 1))
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"c1") == [answer]


# ====================================================================== randomized


@dataclass
class ClientModel:
    peer: bytes
    client_id: int
    next_n: int = 1
    fns: list[int] = field(default_factory=list)  # registered, not released
    options: list[int] = field(default_factory=lambda: [0])
    submitted: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)  # asked to cancel (force or not)
    dropped: set[int] = field(default_factory=set)  # the daemon answered: never runs
    refused: set[int] = field(default_factory=set)  # the daemon answered: may run
    forced: set[int] = field(default_factory=set)  # cancelled with force (no answer comes)
    results: Counter[int] = field(default_factory=Counter)
    sent: int = 0
    acked: int = 0


@dataclass
class WorkerModel:
    peer: bytes
    pid: int
    held: dict[int, int] = field(default_factory=dict)  # task id -> attempt
    cancel_asked: set[int] = field(default_factory=set)
    fns: set[int] = field(default_factory=set)
    silent: bool = False
    broken: bool = False
    draining: bool = False


class World:
    """Clients and workers that follow the protocol, around a real Scheduler."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cluster = Cluster(CONFIG.replace(max_retries=1, max_prefetch=3))
        self.clients: dict[bytes, ClientModel] = {}
        self.workers: dict[bytes, WorkerModel] = {}
        self.gone: set[bytes] = set()
        self.serial = 0

    # ---------------------------------------------------------------- observing

    def absorb(self, out: Out) -> None:
        for peer, messages in out.by_peer.items():
            assert peer not in self.gone, f"sent {messages} to {peer!r}, which is gone"
            if peer in self.clients:
                self._client_receives(self.clients[peer], messages)
            elif peer in self.workers:
                self._worker_receives(self.workers[peer], messages)
            else:
                raise AssertionError(f"sent {messages} to unknown {peer!r}")

    def _client_receives(self, client: ClientModel, messages: list[Any]) -> None:
        for message in messages:
            kind = type(message)
            if kind is m.SubmitAck:
                client.acked += message.count
            elif kind is m.TasksRunning:
                assert set(message.task_ids) <= client.submitted
            elif kind is m.TaskResults:
                for r in message.results:
                    assert r.task_id in client.submitted, (
                        f"result for a task {client.peer!r} never submitted"
                    )
                    assert r.status != Status.PROCESSOR_DIED
                    if r.status == Status.CANCELLED:
                        assert r.task_id in client.cancelled, "cancelled without being asked"
                    assert r.task_id not in client.dropped, "a result for a task said dropped"
                    client.results[r.task_id] += 1
                    assert client.results[r.task_id] == 1, f"task {r.task_id:#x} got two results"
            elif kind is m.TasksCancelled:
                asked = set(message.cancelled) | set(message.refused)
                assert asked <= client.cancelled, "an answer to a cancel never asked"
                assert not set(message.cancelled) & set(client.results), "dropped after its result"
                client.dropped.update(message.cancelled)
                client.refused.update(message.refused)
            else:
                assert kind in (m.Welcome, m.Heartbeat, m.Stats, m.ClusterBroken, m.TasksWithoutWorker), message

    def _worker_receives(self, worker: WorkerModel, messages: list[Any]) -> None:
        for message in messages:
            kind = type(message)
            if kind is m.DispatchTasks:
                assert not worker.broken, "a broken worker got tasks"
                assert not worker.draining, "a draining worker got tasks"
                for blob in message.functions:
                    assert blob.fn_id not in worker.fns, "a function sent twice to one worker"
                    worker.fns.add(blob.fn_id)
                for task in message.tasks:
                    assert not task.fn_id or task.fn_id in worker.fns, (
                        "task sent without its function"
                    )
                    assert task.task_id not in worker.held, "task sent twice to one worker"
                    worker.held[task.task_id] = task.attempt
            elif kind is m.CancelTasks:
                worker.cancel_asked.update(t for t in message.task_ids if t in worker.held)
            elif kind is m.ReleaseFunctions:
                assert set(message.fn_ids) <= worker.fns
                worker.fns.difference_update(message.fn_ids)
            else:
                assert kind in (m.Welcome, m.Heartbeat), message

    def send(self, peer: bytes, *messages: Any) -> None:
        self.absorb(self.cluster.send(peer, *messages))

    def step(self, *events: Any) -> None:
        self.absorb(self.cluster.step(*events))

    # ---------------------------------------------------------------- actions

    def join_client(self) -> None:
        self.serial += 1
        peer = b"c%d" % self.serial
        self.clients[peer] = None  # type: ignore[assignment]  # so the Welcome is absorbed
        out = self.cluster.send(peer, hello(m.Role.CLIENT, name=peer.decode()))
        self.clients[peer] = ClientModel(peer, out.one(peer, m.Welcome).peer_id)

    def join_worker(self) -> None:
        self.serial += 1
        peer = b"w%d" % self.serial
        self.workers[peer] = WorkerModel(peer, pid=self.serial)
        self.absorb(
            self.cluster.worker(peer, capacity=self.rng.choice([1, 1, 2, 3]), pid=self.serial)
        )

    def register(self, client: ClientModel) -> None:
        fn = tid(client.client_id, 1_000_000 + client.next_n)
        client.next_n += 1
        client.fns.append(fn)
        self.send(client.peer, m.RegisterFunction(fn, b"fn"))

    def release(self, client: ClientModel) -> None:
        if client.fns:
            fn = client.fns.pop(self.rng.randrange(len(client.fns)))
            self.send(client.peer, m.ReleaseFunctions([fn]))

    def options(self, client: ClientModel) -> None:
        options_id = len(client.options)
        client.options.append(options_id)
        options = m.TaskOptions(
            {}, [], self.rng.choice([-1, 0, 0, 2]), None, self.rng.choice([None, None, 0, 3])
        )
        self.send(client.peer, m.RegisterOptions(options_id, options))

    def submit(self, client: ClientModel) -> None:
        specs = []
        for _ in range(self.rng.randint(1, 5)):
            t = tid(client.client_id, client.next_n)
            client.next_n += 1
            roll = self.rng.random()
            if roll < 0.05:
                fn = tid(client.client_id, 999_999)  # never registered: rejected
            elif roll < 0.5 or not client.fns:
                fn = 0
            else:
                fn = self.rng.choice(client.fns)
            specs.append(spec(t, fn, options_id=self.rng.choice(client.options)))
            client.submitted.add(t)
        client.sent += len(specs)
        self.send(client.peer, m.SubmitTasks(specs))

    def cancel(self, client: ClientModel) -> None:
        open_ = sorted(
            t for t in client.submitted if not client.results[t] and t not in client.cancelled
        )
        if open_:
            chosen = self.rng.sample(open_, min(len(open_), self.rng.randint(1, 3)))
            client.cancelled.update(chosen)  # the client's futures were cancelled
            force = self.rng.random() < 0.3
            if force:
                client.forced.update(chosen)
            self.send(client.peer, m.CancelTasks(chosen, force))

    def answer(self, worker: WorkerModel, everything: bool = False) -> None:
        if not worker.held:
            return
        chosen = (
            list(worker.held)
            if everything
            else self.rng.sample(sorted(worker.held), self.rng.randint(1, len(worker.held)))
        )
        results = []
        for t in chosen:
            attempt = worker.held.pop(t)
            if t in worker.cancel_asked:
                worker.cancel_asked.discard(t)
                status = Status.CANCELLED
            elif everything:
                status = Status.OK
            else:
                status = self.rng.choice(
                    [Status.OK] * 6 + [Status.ERROR, Status.PROCESSOR_DIED, Status.TIMEOUT]
                )
            results.append(result(t, attempt, status))
        if not everything and self.rng.random() < 0.2:
            # a stale or duplicate answer now and then
            results.append(result(self.rng.choice(chosen), self.rng.randint(0, 3)))
        self.send(worker.peer, m.TaskResults(results))

    def lose_worker(self, worker: WorkerModel) -> None:
        how = self.rng.choice(["goodbye", "exited", "unreachable", "silent"])
        if how == "silent":
            worker.silent = True  # lost at the next long tick
            return
        del self.workers[worker.peer]
        self.gone.add(worker.peer)
        if how == "goodbye":
            # Some of what it holds, handed back as never started (the others may have).
            unstarted = [m.TaskAttempt(t, a) for t, a in worker.held.items() if self.rng.random() < 0.5]
            self.step(Received(worker.peer, [m.Goodbye("scaling down", unstarted)], self.cluster.now))
        elif how == "exited":
            self.step(WorkerExited(worker.pid, "node-1", "exit code -9", self.cluster.now))
        else:
            self.step(PeerUnreachable(worker.peer, self.cluster.now))

    def drain_worker(self, worker: WorkerModel) -> None:
        """SIGTERM with --drain-seconds: it hands back some of what it holds as never started
        (perhaps again later) and finishes the rest."""
        worker.draining = True
        unstarted = [m.TaskAttempt(t, a) for t, a in worker.held.items() if self.rng.random() < 0.5]
        for u in unstarted:
            del worker.held[u.task_id]
            worker.cancel_asked.discard(u.task_id)
        self.send(worker.peer, m.WorkerDraining(unstarted))

    def lose_client(self, client: ClientModel) -> None:
        del self.clients[client.peer]
        self.gone.add(client.peer)
        self.step(Received(client.peer, [m.Goodbye("done")], self.cluster.now))

    def tick(self, dt: float) -> None:
        self.cluster.now += dt
        alive = [Received(p, [m.Heartbeat(0, 0)], self.cluster.now) for p in self.clients]
        alive += [
            Received(p, [m.Heartbeat(0, 0)], self.cluster.now)
            for p, w in self.workers.items()
            if not w.silent
        ]
        for peer in [p for p, w in self.workers.items() if w.silent and dt > DEADLINE]:
            del self.workers[peer]
            self.gone.add(peer)
        self.step(*alive, Tick(self.cluster.now))

    def random_step(self) -> None:
        rng = self.rng
        clients = list(self.clients.values())
        workers = [w for w in self.workers.values() if not w.silent]
        roll = rng.random()
        if roll < 0.30 and clients:
            self.submit(rng.choice(clients))
        elif roll < 0.55 and workers:
            self.answer(rng.choice(workers))
        elif roll < 0.62 and clients:
            self.cancel(rng.choice(clients))
        elif roll < 0.66 and clients:
            self.register(rng.choice(clients))
        elif roll < 0.68 and clients:
            self.release(rng.choice(clients))
        elif roll < 0.70 and clients:
            self.options(rng.choice(clients))
        elif roll < 0.74 and len(self.workers) < 5:
            self.join_worker()
        elif roll < 0.77 and workers:
            self.lose_worker(rng.choice(workers))
        elif roll < 0.78 and workers:
            worker = rng.choice(workers)
            worker.broken = True
            self.send(worker.peer, m.ClusterBroken("initializer failed", b""))
        elif roll < 0.79 and len(self.clients) < 4:
            self.join_client()
        elif roll < 0.795 and len(clients) > 1:
            self.lose_client(rng.choice(clients))
        elif roll < 0.80 and clients:
            self.send(rng.choice(clients).peer, m.StatsRequest())
        elif roll < 0.82:
            self.tick(DEADLINE + 0.5)
        elif roll < 0.83 and workers:
            self.drain_worker(rng.choice(workers))
        else:
            self.tick(rng.uniform(0.05, 0.6))

    def drain(self) -> None:
        for worker in self.workers.values():
            worker.silent = False
        for _ in range(500):
            if not self.cluster.scheduler.tasks:
                return
            if not any(not w.broken and not w.draining for w in self.workers.values()):
                self.join_worker()
            for worker in list(self.workers.values()):
                self.answer(worker, everything=True)
            self.tick(0.1)
        raise AssertionError(
            f"tasks never settled: {list(self.cluster.scheduler.tasks.values())[:5]}"
        )


@pytest.mark.parametrize("seed", range(3))
def test_randomized_no_task_lost(seed: int) -> None:
    world = World(seed)
    for _ in range(2):
        world.join_client()
        world.join_worker()
    for client in list(world.clients.values()):
        world.register(client)
    for _ in range(2500):
        world.random_step()
    world.drain()

    scheduler = world.cluster.scheduler
    assert not scheduler.tasks and not scheduler.ready.live
    for client in world.clients.values():
        assert client.acked == client.sent, (
            f"{client.peer!r}: {client.sent} sent, {client.acked} acknowledged"
        )
        for t in client.submitted:
            outcomes = client.results[t]
            assert outcomes == 1 or (outcomes == 0 and t in client.dropped | client.forced), (
                f"task {t:#x} of {client.peer!r} lost silently"
            )
            assert t in client.forced or not (t in client.dropped and outcomes), t
    # Functions outlive their tasks only while their client keeps them registered.
    assert set(scheduler.functions) == {fn for c in world.clients.values() for fn in c.fns}
    assert not scheduler.function_refs or not any(scheduler.function_refs.values())
    for worker in world.workers.values():
        assert worker.fns <= set(scheduler.functions), "a worker keeps a function nobody may use"


def test_client_silence_is_judged_by_client_timeout() -> None:
    """A client may pause for seconds (a full garbage collection over a million futures):
    the daemon drops it after client_timeout, not after the workers' liveness deadline."""
    cluster = Cluster(CONFIG.replace(client_timeout=DEADLINE * 10))
    cluster.client()
    cluster.worker(b"w1")
    cluster.now += DEADLINE * 5
    cluster.keepalive(b"w1")
    cluster.tick()
    assert cluster.stat("clients") == 1
    cluster.now += DEADLINE * 6
    cluster.keepalive(b"w1")
    cluster.tick()
    assert cluster.stat("clients") == 0
