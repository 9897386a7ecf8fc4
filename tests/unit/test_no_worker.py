"""Tasks queued with no worker able to run them (scheduler/no_worker.py), through the
daemon's pure core with a fake clock: when the client is told, what it is told, once per
episode, and what the statistics say.  Every step runs ``validate()`` and sends what the
core emits through the codec, as tests/unit/test_core.py does."""

from __future__ import annotations

from typing import Any

import cloudpickle
import pytest

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import TASK_ID_BITS, TaskFlags
from scaler_executor.scheduler.core import Received, Scheduler, Send, Tick

AFTER = 5.0  # no_worker_warning
CONFIG = ClusterConfig(heartbeat_interval=1.0, heartbeat_liveness=3, client_timeout=1000.0, no_worker_warning=AFTER)
GPU = m.TaskOptions({"gpu": 1.0}, [], 0, None, None)
SSD = m.TaskOptions({}, ["ssd"], 0, None, None)


def hello(role: str, name: str, **changes: Any) -> m.Hello:
    return m.Hello(
        role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 4242, "node-1",
        1 if role == m.Role.WORKER else 0, {}, [],
    )._replace(**changes)


class Cluster:
    def __init__(self, config: ClusterConfig = CONFIG) -> None:
        self.scheduler = Scheduler(config)
        self.now = 1000.0
        self.ids: dict[bytes, int] = {}
        self.numbers: dict[bytes, int] = {}

    def step(self, *events: Any) -> dict[bytes, list[Any]]:
        commands = self.scheduler.handle(*events)
        self.scheduler.validate()
        out: dict[bytes, list[Any]] = {}
        for command in commands:
            if type(command) is Send:
                assert decode(encode(command.messages))[0] == command.messages
                out[command.peer] = list(command.messages)
        return out

    def send(self, peer: bytes, *messages: Any) -> dict[bytes, list[Any]]:
        return self.step(Received(peer, list(messages), self.now))

    def tick(self, dt: float) -> dict[bytes, list[Any]]:
        """Let ``dt`` pass, every worker keeping alive, in ticks of at most a second."""
        out: dict[bytes, list[Any]] = {}
        while dt > 1e-9:
            step = min(1.0, dt)
            self.now += step
            dt -= step
            for worker in list(self.scheduler.workers):
                self.send(worker, m.Heartbeat(0, 0))
            for peer, messages in self.step(Tick(self.now)).items():
                out.setdefault(peer, []).extend(messages)
        return out

    def join(self, peer: bytes, role: str, **changes: Any) -> None:
        out = self.send(peer, hello(role, peer.decode(), **changes))
        (welcome,) = [x for x in out[peer] if type(x) is m.Welcome]
        self.ids[peer] = welcome.peer_id

    def submit(self, peer: bytes, count: int, options: m.TaskOptions | None = None) -> list[int]:
        first = self.numbers.get(peer, 0)
        self.numbers[peer] = first + count
        ids = [self.ids[peer] << TASK_ID_BITS | (first + i + 1) for i in range(count)]
        messages: list[Any] = []
        options_id = 0
        if options is not None:
            options_id = 1 if options == GPU else 2
            messages.append(m.RegisterOptions(options_id, options))
        messages.append(
            m.SubmitTasks([m.TaskSpec(t, 0, options_id, TaskFlags.INLINE_FN, b"x", [], [], 0) for t in ids])
        )
        self.send(peer, *messages)
        return ids

    def stat(self, key: str) -> Any:
        return self.scheduler.statistics()[key]


def notices(out: dict[bytes, list[Any]], peer: bytes) -> list[m.TasksWithoutWorker]:
    return [x for x in out.get(peer, []) if type(x) is m.TasksWithoutWorker]


def test_tasks_with_no_worker_at_all_are_reported_once_after_no_worker_warning() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.submit(b"c1", 3)
    c.tick(1)  # the first tick that sees them starts the episode
    assert not notices(c.tick(AFTER - 1), b"c1")
    assert c.stat("tasks_without_worker") == 0  # waiting, but not for long enough yet
    (notice,) = notices(c.tick(1), b"c1")
    assert notice.tasks == 3 and notice.reason == "no worker is connected"
    assert notice.waited == AFTER
    assert (c.stat("tasks_without_worker"), c.stat("no_worker_episodes")) == (3, 1)
    assert not notices(c.tick(3 * AFTER), b"c1"), "told twice in one episode"
    c.join(b"w1", m.Role.WORKER)  # a worker joins: the tasks go to it, the episode ends
    assert c.stat("tasks_without_worker") == 0, "at once, not at the next tick"
    c.tick(1)
    assert c.stat("tasks_without_worker") == 0


