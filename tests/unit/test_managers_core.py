"""Worker managers in the daemon's pure core (scheduler/managers.py), with a fake clock.

Several managers at once: the scaling decisions (ScaleWorkers) go where the tasks' needs
can run, capacity on its way (requested, pending) is not asked for twice, scale-down drains
first, and a manager's worker keys live only while it does (plus a bounded grace).
Every step runs ``validate()`` and round-trips every message through the codec.
"""

from __future__ import annotations

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
from scaler_executor.scheduler.capacity import Demand, ManagerView, desired_per_manager
from scaler_executor.scheduler.core import PeerUnreachable, Received, Scheduler, Send, Tick
from scaler_executor.scheduler.managers import ORPHAN_SECONDS, AdmitKeys, WithdrawKeys
from scaler_executor.scheduler.stats import Statistics, stats_message

IDLE = 5.0
CONFIG = ClusterConfig(heartbeat_interval=1.0, heartbeat_liveness=3, client_timeout=3.0, max_retries=2, scale_down_idle=IDLE)
T0 = 1000.0
GPU = m.TaskOptions({"gpu": 1.0}, [], 0, None, None)


def hello(role: str, name: str, **changes: Any) -> m.Hello:
    return m.Hello(
        role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 1, "node-1",
        0, {}, [],
    )._replace(**changes)  # fmt: skip


def offer(max_workers: int = 4, processors: int = 2, resources: dict[str, float] | None = None, **changes: Any) -> m.ManagerOffer:
    return m.ManagerOffer("local", max_workers, 0, processors, resources or {}, [], 1.0, "host node-2", [])._replace(**changes)


def change(name: str, state: str, **changes: Any) -> m.WorkerChange:
    return m.WorkerChange(name, state, "", "", "", "", 0.0, False)._replace(**changes)


class Step:
    """One step's output: messages by peer, and the other commands."""

    def __init__(self, commands: list[Any]) -> None:
        self.by_peer: dict[bytes, list[Any]] = {}
        self.other: list[Any] = []
        for command in commands:
            if type(command) is Send:
                assert decode(encode(command.messages))[0] == command.messages
                self.by_peer.setdefault(command.peer, []).extend(command.messages)
            else:
                self.other.append(command)

    def of(self, peer: bytes, cls: type) -> list[Any]:
        return [x for x in self.by_peer.get(peer, []) if type(x) is cls]

    def scale(self, peer: bytes) -> tuple[int, list[str]]:
        found = self.of(peer, m.ScaleWorkers)
        return sum(s.start for s in found), [n for s in found for n in s.stop]


class World:
    def __init__(self, config: ClusterConfig = CONFIG) -> None:
        self.core = Scheduler(config)
        self.now = T0
        self.client_id = 0
        self.n = 0

    def step(self, *events: Any) -> Step:
        out = Step(self.core.handle(*events))
        self.core.validate()
        return out

    def send(self, peer: bytes, *messages: Any) -> Step:
        return self.step(Received(peer, list(messages), self.now))

    def tick(self, dt: float = 0.0) -> Step:
        self.now += dt
        return self.step(Tick(self.now))

    def manager(self, peer: bytes, name: str, the_offer: m.ManagerOffer) -> None:
        out = self.send(peer, hello(m.Role.MANAGER, name), the_offer)
        assert out.of(peer, m.Welcome), out.by_peer

    def client(self) -> None:
        out = self.send(b"c", hello(m.Role.CLIENT, "c"))
        self.client_id = out.of(b"c", m.Welcome)[0].peer_id

    def submit(self, count: int, options_id: int = 0, options: m.TaskOptions | None = None) -> list[int]:
        ids = []
        messages: list[Any] = [m.RegisterOptions(options_id, options)] if options is not None else []
        specs = []
        for _ in range(count):
            self.n += 1
            task_id = self.client_id << TASK_ID_BITS | self.n
            ids.append(task_id)
            specs.append(m.TaskSpec(task_id, 0, options_id, TaskFlags.INLINE_FN, b"x", [], [], 0))
        self.send(b"c", *messages, m.SubmitTasks(specs))
        return ids

    def worker(self, name: str, processors: int = 2, resources: dict[str, float] | None = None) -> Step:
        peer = name.encode()
        return self.send(peer, hello(m.Role.WORKER, name, capacity=processors, resources=resources or {}))

    def alive(self, *peers: bytes) -> None:
        self.step(*[Received(p, [m.Heartbeat(0, 0)], self.now) for p in peers])


