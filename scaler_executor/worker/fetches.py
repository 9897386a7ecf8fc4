"""What a worker fetches over the network for its tasks, and which task waits for what.

A worker on a host that cannot map the daemon's store (``--fetch-objects-over-network``, or
a store it cannot attach) asks the daemon for its tasks' store objects (``ObjectRequest``)
and keeps them while a task it holds reads them. This module is that bookkeeping and
nothing else: pure (no I/O, no clock, no threads; the objects it keeps are opaque to it),
driven by the worker agent with these events, each of which answers what to do:

* ``hold(task, objects)``: a task dispatched here, with the store objects it reads
  (``Need``: whether it runs now, which objects to request; the others are on their way).
  A task that reads none is not recorded. A new attempt of a task replaces the old one.
* ``started(object, stream)``: the first part of an object came, and it is a pickle stream
  that a task may read as it comes (``handoff.Unsealed``): the tasks it releases.
* ``arrived(object, blob)``: an object is whole (``blob``), or will not come (``None``):
  ``Arrival`` lists the tasks that run now, the parked ones that fail, the ones released
  earlier to read it as it came (those not yet at a processor fail too; the others fail
  on their stream), and that stream, for the caller to abort.
* ``forget(task)``: the task is no longer held (its result, a cancel, a hand-back, its
  processor died): an object no held task reads any more is dropped.
* ``clear()``: the daemon lost track of this worker.

A task runs once each of its objects is whole, or all but one, and that one is a pickle
stream arriving (``handoff.stream`` feeds one stream to a RUN). Each object is requested
once until its answer comes, whatever number of tasks wait for it. ``validate()`` checks
the invariants (the unit tests call it after every step).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple


class Need(NamedTuple):
    ready: bool  # it runs now (every object here, or arriving as a stream it reads as it comes)
    request: list[bytes]  # objects to ask the daemon for (not asked for yet)


class Arrival(NamedTuple):
    ready: list[int]  # parked tasks that run now
    failed: list[int]  # parked tasks that cannot run here: the object will not come (forgotten)
    readers: list[int]  # tasks released to read the object as it came, which failed (still held)
    stream: Any  # the object's stream if it was arriving as one (``handoff.Unsealed``), else None


READY = Need(True, [])


class Fetches:
    __slots__ = ("blobs", "missing", "objects_of", "requested", "streaming", "users")

    def __init__(self) -> None:
        self.objects_of: dict[int, tuple[bytes, ...]] = {}  # held task -> the objects it reads
        self.users: dict[bytes, set[int]] = {}  # object -> held tasks that read it
        self.blobs: dict[bytes, Any] = {}  # objects here whole (kept while a held task reads them)
        self.streaming: dict[bytes, Any] = {}  # pickle streams arriving -> their memfd
        self.requested: set[bytes] = set()  # asked of the daemon, not answered yet
        self.missing: dict[int, set[bytes]] = {}  # parked task -> objects it waits for

    def __len__(self) -> int:
        return len(self.objects_of)

    def _runnable(self, missing: set[bytes]) -> bool:
        return not missing or (len(missing) == 1 and next(iter(missing)) in self.streaming)

    def hold(self, task_id: int, object_ids: Iterable[bytes]) -> Need:
        self.forget(task_id)
        ids = tuple(dict.fromkeys(object_ids))
        if not ids:
            return READY
        self.objects_of[task_id] = ids
        for object_id in ids:
            users = self.users.get(object_id)
            if users is None:
                self.users[object_id] = {task_id}
            else:
                users.add(task_id)
        missing = {i for i in ids if i not in self.blobs}
        request = [i for i in ids if i in missing and i not in self.requested]
        self.requested.update(request)
        if self._runnable(missing):
            return READY
        self.missing[task_id] = missing
        return Need(False, request)

    def started(self, object_id: bytes, stream: Any) -> list[int]:
        """A pickle stream began to arrive: the parked tasks it releases."""
        if object_id not in self.requested:
            return []  # an answer nobody waits for (asked before clear())
        self.streaming[object_id] = stream
        return self._release(object_id)

    def _release(self, object_id: bytes) -> list[int]:
        ready = []
        for task_id in self.users.get(object_id, ()):
            missing = self.missing.get(task_id)
            if missing is not None and self._runnable(missing):
                del self.missing[task_id]
                ready.append(task_id)
        return ready

    def arrived(self, object_id: bytes, blob: Any) -> Arrival:
        """The daemon's answer for ``object_id``: the object whole, or None (gone from its
        store, or cut short)."""
        self.requested.discard(object_id)
        stream = self.streaming.pop(object_id, None)
        users = self.users.get(object_id)
        if blob is not None:
            if users is None:
                return Arrival([], [], [], stream)  # every task that read it has ended
            self.blobs[object_id] = blob
            for task_id in users:
                missing = self.missing.get(task_id)
                if missing is not None:
                    missing.discard(object_id)
            return Arrival(self._release(object_id), [], [], stream)
        if users is None:
            return Arrival([], [], [], stream)
        failed = [t for t in users if t in self.missing]
        # Held tasks not parked: released to read it as it came, or (not a stream) holding a
        # copy that came whole before (an answer asked for again): only the first fail.
        readers = [t for t in users if t not in self.missing] if stream is not None else []
        for task_id in failed:
            self.forget(task_id)
        return Arrival([], failed, readers, stream)

    def for_run(self, task_id: int) -> dict[bytes, Any]:
        """A task's objects as its RUN hands them over: whole, or the stream arriving."""
        blobs, streaming = self.blobs, self.streaming
        return {
            i: blobs[i] if i in blobs else streaming[i] for i in self.objects_of.get(task_id, ())
        }

    def parked(self) -> list[int]:
        """Tasks waiting for their objects."""
        return list(self.missing)

    def forget(self, task_id: int) -> None:
        ids = self.objects_of.pop(task_id, None)
        if ids is None:
            return
        self.missing.pop(task_id, None)
        for object_id in ids:
            users = self.users[object_id]
            users.discard(task_id)
            if not users:
                del self.users[object_id]
                self.blobs.pop(object_id, None)

    def clear(self) -> None:
        """The daemon lost track of this worker: nothing it asked for will come."""
        self.objects_of.clear()
        self.users.clear()
        self.blobs.clear()
        self.streaming.clear()
        self.requested.clear()
        self.missing.clear()

    def validate(self) -> None:
        users: dict[bytes, set[int]] = {}
        for task_id, ids in self.objects_of.items():
            assert ids and len(set(ids)) == len(ids), f"task {task_id}: objects {ids}"
            for object_id in ids:
                users.setdefault(object_id, set()).add(task_id)
        assert users == self.users, "users do not match the tasks' objects"
        assert self.blobs.keys() <= self.users.keys(), "a blob no held task reads"
        assert not self.blobs.keys() & self.streaming.keys(), "an object both whole and arriving"
        assert self.streaming.keys() <= self.requested, "a stream nobody asked for"
        for task_id, missing in self.missing.items():
            assert task_id in self.objects_of, f"parked task {task_id} not held"
            assert missing and missing <= set(self.objects_of[task_id]), (
                f"task {task_id} misses {missing}"
            )
            assert missing <= self.requested, f"task {task_id} waits for objects nobody asked for"
            assert not missing & self.blobs.keys(), f"task {task_id} waits for objects here"
            assert not self._runnable(missing), f"task {task_id} parked but runnable"