def test_the_only_worker_dying_starts_an_episode_and_each_episode_is_told() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.join(b"w1", m.Role.WORKER)
    c.submit(b"c1", 2)
    assert not notices(c.tick(2 * AFTER), b"c1")  # a worker holds them: no problem
    c.send(b"w1", m.Goodbye("killed"))  # its tasks are queued again, and no worker is left
    assert not notices(c.tick(AFTER), b"c1")
    (notice,) = notices(c.tick(1), b"c1")
    assert (notice.tasks, notice.reason) == (2, "no worker is connected")
    c.join(b"w2", m.Role.WORKER)
    c.tick(1)
    c.send(b"w2", m.Goodbye("killed too"))
    (again,) = notices(c.tick(AFTER + 1), b"c1")  # a new episode: told again
    assert again.tasks == 2
    assert c.stat("no_worker_episodes") == 2


def test_tasks_needing_resources_or_tags_no_worker_has_are_reported_with_what_is_missing() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.join(b"w1", m.Role.WORKER, capacity=4, resources={"cpu": 4.0})
    c.submit(b"c1", 2, GPU)
    c.submit(b"c1", 1, SSD)
    c.submit(b"c1", 3)  # these run on w1
    (notice,) = notices(c.tick(AFTER + 1), b"c1")
    assert notice.tasks == 3
    assert "2: no connected worker has gpu=1" in notice.reason
    assert "1: no connected worker has tags ssd" in notice.reason
    assert c.stat("tasks_without_worker") == 3
    c.join(b"w2", m.Role.WORKER, resources={"gpu": 1.0})  # the gpu tasks can run now (one at a time)
    assert c.stat("tasks_without_worker") == 1, "at once, not at the next tick"
    c.tick(1)
    assert c.stat("tasks_without_worker") == 1


def test_a_busy_worker_that_can_run_the_tasks_later_is_no_problem() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.join(b"w1", m.Role.WORKER, capacity=1)
    c.submit(b"c1", 500)  # far beyond its prefetch: most stay queued
    assert c.scheduler.ready.live > 0
    assert not notices(c.tick(3 * AFTER), b"c1")
    assert c.stat("no_worker_episodes") == 0


def test_each_client_is_told_of_its_own_tasks_and_a_late_one_at_the_next_walk() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.join(b"c2", m.Role.CLIENT)
    c.submit(b"c1", 2)
    c.submit(b"c2", 5)
    out = c.tick(AFTER + 1)
    assert [n.tasks for n in notices(out, b"c1")] == [2]
    assert [n.tasks for n in notices(out, b"c2")] == [5]
    c.join(b"c3", m.Role.CLIENT)
    c.submit(b"c3", 1)  # joins the stuck queue late in the episode
    out = c.tick(AFTER)
    assert [n.tasks for n in notices(out, b"c3")] == [1]
    assert not notices(out, b"c1") and not notices(out, b"c2")


def test_draining_workers_count_as_none_and_the_reason_says_so() -> None:
    c = Cluster()
    c.join(b"c1", m.Role.CLIENT)
    c.join(b"w1", m.Role.WORKER)
    c.scheduler.workers[b"w1"].draining = True  # chosen to stop by the autoscaler
    c.submit(b"c1", 1)
    (notice,) = notices(c.tick(AFTER + 1), b"c1")
    assert notice.reason == "the 1 connected worker(s) are stopping or broken"


@pytest.mark.parametrize("setting", [None])
def test_no_warning_when_turned_off(setting: float | None) -> None:
    c = Cluster(CONFIG.replace(no_worker_warning=setting))
    c.join(b"c1", m.Role.CLIENT)
    c.submit(b"c1", 1)
    assert not notices(c.tick(10 * AFTER), b"c1")
    assert (c.stat("tasks_without_worker"), c.stat("no_worker_episodes")) == (0, 0)
