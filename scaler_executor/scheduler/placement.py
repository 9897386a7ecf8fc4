"""Where constrained tasks can go: workers by what they declare, and queues no worker can serve.

Tasks that need resources or tags wait in one queue per constraint key (core.py,
``Scheduler.constrained``).  Without an index, every dispatch pass tried every such queue
over every connected worker, so a queue nobody can serve right now (its tag on no worker,
or every worker that has it full) cost a walk over the workers on every turn, times the
number of such queues.  This module removes both factors:

* **Classes.**  Workers are grouped by their *profile*, what they declare: (resources,
  tags).  A key is tried only over the workers of the profiles that could ever run it
  (``fitting``); profiles are few in a real cluster (workers are started alike), so
  finding them is cheap, and the list is cached per key until a profile appears or goes.
* **Open workers.**  Plain tasks (no needs) go by the allocation policy (policies.py) over
  the workers that may have room, ``open``, not over every worker: a worker leaves the set
  when a dispatch pass finds it full (or broken, or draining) and comes back when it grows
  (below).  With a backlog, most workers are full and a pass costs what the few that
  freed a slot cost.
* **Idle workers.**  With many idle workers and a thin queue (a few tasks ready per turn),
  the open set is nearly every worker, and a pass over it cost O(workers) per turn, divided
  among few tasks.  The least-loaded policy's first choices are known without a pass: the
  idle workers (nothing in flight but seceded tasks, so load 0), in join order, each
  filled to its processors (policies.py).  ``next_idle`` pops them one at a time, while
  tasks remain, from a heap by join order, filled by ``refresh`` with the
  workers that grew while idle; entries that went stale (the worker got tasks, left,
  drains) are dropped when popped.  The core gives them the first ready tasks and runs the
  full pass only for what remains, so the placement is the policy's, at O(tasks /
  processors · log workers) a turn for a thin queue.
* **Stuck keys.**  When a pass over a key's fitting workers leaves tasks in its queue, no
  worker can take one more of them *now* (its tasks all need the same): the key is *stuck*
  and is not tried again until a worker that could ever run it may have room for more:
  it joined, one of its tasks ended or was handed back (``_unassign``), a task of its
  seceded, or its timing (hence its prefetch window) changed.  The core reports those
  with :meth:`Placement.grew` (O(1), a set insertion); at the next dispatch,
  :meth:`Placement.refresh` gives each stuck key that such a worker's profile fits, and
  whose tightest resource need it has free now (``_StuckKeys``: a bisection, not a walk
  over the keys), that worker as a *candidate*; the key is tried on its candidates
  alone.  A stuck key with no candidate costs nothing per turn: the dispatch pass does
  not visit it.

Exactness: a key is stuck only right after a pass over all of its fitting workers left
tasks queued, and between then and now a worker that was not reported as grown can only
have lost room (more tasks, a drain, a break, leaving).  So trying the candidates is
trying every worker that could take one, and placement is the same as a full scan's
(tests/unit/test_placement.py checks it against a brute-force reference at 1,000 workers).

Counters (in the daemon's statistics): ``placement_scans``, full passes over a key's
fitting workers; ``placement_retries``, passes over a stuck key's candidates alone;
``placement_stuck``, the keys stuck now.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable

from scaler_executor.scheduler.state import ConstraintKey, WorkerRecord

# What a worker declares: its resources (sorted) and tags.
Profile = tuple[tuple[tuple[str, float], ...], frozenset[str]]


def profile_of(worker: WorkerRecord) -> Profile:
    return tuple(sorted(worker.resources.items())), worker.tags


def profile_fits(profile: Profile, key: ConstraintKey) -> bool:
    """Could a worker that declares ``profile`` ever run a task of ``key`` (as fits_ever)?"""
    declared, tags = profile
    if not tags.issuperset(key[1]):
        return False
    have = dict(declared)
    return all(have.get(name, 0.0) >= quantity for name, quantity in key[0])


def _joined(worker: WorkerRecord) -> int:
    return worker.worker_id


class _StuckKeys:
    """One profile's stuck keys, by what a worker of it must have free to take one.

    A key with resource needs is filed under one of them, its *tightest* for this profile
    (the largest share of what the profile declares), in a list sorted by that quantity; a
    key with tags only is filed apart.  A worker that grew is a candidate for the keys
    whose filed quantity it has free now, found by bisection: a worker whose GPU is still
    held by a long task is not offered the keys that need a GPU, however many there are.
    (Exact: a key whose tightest need exceeds the worker's free amount cannot fit it now,
    and the worker is reported again once that resource is freed.)
    """

    __slots__ = ("anywhere", "needs")

    def __init__(self) -> None:
        self.anywhere: set[ConstraintKey] = set()  # tags only: any room will do
        self.needs: dict[str, tuple[list[float], list[ConstraintKey]]] = {}  # name -> (quantities, keys), sorted

    @staticmethod
    def _filed(profile: Profile, key: ConstraintKey) -> tuple[str, float] | None:
        if not key[0]:
            return None
        declared = dict(profile[0])
        return max(key[0], key=lambda need: (need[1] / declared[need[0]] if declared.get(need[0]) else 0.0, need[0]))

    def add(self, profile: Profile, key: ConstraintKey) -> None:
        filed = self._filed(profile, key)
        if filed is None:
            self.anywhere.add(key)
            return
        quantities, keys = self.needs.setdefault(filed[0], ([], []))
        at = bisect.bisect_right(quantities, filed[1])
        quantities.insert(at, filed[1])
        keys.insert(at, key)

    def discard(self, profile: Profile, key: ConstraintKey) -> None:
        filed = self._filed(profile, key)
        if filed is None:
            self.anywhere.discard(key)
            return
        entry = self.needs.get(filed[0])
        if entry is None:
            return
        quantities, keys = entry
        at = bisect.bisect_left(quantities, filed[1])
        while at < len(keys) and quantities[at] == filed[1]:
            if keys[at] == key:
                del quantities[at], keys[at]
                break
            at += 1
        if not keys:
            del self.needs[filed[0]]

    def __bool__(self) -> bool:
        return bool(self.anywhere or self.needs)

    def all(self) -> set[ConstraintKey]:
        return self.anywhere.union(*(keys for _, keys in self.needs.values()))

    def fitting_now(self, worker: WorkerRecord) -> list[ConstraintKey]:
        """The keys whose filed need this worker has free now (the rest cannot fit it)."""
        found = list(self.anywhere)
        used = worker.used
        for name, (quantities, keys) in self.needs.items():
            free = worker.resources.get(name, 0.0) - used.get(name, 0.0)
            found += keys[: bisect.bisect_right(quantities, free + 1e-9)]
        return found


class Placement:
    """Workers by profile and the stuck constraint keys (module doc)."""

    def __init__(self) -> None:
        self.classes: dict[Profile, dict[bytes, WorkerRecord]] = {}
        self._profile: dict[bytes, Profile] = {}  # peer -> its profile
        self._fitting: dict[ConstraintKey, list[Profile]] = {}  # cache; cleared when a profile comes or goes
        # key -> workers that may have room for it since it stuck (ordered set)
        self.stuck: dict[ConstraintKey, dict[bytes, None]] = {}
        self._stuck_by_profile: dict[Profile, _StuckKeys] = {}
        self.active: set[ConstraintKey] = set()  # keys the next dispatch pass tries
        self._grown: set[bytes] = set()  # workers that may have more room since the last refresh
        # Workers that may have room for a plain task (a superset: the dispatch pass drops
        # those it finds full, broken or draining; refresh adds back those that grew).
        self.open: dict[bytes, WorkerRecord] = {}
        # (worker id, peer) of workers idle when they last grew, a heap by join order, and
        # the same entries as a set (module doc, "Idle workers")
        self._idle: list[tuple[int, bytes]] = []
        self._idle_in: set[tuple[int, bytes]] = set()
        self.scans = 0
        self.retries = 0

    # ------------------------------------------------------------------ workers

    def add(self, worker: WorkerRecord) -> None:
        if worker.peer in self._profile:  # the same peer again: its old record goes
            self.remove(worker)
        profile = profile_of(worker)
        self._profile[worker.peer] = profile
        members = self.classes.get(profile)
        if members is None:
            members = self.classes[profile] = {}
            self._fitting.clear()
            filed = _StuckKeys()
            for key in self.stuck:
                if profile_fits(profile, key):
                    filed.add(profile, key)
            if filed:
                self._stuck_by_profile[profile] = filed
        members[worker.peer] = worker
        self._grown.add(worker.peer)
        self.open[worker.peer] = worker

    def remove(self, worker: WorkerRecord) -> None:
        profile = self._profile.pop(worker.peer, None)
        if profile is None:
            return
        members = self.classes[profile]
        del members[worker.peer]
        if not members:
            del self.classes[profile]
            self._stuck_by_profile.pop(profile, None)
            self._fitting.clear()
        self._grown.discard(worker.peer)
        self.open.pop(worker.peer, None)

    def grew(self, peer: bytes) -> None:
        """This worker may have room for more than at the last dispatch pass."""
        self._grown.add(peer)

    def fitting(self, key: ConstraintKey) -> list[Profile]:
        profiles = self._fitting.get(key)
        if profiles is None:
            profiles = self._fitting[key] = [p for p in self.classes if profile_fits(p, key)]
        return profiles

    def workers_for(self, key: ConstraintKey) -> Iterable[WorkerRecord]:
        """Every connected worker that could ever run ``key`` (broken and draining ones included)."""
        classes = self.classes
        for profile in self.fitting(key):
            yield from classes[profile].values()

    def satisfiable(self, key: ConstraintKey) -> bool:
        """Some connected, unbroken worker could ever run ``key``."""
        classes = self.classes
        return any(w.broken is None for p in self.fitting(key) for w in classes[p].values())

    # ------------------------------------------------------------------ keys

    def queued(self, key: ConstraintKey) -> None:
        """A queue for ``key`` was made: try it at the next pass."""
        if key not in self.stuck:
            self.active.add(key)

    def refresh(self) -> None:
        """Before a dispatch pass: stuck keys get the workers that grew since as candidates."""
        grown = self._grown
        if not grown:
            return
        profiles, classes, open_, idle, idle_in = self._profile, self.classes, self.open, self._idle, self._idle_in
        for peer in grown:
            profile = profiles.get(peer)
            if profile is not None:
                worker = open_[peer] = classes[profile][peer]
                if len(worker.inflight) == len(worker.seceded):  # idle (seceded tasks are no load)
                    entry = (worker.worker_id, peer)
                    if entry not in idle_in:
                        idle_in.add(entry)
                        heapq.heappush(idle, entry)
        if self._stuck_by_profile:
            profiles, stuck, active = self._profile, self.stuck, self.active
            by_profile = self._stuck_by_profile
            for peer in grown:
                profile = profiles.get(peer)
                filed = by_profile.get(profile) if profile is not None else None
                if filed:
                    for key in filed.fitting_now(classes[profile][peer]):  # type: ignore[index]
                        stuck[key][peer] = None
                        active.add(key)
        grown.clear()

    def pending(self, peer: bytes) -> bool:
        """This worker grew since the last refresh (the next dispatch pass will look at it)."""
        return peer in self._grown

    def open_workers(self, workers: dict[bytes, WorkerRecord]) -> list[WorkerRecord]:
        """Every worker that may have room, in the order they joined (``workers``' order, the
        policy's tie order): sorted when few; when most are open, simply every worker (the
        pass closes those it finds full, as it would have skipped them anyway)."""
        open_ = self.open
        if 4 * len(open_) > len(workers):
            return list(workers.values())
        found = list(open_.values())
        found.sort(key=_joined)
        return found

    def next_idle(self) -> WorkerRecord | None:
        """The first-joined open worker with nothing in flight (seceded tasks aside) that may
        take a task, or None: the least-loaded policy's next choice while workers are idle
        (filled to its processors, policies.py).  Taken off the heap: a worker the caller
        gives no task goes back by :meth:`put_back`."""
        idle, idle_in, open_ = self._idle, self._idle_in, self.open
        while idle:
            entry = heapq.heappop(idle)
            idle_in.discard(entry)
            worker = open_.get(entry[1])
            if (
                worker is None or worker.worker_id != entry[0] or len(worker.inflight) != len(worker.seceded)
                or worker.broken is not None or worker.draining or worker.capacity <= 0
            ):
                continue  # stale: it grows again (and comes back here) when it may take one
            return worker
        return None

    def put_back(self, worker: WorkerRecord) -> None:
        """An idle worker :meth:`next_idle` gave out that got no task."""
        entry = (worker.worker_id, worker.peer)
        if entry not in self._idle_in:
            self._idle_in.add(entry)
            heapq.heappush(self._idle, entry)

    def closed(self, peer: bytes) -> None:
        """This worker has no room for a plain task now (until it grows)."""
        self.open.pop(peer, None)

    def candidates(self, key: ConstraintKey) -> dict[bytes, None] | None:
        """A stuck key's candidates (taken: the pass tries them now), or None: try every fitting worker."""
        candidates = self.stuck.get(key)
        if candidates is None:
            self.scans += 1
            return None
        self.retries += 1
        self.stuck[key] = {}
        return candidates

    def stick(self, key: ConstraintKey) -> None:
        """A pass over ``key`` left tasks queued: no worker can take one more now."""
        self.active.discard(key)
        if key in self.stuck:
            return  # its candidates were taken by this pass; any added since are kept
        self.stuck[key] = {}
        for profile in self.fitting(key):
            filed = self._stuck_by_profile.get(profile)
            if filed is None:
                filed = self._stuck_by_profile[profile] = _StuckKeys()
            filed.add(profile, key)

    def served(self, key: ConstraintKey) -> None:
        """``key``'s queue emptied (or went): forget it."""
        self.active.discard(key)
        if self.stuck.pop(key, None) is not None:
            for profile in self.fitting(key):
                filed = self._stuck_by_profile.get(profile)
                if filed is not None:
                    filed.discard(profile, key)
                    if not filed:
                        del self._stuck_by_profile[profile]

    def statistics(self) -> dict[str, int]:
        return {"placement_scans": self.scans, "placement_retries": self.retries, "placement_stuck": len(self.stuck)}

    def validate(self, workers: dict[bytes, WorkerRecord], keys: Iterable[ConstraintKey]) -> None:
        """Structure: every worker in its class, the stuck keys' reverse index right."""
        assert set(self._profile) == set(workers), "placement classes and the workers differ"
        for peer, worker in workers.items():
            profile = profile_of(worker)
            assert self._profile[peer] == profile and self.classes[profile][peer] is worker, f"{worker!r} misfiled"
        assert sum(len(members) for members in self.classes.values()) == len(workers)
        assert all(self.classes.values()), "an empty class is kept"
        known = set(keys)
        assert set(self.stuck) <= known, "a stuck key without a queue"
        assert self.active <= known, "an active key without a queue"
        for profile in self.classes:
            expected = {key for key in self.stuck if profile_fits(profile, key)}
            filed = self._stuck_by_profile.get(profile)
            assert (filed.all() if filed is not None else set()) == expected, f"stuck keys of {profile} are off"
            if filed is not None:
                for quantities, keys in filed.needs.values():
                    assert quantities == sorted(quantities) and len(quantities) == len(keys) > 0
        assert set(self._stuck_by_profile) <= set(self.classes)
        for key, candidates in self.stuck.items():
            assert not candidates or key in self.active, f"stuck key {key} has candidates but is not tried"
        assert all(workers.get(peer) is w for peer, w in self.open.items()), "an open worker is not connected"
        assert len(self._idle) == len(self._idle_in) and set(self._idle) == self._idle_in, "idle heap and set differ"
        for peer, worker in self.open.items():
            if (
                peer not in self._grown and len(worker.inflight) == len(worker.seceded) and worker.broken is None
                and not worker.draining and worker.capacity > 0
            ):
                assert (worker.worker_id, peer) in self._idle_in, f"idle {worker!r} is not in the idle heap"