def dispatched(out: Step, peer: bytes) -> list[m.TaskDispatch]:
    return [t for d in out.of(peer, m.DispatchTasks) for t in d.tasks]


# ====================================================================== the pure policy


def view(processors: int = 2, resources: dict[str, float] | None = None, maximum: int = 4, held: int = 0, startup: float = 1.0) -> ManagerView:
    return ManagerView(processors, resources or {}, frozenset(), 0, maximum, startup, held)


@pytest.mark.parametrize(
    "demand, managers, expected",
    [
        ([], [view()], [0]),
        ([Demand((), (), 3)], [view()], [2]),  # 3 tasks, 2 processors a worker
        ([Demand((), (), 100)], [view()], [4]),  # a burst: straight to the maximum
        ([Demand((), (), 3)], [view(held=4)], [4]),  # the tasks its workers hold keep them
        # plain work goes to the plain manager first, overflows to the GPU one
        ([Demand((), (), 4)], [view(resources={"gpu": 1}), view()], [0, 2]),
        ([Demand((), (), 20)], [view(resources={"gpu": 1}), view()], [4, 4]),
        # GPU work only where there are GPUs, one task per GPU
        ([Demand((("gpu", 1.0),), (), 3)], [view(resources={"gpu": 1}), view()], [3, 0]),
        ([Demand((("gpu", 2.0),), (), 3)], [view(resources={"gpu": 1}), view()], [0, 0]),  # nobody can: ask nothing
        # the faster start-up first among equals
        ([Demand((), (), 2)], [view(startup=60.0), view(startup=1.0)], [0, 1]),
        # both kinds at once: the constrained kind is placed first
        ([Demand((), (), 8), Demand((("gpu", 1.0),), (), 2)], [view(resources={"gpu": 1}, maximum=3), view(maximum=2)], [3, 2]),
    ],
)
def test_desired_per_manager(demand: list[Demand], managers: list[ManagerView], expected: list[int]) -> None:
    assert desired_per_manager(demand, managers) == expected


def test_minimum_is_kept_when_idle() -> None:
    assert desired_per_manager([], [ManagerView(2, {}, frozenset(), 1, 4, 1.0, 0)]) == [1]


# ====================================================================== handshake and roles


def test_a_manager_is_welcomed_and_its_messages_are_its_own() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer())
    assert world.core.statistics()["managers"] == 1
    world.client()
    before = world.core.counters["refused"]
    world.send(b"c", offer(), m.WorkerKeys([m.WorkerKey("c-1", "k")]))
    assert world.core.counters["refused"] == before + 2, "a client may send no manager message"
    assert not world.core.managers.workers
    assert world.core.statistics()["managers"] == 1


def test_a_manager_joining_again_under_its_name_replaces_the_old_connection() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer())
    world.send(b"m1", m.WorkerStates([change("cpu-1", "pending")]))
    world.manager(b"m2", "cpu", offer(adopted=["cpu-1"]))  # restarted before its silence was noticed
    assert list(world.core.managers.managers) == [b"m2"]
    assert world.core.managers.workers["cpu-1"].manager == "cpu"
    out = world.send(b"m1", m.WorkerStates([change("cpu-1", "gone")]))
    assert out.of(b"m1", m.Refused), "the old connection is no longer a manager"
    assert "cpu-1" in world.core.managers.workers


def test_worker_names_carry_their_managers_prefix() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer())
    world.manager(b"m2", "gpu", offer())
    world.send(b"m1", m.WorkerStates([change("cpu-1", "requested")]))
    out = world.send(b"m2", m.WorkerStates([change("cpu-1", "gone")]), m.WorkerKeys([m.WorkerKey("other-1", "k")]))
    reasons = [r.reason for r in out.of(b"m2", m.Refused)]
    assert any("does not start with 'gpu-'" in r for r in reasons)
    assert world.core.managers.workers["cpu-1"].state == "requested", "another manager cannot end it"
    assert not [c for c in out.other if isinstance(c, AdmitKeys)]


