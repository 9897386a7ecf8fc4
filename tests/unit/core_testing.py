"""What the unit tests of the daemon's core share: ``Cluster``, a ``Scheduler`` with a fake
clock whose every step is checked (``validate()``, one batch per peer, every message through
the codec), its ``cluster`` fixture, the messages tests build, and ``CommandsCluster`` for
steps that yield more than sends.  A module with a unique name (see tests/scaler_testing.py
for why not conftest.py).
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import pytest

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
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


from scaler_executor.protocol import messages as m

#: A client, a worker and a monitor: the roles that may, may also and may not send objects.
PEERS_OF_EVERY_ROLE: tuple[tuple[bytes, str], ...] = ((b"c", m.Role.CLIENT), (b"w", m.Role.WORKER), (b"m", m.Role.MONITOR))


class CommandsCluster(Cluster):
    """``Cluster`` whose steps may also yield commands other than ``Send`` (store,
    object and manager commands): the sends are checked as ``Cluster`` checks them and
    returned as an ``Out``; the other commands of the last step are kept in ``others``."""

    others: list[Any]

    def step(self, *events: Any) -> Out:
        commands = self.scheduler.handle(*events)
        self.scheduler.validate()
        sends = [c for c in commands if type(c) is Send]
        for command in sends:
            assert decode(encode(command.messages))[0] == command.messages
        self.others = [c for c in commands if type(c) is not Send]
        return Out(sends)


def role_hello(role: str) -> m.Hello:
    """A ``Hello`` of a peer of ``role``, named after it, with one processor."""
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
                   role, 1, "h", 1, {}, [])


def joining(peers: tuple[tuple[bytes, str], ...] = PEERS_OF_EVERY_ROLE, now: float = 1.0) -> list[Received]:
    """The events of ``peers`` (peer, role) joining a core at ``now``."""
    return [Received(peer, [role_hello(role)], now) for peer, role in peers]
