"""ObjectStore in one process: every lifecycle path and every status, through cffi."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scaler_executor.exceptions import TaskError
from scaler_executor.objstore import (
    ObjectAlreadySealed,
    ObjectExists,
    ObjectNotFound,
    ObjectNotHeld,
    ObjectNotSealed,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreFull,
    ObjectStoreStats,
    ObjectTableFull,
    RegionExists,
    RegionNoSpace,
    RegionNotFound,
    StoreForked,
    StoreLockTimeout,
    StoreSystemError,
)
from scaler_executor.objstore._objstore import ffi, lib
from scaler_executor.objstore.errors import STATUS_TABLE, StatusContext, error_for

pytestmark = pytest.mark.timeout(60)


def oid() -> bytes:
    return uuid.uuid4().bytes


def address(view: memoryview) -> int:
    return int(ffi.cast("uintptr_t", ffi.from_buffer(view)))


# ------------------------------------------------------------------ lifecycle


def test_put_get_is_zero_copy_and_read_only(store: ObjectStore) -> None:
    a = oid()
    store.put(a, b"hello world")
    v1, v2 = store.get(a), store.get(a)
    assert bytes(v1) == b"hello world" and v1.readonly
    assert address(v1) == address(v2)  # both views are the same bytes in the mapping
    assert address(v1) % 64 == 0
    with pytest.raises(TypeError):
        v1[0] = 0
    assert store.stats().references == 2
    v1.release()
    v2.release()
    assert store.stats().references == 0


def test_put_accepts_any_buffer(store: ObjectStore) -> None:
    arr = np.arange(1000, dtype=np.float64)
    a, b, c = oid(), oid(), oid()
    store.put(a, arr)
    store.put(b, arr[::2])  # not contiguous: copied once
    store.put(c, bytearray())
    assert np.array_equal(np.frombuffer(store.get(a), dtype=np.float64), arr)
    assert np.array_equal(np.frombuffer(store.get(b), dtype=np.float64), arr[::2])
    assert len(store.get(c)) == 0


def test_create_buffer_write_seal_get(store: ObjectStore) -> None:
    a = oid()
    buf = store.create_buffer(a, 10)
    assert not buf.readonly and address(buf) % 64 == 0
    buf[:] = b"0123456789"
    assert store.state(a) == "unsealed" and a not in store
    with pytest.raises(ObjectNotSealed):
        store.get(a)
    with pytest.raises(ObjectNotSealed):
        store.delete(a)
    store.seal(a)
    with pytest.raises(ValueError):  # seal released the writable view
        buf[0] = 1
    assert a in store and store.state(a) == "sealed"
    assert bytes(store.get(a)) == b"0123456789"
    assert store.stats().references == 0  # get's view was a temporary


def test_double_seal_and_abort_of_sealed(store: ObjectStore) -> None:
    a = oid()
    buf = store.create_buffer(a, 4)
    buf[:] = b"abcd"
    store.seal(a)
    with pytest.raises(ObjectAlreadySealed):
        store.seal(a)
    with pytest.raises(ObjectAlreadySealed):
        store.abort(a)


def test_abort_frees_at_once(store: ObjectStore) -> None:
    a = oid()
    buf = store.create_buffer(a, 100_000)
    assert store.stats().in_use > 100_000
    store.abort(a)
    assert store.state(a) == "absent" and store.stats().in_use == 0
    with pytest.raises(ValueError):
        buf[0] = 1
    with pytest.raises(ObjectNotFound):
        store.abort(a)
    store.put(a, b"again")  # the id is free again


def test_dropping_an_unsealed_buffer_aborts_it(store: ObjectStore) -> None:
    a = oid()
    buf = store.create_buffer(a, 10)
    del buf
    assert store.state(a) == "absent"


def test_abort_waits_for_arrays_and_refuses_exports(store: ObjectStore) -> None:
    a = oid()
    buf = store.create_buffer(a, 80)
    arr = np.frombuffer(buf, dtype=np.uint8)  # NumPy takes its own view of the bytes
    store.abort(a)
    assert store.state(a) == "unsealed"  # memory stays while the array can still use it
    del arr
    assert store.state(a) == "absent"
    buf = store.create_buffer(a, 80)
    export = ffi.from_buffer(buf)  # a real buffer export of the view
    with pytest.raises(BufferError, match="exported"):
        store.abort(a)
    assert store.state(a) == "unsealed"
    ffi.release(export)
    store.abort(a)
    assert store.state(a) == "absent"


def test_delete_with_readers_is_deferred(store: ObjectStore) -> None:
    a = oid()
    store.put(a, b"x" * 5000)
    view = store.get(a)
    assert store.delete(a) is False
    assert store.state(a) == "delete_pending" and a not in store
    with pytest.raises(ObjectNotFound):
        store.get(a)
    with pytest.raises(ObjectNotFound):
        store.delete(a)
    with pytest.raises(ObjectExists):
        store.put(a, b"new")
    assert bytes(view[:3]) == b"xxx"  # the reader still sees its bytes
    assert store.stats().pending_delete == 1
    view.release()
    assert store.state(a) == "absent"
    s = store.stats()
    assert s.objects == 0 and s.in_use == 0 and s.pending_delete == 0
    store.put(a, b"new")


def test_delete_without_readers_frees(store: ObjectStore) -> None:
    a = oid()
    store.put(a, b"abc")
    assert store.delete(a) is True
    assert store.state(a) == "absent"


def test_not_found(store: ObjectStore) -> None:
    a = oid()
    with pytest.raises(ObjectNotFound):
        store.get(a)
    with pytest.raises(ObjectNotFound):
        store.delete(a)
    with pytest.raises(ObjectNotFound):
        store.seal(a)
    with pytest.raises(ObjectNotHeld):
        store.release(a)
    assert store.state(a) == "absent" and a not in store


def test_id_exists(store: ObjectStore) -> None:
    a = oid()
    store.put(a, b"1")
    with pytest.raises(ObjectExists):
        store.put(a, b"2")
    with pytest.raises(ObjectExists):
        store.create_buffer(a, 1)
    assert bytes(store.get(a)) == b"1"


def test_release_paths(store: ObjectStore) -> None:
    a = oid()
    store.put(a, bytes(range(100)))
    view = store.get(a)
    part = view[10:20]
    store.release(a)  # releases the view; the slice keeps the reference
    with pytest.raises(ValueError):
        view[0]
    assert store.stats().references == 1 and bytes(part) == bytes(range(10, 20))
    with pytest.raises(ObjectNotHeld):
        store.release(a)
    del part
    assert store.stats().references == 0
    view = store.get(a)
    arr = np.frombuffer(view, dtype=np.uint8)
    store.release(a)  # the array holds its own view: the reference lives on with it
    assert store.stats().references == 1 and arr[5] == 5
    del arr
    assert store.stats().references == 0
    view = store.get(a)
    export = ffi.from_buffer(view)
    with pytest.raises(BufferError, match="exported"):
        store.release(a)
    ffi.release(export)
    store.release(a)
    assert store.stats().references == 0
    # low level: the C library tells apart "not held" and "not found"
    h = store._region.handle
    assert lib.objstore_release(h, a) == lib.OBJSTORE_E_NOT_HELD
    assert lib.objstore_release(h, oid()) == lib.OBJSTORE_E_NOT_FOUND


def test_full_is_immediate_and_clears(region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 256 * 1024) as store:
        a, b = oid(), oid()
        store.put(a, b"x" * 200_000)
        with pytest.raises(ObjectStoreFull) as info:
            store.put(b, b"y" * 100_000)
        err = info.value
        assert isinstance(err, TaskError)
        assert (err.size, err.limit) == (100_000, 256 * 1024)
        assert err.in_use == store.stats().in_use > 200_000
        assert "100000 bytes" in str(err)
        again = pickle.loads(pickle.dumps(err))
        assert (again.size, again.limit, again.in_use) == (err.size, err.limit, err.in_use)
        with pytest.raises(ObjectStoreFull):
            store.create_buffer(b, 1 << 40)
        store.delete(a)
        store.put(b, b"y" * 100_000)  # serves again at once
        store.validate()


def test_table_full(region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 1 << 20, max_objects=4) as store:
        for _ in range(4):
            store.put(oid(), b"z")
        with pytest.raises(ObjectTableFull) as info:
            store.put(oid(), b"z")
        assert isinstance(info.value, ObjectStoreFull) and "4 of 4 objects" in str(info.value)


def test_stats_snapshot(store: ObjectStore) -> None:
    a, b = oid(), oid()
    store.put(a, b"a" * 100)
    buf = store.create_buffer(b, 1000)
    view = store.get(a)
    s = store.stats()
    assert isinstance(s, ObjectStoreStats)
    with pytest.raises(AttributeError):
        s.objects = 0  # type: ignore[misc]  # frozen
    assert (s.capacity, s.objects, s.sealed, s.data_bytes) == (4 << 20, 2, 1, 1100)
    assert s.in_use == (64 + 128) + (64 + 1024)
    assert s.references == 2 and s.processes == 1 and not s.file_backed
    assert s.largest_free == s.capacity - s.in_use - 64 and s.free_blocks == 1
    assert s.region_size > s.capacity
    # usage(): the same figures without the lock (nothing is changing them here)
    assert store.usage() == (s.capacity, s.in_use, s.data_bytes, s.objects)
    del view, buf


def test_list_ids(store: ObjectStore) -> None:
    assert store.list_ids() == []
    ids = {oid() for _ in range(100)}
    for a in ids:
        store.put(a, b"v")
    buf = store.create_buffer(b := oid(), 1)
    assert set(store.list_ids()) == ids | {b}
    del buf


def test_invalid_arguments(store: ObjectStore, region_name: Callable[[], str]) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        store.put(b"short", b"x")
    with pytest.raises(TypeError):
        store.get(12345)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.create_buffer(oid(), -1)
    with pytest.raises(ValueError):
        ObjectStore.create("bad/name", 1 << 20)
    with pytest.raises(ValueError):
        ObjectStore.create(region_name(), 10)
    with pytest.raises(ValueError):
        store._test_crash_point("nowhere")


# ------------------------------------------------------------------ regions


def test_region_exists_and_not_found(store: ObjectStore, region_name: Callable[[], str]) -> None:
    with pytest.raises(RegionExists):
        ObjectStore.create(store.name, 1 << 20)
    with pytest.raises(RegionNotFound):
        ObjectStore.attach(region_name())
    assert ObjectStore.unlink_name(region_name()) is False


def test_region_file_mode(store: ObjectStore) -> None:
    assert store.path == f"/dev/shm/{store.name}"
    assert os.stat(store.path).st_mode & 0o777 == 0o600


def test_reopen_after_unlink_keeps_old_views(region_name: Callable[[], str]) -> None:
    name = region_name()
    first = ObjectStore.create(name, 1 << 20)
    a = oid()
    first.put(a, b"old bytes")
    view = first.get(a)
    assert first.unlink() is True and first.unlink() is False
    with pytest.raises(RegionNotFound):
        ObjectStore.attach(name)
    with ObjectStore.create(name, 1 << 20) as second:  # same name, new region
        assert a not in second
        second.put(a, b"new bytes")
        assert bytes(view) == b"old bytes"
    first.close()
    assert bytes(view) == b"old bytes"  # mapping held by the view after close
    view.release()


def test_close_with_live_views(region_name: Callable[[], str]) -> None:
    name = region_name()
    with ObjectStore.create(name, 1 << 20) as owner:
        reader = ObjectStore.attach(name)
        a = oid()
        owner.put(a, b"kept")
        view = reader.get(a)
        reader.close()
        reader.close()  # idempotent
        with pytest.raises(ValueError, match="closed"):
            reader.get(a)
        assert bytes(view) == b"kept"
        assert owner.stats().processes == 2 and owner.stats().references == 1
        view.release()  # last view: the reader's handle detaches now
        assert owner.stats().processes == 1 and owner.stats().references == 0
    assert not os.path.exists(f"/dev/shm/{name}")


def test_context_manager_owner_unlinks_attacher_does_not(region_name: Callable[[], str]) -> None:
    name = region_name()
    with ObjectStore.create(name, 1 << 20) as owner:
        with ObjectStore.attach(name) as other:
            assert other.stats().processes == 2
        assert os.path.exists(owner.path)
    assert not os.path.exists(f"/dev/shm/{name}")
    assert "closed" in repr(owner)


def test_no_room_in_shm_is_a_clear_error(region_name: Callable[[], str]) -> None:
    name = region_name()
    with pytest.raises(RegionNoSpace, match="fallback directory"):
        ObjectStore.create(name, 1 << 20, _test_shm_avail=4096)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_file_backed_fallback(region_name: Callable[[], str], tmp_path: Path) -> None:
    name = region_name()
    with ObjectStore.create(name, 1 << 20, fallback_dir=str(tmp_path), _test_shm_avail=4096) as s:
        assert s.stats().file_backed and s.path == str(tmp_path / name)
        assert os.stat(s.path).st_mode & 0o777 == 0o600
        a = oid()
        s.put(a, b"on disk")
        with pytest.raises(RegionNotFound):
            ObjectStore.attach(name)
        with ObjectStore.attach(name, fallback_dir=str(tmp_path)) as other:
            assert bytes(other.get(a)) == b"on disk"
    assert not list(tmp_path.iterdir())


def test_fallback_too_small_is_no_space(region_name: Callable[[], str], tmp_path: Path) -> None:
    # /dev/shm "full", and a fallback that cannot hold 1 PiB either
    with pytest.raises(RegionNoSpace):
        ObjectStore.create(region_name(), 1 << 48, fallback_dir=str(tmp_path), _test_shm_avail=1)
    assert not list(tmp_path.iterdir())


def test_handle_used_after_fork_is_refused(store: ObjectStore) -> None:
    a = oid()
    store.put(a, b"x")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            store.get(a)
        except StoreForked:
            os._exit(0)
        except BaseException:  # noqa: BLE001 - any other outcome is a failure code
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.stats().references == 0


# ------------------------------------------------------------------ the status table


def test_status_table_covers_every_c_status() -> None:
    names = {}
    for st in range(1, 64):
        name = ffi.string(lib.objstore_status_name(st)).decode()
        if name == "UNKNOWN":
            break
        names[st] = name
    assert names == {st: entry[0] for st, entry in STATUS_TABLE.items()}
    assert lib.OBJSTORE_E_SYSTEM == max(STATUS_TABLE)


@pytest.mark.parametrize("status", sorted(STATUS_TABLE))
def test_every_status_maps_to_its_exception(status: int) -> None:
    ctx = StatusContext(
        "op",
        "text",
        object_id=b"\x01" * 16,
        region="r",
        size=5,
        limit=10,
        in_use=7,
        holder_pid=1234,
        errno=2,
    )
    err = error_for(status, ctx)
    name = STATUS_TABLE[status][0]
    if name == "INVALID":
        assert type(err) is ValueError
    else:
        assert isinstance(err, ObjectStoreError) and type(err).status == name
    if isinstance(err, StoreLockTimeout):
        assert err.holder_pid == 1234 and "1234" in str(err)
    if isinstance(err, StoreSystemError):
        assert err.errno == 2 and "ENOENT" in str(err)
    if isinstance(err, ObjectStoreFull) and not isinstance(err, ObjectTableFull):
        assert (err.size, err.limit, err.in_use) == (5, 10, 7)
    assert "unknown status" in str(error_for(99, ctx))