# ====================================================================== scaling up


def test_a_burst_asks_once_and_pending_workers_count_as_capacity() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=4, processors=2))
    world.client()
    world.submit(5)  # 5 tasks, no worker: 3 workers of 2
    assert world.tick().scale(b"m1") == (3, [])
    assert world.tick(0.5).scale(b"m1") == (0, []), "asked already: not again before the manager answers"
    # The manager names them and sends their keys: the loop admits them, the manager hears so.
    out = world.send(b"m1", m.WorkerKeys([m.WorkerKey(f"cpu-{i}", f"key{i}") for i in range(3)]))
    assert out.of(b"m1", m.KeysAdmitted) == [m.KeysAdmitted(["cpu-0", "cpu-1", "cpu-2"])]
    assert out.other == [AdmitKeys("cpu", (("cpu-0", "key0"), ("cpu-1", "key1"), ("cpu-2", "key2")))]
    world.send(b"m1", m.WorkerStates([change(f"cpu-{i}", "pending", job=f"{100 + i}", reason="Resources") for i in range(3)]))
    stats = world.core.statistics()
    (cpu,) = stats.managers
    assert stats["managed_pending"] == 3 and cpu.starting == 3 and cpu.pending_reason == "Resources"
    assert (cpu.kind, cpu.connected, cpu.requested, cpu.pending_keys) == ("local", True, 0, 3)
    assert world.tick(1.0).scale(b"m1") == (0, []), "pending workers are capacity on its way"
    more = world.submit(4)
    assert world.tick(1.0).scale(b"m1") == (1, []), "only up to the maximum"
    # A worker joins under its name: it is the manager's, running, and gets tasks.
    world.send(b"m1", m.WorkerStates([change("cpu-0", "running", host="node-2")]))
    out = world.worker("cpu-0")
    assert len(dispatched(out, b"cpu-0")) == 4  # its window: 2 processors + 2 prefetched
    assert world.core.managers.workers["cpu-0"].peer == b"cpu-0"
    assert more


def test_tasks_go_to_the_manager_whose_workers_can_run_them() -> None:
    world = World()
    world.manager(b"mc", "cpu", offer(max_workers=4, processors=4))
    world.manager(b"mg", "gpu", offer(max_workers=2, processors=4, resources={"gpu": 1.0}))
    world.client()
    world.submit(3, options_id=1, options=GPU)  # would be rejected as unsatisfiable without the gpu manager
    out = world.tick()
    assert out.scale(b"mg") == (2, []) and out.scale(b"mc") == (0, [])
    world.submit(6)
    out = world.tick(0.5)
    assert out.scale(b"mc") == (2, []) and out.scale(b"mg") == (0, []), "plain tasks do not take GPU nodes"


def test_tasks_no_manager_can_run_are_still_unsatisfiable() -> None:
    world = World(CONFIG.replace(unsatisfiable_timeout=1.0))
    world.manager(b"mc", "cpu", offer())
    world.client()
    (task,) = world.submit(1, options_id=1, options=GPU)
    results = []
    for _ in range(3):
        world.alive(b"mc", b"c")
        results += [r for x in world.tick(1.0).of(b"c", m.TaskResults) for r in x.results]
    assert [(r.task_id, r.status) for r in results] == [(task, Status.REJECTED)]


# ====================================================================== scaling down


