"""scheduler/placement.py's plain-task candidates give the policy's placement exactly.

``Placement.least_loaded`` hands the allocation policy only the k least loaded open
workers (k: the ready tasks) from a lazy heap; LeastLoaded over those must place the tasks
exactly as over every worker.  Random workers, loads moving up (tasks taken, not reported
to the index, as dispatch does) and down (results: reported with ``grew``), seceded tasks,
workers leaving and joining, drains and breaks; every step compares the two placements.
"""

from __future__ import annotations

import random

import pytest

from scaler_executor.scheduler.placement import Placement
from scaler_executor.scheduler.policies import LeastLoaded, WorkerSlot
from scaler_executor.scheduler.state import WorkerRecord


def slot(w: WorkerRecord) -> WorkerSlot:
    return WorkerSlot(w.capacity, len(w.inflight) - len(w.seceded), w.mean_task_seconds)


def placed(policy: LeastLoaded, ready: int, workers: list[WorkerRecord]) -> dict[bytes, int]:
    usable = [w for w in workers if w.broken is None and not w.draining]
    counts = policy.allocate(ready, [slot(w) for w in usable])
    return {w.peer: n for w, n in zip(usable, counts, strict=True) if n}


@pytest.mark.parametrize("seed", range(6))
def test_least_loaded_candidates_place_tasks_as_every_worker_would(seed: int) -> None:
    rng = random.Random(seed)
    max_prefetch = rng.choice((1, 2, 4))
    policy = LeastLoaded(max_prefetch)
    index = Placement()
    workers: dict[bytes, WorkerRecord] = {}
    next_id = 0
    task = 0

    def join() -> None:
        nonlocal next_id
        next_id += 1
        peer = b"w%d" % next_id
        w = WorkerRecord(peer, next_id, peer.decode(), rng.randint(1, 4), {}, frozenset(), 0.0)
        w.mean_task_seconds = rng.choice((None, 0.5, 1e-5))
        workers[peer] = w
        index.add(w)

    for _ in range(rng.randint(20, 200)):
        join()
    for _ in range(300):
        index.refresh()
        ready = rng.choice((1, 2, 3, 5, 8, 40, 400))
        candidates = index.least_loaded(ready, workers, max_prefetch)
        assert [w.worker_id for w in candidates] == sorted(w.worker_id for w in candidates)
        expected = placed(policy, ready, list(workers.values()))
        got = placed(policy, ready, candidates)
        assert got == expected, (ready, got, expected)
        for peer, n in got.items():  # dispatch: loads go up, the index is not told
            for _ in range(n):
                task += 1
                workers[peer].inflight[task] = None
        index.validate(workers, [])
        # Events between passes: results (told: grew), secessions, churn, drains.
        for w in rng.sample(list(workers.values()), min(len(workers), rng.randint(0, 10))):
            held = list(w.inflight)
            for t in rng.sample(held, rng.randint(0, len(held))):
                del w.inflight[t]
                w.seceded.discard(t)
            if held and rng.random() < 0.2:
                w.seceded.add(next(iter(w.inflight), held[0]) if w.inflight else held[0])
                w.seceded &= set(w.inflight)
            index.grew(w.peer)
        if rng.random() < 0.1:
            gone = workers.pop(rng.choice(list(workers)))
            index.remove(gone)
        if rng.random() < 0.1 or not workers:
            join()
        if rng.random() < 0.05:
            w = rng.choice(list(workers.values()))
            if rng.random() < 0.5:
                w.draining = True
            else:
                w.broken = "broken in the test"
