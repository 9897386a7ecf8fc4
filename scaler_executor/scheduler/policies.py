"""Allocation policies: pure functions over a snapshot of the workers.

A policy answers one question — *how many of the ready tasks go to each
worker now?* — from a frozen view of each worker's capacity, the tasks it
holds and its prefetch window.  It touches no state and no clock, so it is
tested with plain tables (tests/unit/test_policies.py).

The prefetch window follows Little's law: to keep a worker's processors busy
while results travel back and new tasks travel out, it must hold about
``refill round trip / mean task time`` tasks per processor beyond the one each
is running — never fewer than two per processor, never more than the
configured cap.  Deep push queues (the reference system sends thousands and
rebalances later) are what this avoids: a task sits in the daemon, where any
worker that frees up can take it, until a worker is about to need it.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple, Protocol

# Assumed refill round trip (daemon → worker → daemon) before one is observed.
# A local round trip measures 0.2 to 1 ms under load; erring high only prefetches more.
DEFAULT_REFILL_SECONDS = 0.002


class WorkerSlot(NamedTuple):
    """What a policy sees of one worker."""

    capacity: int  # processors
    inflight: int  # tasks it holds (queued there or running)
    mean_task_seconds: float | None  # observed; None before the first result


def prefetch_window(slot: WorkerSlot, max_prefetch: int, refill: float = DEFAULT_REFILL_SECONDS) -> int:
    """How many tasks the worker should hold, by Little's law."""
    if slot.mean_task_seconds is None:
        per_processor = 2
    else:
        per_processor = max(2, math.ceil(refill / max(slot.mean_task_seconds, 1e-6)) + 1)
    return slot.capacity + min(slot.capacity * (per_processor - 1), max_prefetch)


class AllocationPolicy(Protocol):
    def allocate(self, ready: int, slots: list[WorkerSlot]) -> list[int]:
        """How many of ``ready`` tasks each worker (same order as ``slots``) gets now."""
        ...


class LeastLoaded:
    """Fill the idle workers' processors first, then give each next task to the worker with
    the lowest load (held / capacity) that has room.

    An idle worker (nothing held) takes as many tasks as it has processors before the next
    idle one takes any, in the slots' order (join order): they run at once either way, and a
    thin queue over many idle workers then travels one dispatch (and one answer) per worker
    rather than one per task, which is what a task costs the daemon there (docs/scaling.rst,
    "Filling idle workers").  One ready task goes to the first idle worker either way."""

    def __init__(self, max_prefetch: int) -> None:
        self.max_prefetch = max_prefetch

    def allocate(self, ready: int, slots: list[WorkerSlot]) -> list[int]:
        counts = [0] * len(slots)
        if ready > 1:
            for i, slot in enumerate(slots):
                if slot.inflight == 0 and slot.capacity > 0:
                    take = min(ready, slot.capacity)  # (a window is never below the processors)
                    counts[i] = take
                    ready -= take
                    if not ready:
                        return counts
        if ready == 1 and not any(counts):  # a sequential caller's task: the least loaded worker with room, no heap
            best, best_load = -1, 0.0
            for i, slot in enumerate(slots):
                if slot.capacity > 0 and prefetch_window(slot, self.max_prefetch) > slot.inflight:
                    load = slot.inflight / slot.capacity
                    if best < 0 or load < best_load:
                        best, best_load = i, load
            if best >= 0:
                counts[best] = 1
            return counts
        heap = []
        for i, slot in enumerate(slots):
            held = slot.inflight + counts[i]
            room = prefetch_window(slot, self.max_prefetch) - held
            if room > 0 and slot.capacity > 0:
                heap.append((held / slot.capacity, i, room))
        heapq.heapify(heap)
        while ready and heap:
            _load, i, room = heapq.heappop(heap)
            counts[i] += 1
            ready -= 1
            if room > 1:
                slot = slots[i]
                heapq.heappush(heap, ((slot.inflight + counts[i]) / slot.capacity, i, room - 1))
        return counts


POLICIES = {"least-loaded": LeastLoaded}


class ScalingView(NamedTuple):
    """What the scaling policy sees of the cluster."""

    demand: int  # tasks queued in the daemon plus tasks held by workers
    workers: int  # local worker processes, started or starting
    per_worker: int  # processors each local worker brings
    minimum: int
    maximum: int


def desired_workers(view: ScalingView) -> int:
    """Enough workers for every task to have a processor, within [minimum, maximum].

    Scale-up goes to the target in one step — not one worker per heartbeat — because
    the tasks are already waiting.  Scale-down is not decided here: only workers idle
    for the configured time are stopped, so a burst's gaps do not churn processes.
    """
    need = -(-view.demand // max(1, view.per_worker))
    return max(view.minimum, min(view.maximum, need))