def test_idle_workers_are_drained_then_stopped_and_busy_ones_kept() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=2, processors=1))
    world.client()
    tasks = world.submit(2)
    assert world.tick().scale(b"m1") == (2, [])
    world.send(b"m1", m.WorkerStates([change("cpu-1", "requested"), change("cpu-2", "requested")]))
    held = {b"cpu-1": dispatched(world.worker("cpu-1", processors=1), b"cpu-1")}
    held[b"cpu-2"] = dispatched(world.worker("cpu-2", processors=1), b"cpu-2")
    assert {t.task_id for ts in held.values() for t in ts} == set(tasks)
    busy = b"cpu-1" if held[b"cpu-1"] else b"cpu-2"  # the window (2 a processor) may give one both
    idle = ({b"cpu-1", b"cpu-2"} - {busy}).pop()
    first = held[busy][0]
    world.send(busy, m.TaskResults([m.TaskResult(first.task_id, 0, Status.OK, b"v", m.NO_FACTS, [])]))
    for task in held[idle]:
        world.send(idle, m.TaskResults([m.TaskResult(task.task_id, 0, Status.OK, b"v", m.NO_FACTS, [])]))
    assert world.core.workers[busy].inflight and not world.core.workers[idle].inflight
    for _ in range(8):  # long past the idle time; the busy one still runs its task
        world.now += 1.0
        world.alive(b"m1", b"cpu-1", b"cpu-2", b"c")
        out = world.tick()
        if out.scale(b"m1")[1]:
            break
    assert out.scale(b"m1") == (0, [idle.decode()])
    assert world.core.workers[idle].draining and not world.core.workers[busy].draining
    # A new task does not land on the draining worker.
    (late,) = world.submit(1)
    assert late in world.core.tasks and not world.core.workers[idle].inflight
    # It ends; the manager says so; the daemon forgets it.
    world.send(idle, m.Goodbye("stopping"))
    world.send(b"m1", m.WorkerStates([change(idle.decode(), "gone", reason="exited with code 0")]))
    assert idle.decode() not in world.core.managers.workers
    assert world.core.counters["failed"] == 0


def test_pending_workers_are_cancelled_first() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=3, processors=1))
    world.client()
    tasks = world.submit(3)
    assert world.tick().scale(b"m1") == (3, [])
    world.send(b"m1", m.WorkerStates([change(f"cpu-{i}", "pending", reason="Priority") for i in range(3)]))
    world.send(b"c", m.CancelTasks(tasks, False))
    assert world.tick().scale(b"m1") == (0, []), "a surplus waits scale_down_idle"
    stopped: list[str] = []
    for _ in range(int(IDLE) + 1):
        world.now += 1.0
        world.alive(b"m1", b"c")
        stopped += world.tick().scale(b"m1")[1]
    assert sorted(stopped) == ["cpu-0", "cpu-1", "cpu-2"]


# ====================================================================== losses


def test_infrastructure_loss_retries_for_free_but_not_at_most_once_tasks() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=1, processors=2))
    world.client()
    free = world.submit(1)
    once = world.submit(1, options_id=1, options=m.TaskOptions({}, [], 0, None, 0))
    world.tick()
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running", job="4711", host="node-3")]))
    assert len(dispatched(world.worker("cpu-1"), b"cpu-1")) == 2
    out = world.send(
        b"m1", m.WorkerStates([change("cpu-1", "gone", reason="PREEMPTED", log_tail="slurmstepd: cancelled", infrastructure=True)])
    )
    results = [r for x in out.of(b"c", m.TaskResults) for r in x.results]
    assert [(r.task_id, r.status) for r in results] == [(once[0], Status.WORKER_LOST)]
    assert b"job 4711 on node-3: PREEMPTED" in results[0].payload
    assert world.core.tasks[free[0]].failures is None, "the preempted task's retry is not charged to it"


ONCE = m.TaskOptions({}, [], 0, None, 0)  # max_retries=0: at most once


def _three_tasks_at_a_slurm_job(world: World) -> tuple[int, int, int]:
    """An ordinary task and two at-most-once ones, all held by worker cpu-1 (job 4711)."""
    world.manager(b"m1", "cpu", offer(max_workers=1, processors=3))
    world.client()
    (ordinary,) = world.submit(1)
    started, unstarted = world.submit(2, options_id=1, options=ONCE)
    world.tick()
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running", job="4711", host="node-3")]))
    held = dispatched(world.worker("cpu-1", processors=3), b"cpu-1")
    assert sorted((t.task_id, t.attempt) for t in held) == [(ordinary, 0), (started, 0), (unstarted, 0)]
    return ordinary, started, unstarted


def _results(out: Step) -> dict[int, m.TaskResult]:
    return {r.task_id: r for x in out.of(b"c", m.TaskResults) for r in x.results}


