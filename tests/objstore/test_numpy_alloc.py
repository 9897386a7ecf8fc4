"""NumPy arrays allocated in the store (objstore/numpy_alloc.py, native/os_numpy.c).

The handler is installed in this test process for one test at a time and uninstalled
after it; every array a test made in the store must be gone by then (checked).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from scaler_executor.objstore import ObjectStore
from scaler_executor.objstore import numpy_alloc, payload

KIB = 1024
THRESHOLD = 256 * KIB


def handler_name(a: np.ndarray) -> str:
    core = getattr(np, "_core", None) or np.core
    return core.multiarray.get_handler_name(a)


@pytest.fixture
def big_store(region_name: Callable[[], str]) -> Iterator[ObjectStore]:
    s = ObjectStore.create(region_name(), 16 << 20)
    try:
        yield s
        s.validate()
    finally:
        s.unlink()
        s.close()


@pytest.fixture
def arrays(big_store: ObjectStore) -> Iterator[numpy_alloc.Installed]:
    installed = numpy_alloc.install(big_store, THRESHOLD)
    assert installed is not None
    try:
        yield installed
    finally:
        numpy_alloc.uninstall(installed)
        gc.collect()
    counts = installed.stats()
    assert counts["lost"] == 0
    assert counts["store"] == counts["released"], f"store arrays still alive after the test: {counts}"
    assert installed.pin is None, "the mapping should be let go once no store array is left"


def test_large_arrays_live_in_the_store_small_and_zeros_do_not(
    big_store: ObjectStore, arrays: numpy_alloc.Installed
) -> None:
    large = np.full(THRESHOLD // 8, 2.5)
    found = big_store.object_at(large.ctypes.data)
    assert found is not None and found[1:] == (THRESHOLD, "unsealed")
    assert handler_name(large) == numpy_alloc.HANDLER_NAME
    assert (large == 2.5).all()
    small = np.ones(THRESHOLD // 8 - 1)
    zeros = np.zeros(THRESHOLD)  # calloc: private pages cost nothing until touched
    assert big_store.object_at(small.ctypes.data) is None
    assert big_store.object_at(zeros.ctypes.data) is None
    assert arrays.stats()["store"] == 1
    objects = big_store.stats().objects
    del large
    assert big_store.stats().objects == objects - 1, "freeing an unsealed store array frees its block"


def test_a_returned_array_becomes_the_object_without_a_copy(
    big_store: ObjectStore, arrays: numpy_alloc.Installed
) -> None:
    a = np.arange(THRESHOLD // 8, dtype=np.float64)
    address = a.ctypes.data
    packed = payload.pack((a, "x"), big_store)
    assert len(packed.object_ids) == 1 and packed.created == packed.object_ids
    oid = packed.object_ids[0]
    assert big_store.object_at(address) == (oid, a.nbytes, "sealed")
    assert not a.flags.writeable, "readers share these bytes now: the owner must not write"
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    value, tag = payload.unpack(packed.header, packed.object_ids, big_store)
    assert tag == "x" and value.ctypes.data == address, "the reader maps the very block"
    assert np.array_equal(value, np.arange(THRESHOLD // 8, dtype=np.float64))
    in_use = big_store.stats().in_use
    del a  # the creator's reference goes; the object stays for its reader
    assert big_store.state(oid) == "sealed" and big_store.stats().in_use == in_use
    payload.delete_objects(big_store, packed.created)
    assert big_store.state(oid) == "delete_pending"  # the reader still holds it
    del value
    gc.collect()
    assert big_store.state(oid) == "absent"


def test_slices_and_second_views_are_copied(big_store: ObjectStore, arrays: numpy_alloc.Installed) -> None:
    a = np.arange(2 * THRESHOLD // 8, dtype=np.float64)
    tail = a[THRESHOLD // 8 :]  # starts inside the block: cannot be the object
    packed = payload.pack(tail, big_store)
    assert big_store.object_at(a.ctypes.data)[2] == "unsealed"
    assert a.flags.writeable and tail.flags.writeable
    again = payload.pack((a, a[:]), big_store)  # the second view finds the block sealed
    assert len(again.object_ids) == 2 and big_store.object_at(a.ctypes.data)[2] == "sealed"
    assert again.object_ids[0] == big_store.object_at(a.ctypes.data)[0] != again.object_ids[1]
    got = payload.unpack(again.header, again.object_ids, big_store)
    assert np.array_equal(got[0], got[1]) and got[0].ctypes.data != got[1].ctypes.data
    assert np.array_equal(payload.unpack(packed.header, packed.object_ids, big_store), tail)
    del got, a, tail
    gc.collect()
    payload.delete_objects(big_store, packed.created + again.created)


def test_temporaries_go_back_and_are_reused(big_store: ObjectStore, arrays: numpy_alloc.Installed) -> None:
    before = big_store.stats()
    addresses = set()
    for i in range(200):
        a = np.empty(THRESHOLD // 8)
        a.fill(i)
        b = a * 2 + 1  # two more temporaries of the same size
        assert b[0] == 2 * i + 1
        addresses.add(a.ctypes.data)
        del a, b
    after = big_store.stats()
    assert (after.objects, after.in_use) == (before.objects, before.in_use)
    assert len(addresses) <= 3, "freed blocks are reused most recent first"
    assert arrays.stats()["store"] >= 400


def test_arrays_use_at_most_the_limit(big_store: ObjectStore, region_name: Callable[[], str]) -> None:
    installed = numpy_alloc.install(big_store, THRESHOLD, limit=3 * THRESHOLD)
    assert installed is not None
    try:
        held = [np.empty(THRESHOLD // 8) for _ in range(4)]
        in_store = [big_store.object_at(a.ctypes.data) is not None for a in held]
        assert in_store == [True, True, False, False]  # each block is the bytes + a 64-byte header
        assert installed.stats()["declined"] == 2
        held[2][:] = 7  # private memory works as ever
        assert held[2].sum() == 7 * (THRESHOLD // 8)
        del held
    finally:
        numpy_alloc.uninstall(installed)
    assert installed.stats()["released"] == 2 and installed.pin is None


def test_resize_moves_the_bytes(big_store: ObjectStore, arrays: numpy_alloc.Installed) -> None:
    objects = big_store.stats().objects
    a = np.arange(THRESHOLD // 8, dtype=np.int64)
    old = a.ctypes.data
    a.resize(THRESHOLD // 4, refcheck=False)  # realloc through the handler
    assert np.array_equal(a[: THRESHOLD // 8], np.arange(THRESHOLD // 8))
    found = big_store.object_at(a.ctypes.data)
    assert found is not None and found[1] == 2 * THRESHOLD
    assert big_store.object_at(old) is None or old == a.ctypes.data
    assert big_store.stats().objects == objects + 1, "the old block goes back"
    del a


def test_uninstall_restores_the_previous_handler(big_store: ObjectStore) -> None:
    installed = numpy_alloc.install(big_store, THRESHOLD)
    assert installed is not None
    kept = np.empty(THRESHOLD // 8)
    numpy_alloc.uninstall(installed)
    assert installed.pin is not None, "an array still lives in the store: keep the mapping"
    fresh = np.empty(THRESHOLD // 8)
    assert handler_name(fresh) == "default_allocator"
    assert big_store.object_at(fresh.ctypes.data) is None
    kept[:] = 1.0  # still valid after uninstall
    assert kept.sum() == THRESHOLD // 8
    del kept
    assert installed.stats()["released"] == 1


def test_install_needs_a_positive_threshold(big_store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="threshold must be > 0"):
        numpy_alloc.install(big_store, 0)


@pytest.mark.timeout(30)
def test_a_forked_child_writes_into_its_own_copy(big_store: ObjectStore, arrays: numpy_alloc.Installed) -> None:
    a = np.full(THRESHOLD // 8, 1.0)
    assert big_store.object_at(a.ctypes.data) is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            a[:] = 5.0  # copy-on-write, as private memory would be
            b = np.empty(THRESHOLD // 8)  # the handle is the parent's: private memory
            b[:] = 3.0
            os.write(w, f"{a.sum()} {b.sum()} {big_store._region.handle is not None}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as pipe:
        seen = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seen.split()[:2] == [repr(5.0 * (THRESHOLD // 8)), repr(3.0 * (THRESHOLD // 8))]
    assert (a == 1.0).all(), "the child's write must not reach the parent's array"
    del a


@pytest.mark.parametrize(
    ("version", "ok"), [("1.21.6", False), ("1.22.0rc1", True), ("2.4.6", True), ("garbage", False)]
)
def test_supported_versions(version: str, ok: bool) -> None:
    class Fake:
        __version__ = version

    assert numpy_alloc.supported(Fake()) is ok


def test_old_numpy_is_declined(big_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    class Old:
        __version__ = "1.21.6"

    monkeypatch.setitem(sys.modules, "numpy", Old())
    assert numpy_alloc.install(big_store, THRESHOLD) is None
    monkeypatch.delitem(sys.modules, "numpy")
    assert numpy_alloc.install(big_store, THRESHOLD) is None
