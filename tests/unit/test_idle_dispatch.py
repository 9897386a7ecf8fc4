"""Plain tasks go where the least-loaded policy says, also on the idle-worker path.

With idle workers and a thin queue the core gives the ready tasks to the idle workers in
join order without a pass over every open worker (scheduler/placement.py, "Idle workers").
That must be exactly the policy's choice: here, before every submit, the reference computes
``LeastLoaded.allocate`` over every connected worker that may take a task (not broken, not
draining, room in its prefetch window; in join order), as the full pass does, and the
dispatches of the step must match it worker by worker.  Results, seceded tasks, drains,
leaves and joins come in between (random, seeded), so the idle heap sees stale entries of
every kind; the core's ``validate()`` (which checks that every idle open worker is on the
heap) runs after every step.
"""

from __future__ import annotations

import random

import pytest
from core_testing import Cluster, hello, result

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS, TaskFlags
from scaler_executor.scheduler.core import Received
from scaler_executor.scheduler.policies import LeastLoaded, WorkerSlot, prefetch_window

CONFIG = ClusterConfig(heartbeat_interval=10.0, daemon_loss_timeout=30.0, max_prefetch=3, max_retries=5)


def _expected(cluster: Cluster, ready: int) -> dict[bytes, int]:
    scheduler = cluster.scheduler
    workers, slots = [], []
    for worker in scheduler.workers.values():  # join order
        slot = WorkerSlot(worker.capacity, len(worker.inflight) - len(worker.seceded), worker.mean_task_seconds)
        if worker.broken is None and not worker.draining and prefetch_window(slot, CONFIG.max_prefetch) > slot.inflight:
            workers.append(worker.peer)
            slots.append(slot)
    counts = LeastLoaded(CONFIG.max_prefetch).allocate(ready, slots)
    return {peer: count for peer, count in zip(workers, counts, strict=True) if count}


@pytest.mark.parametrize("seed", range(12))
def test_plain_dispatch_is_the_least_loaded_policys_choice(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(CONFIG)
    cid = cluster.client(b"c1")
    joined = 0
    held: dict[bytes, list[tuple[int, int]]] = {}  # worker -> (task id, attempt) it holds

    def join() -> None:
        nonlocal joined
        joined += 1
        peer = b"w%d" % joined
        cluster.join(peer, hello(m.Role.WORKER, name=peer.decode(), capacity=rng.randint(1, 4), pid=1000 + joined))
        held[peer] = []

    def note(out: object) -> None:
        for peer in held:
            held[peer].extend((d.task_id, d.attempt) for d in out.dispatched(peer))  # type: ignore[attr-defined]

    for _ in range(rng.randint(5, 40)):
        join()
    number = 0
    checked = 0
    for _ in range(300):
        action = rng.random()
        scheduler = cluster.scheduler
        if action < 0.4 and not scheduler.ready.live:
            # A thin batch (mostly fewer tasks than idle workers), checked against the policy.
            count = rng.choice((1, 1, 2, 3, 5, 8, 30))
            specs = []
            for _ in range(count):
                number += 1
                specs.append(m.TaskSpec((cid << TASK_ID_BITS) | number, 0, 0, TaskFlags.INLINE_FN, b"p", [], [], 0))
            expected = _expected(cluster, count)
            out = cluster.send(b"c1", m.SubmitTasks(specs))
            got = {peer: len(out.dispatched(peer)) for peer in held if out.dispatched(peer)}
            assert got == expected, f"step placed {got}, the policy says {expected}"
            note(out)
            checked += 1
        elif action < 0.75:
            busy = [peer for peer, tasks in held.items() if tasks and peer in scheduler.workers]
            if busy:
                peer = rng.choice(busy)
                done = rng.sample(held[peer], rng.randint(1, len(held[peer])))
                for item in done:
                    held[peer].remove(item)
                note(cluster.send(peer, m.TaskResults([result(t, a) for t, a in done])))
        elif action < 0.82:
            busy = [peer for peer, tasks in held.items() if tasks and peer in scheduler.workers]
            if busy:
                peer = rng.choice(busy)
                worker = scheduler.workers[peer]
                running = [t for t, _ in held[peer] if t in worker.inflight and t not in worker.seceded]
                if running:
                    note(cluster.step(Received(peer, [m.Seceded([rng.choice(running)])], cluster.now)))
        elif action < 0.88:
            live = [peer for peer in held if peer in scheduler.workers and not scheduler.workers[peer].draining]
            if len(live) > 2:
                peer = rng.choice(live)
                note(cluster.send(peer, m.WorkerDraining([])))
        elif action < 0.94:
            live = [peer for peer in held if peer in scheduler.workers]
            if len(live) > 2:
                peer = rng.choice(live)
                note(cluster.send(peer, m.Goodbye("leaving")))
                held.pop(peer)
        else:
            join()
    assert checked > 30