def test_a_job_ended_by_slurm_whose_worker_says_goodbye_first_runs_at_most_once_tasks_once() -> None:
    """scancel, preemption or the walltime's drain signal: the worker gets SIGTERM and says
    Goodbye, listing what it hands back never started, seconds before the manager's poll
    reports the job gone.  The at-most-once task that may have started fails naming the
    worker and its job; the unstarted one and the ordinary one go back for free."""
    world = World()
    ordinary, started, unstarted = _three_tasks_at_a_slurm_job(world)
    out = world.send(b"cpu-1", m.Goodbye("worker stopping", [m.TaskAttempt(unstarted, 0)]))
    results = _results(out)
    assert list(results) == [started] and results[started].status == Status.WORKER_LOST
    text, lines = msgpack.unpackb(results[started].payload)
    assert "may have started on worker cpu-1" in text and "max_retries=0" in text, text
    assert lines == ["attempt 1: worker cpu-1 (manager cpu: job 4711 on node-3): left: worker stopping"]
    tasks = world.core.tasks
    assert set(tasks) == {ordinary, unstarted}
    assert tasks[ordinary].failures is None and tasks[unstarted].failures is None
    # The manager's report comes later: the worker is gone already, nothing more happens.
    out = world.send(b"m1", m.WorkerStates([change("cpu-1", "gone", reason="Slurm job 4711 CANCELLED", infrastructure=True)]))
    assert not _results(out) and set(world.core.tasks) == {ordinary, unstarted}
    again = dispatched(world.worker("cpu-2", processors=3), b"cpu-2")
    assert sorted((t.task_id, t.attempt) for t in again) == [(ordinary, 1), (unstarted, 1)]
    # The ordinary task's rerun is the manager's cost, not the task's: charged to manager cpu.
    stats = world.core.statistics()
    (cpu,) = stats.managers
    assert stats["tasks_interrupted"] == 1 and cpu.interrupted_tasks == 1
    assert cpu.infrastructure_ends == 1 and cpu.failed == 0 and cpu.last_error is None


def test_a_job_reported_gone_before_its_worker_says_goodbye_runs_at_most_once_tasks_once() -> None:
    """The other order: the manager reports the job ended by the infrastructure while its
    worker is still connected.  The daemon cannot know which at-most-once task started, so
    both fail naming the job and its fate; the ordinary task goes back for free, and the
    worker's late Goodbye (from a peer the daemon has forgotten) changes nothing."""
    world = World()
    ordinary, started, unstarted = _three_tasks_at_a_slurm_job(world)
    out = world.send(b"m1", m.WorkerStates([change("cpu-1", "gone", reason="Slurm job 4711 CANCELLED", infrastructure=True)]))
    results = _results(out)
    assert sorted(results) == sorted([started, unstarted])
    for result in results.values():
        assert result.status == Status.WORKER_LOST
        text, lines = msgpack.unpackb(result.payload)
        assert "may have started on worker cpu-1" in text and "max_retries=0" in text, text
        assert lines == ["attempt 1: worker cpu-1: manager cpu: job 4711 on node-3: Slurm job 4711 CANCELLED"]
    assert set(world.core.tasks) == {ordinary} and world.core.tasks[ordinary].failures is None
    out = world.send(b"cpu-1", m.Goodbye("worker stopping", [m.TaskAttempt(unstarted, 0)]))
    assert not _results(out) and set(world.core.tasks) == {ordinary}
    stats = world.core.statistics()
    (cpu,) = stats.managers
    assert stats["tasks_interrupted"] == 1 and cpu.interrupted_tasks == 1
    assert cpu.infrastructure_ends == 1 and stats["retried"] == 0


def test_a_lost_managers_keys_last_a_bounded_time_and_a_restart_adopts() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=2))
    world.send(b"m1", m.WorkerKeys([m.WorkerKey("cpu-1", "k1"), m.WorkerKey("cpu-2", "k2")]))
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running"), change("cpu-2", "pending")]))
    world.worker("cpu-1")
    world.step(PeerUnreachable(b"m1", world.now))
    assert world.core.statistics()["managers"] == 0
    # It comes back in time and adopts cpu-1 only: cpu-2's key goes.
    out = world.send(b"m9", hello(m.Role.MANAGER, "cpu"), offer(max_workers=2, adopted=["cpu-1"]))
    assert out.other == [WithdrawKeys(("k2",))]
    assert set(world.core.managers.workers) == {"cpu-1"}
    # Lost again: its worker that leaves meanwhile is forgotten, and its key withdrawn, at once.
    world.step(PeerUnreachable(b"m9", world.now))
    out = world.send(b"cpu-1", m.Goodbye("stopping"))
    assert out.other == [WithdrawKeys(("k1",))]


