"""The Python face of the C object store: :class:`ObjectStore`.

How views keep references (the choice, and why)
------------------------------------------------
``get`` returns a plain read-only ``memoryview`` straight into the shared mapping (no
copy). Python 3.11 has no way to define the buffer protocol in Python, so the reference
is tied to the view through cffi: the pointer is wrapped by ``ffi.gc(ptr, finalizer)``,
``ffi.buffer`` over it keeps that cdata alive, and the memoryview (plus every slice of it,
and every NumPy array built on it) keeps the buffer alive. When the last of those goes,
the finalizer runs ``objstore_release``. So:

* ``view.release()`` (or dropping the view, its slices and its exports) releases the
  reference; ``store.release(object_id)`` does ``view.release()`` on the most recent live
  view of that object, and raises ``BufferError`` if something (a NumPy array) still
  exports it, rather than pulling memory from under it.
* Views are read-only memoryviews; ``view.obj`` is the underlying cffi buffer, which is
  writable: writing through it is a bug this wrapper does not stop.

Lifetime of the mapping
-----------------------
The mapping (the C handle) is unmapped only when the store is closed *and* the last view
is gone: ``close()`` stops new operations at once, and views handed out before stay valid
(and keep their references) until released. ``unlink()`` removes the region's name so no
new process can attach; existing mappings and views stay valid.

Thread safety: operations may run from several threads (the C calls release the GIL and
the region lock serialises them), but ``close()`` must not race other calls on the same
``ObjectStore``. After ``fork``, attach again in the child.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Literal, Self

from scaler_executor.objstore.errors import (
    ObjectNotHeld,
    StatusContext,
    StoreCorrupt,
    error_for,
)

try:
    from scaler_executor.objstore._objstore import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "the C object store is not built: run `python native/build_objstore.py` in the "
        "source tree, or install the package with `pip install .`"
    ) from exc

__all__ = ["CRASH_POINTS", "ObjectState", "ObjectStore", "ObjectStoreStats"]

ID_SIZE = 16
DEFAULT_LOCK_TIMEOUT = 10.0  # seconds: critical sections take microseconds; a wait this
# long means the holder is stopped or stuck, and the error then names it.

ObjectState = Literal["absent", "unsealed", "sealed", "delete_pending"]
_STATES: dict[int, ObjectState] = {
    lib.OBJSTORE_ABSENT: "absent",
    lib.OBJSTORE_UNSEALED: "unsealed",
    lib.OBJSTORE_SEALED: "sealed",
    lib.OBJSTORE_DELETE_PENDING: "delete_pending",
}

#: names accepted by ObjectStore._test_crash_point
CRASH_POINTS = (
    "create_after_alloc",
    "create_after_index",
    "seal",
    "get_after_incref",
    "release_after_decref",
    "free_after_unlink",
    "delete_after_unindex",
    "reap",
    "grow",
)


@dataclass(frozen=True, slots=True)
class ObjectStoreStats:
    """A consistent snapshot of the store (taken under its lock)."""

    capacity: int  # bytes for objects (the memory limit, block headers included)
    in_use: int  # bytes in allocated blocks
    data_bytes: int  # sum of object sizes
    objects: int  # objects in any state
    sealed: int
    pending_delete: int
    free_blocks: int
    largest_free: int  # largest object that fits now
    max_objects: int
    references: int  # references held by all processes
    processes: int  # attached processes
    max_processes: int
    recoveries: int  # updates rolled back after a process died holding the lock
    reaped_processes: int
    region_size: int  # bytes mapped, metadata included
    file_backed: bool  # the region lives in the fallback directory, not /dev/shm
    committed: int  # bytes of the region backed by memory so far (grows on demand)


def _object_id(object_id: Any) -> bytes:
    if not isinstance(object_id, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"object ids are 16-byte bytes objects (e.g. uuid.uuid4().bytes), not "
            f"{type(object_id).__name__}"
        )
    oid = bytes(object_id)
    if len(oid) != ID_SIZE:
        raise ValueError(
            f"object ids are {ID_SIZE} bytes (e.g. uuid.uuid4().bytes); got {len(oid)} bytes"
        )
    return oid


class _Held:
    """One reference handed to Python through a view (get or create_buffer)."""

    __slots__ = ("object_id", "released", "status", "view", "writable")

    def __init__(self, object_id: bytes, writable: bool) -> None:
        self.object_id = object_id
        self.writable = writable
        self.view: weakref.ref[memoryview] | None = None
        self.released = False  # view.release() was called by us
        self.status = 0  # objstore_release's status, once the finalizer ran


class _Region:
    """Owns the C handle (the mapping). Closed once closing is asked and no view is live."""

    def __init__(self, handle: Any) -> None:
        self.handle: Any = ffi.gc(handle, lib.objstore_close)  # backstop if never closed
        self.live: dict[int, _Held] = {}
        self.closing = False
        self.release_failures = 0
        self._tokens = itertools.count()
        self._lock = threading.RLock()
        self.users = 0  # threads inside a C call on the handle (ObjectStore._use)

    def view(self, object_id: bytes, ptr: Any, size: int, writable: bool) -> memoryview:
        held = _Held(object_id, writable)
        token = next(self._tokens)
        self.live[token] = held
        try:
            owner = ffi.gc(ffi.cast("char *", ptr), functools.partial(self._finalize, token, held))
        except BaseException:
            del self.live[token]
            raise
        raw = memoryview(ffi.buffer(owner, size))
        del owner  # the buffer keeps it alive now
        view = raw if writable else raw.toreadonly()
        if not writable:
            raw.release()
        held.view = weakref.ref(view)
        return view

    def _finalize(self, token: int, held: _Held, _cdata: Any) -> None:
        # Runs when the last buffer over this reference is gone; may run in any thread and
        # at interpreter exit, so it must not raise. The token stays registered during the
        # C call, which keeps close_now from freeing the handle under it.
        try:
            handle = self.handle
            if handle is not None:
                held.status = lib.objstore_release(handle, held.object_id)
                if held.status != lib.OBJSTORE_OK:
                    self.release_failures += 1
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            self.release_failures += 1
        finally:
            self.live.pop(token, None)
            if self.closing and not self.live:
                self.close_now()

    def find(self, object_id: bytes, writable: bool) -> Iterator[tuple[_Held, memoryview]]:
        """Live, not yet released views of object_id, newest first."""
        for held in reversed(list(self.live.values())):
            if held.object_id != object_id or held.writable != writable or held.released:
                continue
            view = held.view() if held.view is not None else None
            if view is not None:
                yield held, view

    def close(self) -> None:
        self.closing = True
        if not self.live:
            self.close_now()

    def pin(self) -> int:
        """Keep the mapping, even once closing is asked, until :meth:`unpin` (memory
        that outlives every view points into it: see :mod:`.numpy_alloc`)."""
        token = next(self._tokens)
        self.live[token] = _Held(b"", writable=False)
        return token

    def unpin(self, token: int) -> None:
        self.live.pop(token, None)
        if self.closing and not self.live:
            self.close_now()

    def close_now(self) -> None:
        with self._lock:
            if self.users:
                return  # a thread is inside a C call on the mapping: the last one closes it
            handle, self.handle = self.handle, None
            if handle is not None:
                ffi.release(handle)  # runs objstore_close now


class ObjectStore:
    """A handle on one host's shared-memory object store.

    Create the region once per host with :meth:`create`; every other local process uses
    :meth:`attach`. Object ids are 16-byte ``bytes``. Lifecycle: ``put`` (or
    ``create_buffer`` + write + ``seal``; ``abort`` to give up) -> ``get`` / ``release``
    -> ``delete``. Used as a context manager, it closes on exit, and the creator's handle
    also unlinks the region's name.
    """

    def __init__(self, region: _Region, name: str, fallback_dir: str | None, owner: bool) -> None:
        # private: use ObjectStore.create / ObjectStore.attach
        self._region = region
        self._name = name
        self._fallback_dir = fallback_dir
        self._owner = owner
        self._path: str = ffi.string(lib.objstore_path(region.handle)).decode()
        self._closed = False
        self._span: tuple[int, int] | None = None  # the mapping, once asked for

    # ------------------------------------------------------------ regions

    @classmethod
    def create(
        cls,
        name: str,
        size: int,
        *,
        max_objects: int = 0,
        max_processes: int = 0,
        fallback_dir: str | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        _test_shm_avail: int = 0,
    ) -> ObjectStore:
        """Create region ``name`` holding ``size`` bytes of objects, mode 0600, and attach.

        ``name``: 1-200 characters of ``[A-Za-z0-9._-]``, not starting with ``.``.
        Memory is committed on demand: creation reserves the tables and a first 4 MiB
        step of the heap, and allocations reserve more in 64 MiB steps (``stats().
        committed``), so a large store costs little until it is used. Writes never die
        with SIGBUS: if /dev/shm fills up before the store does, allocations raise
        ObjectStoreFull. Creation needs room for the first step and a filesystem at
        least ``size`` large; if /dev/shm fails that and ``fallback_dir`` is given, the
        region is a file there instead.
        ``max_objects`` (default ``size // 8192``, at least 256) bounds the index;
        ``max_processes`` (default 128) the attached processes.
        Raises RegionExists, RegionNoSpace, ValueError (bad name or size), StoreSystemError.
        """
        opts = ffi.new(
            "objstore_options_t *",
            {
                "capacity": size,
                "max_objects": max_objects,
                "max_processes": max_processes,
                "test_shm_avail": _test_shm_avail,
            },
        )
        keep = ffi.new("char[]", fallback_dir.encode()) if fallback_dir else ffi.NULL
        opts.fallback_dir = keep
        out = ffi.new("objstore_t **")
        _check_region(lib.objstore_create_region(name.encode(), opts, out), "create", name)
        return cls._wrap(out[0], name, fallback_dir, True, lock_timeout)

    @classmethod
    def attach(
        cls,
        name: str,
        *,
        fallback_dir: str | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> ObjectStore:
        """Map the existing region ``name`` (looked up in /dev/shm, then ``fallback_dir``).

        Reaps the slots of processes that are gone first. Raises RegionNotFound,
        RegionInvalid, NoProcessSlot, StoreLockTimeout, StoreSystemError.
        """
        out = ffi.new("objstore_t **")
        fdir = fallback_dir.encode() if fallback_dir else ffi.NULL
        _check_region(lib.objstore_attach(name.encode(), fdir, out), "attach", name)
        return cls._wrap(out[0], name, fallback_dir, False, lock_timeout)

    @classmethod
    def _wrap(
        cls, handle: Any, name: str, fallback_dir: str | None, owner: bool, lock_timeout: float
    ) -> ObjectStore:
        lib.objstore_set_lock_timeout(handle, max(1, int(lock_timeout * 1000)))
        return cls(_Region(handle), name, fallback_dir, owner)

    @staticmethod
    def unlink_name(name: str, fallback_dir: str | None = None) -> bool:
        """Remove region ``name`` without attaching (stale-region cleanup).

        Returns True if it existed. Mappings of it stay valid until closed.
        """
        fdir = fallback_dir.encode() if fallback_dir else ffi.NULL
        st = lib.objstore_unlink_name(name.encode(), fdir)
        if st == lib.OBJSTORE_E_NO_REGION:
            return False
        _check_region(st, "unlink", name)
        return True

    @property
    def name(self) -> str:
        return self._name

    @property
    def path(self) -> str:
        """Where the region lives: ``/dev/shm/NAME`` or ``FALLBACK_DIR/NAME``."""
        return self._path

    @property
    def mapping(self) -> tuple[int, int]:
        """``(address, size)`` of this process's mapping of the region: every view that
        :meth:`get` returns lies inside it (how tests prove a value is zero-copy)."""
        base = ffi.new("const void **")
        size = ffi.new("uint64_t *")
        self._call(lib.objstore_mapping, base, size)
        return int(ffi.cast("uintptr_t", base[0])), int(size[0])

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_holder_pid(self) -> int:
        """The pid that held the lock when this handle last timed out (0: never)."""
        handle = self._region.handle
        return int(lib.objstore_last_holder_pid(handle)) if handle is not None else 0

    def close(self) -> None:
        """Stop using the store; idempotent.

        The mapping stays until the last view handed out is released; then this
        process's remaining references are returned (its unsealed objects aborted) and
        its slot freed.
        """
        if not self._closed:
            self._closed = True
            self._region.close()

    def unlink(self) -> bool:
        """Remove the region's name (no new attach); True if it was still there.

        Mappings, this one included, stay valid until closed.
        """
        handle = self._region.handle
        if handle is None:
            return ObjectStore.unlink_name(self._name, self._fallback_dir)
        st = lib.objstore_unlink(handle)
        if st == lib.OBJSTORE_E_NO_REGION:
            return False
        self._check(st, "unlink")
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._owner and not self._closed:
            self.unlink()
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ObjectStore {self._name!r} at {self._path!r} {state}>"

    # ------------------------------------------------------------ objects

    def put(self, object_id: bytes, data: Any) -> None:
        """Store a copy of ``data`` (any bytes-like object) as a sealed object.

        One call: create, copy (outside the lock), seal, release. Raises ObjectExists,
        ObjectStoreFull, ObjectTableFull, StoreLockTimeout.
        """
        oid = _object_id(object_id)
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        size = view.nbytes
        # The export taken by from_buffer is released before anything is raised: a frame
        # kept by a traceback cycle that still holds an exported memoryview can crash
        # CPython's garbage collector (memory_clear drops the buffer under the export).
        try:
            with self._use() as handle:
                if size:
                    with ffi.from_buffer(view) as source:
                        st = lib.objstore_put(handle, oid, source, size)
                else:
                    st = lib.objstore_put(handle, oid, ffi.NULL, 0)
        finally:
            view.release()
        self._check(st, "put", oid, size)

    def create_buffer(self, object_id: bytes, size: int) -> memoryview:
        """Create an unsealed object of ``size`` bytes; return a writable view of it.

        Write through the view, then :meth:`seal` (which releases the view) or
        :meth:`abort`. Dropping the view before sealing aborts the object. Raises
        ObjectExists, ObjectStoreFull, ObjectTableFull, StoreLockTimeout.
        """
        oid = _object_id(object_id)
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        data = ffi.new("void **")
        with self._use() as handle:  # the view is registered before a close may unmap
            self._check(lib.objstore_create(handle, oid, size, data), "create", oid, size)
            return self._region.view(oid, data[0], size, writable=True)

    def seal(self, object_id: bytes) -> None:
        """Make the object immutable and visible to readers; release its writable views.

        A view still exported (a NumPy array on it) keeps the creator's reference until it
        goes. Raises ObjectNotFound, ObjectAlreadySealed, ObjectNotHeld.
        """
        oid = _object_id(object_id)
        self._check(self._call(lib.objstore_seal, oid), "seal", oid)
        for _held, view in list(self._region.find(oid, writable=True)):
            try:
                view.release()
            except BufferError:
                pass  # exported: the reference goes when the export does

    def seal_at(self, address: int, size: int) -> bytes | None:
        """Seal the unsealed object this handle created whose bytes start at ``address``
        (in this process) and are exactly ``size`` long, and return its id; None when no
        such object starts there (not store memory, a slice of an object, another
        process's object, already sealed). How an array allocated in the store
        (:mod:`.numpy_alloc`) becomes an object without a copy. The creator's reference
        stays with whoever owns that memory."""
        if self._span is None:
            self._span = self.mapping  # fixed for the handle's life
        base, length = self._span
        if not base <= address < base + length:
            return None
        oid = ffi.new("char[16]")
        st = self._call(lib.objstore_seal_at, ffi.cast("void *", address), size, oid)
        if st in (lib.OBJSTORE_E_NOT_FOUND, lib.OBJSTORE_E_SEALED, lib.OBJSTORE_E_NOT_HELD):
            return None
        self._check(st, "seal_at")
        return bytes(ffi.buffer(oid, 16))

    def object_at(self, address: int) -> tuple[bytes, int, ObjectState] | None:
        """``(id, size, state)`` of the object whose bytes start at ``address`` in this
        process, or None."""
        base, length = self.mapping
        if not base <= address < base + length:
            return None
        oid = ffi.new("char[16]")
        size = ffi.new("uint64_t *")
        state = ffi.new("int *")
        st = self._call(lib.objstore_object_at, ffi.cast("void *", address), oid, size, state)
        if st == lib.OBJSTORE_E_NOT_FOUND:
            return None
        self._check(st, "object_at")
        return ffi.buffer(oid, 16)[:], int(size[0]), _STATES[state[0]]

    def abort(self, object_id: bytes) -> None:
        """Drop an unsealed object created here and free its memory.

        Releases its writable view first; raises BufferError if that view is still
        exported. If slices of the view are alive, the memory is freed when they go.
        Raises ObjectNotFound, ObjectAlreadySealed, ObjectNotHeld.
        """
        oid = _object_id(object_id)
        state = self.state(oid)
        if state != "unsealed":
            # let the C library produce the exact status for this state
            self._check(self._call(lib.objstore_abort, oid), "abort", oid)
            return
        views = list(self._region.find(oid, writable=True))
        if not views:
            self._check(self._call(lib.objstore_abort, oid), "abort", oid)
            return
        for held, view in views:
            _release_view(held, view, oid)
            if held.status not in (0, lib.OBJSTORE_E_NOT_FOUND):
                self._check(held.status, "abort", oid)

    def get(self, object_id: bytes) -> memoryview:
        """A read-only, zero-copy view of a sealed object, holding a reference on it.

        The reference is released when the view and everything made from it (slices,
        NumPy arrays) are gone, or by ``view.release()`` / :meth:`release`. Never blocks
        for the object. Raises ObjectNotFound, ObjectNotSealed, ObjectTableFull.
        """
        oid = _object_id(object_id)
        data = ffi.new("const void **")
        size = ffi.new("uint64_t *")
        with self._use() as handle:  # the view is registered before a close may unmap
            self._check(lib.objstore_get(handle, oid, data, size), "get", oid)
            return self._region.view(oid, data[0], int(size[0]), writable=False)

    def release(self, object_id: bytes) -> None:
        """Release the most recent live view returned by :meth:`get` for ``object_id``.

        Raises ObjectNotHeld if this store handed out no live view of it, BufferError if
        the view is still exported (drop the NumPy array or other export first). Slices of
        the view keep the reference until they are gone.
        """
        oid = _object_id(object_id)
        for held, view in self._region.find(oid, writable=False):
            _release_view(held, view, oid)
            if held.status != 0:
                self._check(held.status, "release", oid)
            return
        raise ObjectNotHeld(f"release(object {oid.hex()}): this store holds no live view of it")

    def delete(self, object_id: bytes) -> bool:
        """Delete a sealed object. Returns True if freed now, False if readers still hold
        it (it is then invisible to new readers and freed by the last release).

        Raises ObjectNotFound, ObjectNotSealed (abort it instead).
        """
        oid = _object_id(object_id)
        deferred = ffi.new("int *")
        self._check(self._call(lib.objstore_delete, oid, deferred), "delete", oid)
        return not deferred[0]

    def state(self, object_id: bytes) -> ObjectState:
        """``"absent"``, ``"unsealed"``, ``"sealed"`` or ``"delete_pending"``."""
        oid = _object_id(object_id)
        out = ffi.new("int *")
        self._check(self._call(lib.objstore_contains, oid, out), "contains", oid)
        return _STATES[out[0]]

    def contains(self, object_id: bytes) -> bool:
        """True if ``object_id`` is sealed and not being deleted (``get`` would succeed)."""
        return self.state(object_id) == "sealed"

    def list_ids(self) -> list[bytes]:
        """The ids of every object in the store, in any state (a snapshot)."""
        count = ffi.new("uint64_t *")
        room = 0
        while True:
            ids = ffi.new("char[]", max(1, room) * ID_SIZE)
            self._check(self._call(lib.objstore_list, ids, room, count), "list")
            if count[0] <= room:
                raw = ffi.buffer(ids, count[0] * ID_SIZE)[:]
                return [raw[i : i + ID_SIZE] for i in range(0, len(raw), ID_SIZE)]
            room = int(count[0]) + 64  # objects were added meanwhile: ask again

    def __contains__(self, object_id: object) -> bool:
        return self.contains(object_id)  # type: ignore[arg-type]  # validated inside

    # ------------------------------------------------------------ maintenance

    def stats(self) -> ObjectStoreStats:
        """A snapshot of capacity, use, objects, references and processes."""
        out = ffi.new("objstore_stats_t *")
        self._check(self._call(lib.objstore_stats, out), "stats")
        values: dict[str, Any] = {
            f.name: int(getattr(out, f.name)) for f in fields(ObjectStoreStats)
        }
        values["file_backed"] = bool(values["file_backed"])
        return ObjectStoreStats(**values)

    def usage(self) -> tuple[int, int, int, int]:
        """(capacity, bytes allocated, bytes of object data, objects), read without the store's
        lock: O(1) and never waits (a heartbeat reads it), but not one consistent snapshot
        (an update in progress may show in some figures only); ``stats`` is consistent."""
        out = ffi.new("objstore_usage_t *")
        self._check(self._call(lib.objstore_usage, out), "usage")
        return int(out.capacity), int(out.in_use), int(out.data_bytes), int(out.objects)

    def reap(self) -> int:
        """Return the references and slots of processes that are gone; how many were."""
        out = ffi.new("uint32_t *")
        self._check(self._call(lib.objstore_reap, out), "reap")
        return int(out[0])

    def validate(self) -> None:
        """Check every invariant of the region; raise StoreCorrupt saying which failed."""
        msg = ffi.new("char[512]")
        st = self._call(lib.objstore_validate, msg, 512)
        if st == lib.OBJSTORE_E_CORRUPT:
            raise StoreCorrupt(f"validate on region {self._name!r}: {ffi.string(msg).decode()}")
        self._check(st, "validate")

    def _test_crash_point(
        self, point: str, countdown: int = 1, action: Literal["exit", "stop"] = "exit"
    ) -> None:
        """Tests only: the ``countdown``-th time this process reaches ``point`` (one of
        CRASH_POINTS) inside the lock, it exits with code 86 or stops itself (SIGSTOP)."""
        if point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; choose one of {CRASH_POINTS}")
        code = getattr(lib, "OBJSTORE_CRASH_" + point.upper())
        act = lib.OBJSTORE_CRASH_STOP if action == "stop" else lib.OBJSTORE_CRASH_EXIT
        self._call(lib.objstore_test_crash_point, code, countdown, act)

    def _test_set_commit_limit(self, limit: int) -> None:
        """Tests only: committing the region past ``limit`` bytes (from its start,
        tables included) fails for this handle as if /dev/shm were full; 0 lifts it."""
        self._call(lib.objstore_test_set_commit_limit, limit)

    # ------------------------------------------------------------ helpers

    @contextlib.contextmanager
    def _use(self) -> Iterator[Any]:
        """The C handle, kept mapped until the block ends: another thread's ``close`` (the
        client's agent tearing down while a user thread reads the store) waits for it
        instead of unmapping the region under a running C call."""
        region = self._region
        with region._lock:
            handle = region.handle
            if self._closed or handle is None:
                raise ValueError(f"the object store {self._name!r} is closed")
            region.users += 1
        try:
            yield handle
        finally:
            with region._lock:
                region.users -= 1
                close = region.closing and not region.users and not region.live
            if close:
                region.close_now()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(handle, *args)`` inside :meth:`_use`."""
        with self._use() as handle:
            return fn(handle, *args)

    def _check(self, st: int, operation: str, oid: bytes | None = None, size: int = 0) -> None:
        if st == lib.OBJSTORE_OK:
            return
        handle = self._region.handle
        limit = in_use = holder = err = 0
        detail = ""
        if st in (lib.OBJSTORE_E_FULL, lib.OBJSTORE_E_TABLE_FULL) and handle is not None:
            grow_errno = int(lib.objstore_last_errno(handle)) if st == lib.OBJSTORE_E_FULL else 0
            out = ffi.new("objstore_stats_t *")
            if lib.objstore_stats(handle, out) == lib.OBJSTORE_OK:
                limit, in_use = int(out.capacity), int(out.in_use)
                if st == lib.OBJSTORE_E_TABLE_FULL:
                    detail = f"{out.objects} of {out.max_objects} objects"
                elif grow_errno:
                    where = self._path.rsplit("/", 1)[0] or "/"
                    detail = (
                        f"{where} has no room to grow the store past {out.committed} of "
                        f"{out.region_size} bytes ({_errno_name(grow_errno)}): free space "
                        "there (docker run --shm-size=...), or create a smaller store"
                    )
        if handle is not None:
            holder = int(lib.objstore_last_holder_pid(handle))
            err = int(lib.objstore_last_errno(handle))
        raise error_for(
            st,
            StatusContext(
                operation=operation,
                message=_status_message(st),
                object_id=oid,
                region=self._name,
                size=size,
                limit=limit,
                in_use=in_use,
                holder_pid=holder,
                errno=err,
                detail=detail,
            ),
        )


def _release_view(held: _Held, view: memoryview, oid: bytes) -> None:
    held.released = True
    try:
        view.release()
    except BufferError:
        held.released = False
        raise BufferError(
            f"object {oid.hex()}: its view is still exported (for example a NumPy array "
            "built on it); delete that first"
        ) from None


def _errno_name(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def _status_message(st: int) -> str:
    return str(ffi.string(lib.objstore_status_message(st)).decode())


def _check_region(st: int, operation: str, name: str) -> None:
    if st != lib.OBJSTORE_OK:
        raise error_for(
            st,
            StatusContext(
                operation=operation, message=_status_message(st), region=name, errno=ffi.errno
            ),
        )
