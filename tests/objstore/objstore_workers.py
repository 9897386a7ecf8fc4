"""Helpers and child-process targets of the object store tests.

A module of its own (not a test module) so that processes started with the ``spawn``
context import it cheaply. Every target reports through a ``multiprocessing`` Pipe
connection: a dict with counters, or ``{"error": traceback}``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import random
import time
import traceback
from collections.abc import Callable
from typing import Any

from scaler_executor.objstore import (
    ObjectExists,
    ObjectNotFound,
    ObjectNotHeld,
    ObjectNotSealed,
    ObjectStore,
    ObjectStoreFull,
)

MAX_OBJECT = 24_000  # bytes; sizes vary with the id so blocks of many classes mix


def make_id(group: int, n: int) -> bytes:
    return hashlib.blake2b(f"{group}:{n}".encode(), digest_size=16).digest()


def content(oid: bytes) -> bytes:
    """The bytes every object with this id must hold: derived from the id alone."""
    size = int.from_bytes(oid[:4], "little") % MAX_OBJECT
    pattern = hashlib.blake2b(oid, digest_size=64).digest()
    return (pattern * (size // 64 + 1))[:size]


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (for states only the real clock decides)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def proc_state(pid: int) -> str:
    """State letter of /proc/PID/stat ('' if the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _report(conn: Any, body: Callable[[], dict[str, Any]]) -> None:
    try:
        result = body()
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        result = {"error": traceback.format_exc()}
    conn.send(result)
    conn.close()


# ------------------------------------------------------------------ small scenarios


def attach_check_put(name: str, oid: bytes, expected: bytes, new_oid: bytes, conn: Any) -> None:
    """A second process: attach, read an object, add one, close."""

    def body() -> dict[str, Any]:
        with ObjectStore.attach(name) as store:
            view = store.get(oid)
            same = bytes(view) == expected
            view.release()
            store.put(new_oid, b"from the child " + str(os.getpid()).encode())
            return {"same": same, "pid": os.getpid(), "processes": store.stats().processes}

    _report(conn, body)


def hold_and_vanish(name: str, oids: list[bytes], conn: Any) -> None:
    """Take references and an unsealed object, then die without closing."""
    store = ObjectStore.attach(name)
    views = [store.get(oid) for oid in oids]
    buf = store.create_buffer(make_id(99, os.getpid()), 100)
    conn.send({"held": len(views), "pid": os.getpid(), "unsealed": len(buf)})
    conn.close()
    os._exit(0)


def stop_in_lock(name: str, oid: bytes) -> None:
    """Stop (SIGSTOP) inside the critical section of a get, holding the lock."""
    store = ObjectStore.attach(name)
    store._test_crash_point("get_after_incref", action="stop")
    store.get(oid)
    os._exit(0)  # only reached if someone sends SIGCONT


def grow_and_crash(name: str, point: str, size: int) -> None:
    """Arm `point`, then create an object that makes the store commit more memory."""
    store = ObjectStore.attach(name)
    store._test_crash_point(point)
    store.create_buffer(make_id(77, 0), size)
    os._exit(3)  # the crash point was not reached


def read_back(name: str, oids: list[bytes], conn: Any) -> None:
    """Attach, say so, wait for the parent to grow the store, then check every object."""

    def body() -> dict[str, Any]:
        with ObjectStore.attach(name) as store:
            conn.send("attached")
            conn.recv()  # the parent has put objects past the committed mark of our attach
            same = []
            for oid in oids:
                view = store.get(oid)
                same.append(bytes(view) == content_big(oid, len(view)))
                view.release()
            return {"same": same}

    _report(conn, body)


def content_big(oid: bytes, size: int) -> bytes:
    """Deterministic bytes of any size for `oid` (cheap to build, differs per page)."""
    pattern = hashlib.blake2b(oid, digest_size=64).digest() * 64  # 4 KiB
    return (pattern * (size // len(pattern) + 1))[:size]


def pack_and_exit(name: str, conn: Any) -> None:
    """Pack a value with a large array into the store, send its header and ids, exit."""
    import numpy as np

    from scaler_executor.objstore.payload import pack

    def body() -> dict[str, Any]:
        with ObjectStore.attach(name) as store:
            value = {"array": np.arange(1 << 20, dtype=np.int64), "pid": os.getpid()}
            packed = pack(value, store)
            return {"header": packed.header, "ids": packed.object_ids}

    _report(conn, body)
    os._exit(0)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def unpack_and_measure(name: str, header: bytes, ids: list[bytes], conn: Any) -> None:
    """Unpack a value holding one large array, touch every page of it, and report how
    this process's anonymous (private) and shared resident memory grew, in KiB."""
    import numpy as np

    from scaler_executor.objstore.payload import unpack

    def body() -> dict[str, Any]:
        with ObjectStore.attach(name) as store:
            anon, shmem = _status_kib("RssAnon"), _status_kib("RssShmem")
            array = unpack(header, ids, store)
            total = int(np.sum(array, dtype=np.int64))  # reads every page
            result = {
                "anon_kib": _status_kib("RssAnon") - anon,
                "shmem_kib": _status_kib("RssShmem") - shmem,
                "nbytes": array.nbytes,
                "total": total,
                "writeable": bool(array.flags.writeable),
            }
            del array
            return result

    _report(conn, body)


def run_ops(store: ObjectStore, group: int, rounds: int) -> None:
    """put, get, release, delete on own ids: reaches every crash point but reap."""
    for n in range(rounds):
        oid = make_id(group, n)
        store.put(oid, content(oid))
        view = store.get(oid)
        store.release(oid)
        del view
        buf = store.create_buffer(make_id(group + 1, n), 10)
        store.abort(make_id(group + 1, n))
        del buf
        store.delete(oid)


def crash_at(name: str, point: str, holder_oid: bytes, conn: Any) -> None:
    """Hold one reference, arm `point`, work until the process exits inside the lock."""
    store = ObjectStore.attach(name)
    view = store.get(holder_oid)
    if point == "reap":
        conn.send("attached")
        conn.recv()  # the parent has made a process die holding references
        store._test_crash_point("reap", countdown=2)
        store.reap()
    else:
        store._test_crash_point(point)
        run_ops(store, 500, 3)
    del view
    os._exit(3)  # the crash point was not reached


# ------------------------------------------------------------------ stress
#
# Every stress worker attaches, says "ready", and waits for the parent to send the common
# deadline (time.monotonic() is the same clock in every process), so the concurrent part
# lasts as long as asked even when spawning the interpreters is slow.


def _ready(conn: Any) -> float:
    conn.send("ready")
    return float(conn.recv())


def creator(name: str, group: int, count: int, conn: Any) -> None:
    def body() -> dict[str, Any]:
        made = full = exists = 0
        with ObjectStore.attach(name) as store:
            deadline = _ready(conn)
            while time.monotonic() < deadline:
                for n in range(count):
                    oid = make_id(group, n)
                    data = content(oid)
                    try:
                        if n % 2:
                            buf = store.create_buffer(oid, len(data))
                            buf[:] = data
                            store.seal(oid)
                        else:
                            store.put(oid, data)
                        made += 1
                    except ObjectStoreFull:
                        full += 1
                    except ObjectExists:
                        exists += 1
                    if time.monotonic() >= deadline:
                        break
        return {"made": made, "full": full, "exists": exists}

    _report(conn, body)


def reader(name: str, groups: list[int], count: int, seed: int, conn: Any) -> None:
    """Read random ids and hold the last few views; release the oldest either through the
    view or through ``store.release(oid)``, which must release the newest live view of
    that id (a later one still held here, when the id was read twice). The reader models
    which view that is and checks it: released views must be unusable, live ones intact.
    ``bad`` counts every departure, ``kinds`` says which check saw it."""

    def body() -> dict[str, Any]:
        rng = random.Random(seed)
        read = missing = 0
        kinds: collections.Counter[str] = collections.Counter()
        held: collections.deque[_Read] = collections.deque()
        with ObjectStore.attach(name) as store:
            deadline = _ready(conn)
            while time.monotonic() < deadline:
                oid = make_id(rng.choice(groups), rng.randrange(count))
                try:
                    view = store.get(oid)
                except (ObjectNotFound, ObjectNotSealed):
                    missing += 1
                    continue
                read += 1
                if view != content(oid):
                    kinds["fresh"] += 1
                held.append(_Read(oid, view))
                if len(held) > 4:
                    old = held.popleft()
                    if not old.released and old.view != content(old.oid):
                        kinds["popped"] += 1
                    if rng.random() < 0.5:
                        old.view.release()
                    else:
                        _release_newest(store, old, held, kinds)
                    del old
            for entry in held:
                if not entry.released and entry.view != content(entry.oid):
                    kinds["held"] += 1
                entry.view.release()
        return {"read": read, "missing": missing, "bad": sum(kinds.values()), "kinds": kinds}

    _report(conn, body)


class _Read:
    __slots__ = ("oid", "released", "view")

    def __init__(self, oid: bytes, view: memoryview) -> None:
        self.oid, self.view, self.released = oid, view, False


def _release_newest(
    store: ObjectStore, old: _Read, held: collections.deque[_Read], kinds: collections.Counter[str]
) -> None:
    """``store.release(old.oid)``: check it released exactly the newest live view."""
    target = next((e for e in reversed(held) if e.oid == old.oid and not e.released), None)
    if target is None and not old.released:
        target = old
    try:
        store.release(old.oid)
    except ObjectNotHeld:
        if target is not None:
            kinds["release_found_none"] += 1
        return
    if target is None:
        kinds["release_found_extra"] += 1
        return
    target.released = True
    kinds["release_left_usable"] += _still_usable(target.view)
    if not old.released and old.view != content(old.oid):  # a later view went instead
        kinds["release_wrong_view"] += 1


def _still_usable(view: memoryview) -> int:
    """1 if `view` was not released (it should have been), else 0."""
    try:
        _ = view.nbytes
    except ValueError:
        return 0
    return 1


def deleter(name: str, groups: list[int], count: int, seed: int, conn: Any) -> None:
    def body() -> dict[str, Any]:
        rng = random.Random(seed)
        deleted = deferred = missing = 0
        with ObjectStore.attach(name) as store:
            deadline = _ready(conn)
            while time.monotonic() < deadline:
                oid = make_id(rng.choice(groups), rng.randrange(count))
                try:
                    if store.delete(oid):
                        deleted += 1
                    else:
                        deferred += 1
                except (ObjectNotFound, ObjectNotSealed):
                    missing += 1
        return {"deleted": deleted, "deferred": deferred, "missing": missing}

    _report(conn, body)


def victim(name: str, point: str, countdown: int, group: int, hold: list[bytes], conn: Any) -> None:
    """Hold references, then work until the armed crash point exits the process (86)."""
    store = ObjectStore.attach(name)
    deadline = _ready(conn)
    views = []
    for oid in hold:
        try:
            views.append(store.get(oid))
        except (ObjectNotFound, ObjectNotSealed):
            pass
    store._test_crash_point(point, countdown=countdown)
    n = 0
    while time.monotonic() < deadline:
        try:
            run_ops(store, group * 100_000 + 2 * n, 1)
        except (ObjectStoreFull, ObjectExists, ObjectNotFound):
            pass
        n += 1
    os._exit(3)  # not reached


def doomed_reader(name: str, groups: list[int], count: int, seed: int, conn: Any) -> None:
    """Read and hold until killed; says "busy" once it has done some work."""
    rng = random.Random(seed)
    store = ObjectStore.attach(name)
    deadline = _ready(conn)
    held: collections.deque[memoryview] = collections.deque(maxlen=8)
    ops = 0
    while time.monotonic() < deadline:
        oid = make_id(rng.choice(groups), rng.randrange(count))
        try:
            held.append(store.get(oid))
        except (ObjectNotFound, ObjectNotSealed):
            pass
        ops += 1
        if ops == 300:
            conn.send("busy")
    os._exit(0)