def test_a_lost_managers_keys_are_withdrawn_after_a_bounded_time() -> None:
    world = World()
    world.manager(b"m1", "gpu", offer(max_workers=2))
    world.send(b"m1", m.WorkerKeys([m.WorkerKey("gpu-1", "k1")]), m.WorkerStates([change("gpu-1", "pending")]))
    world.step(PeerUnreachable(b"m1", world.now))
    assert not [c for c in world.tick(ORPHAN_SECONDS - 1).other if isinstance(c, WithdrawKeys)]
    assert world.tick(1.0).other == [WithdrawKeys(("k1",))]
    assert not world.core.managers.workers


def test_a_manager_gets_at_most_twice_its_maximum_in_keys() -> None:
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=1))
    out = world.send(b"m1", m.WorkerKeys([m.WorkerKey(f"cpu-{i}", f"k{i}") for i in range(3)]))
    assert out.of(b"m1", m.KeysAdmitted) == [m.KeysAdmitted(["cpu-0", "cpu-1"])]
    assert "more than 2 worker keys" in out.of(b"m1", m.Refused)[0].reason
    assert set(world.core.managers.workers) == {"cpu-0", "cpu-1"}, "a refused key leaves no record"


def test_a_running_worker_reported_draining_gets_its_replacement_asked_for_while_it_still_serves() -> None:
    """A Slurm job near its time limit is reported draining while its worker still runs: the
    policy counts it out at once and asks for a replacement, and the worker keeps its tasks
    (it stops when Slurm's signal comes, handing back what it never started)."""
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=2, processors=2))
    world.client()
    world.submit(2)
    assert world.tick().scale(b"m1") == (1, [])
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running", job="4711", host="node-3")]))
    held = dispatched(world.worker("cpu-1"), b"cpu-1")
    assert len(held) == 2
    assert world.tick(1.0).scale(b"m1") == (0, []), "one worker is what the tasks it holds need"
    out = world.send(b"m1", m.WorkerStates([change("cpu-1", "draining", job="4711", reason="its time limit ends in 150 s")]))
    assert world.tick(1.0).scale(b"m1") == (1, []), "the draining worker is counted out: its replacement is asked for"
    assert world.core.workers[b"cpu-1"].inflight, "it keeps what it holds"
    assert not out.of(b"cpu-1", m.CancelTasks)


def test_a_worker_that_drains_by_itself_gets_its_replacement_asked_for_and_finishes_its_tasks() -> None:
    """Slurm's drain signal reaches the worker (--drain-seconds) before the manager's poll
    reports its job draining: its WorkerDraining counts it out of its manager's workers at
    once, so its replacement is asked for while it finishes what it runs; what it never
    started goes back for free, and the manager's later report changes nothing."""
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=2, processors=2))
    world.client()
    once, ordinary = world.submit(1, options_id=1, options=ONCE) + world.submit(1)
    assert world.tick().scale(b"m1") == (1, [])
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running", job="4711", host="node-3")]))
    held = dispatched(world.worker("cpu-1"), b"cpu-1")
    assert sorted(t.task_id for t in held) == [once, ordinary]
    assert world.tick(1.0).scale(b"m1") == (0, [])
    world.send(b"cpu-1", m.WorkerDraining([m.TaskAttempt(ordinary, 0)]))
    assert world.core.managers.workers["cpu-1"].state == "draining"
    assert world.tick(1.0).scale(b"m1") == (1, []), "counted out at once: its replacement is asked for"
    world.send(b"m1", m.WorkerStates([change("cpu-1", "draining", job="4711", reason="its time limit ends in 150 s")]))
    assert world.tick(1.0).scale(b"m1") == (0, []), "asked for once"
    world.send(b"m1", m.WorkerStates([change("cpu-2", "running", job="4712", host="node-4")]))
    again = dispatched(world.worker("cpu-2"), b"cpu-2")
    assert [(t.task_id, t.attempt) for t in again] == [(ordinary, 1)]
    out = world.send(b"cpu-1", m.TaskResults([m.TaskResult(once, 0, Status.OK, b"v", m.TaskFacts("cpu-1", 1.0, 2.0, 0), [])]))
    assert [(r.task_id, r.status) for r in _results(out).values()] == [(once, Status.OK)]
    out = world.send(b"cpu-1", m.Goodbye("worker stopping", []))
    assert not _results(out) and set(world.core.tasks) == {ordinary}


