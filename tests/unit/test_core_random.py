"""The daemon's pure core under random clients and workers, checked against a model
(driven as in test_core.py)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from core_testing import (
    CONFIG,
    DEADLINE,
    Cluster,
    Out,
    cluster,  # noqa: F401  (a fixture)
    hello,
    result,
    spec,
    tid,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.scheduler.core import (
    PeerUnreachable,
    Received,
    Tick,
    WorkerExited,
)

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
