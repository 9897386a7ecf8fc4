"""Placement of tasks that need resources and tags, checked against a brute-force reference.

Up to 1,000 workers with random processors, resources (gpu 0-4, mem in GB to a tenth)
and tags, a few thousand tasks with random needs (some plain, some that no worker can
ever run) from several clients, driven through the core's public ``handle`` (the
``Cluster`` helper of core_testing.py: ``validate()`` and a codec round trip after every
step).  Workers return random subsets of what they hold, several workers per step; some
leave (Goodbye, their tasks handed back or interrupted) and new ones join.

The reference is a separate model that knows only what the wire says: each worker's
declared capacity, what was dispatched to it and what it answered.  Quantities are kept
as integers (mem in tenths of a GB), so its arithmetic is exact where the core's is float.
After every step it checks:

1. *Fit at dispatch.*  Every dispatched task was queued (not held anywhere, attempt as
   expected) and went to a connected worker that has all its tags and whose free
   resources -- declared minus what its in-flight tasks hold, prefetched ones included --
   covered it: after the step's results are freed and its dispatches added, no worker
   holds more of any resource than it declared, nor more tasks than its window.
2. *No task dispatched twice or lost.*  Each (task, attempt) is dispatched at most once; a
   task is dispatched again only after its worker left while holding it (then with the
   next attempt number); the set of tasks the core has queued equals the reference's;
   every result reaches its client exactly once.  At the end, every task a worker could
   ever run has finished exactly once, and what stays queued is exactly what no
   connected worker could ever run, whatever it held (tags, declared quantities): for
   those the core logs one warning per kind of need on its next tick and, once they have
   waited ``no_worker_warning``, sends each client one ``TasksWithoutWorker`` counting its
   own; with ``unsatisfiable_timeout=0`` it rejects them (REJECTED) at submit, or on the
   first tick after a leave made them so.  Then a worker that has everything joins and
   they run too.
3. *Work conservation*, by brute force over every (queued task, connected worker) pair:
   no queued task is left waiting while some worker has all its tags, free resources
   covering it *now* and room in its window.  The core's one intentional limit is the
   window, and this is its exact rule: a worker holds at most ``capacity +
   min(capacity, max_prefetch)`` tasks, constrained and plain alike (the prefetch window
   of policies.py with two tasks per processor, which is what it is here: every task
   reports a 0.5 s run, far above the 2 ms refill time, and a worker with no run yet
   gets two per processor too).  A worker that is full by count, but not by resources,
   takes nothing more; a plain task needs no resource, so it waits only while every
   worker's window is full.  Nothing else (no seceded, draining or broken workers here)
   keeps a fitting task from a worker with room.  One variant adds seceded tasks (a task
   waiting on sub-tasks, ``Seceded``: not counted in the window, so its worker has room
   again) and draws its workers from a few *profiles* (resources and tags), as real
   clusters are started alike, so that the core's index of workers by profile and its
   stuck keys (scheduler/placement.py) see classes of many workers.

The core's ``validate()`` runs after every step too; besides its own records it checks
the placement index: every worker with room is open to plain tasks, and a stuck key with
no candidate fits no worker with room now.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from core_testing import Cluster, Out, hello, result

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.scheduler.core import Received, Tick
from scaler_executor.scheduler.state import QUEUED_STATES

RESOURCES = ("gpu", "mem")
UNIT = {"gpu": 1, "mem": 10}  # reference integers per 1.0 on the wire: mem in tenths of a GB
TAGS = ("ssd", "linux", "a100", "eu", "us", "spot", "big", "fast")
NOWHERE = "nowhere"  # a tag no worker declares: tasks asking for it can never run
BIT = {tag: 1 << i for i, tag in enumerate((*TAGS, NOWHERE))}
AFTER = 5.0  # no_worker_warning
BASE = ClusterConfig(
    heartbeat_interval=10.0,  # nobody is lost to the fake clock's ticks at the end (6 s)
    daemon_loss_timeout=30.0,
    heartbeat_liveness=3,
    client_timeout=100.0,
    max_retries=2,
    no_worker_warning=AFTER,
)


def mask(tags: frozenset[str]) -> int:
    bits = 0
    for tag in tags:
        bits |= BIT[tag]
    return bits


@dataclass(frozen=True)
class WorkerSpec:
    capacity: int
    resources: tuple[tuple[str, int], ...]  # reference units; a resource not named is 0
    tags: frozenset[str]
    declare_zero: bool = False  # declares gpu=0 rather than leaving it out

    def amount(self, name: str) -> int:
        return dict(self.resources).get(name, 0)

    def hello(self, name: str) -> m.Hello:
        declared = {n: q / UNIT[n] for n, q in self.resources if q}
        if self.declare_zero and "gpu" not in declared:
            declared["gpu"] = 0.0
        return hello(
            m.Role.WORKER, name=name, capacity=self.capacity, resources=declared, tags=sorted(self.tags)
        )


@dataclass(frozen=True)
class Need:
    resources: tuple[tuple[str, int], ...]  # reference units, each > 0
    tags: frozenset[str]
    priority: int = 0

    def amount(self, name: str) -> int:
        return dict(self.resources).get(name, 0)

    def options(self) -> m.TaskOptions:
        wire = {n: q / UNIT[n] for n, q in self.resources}
        return m.TaskOptions(wire, sorted(self.tags), self.priority, None, None)


# ---------------------------------------------------------------------- random cases


def random_worker(rng: random.Random) -> WorkerSpec:
    resources = []
    gpu = rng.choice((0, 0, 0, 1, 1, 2, 4))
    if gpu:
        resources.append(("gpu", gpu))
    if rng.random() < 0.9:  # a few declare no memory at all
        mem = rng.choice((4, 8, 16, 32, 64, 128)) * 10 if rng.random() < 0.8 else rng.randint(5, 960)
        resources.append(("mem", mem))
    tags = frozenset(t for t in TAGS if rng.random() < 0.3)
    return WorkerSpec(rng.randint(1, 4), tuple(resources), tags, declare_zero=rng.random() < 0.2)


def random_need(rng: random.Random) -> Need:
    if rng.random() < 0.12:
        return Need((), frozenset(), rng.randint(0, 2))  # plain: any worker
    resources = []
    gpu = rng.choices((0, 1, 2, 3, 4, 5), weights=(60, 22, 10, 4, 3, 1))[0]  # 5: no worker has it
    if gpu:
        resources.append(("gpu", gpu))
    if rng.random() < 0.7:
        if rng.random() < 0.75:  # tenths: mostly round sizes
            mem = rng.choice((5, 10, 20, 40, 80, 160, 320, 640))
        else:
            mem = max(1, min(2000, int(rng.expovariate(1 / 60))))  # any tenth: mean 6 GB, rarely over 128
        resources.append(("mem", mem))
    tags = set(rng.sample(TAGS, rng.choice((0, 0, 1, 1, 2))))
    if rng.random() < 0.01:
        tags.add(NOWHERE)
    return Need(tuple(sorted(resources)), frozenset(tags), rng.randint(0, 2))


worker_specs = st.builds(
    WorkerSpec,
    capacity=st.integers(1, 4),
    resources=st.tuples(st.integers(0, 4), st.sampled_from((0, 5, 20, 40, 80, 160, 37))).map(
        lambda gm: tuple((n, q) for n, q in zip(RESOURCES, gm, strict=True) if q)
    ),
    tags=st.frozensets(st.sampled_from(TAGS[:4]), max_size=3),
    declare_zero=st.booleans(),
)
needs = st.builds(
    Need,
    resources=st.tuples(st.integers(0, 5), st.sampled_from((0, 1, 5, 13, 20, 40, 80, 170))).map(
        lambda gm: tuple((n, q) for n, q in zip(RESOURCES, gm, strict=True) if q)
    ),
    tags=st.frozensets(st.sampled_from((*TAGS[:4], NOWHERE)), max_size=2),
    priority=st.integers(0, 2),
)


# ---------------------------------------------------------------------- the reference


@dataclass
class RefWorker:
    spec: WorkerSpec
    inflight: dict[int, int] = field(default_factory=dict)  # task id -> attempt, in order
    seceded: set[int] = field(default_factory=set)  # of inflight: waiting on sub-tasks, not load

    @property
    def load(self) -> int:
        return len(self.inflight) - len(self.seceded)


@dataclass
class RefTask:
    need: Need
    client: bytes
    attempt: int = 0
    where: bytes | None = None  # the worker holding it
    state: str = "queued"  # queued | held | done | rejected
    dispatches: list[tuple[int, bytes]] = field(default_factory=list)  # (attempt, worker)


class Placement:
    """The core and the reference side by side; every step is checked (module doc)."""

    def __init__(self, config: ClusterConfig, rng: random.Random) -> None:
        self.cluster = Cluster(config)
        self.cluster.step(Tick(self.cluster.now))  # the clock starts: later ticks measure from here
        self.config = config
        self.rng = rng
        self.workers: dict[bytes, RefWorker] = {}
        self.tasks: dict[int, RefTask] = {}
        self.clients: dict[bytes, int] = {}  # peer -> client id
        self.options: dict[bytes, dict[Need, int]] = {}
        self.numbers: Counter[bytes] = Counter()
        self.unanswered: set[int] = set()  # ended tasks whose result the client has not had yet
        self.answered: Counter[int] = Counter()
        self.without_worker: dict[bytes, list[m.TasksWithoutWorker]] = {}
        self.next_worker = 0
        self.steps = 0

    # -------------------------------------------------------------- reference rules

    def window(self, worker: RefWorker) -> int:
        capacity = worker.spec.capacity
        return capacity + min(capacity, self.config.max_prefetch)

    def held(self, worker: RefWorker, name: str) -> int:
        return sum(self.tasks[t].need.amount(name) for t in worker.inflight)

    def fits_ever(self, worker: RefWorker, need: Need) -> bool:
        return need.tags <= worker.spec.tags and all(worker.spec.amount(n) >= q for n, q in need.resources)

    def satisfiable(self, need: Need) -> bool:
        return any(self.fits_ever(w, need) for w in self.workers.values())

    def queued(self) -> list[int]:
        return [t for t, task in self.tasks.items() if task.state == "queued"]

    # -------------------------------------------------------------- driving

    def step(self, *events: Any) -> Out:
        out = self.cluster.step(*events)
        self.steps += 1
        self.observe(out)
        self.check()
        return out

    def join_client(self, peer: bytes) -> None:
        out = self.step(Received(peer, [hello(m.Role.CLIENT, name=peer.decode())], self.cluster.now))
        self.clients[peer] = out.one(peer, m.Welcome).peer_id
        self.options[peer] = {}

    def join_worker(self, spec: WorkerSpec) -> bytes:
        self.next_worker += 1
        peer = b"w%d" % self.next_worker
        self.workers[peer] = RefWorker(spec)  # before the step: its Welcome may bring tasks
        out = self.step(Received(peer, [spec.hello(peer.decode())], self.cluster.now))
        out.one(peer, m.Welcome)
        return peer

    def submit(self, peer: bytes, batch: list[Need]) -> None:
        messages: list[Any] = []
        table = self.options[peer]
        specs = []
        reject_now = self.config.unsatisfiable_timeout == 0
        for need in batch:
            options_id = 0  # the default options: no needs, priority 0
            if need != Need((), frozenset()):
                if need not in table:
                    table[need] = len(table) + 1
                    messages.append(m.RegisterOptions(table[need], need.options()))
                options_id = table[need]
            self.numbers[peer] += 1
            task_id = self.clients[peer] << TASK_ID_BITS | self.numbers[peer]
            specs.append(m.TaskSpec(task_id, 0, options_id, TaskFlags.INLINE_FN, b"x", [], [], 0))
            task = self.tasks[task_id] = RefTask(need, peer)
            if reject_now and (need.resources or need.tags) and not self.satisfiable(need):
                task.state = "rejected"  # unsatisfiable_timeout=0: answered at once
                self.unanswered.add(task_id)
        messages.append(m.SubmitTasks(specs))
        self.step(Received(peer, messages, self.cluster.now))

    def results(self, fraction: float) -> None:
        """Some busy workers answer a random part of what they hold (one step)."""
        busy = [p for p, w in self.workers.items() if w.inflight]
        if not busy:
            return
        chosen = self.rng.sample(busy, max(1, int(len(busy) * fraction * self.rng.random())))
        events = []
        for peer in chosen:
            worker = self.workers[peer]
            held = list(worker.inflight.items())
            done = self.rng.sample(held, self.rng.randint(1, len(held)))
            for task_id, _ in done:
                del worker.inflight[task_id]  # freed before the step: its dispatches see it so
                worker.seceded.discard(task_id)
                task = self.tasks[task_id]
                task.state, task.where = "done", None
                self.unanswered.add(task_id)
            events.append(Received(peer, [m.TaskResults([result(t, a) for t, a in done])], self.cluster.now))
        self.step(*events)

    def secede(self) -> None:
        """A busy worker says some of its tasks wait on sub-tasks: they stop counting as load."""
        busy = [p for p, w in self.workers.items() if len(w.inflight) > len(w.seceded)]
        if not busy:
            return
        peer = self.rng.choice(busy)
        worker = self.workers[peer]
        open_ = [t for t in worker.inflight if t not in worker.seceded]
        chosen = self.rng.sample(open_, self.rng.randint(1, len(open_)))
        worker.seceded.update(chosen)
        self.step(Received(peer, [m.Seceded(chosen)], self.cluster.now))

    def leave(self, peer: bytes) -> None:
        """The worker leaves in an orderly way, handing back part of what it holds as
        unstarted; the rest was interrupted.  Either way it runs again, next attempt."""
        worker = self.workers.pop(peer)
        held = list(worker.inflight.items())
        unstarted = [m.TaskAttempt(t, a) for t, a in held if self.rng.random() < 0.5]
        for task_id, _ in held:
            task = self.tasks[task_id]
            task.state, task.where, task.attempt = "queued", None, task.attempt + 1
        self.step(Received(peer, [m.Goodbye("placement test", unstarted)], self.cluster.now))

    # -------------------------------------------------------------- checks

    def observe(self, out: Out) -> None:
        touched = set()
        for peer in out.peers:
            for dispatch in out.dispatched(peer):
                task = self.tasks.get(dispatch.task_id)
                assert task is not None, f"step {self.steps}: unknown task {dispatch.task_id:#x} dispatched"
                assert peer in self.workers, f"step {self.steps}: task {dispatch.task_id:#x} sent to {peer!r}, no worker"
                assert task.state == "queued", (
                    f"step {self.steps}: task {dispatch.task_id:#x} dispatched to {peer!r} but it is {task.state}"
                    f" (at {task.where!r}, dispatches {task.dispatches})"
                )
                assert dispatch.attempt == task.attempt, (dispatch, task)
                assert all(a != dispatch.attempt for a, _ in task.dispatches), f"attempt dispatched twice: {task}"
                worker = self.workers[peer]
                missing = task.need.tags - worker.spec.tags
                assert not missing, f"step {self.steps}: task {dispatch.task_id:#x} needs tags {missing} {peer!r} lacks"
                task.state, task.where = "held", peer
                task.dispatches.append((dispatch.attempt, peer))
                worker.inflight[dispatch.task_id] = dispatch.attempt
                touched.add(peer)
            for message in out.to(peer):
                if type(message) is m.TaskResults:
                    assert peer in self.clients
                    for answer in message.results:
                        task = self.tasks[answer.task_id]
                        assert answer.task_id in self.unanswered, f"unexpected result {answer}"
                        expected = Status.REJECTED if task.state == "rejected" else Status.OK
                        assert answer.status == expected, (answer, task)
                        self.unanswered.discard(answer.task_id)
                        self.answered[answer.task_id] += 1
                elif type(message) is m.TasksWithoutWorker:
                    self.without_worker.setdefault(peer, []).append(message)
        for peer in touched:
            worker = self.workers[peer]
            for name in RESOURCES:
                held, declared = self.held(worker, name), worker.spec.amount(name)
                assert held <= declared, (
                    f"step {self.steps}: {peer!r} over-committed: its tasks hold {name}={held / UNIT[name]:g}"
                    f" of {declared / UNIT[name]:g} ({worker.spec}; {[self.tasks[t].need for t in worker.inflight]})"
                )
            assert worker.load <= self.window(worker), (peer, worker, self.window(worker))

    def check(self) -> None:
        # What every result step must have answered: results travel in the step they end.
        assert not self.unanswered, f"step {self.steps}: no result reached the client for {sorted(self.unanswered)[:5]}"
        core = self.cluster.scheduler
        core_queued = {t for t, task in core.tasks.items() if task.state in QUEUED_STATES}
        ref_queued = set(self.queued())
        assert core_queued == ref_queued, (
            f"step {self.steps}: queued in the core but not the reference {sorted(core_queued - ref_queued)[:5]},"
            f" the other way {sorted(ref_queued - core_queued)[:5]}"
        )
        self.check_work_conserved(ref_queued)

    def check_work_conserved(self, queued: set[int]) -> None:
        """Brute force over every (queued task, worker) pair: none fits now with room."""
        if not queued or not self.workers:
            return
        peers = list(self.workers)
        workers = [self.workers[p] for p in peers]
        free = np.array(
            [[w.spec.amount(n) - self.held(w, n) for n in RESOURCES] for w in workers], dtype=np.int64
        )
        room = np.array([w.load < self.window(w) for w in workers])
        worker_tags = np.array([mask(w.spec.tags) for w in workers], dtype=np.int64)
        ids = sorted(queued)
        need = np.array([[self.tasks[t].need.amount(n) for n in RESOURCES] for t in ids], dtype=np.int64)
        need_tags = np.array([mask(self.tasks[t].need.tags) for t in ids], dtype=np.int64)
        fits = (
            room[None, :]
            & ((need_tags[:, None] & ~worker_tags[None, :]) == 0)
            & (need[:, None, :] <= free[None, :, :]).all(axis=2)
        )
        if fits.any():
            i, j = (int(x) for x in np.argwhere(fits)[0])
            worker, task = workers[j], self.tasks[ids[i]]
            raise AssertionError(
                f"step {self.steps}: task {ids[i]:#x} needs {task.need} and waits, but {peers[j]!r}"
                f" ({worker.spec}) has it free: {dict(zip(RESOURCES, free[j].tolist(), strict=True))},"
                f" {worker.load} of a window of {self.window(worker)}"
            )

    # -------------------------------------------------------------- the end

    def finish(self, caplog: pytest.LogCaptureFixture) -> None:
        """Nothing held: what is queued must be unsatisfiable; it is reported (or rejected),
        then a worker with everything joins and runs it; every task ended exactly once."""
        assert not any(w.inflight for w in self.workers.values())
        stuck = self.queued()
        for task_id in stuck:
            assert not self.satisfiable(self.tasks[task_id].need), f"{task_id:#x} fits a worker yet waits"
        per_client = Counter(self.tasks[t].client for t in stuck)
        kinds = {self.tasks[t].need for t in stuck if self.tasks[t].need.resources or self.tasks[t].need.tags}
        timeout = self.config.unsatisfiable_timeout
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scaler_executor.daemon"):
            if timeout == 0:  # rejected on the first tick (they became so when a worker left)
                for task_id in stuck:
                    self.tasks[task_id].state = "rejected"
                    self.unanswered.add(task_id)
                self.cluster.now += 1.0
                self.step(Tick(self.cluster.now))
                stuck, per_client = [], Counter()
            else:
                self.cluster.now += 1.0
                self.step(Tick(self.cluster.now))
                self.cluster.now += AFTER
                self.step(Tick(self.cluster.now))
        warned = [r.getMessage() for r in caplog.records if "which no connected worker has" in r.getMessage()]
        if timeout != 0:
            assert len(warned) == len({(n.resources, n.tags) for n in kinds}), (warned, kinds)
        told = {peer: sum(n.tasks for n in notes) for peer, notes in self.without_worker.items()}
        assert told == dict(per_client), (told, per_client)
        assert self.cluster.scheduler.statistics()["tasks_without_worker"] == len(stuck)
        # A worker with everything: the stuck tasks run on it, a window at a time.
        everything = WorkerSpec(
            4,
            tuple((n, max([t.need.amount(n) for t in self.tasks.values()] + [1])) for n in RESOURCES),
            frozenset((*TAGS, NOWHERE)),
        )
        self.join_worker(everything)
        self.drain()
        for task_id, task in self.tasks.items():
            assert task.state in ("done", "rejected"), (task_id, task)
            assert self.answered[task_id] == 1, (task_id, task)
            if task.state == "done":
                assert [a for a, _ in task.dispatches] == list(range(task.attempt + 1)), task
        assert not self.cluster.scheduler.tasks

    def drain(self, churn: float = 0.0) -> None:
        for _ in range(100_000):
            if not any(w.inflight for w in self.workers.values()):
                return
            if churn and self.rng.random() < churn:
                self.leave(self.rng.choice(list(self.workers)))
                self.join_worker(random_worker(self.rng))
            self.results(0.25)
        raise AssertionError("the workers never emptied")


def run(
    caplog: pytest.LogCaptureFixture,
    rng: random.Random,
    workers: list[WorkerSpec],
    tasks: list[Need],
    clients: int,
    waves: int,
    config: ClusterConfig,
    churn: float,
    make_worker: Any = None,
    secede: float = 0.0,
) -> Placement:
    p = Placement(config, rng)
    peers = [b"c%d" % i for i in range(1, clients + 1)]
    for peer in peers:
        p.join_client(peer)
    late = workers[len(workers) * 9 // 10 :]  # a tenth join after the first wave
    for spec in workers[: len(workers) - len(late)]:
        p.join_worker(spec)
    for wave in range(waves):
        share = tasks[wave * len(tasks) // waves : (wave + 1) * len(tasks) // waves]
        for i, peer in enumerate(peers):
            p.submit(peer, share[i::clients])
        if wave == 0:
            for spec in late:
                p.join_worker(spec)
        for _ in range(3):
            p.results(0.2)
            if secede and rng.random() < secede:
                p.secede()
            if churn and rng.random() < churn * 5:
                p.leave(rng.choice(list(p.workers)))
                p.join_worker(make_worker(rng) if make_worker else rng.choice(workers))
    p.drain(churn)
    p.finish(caplog)
    return p


# ---------------------------------------------------------------------- the tests


# The 1,000-worker runs check the core's and the index's invariants and the reference after
# every one of ~1,500 steps, each O(workers): 6-20 s on a quiet 2-core machine, several times
# that when other processes hold the cores. Their bound is set for that, not the suite's 120 s.
AT_SCALE = pytest.mark.timeout(900)


@AT_SCALE
@pytest.mark.parametrize(
    ("seed", "max_prefetch", "churn"),
    [(20260, 2, 0.0), (7, 1, 0.1)],
    ids=["seed-20260", "seed-7-churn"],
)
def test_placement_at_1000_workers_matches_the_reference(
    caplog: pytest.LogCaptureFixture, seed: int, max_prefetch: int, churn: float
) -> None:
    rng = random.Random(seed)
    workers = [random_worker(rng) for _ in range(1000)]
    tasks = [random_need(rng) for _ in range(4000)]
    started = time.perf_counter()
    p = run(caplog, rng, workers, tasks, 3, 4, BASE.replace(max_prefetch=max_prefetch), churn, random_worker)
    elapsed = time.perf_counter() - started
    dispatched = sum(len(t.dispatches) for t in p.tasks.values())
    stuck = sum(1 for t in p.tasks.values() if any(w == b"w%d" % p.next_worker for _, w in t.dispatches))
    assert dispatched >= len(tasks) and stuck > 0, (dispatched, stuck)
    print(f"seed {seed}: {p.steps} steps, {dispatched} dispatches, {stuck} needed the last worker, {elapsed:.1f} s")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    workers=st.lists(worker_specs, min_size=1, max_size=12),
    tasks=st.lists(needs, min_size=1, max_size=60),
    clients=st.integers(1, 3),
    waves=st.integers(1, 3),
    max_prefetch=st.integers(1, 3),
    reject_at_once=st.booleans(),
    churn=st.sampled_from((0.0, 0.2)),
    seed=st.integers(0, 2**32 - 1),
)
def test_placement_matches_the_reference(
    caplog: pytest.LogCaptureFixture,
    workers: list[WorkerSpec],
    tasks: list[Need],
    clients: int,
    waves: int,
    max_prefetch: int,
    reject_at_once: bool,
    churn: float,
    seed: int,
) -> None:
    config = BASE.replace(max_prefetch=max_prefetch, unsatisfiable_timeout=0 if reject_at_once else None)
    run(caplog, random.Random(seed), workers, tasks, clients, waves, config, churn)


@AT_SCALE
def test_placement_with_few_profiles_and_seceded_tasks_matches_the_reference(caplog: pytest.LogCaptureFixture) -> None:
    """1,000 workers of 8 profiles (capacities still random), tasks seceding now and then."""
    rng = random.Random(2612)
    profiles = [random_worker(rng) for _ in range(8)]

    def make_worker(r: random.Random) -> WorkerSpec:
        base = r.choice(profiles)
        return WorkerSpec(r.randint(1, 4), base.resources, base.tags, base.declare_zero)

    workers = [make_worker(rng) for _ in range(1000)]
    tasks = [random_need(rng) for _ in range(3000)]
    p = run(caplog, rng, workers, tasks, 3, 4, BASE.replace(max_prefetch=2), 0.05, make_worker, secede=0.5)
    assert sum(len(t.dispatches) for t in p.tasks.values()) >= len(tasks)
    assert p.cluster.scheduler.statistics()["placement_retries"] > 0  # stuck keys were retried on candidates


def _answer(p: Placement, peer: bytes, count: int | None = None) -> Out:
    """The worker answers its oldest ``count`` tasks (all by default)."""
    worker = p.workers[peer]
    done = list(worker.inflight.items())[:count]
    for task_id, _ in done:
        del worker.inflight[task_id]
        p.tasks[task_id].state, p.tasks[task_id].where = "done", None
        p.unanswered.add(task_id)
    return p.step(Received(peer, [m.TaskResults([result(t, a) for t, a in done])], p.cluster.now))


def _counts(p: Placement) -> tuple[int, int, int]:
    stats = p.cluster.scheduler.statistics()
    return stats["placement_scans"], stats["placement_retries"], stats["placement_stuck"]


def test_a_stuck_key_is_not_tried_again_until_a_worker_that_fits_it_has_room(caplog: pytest.LogCaptureFixture) -> None:
    """Through the daemon's statistics: keys nobody can serve cost no pass while nothing
    that could serve them changes; a freed slot retries only the keys its worker fits."""
    p = Placement(BASE.replace(max_prefetch=1), random.Random(1))
    p.join_client(b"c1")
    x_worker = WorkerSpec(1, (("mem", 80),), frozenset({"ssd"}))
    peers = [p.join_worker(x_worker) for _ in range(20)]  # one profile; a window of 2 tasks each
    never = [Need((("mem", 10 * (i + 1)),), frozenset({NOWHERE})) for i in range(30)]  # 30 keys, no worker has the tag
    plenty = [Need((("mem", 10),), frozenset({"ssd"}))] * 50  # one key: 40 fit the windows, 10 wait
    p.submit(b"c1", never + plenty)
    scans, retries, stuck = _counts(p)
    assert stuck == 31 and scans == 31 and retries == 0, (scans, retries, stuck)
    assert len(p.queued()) == 40

    # Nothing that could serve them changes: heartbeats, ticks, plain tasks on other workers.
    plain = p.join_worker(WorkerSpec(2, (), frozenset()))
    for _ in range(5):
        p.step(*(Received(peer, [m.Heartbeat(1, 1)], p.cluster.now) for peer in peers))
        p.cluster.now += 0.1
        p.step(Tick(p.cluster.now))
        p.submit(b"c1", [Need((), frozenset())])
        assert p.workers[plain].inflight  # the only worker with room for it
        _answer(p, plain)
    scans1, retries1, stuck1 = _counts(p)
    # The plain worker's profile fits none of the stuck keys (no ssd, no mem): no pass at all.
    assert (scans1, retries1, stuck1) == (scans, retries, stuck), ((scans1, retries1, stuck1), (scans, retries, stuck))

    # One ssd worker frees a slot: the ssd key alone is tried, on that worker alone.
    peer = peers[0]
    out = _answer(p, peer, 1)
    assert len(out.dispatched(peer)) == 1 and len(p.queued()) == 39
    assert _counts(p) == (scans, retries + 1, stuck)

    # A worker with the missing tag joins: the 30 keys are tried on it, and run there.
    p.join_worker(WorkerSpec(40, (("mem", 5000),), frozenset({NOWHERE})))
    assert _counts(p) == (scans, retries + 31, 1)
    assert len(p.queued()) == 9