def test_a_job_that_dies_before_its_manager_reports_it_gets_its_fate_in_the_tasks_story() -> None:
    """The worker of a job that died (a node failure, an OOM kill of the job) goes silent and is
    lost by its missed heartbeats before the manager's next poll: its tasks' attempts are
    recorded then, and the manager's later report adds Slurm's words to those lines, so the
    WorkerLost a task may end with says what ended the job."""
    world = World(CONFIG.replace(max_retries=1))
    world.manager(b"m1", "cpu", offer(max_workers=1, processors=1))
    world.client()
    (task,) = world.submit(1)
    world.tick()
    world.send(b"m1", m.WorkerStates([change("cpu-1", "running", job="4711", host="node-3")]))
    assert dispatched(world.worker("cpu-1", processors=1), b"cpu-1")
    for _ in range(4):  # the client and the manager speak; the worker is silent
        world.now += 1.0
        world.alive(b"c", b"m1")
        world.tick()
    assert b"cpu-1" not in world.core.workers
    (line,) = world.core.tasks[task].failures or []
    assert "missed heartbeats" in line and "Slurm" not in line
    world.send(b"m1", m.WorkerStates([change("cpu-1", "gone", reason="Slurm job 4711 NODE_FAIL, exit code 0:9", infrastructure=True)]))
    (line,) = world.core.tasks[task].failures or []
    assert line.startswith("attempt 1: worker cpu-1") and "(manager cpu: job 4711 on node-3: Slurm job 4711 NODE_FAIL" in line
    # Its second attempt fails too: the WorkerLost lists both, the first with the job's fate.
    world.send(b"m1", m.WorkerStates([change("cpu-2", "running", job="4712", host="node-4")]))
    assert dispatched(world.worker("cpu-2", processors=1), b"cpu-2")
    lost = []
    for _ in range(4):
        world.now += 1.0
        world.alive(b"c", b"m1")
        lost += _results(world.tick()).values()
    (result,) = lost
    assert result.status == Status.WORKER_LOST
    _text, lines = msgpack.unpackb(result.payload)
    assert len(lines) == 2 and "Slurm job 4711 NODE_FAIL" in lines[0] and "missed heartbeats" in lines[1]


# ====================================================================== the snapshot


def test_the_snapshot_lists_each_manager_typed_and_keeps_a_departed_ones_line() -> None:
    """``Statistics.managers``: per manager, its workers by state, its failures and last
    error, its infrastructure's cost; a manager that left stays listed (not connected) while
    the daemon remembers what it cost."""
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=4, processors=1, kind="slurm"))
    world.manager(b"m2", "gpu", offer(max_workers=1))
    world.client()
    world.submit(4)
    assert world.tick().scale(b"m1") == (4, [])
    stats = world.core.statistics()
    cpu, gpu = stats.managers
    assert (cpu.name, cpu.kind, cpu.max_workers, cpu.requested, cpu.starting, cpu.running) == ("cpu", "slurm", 4, 4, 0, 0)
    assert (gpu.name, gpu.requested, gpu.last_error, gpu.last_error_ago) == ("gpu", 0, None, None)
    # Named and keyed: cpu-0 starts and joins, cpu-1 waits in the queue, cpu-2 is keyed only.
    world.send(b"m1", m.WorkerKeys([m.WorkerKey(f"cpu-{i}", f"key{i}") for i in range(3)]))
    world.send(
        b"m1",
        m.WorkerStates([change("cpu-0", "running"), change("cpu-1", "pending", reason="Priority"), change("cpu-2", "requested")]),
    )
    world.worker("cpu-0", processors=1)
    (cpu, _) = world.core.statistics().managers
    assert (cpu.requested, cpu.starting, cpu.running, cpu.draining) == (1 + 1, 1, 1, 0), cpu  # cpu-3 still unnamed
    assert cpu.pending_keys == 2 and cpu.pending_reason == "Priority"
    # cpu-1's job fails on its own: a failure with its reason, the manager's last error.
    world.now += 2.0
    world.send(b"m1", m.WorkerStates([change("cpu-1", "gone", job="77", reason="exit code 1")]))
    world.now += 3.0
    world.alive(b"m1", b"m2", b"cpu-0", b"c")
    (cpu, _) = world.core.statistics().managers
    assert cpu.failed == 1 and cpu.infrastructure_ends == 0
    assert cpu.last_error is not None and "cpu-1" in cpu.last_error and "exit code 1" in cpu.last_error
    assert cpu.last_error_ago == 3.0
    # cpu-0 drains by itself; a name outside its prefix is refused: the last error now.
    world.send(b"cpu-0", m.WorkerDraining([]))
    world.send(b"m1", m.WorkerStates([change("gpu-9", "pending")]))
    (cpu, _) = world.core.statistics().managers
    assert cpu.draining == 1 and cpu.running == 0
    assert cpu.last_error is not None and "refused" in cpu.last_error and "gpu-9" in cpu.last_error
    assert cpu.last_error_ago == 0.0
    # m2 leaves: it had no worker and cost nothing, so it goes; m1 leaves with workers: kept.
    world.send(b"m2", m.Goodbye("bye"))
    world.send(b"m1", m.Goodbye("bye"))
    (cpu,) = world.core.statistics().managers
    assert not cpu.connected and cpu.failed == 1 and cpu.requested == 1, cpu  # no more unnamed ask
    # Through the wire and back: the same figures.
    message = stats_message(world.core)
    (decoded,), _ = decode(encode([message]))
    assert Statistics.from_message(decoded).managers == (cpu,)


def test_a_manager_known_only_by_a_refusal_leaves_no_trace_when_it_goes() -> None:
    """Refused (its offer, then its keys) and never registered any capacity or worker: listed
    with its error while connected; once it leaves, or falls silent, nothing of it stays in the
    snapshot, and a later manager of that name does not inherit its error. (validate(), run
    after every step, checks that nothing is kept for a manager the snapshot does not list.)"""
    world = World()
    world.manager(b"m1", "cpu", offer(max_workers=-1))
    world.send(b"m1", m.WorkerKeys([m.WorkerKey("cpu-0", "key0")]))
    (cpu,) = world.core.statistics().managers
    assert cpu.connected and cpu.last_error is not None and "refused (worker-keys)" in cpu.last_error
    world.send(b"m1", m.Goodbye("bye"))
    assert world.core.statistics().managers == ()
    # The same name again: a fresh line, without the old refusal or offer.
    world.manager(b"m2", "cpu", offer(max_workers=2, kind="slurm"))
    (cpu,) = world.core.statistics().managers
    assert (cpu.kind, cpu.last_error, cpu.last_error_ago) == ("slurm", None, None)
    # Refused again, then silent past its liveness: lost on the clock, and gone from the snapshot.
    world.send(b"m2", m.ManagerOffer("slurm", 1, 2, 1, {}, [], 1.0, "", []))  # min above max
    assert world.core.statistics().managers[0].last_error is not None
    world.client()
    for _ in range(5):
        world.alive(b"c")
        world.tick(1.0)
    assert world.core.statistics().managers == ()
    # One that cost something (a worker that failed) stays listed, its error with it.
    world.manager(b"m3", "gpu", offer(max_workers=2))
    world.send(b"m3", m.WorkerStates([change("gpu-0", "gone", reason="exit code 1")]), m.Goodbye("bye"))
    (gpu,) = world.core.statistics().managers
    assert not gpu.connected and gpu.failed == 1 and gpu.last_error is not None and "exit code 1" in gpu.last_error
