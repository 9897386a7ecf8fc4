"""Values through the store (scaler_executor/objstore/payload.py): round trips, zero-copy
read-only views, the shared cache, a full store, and what other processes see."""

from __future__ import annotations

import multiprocessing.context
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from objstore_workers import pack_and_exit, unpack_and_measure

from scaler_executor.objstore import ObjectNotFound, ObjectStore, ObjectStoreFull
from scaler_executor.objstore.payload import (
    DEFAULT_THRESHOLD,
    Packed,
    SharedBuffers,
    add_readonly_hint,
    delete_objects,
    pack,
    pack_inline,
    unpack,
    unpack_inline,
)

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20
PREFIX = 12  # bytes of the header's fixed prefix
Spawn = multiprocessing.context.SpawnContext


@pytest.fixture
def big_store(region_name: Callable[[], str]) -> Iterator[ObjectStore]:
    store = ObjectStore.create(region_name(), 64 * MiB)
    try:
        yield store
        if not store.closed:
            store.validate()
    finally:
        store.unlink()
        store.close()


def in_store(store: ObjectStore, array: np.ndarray) -> bool:
    base, size = store.mapping
    address = array.__array_interface__["data"][0]
    return base <= address and address + array.nbytes <= base + size


def round_trip(store: ObjectStore, value: Any, **kwargs: Any) -> tuple[Any, Packed]:
    packed = pack(value, store, **kwargs)
    return unpack(packed.header, packed.object_ids, store), packed


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize(
    "value",
    [
        0,
        -(10**40),
        "text ünïcode",
        None,
        (1, 2.5, "x"),
        {"nested": [1, {2: (3,)}], "set": {1, 2}},
        b"small bytes",
        bytearray(b"small bytearray"),
    ],
    ids=repr,
)
def test_small_values_stay_in_the_header(big_store: ObjectStore, value: Any) -> None:
    got, packed = round_trip(big_store, value)
    assert got == value and type(got) is type(value)
    assert packed.object_ids == [] and packed.created == []
    assert big_store.stats().objects == 0


def test_big_bytes_bytearray_and_list_go_as_one_stream_object(big_store: ObjectStore) -> None:
    for value in [b"\x01" * (3 * MiB), bytearray(b"\x02" * (2 * MiB)), list(range(200_000))]:
        got, packed = round_trip(big_store, value)
        assert got == value and type(got) is type(value)
        assert len(packed.header) == PREFIX  # a tiny reference to the stream object
        assert packed.object_ids == packed.created and len(packed.object_ids) == 1
        delete_objects(big_store, packed.created)
    assert big_store.stats().objects == 0


def test_a_function_and_a_lambda_round_trip(big_store: ObjectStore) -> None:
    scale = 3
    got, _ = round_trip(big_store, {"f": lambda x: x * scale, "g": np.add})
    assert got["f"](2) == 6 and got["g"] is np.add


ARRAYS = {
    "float64-1d": np.arange(100_000, dtype=np.float64),
    "int8-3d": np.arange(4 * 50 * 400, dtype=np.int8).reshape(4, 50, 400),
    "complex128-2d": (np.arange(20_000) * 1j).reshape(100, 200),
    "bool": np.arange(300_000) % 3 == 0,
    "uint16-fortran": np.asfortranarray(np.arange(300 * 400, dtype=np.uint16).reshape(300, 400)),
    "structured": np.zeros(10_000, dtype=[("a", "i4"), ("b", "f8"), ("c", "S3")]),
    "datetime64": np.arange(100_000).astype("datetime64[s]"),
    "timedelta64-fortran": np.asfortranarray(
        np.arange(40_000).astype("timedelta64[ms]").reshape(200, 200)
    ),
    "float32-big": np.linspace(0, 1, 1_000_000, dtype=np.float32),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_contiguous_arrays_are_zero_copy_and_read_only(big_store: ObjectStore, name: str) -> None:
    want = ARRAYS[name]
    got, packed = round_trip(big_store, want)
    assert_same_array(got, want)
    assert got.flags.f_contiguous == want.flags.f_contiguous
    assert in_store(big_store, got)  # the data pointer lies in the store's mapping
    assert not got.flags.writeable
    assert packed.object_ids == packed.created and len(packed.object_ids) == 1
    assert len(packed.header) < 1024


def test_dict_of_arrays(big_store: ObjectStore) -> None:
    value = {name: array for name, array in ARRAYS.items()}
    value["small"] = np.arange(10)
    got, packed = round_trip(big_store, value)
    for name, array in value.items():
        assert_same_array(got[name], array)
    assert not in_store(big_store, got["small"])  # below the threshold: in the header
    assert len(packed.object_ids) == len(ARRAYS)
    assert all(in_store(big_store, got[name]) for name in ARRAYS)


def test_non_contiguous_and_object_arrays_travel_as_copies(big_store: ObjectStore) -> None:
    base = np.arange(600 * 400, dtype=np.float64).reshape(600, 400)
    objects = np.empty(30_000, dtype=object)
    objects[:] = [{"a": n} if n % 2 else [n] for n in range(30_000)]
    for want in [base[:, ::2], base[::3], base.T[::2], objects]:
        assert not (want.flags.c_contiguous or want.flags.f_contiguous) or want.dtype == object
        got, packed = round_trip(big_store, want)
        assert_same_array(got, want)
        # NumPy copies them into the pickle stream: private, writable copies
        assert got.flags.writeable and not in_store(big_store, got)
        delete_objects(big_store, packed.created)


def test_writing_into_a_view_is_refused_with_advice(big_store: ObjectStore) -> None:
    got, _ = round_trip(big_store, np.ones(100_000))
    with pytest.raises(ValueError, match="assignment destination is read-only") as info:
        got[0] = 5.0
    assert add_readonly_hint(info.value)
    notes = "\n".join(info.value.__notes__)
    assert "arr.copy()" in notes and "writable=True" in notes
    assert not add_readonly_hint(info.value)  # once only
    with pytest.raises(ValueError) as again:
        got.flags.writeable = True
    assert add_readonly_hint(again.value)
    assert not add_readonly_hint(ValueError("unrelated"))
    copy = got.copy()
    copy[0] = 5.0
    assert got[0] == 1.0


def test_writable_gives_private_copies(big_store: ObjectStore) -> None:
    want = np.arange(200_000, dtype=np.int32)
    packed = pack({"a": want}, big_store)
    got = unpack(packed.header, packed.object_ids, big_store, writable=True)["a"]
    assert got.flags.writeable and not in_store(big_store, got)
    got[:] = -1
    assert big_store.stats().references == 0  # the copy holds no store reference
    again = unpack(packed.header, packed.object_ids, big_store)["a"]
    assert_same_array(again, want)  # the stored object is untouched


def test_views_hold_references_until_dropped(big_store: ObjectStore) -> None:
    packed = pack([np.ones(100_000), np.zeros(100_000)], big_store)
    got = unpack(packed.header, packed.object_ids, big_store)
    assert big_store.stats().references == 2
    assert big_store.delete(packed.object_ids[0]) is False  # deferred: a reader holds it
    assert got[0].sum() == 100_000  # still readable
    del got
    s = big_store.stats()
    assert (s.references, s.objects) == (0, 1)


def test_views_survive_close_and_unlink(region_name: Callable[[], str]) -> None:
    store = ObjectStore.create(region_name(), 16 * MiB)
    packed = pack(np.arange(500_000), store)
    got = unpack(packed.header, packed.object_ids, store)
    store.unlink()
    store.close()
    assert got.sum() == np.arange(500_000).sum()


def test_threshold_decides(big_store: ObjectStore) -> None:
    array = np.arange(1000, dtype=np.uint8)  # 1000 bytes
    _, low = round_trip(big_store, array, threshold=1000)
    assert len(low.object_ids) == 1
    _, high = round_trip(big_store, array, threshold=2000)  # buffer and stream in band
    assert high.object_ids == [] and len(high.header) > 1000
    _, stream = round_trip(big_store, array, threshold=1001)  # the stream is > 1001 bytes
    assert len(stream.object_ids) == 1 and len(stream.header) == PREFIX
    _, everything = round_trip(big_store, [np.arange(3), b"x"], threshold=0)
    assert len(everything.object_ids) == 2  # the buffer, and the (non-empty) stream
    with pytest.raises(ValueError):
        pack(1, big_store, threshold=-1)
    assert DEFAULT_THRESHOLD == 64 * 1024


# ------------------------------------------------------------------ the shared cache


def test_shared_cache_stores_an_array_once(big_store: ObjectStore) -> None:
    shared = SharedBuffers()
    array = np.arange(500_000, dtype=np.float64)
    fortran = np.asfortranarray(array.reshape(500, 1000))  # a fresh exporter per pickle
    packs = [pack((n, array, fortran), big_store, shared=shared) for n in range(20)]
    assert len(shared) == 2 and big_store.stats().objects == 2
    assert all(p.created == [] for p in packs)  # the cache owns them
    assert all(p.object_ids == packs[0].object_ids for p in packs)
    assert sorted(shared.object_ids()) == sorted(packs[0].object_ids)
    for n, p in enumerate(packs):
        got = unpack(p.header, p.object_ids, big_store)
        assert got[0] == n and in_store(big_store, got[1]) and in_store(big_store, got[2])
        assert_same_array(got[1], array)
        assert_same_array(got[2], fortran)
    del got
    shared.delete_all(big_store)
    assert len(shared) == 0 and big_store.stats().objects == 0


def test_shared_cache_never_aliases_equal_bytes(big_store: ObjectStore) -> None:
    shared: dict[Any, Any] = {}  # any mutable mapping will do
    a = np.zeros(100_000)
    b = np.zeros(100_000)  # equal bytes, another array: another object
    pa = pack(a, big_store, shared=shared)
    pb = pack(b, big_store, shared=shared)
    half = pack(a[:50_000], big_store, shared=shared)  # same owner, another length
    assert len({pa.object_ids[0], pb.object_ids[0], half.object_ids[0]}) == 3
    assert all(entry[0] is a or entry[0] is b for entry in shared.values())  # kept alive


def test_shared_cache_entry_whose_object_is_gone_is_written_again(
    big_store: ObjectStore,
) -> None:
    shared = SharedBuffers()
    array = np.arange(100_000)
    first = pack(array, big_store, shared=shared)
    delete_objects(big_store, first.object_ids)  # freed behind the cache's back
    second = pack(array, big_store, shared=shared)
    assert second.object_ids != first.object_ids
    assert_same_array(unpack(second.header, second.object_ids, big_store), array)


# ------------------------------------------------------------------ failures


def test_full_store_raises_and_leaves_nothing(region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 4 * MiB) as store:
        keep = pack(np.ones(100_000), store)  # 800 KB already there
        before = store.stats()
        shared = SharedBuffers()
        value = [np.ones(1_000_000 // 8), np.ones(2 * MiB // 8), np.ones(2 * MiB // 8)]
        with pytest.raises(ObjectStoreFull) as info:
            pack(value, store, shared=shared)
        err = info.value
        assert err.size == 2 * MiB and err.limit == 4 * MiB and err.in_use > 0
        after = store.stats()
        assert (after.objects, after.in_use) == (before.objects, before.in_use)
        assert len(shared) == 0  # nothing half-added to the cache either
        with pytest.raises(ObjectStoreFull):  # the stream object itself does not fit
            pack(b"x" * (5 * MiB), store)
        assert store.stats().objects == before.objects
        got = unpack(keep.header, keep.object_ids, store)
        assert got.sum() == 100_000


def test_pickling_error_writes_nothing(big_store: ObjectStore) -> None:
    import threading

    with pytest.raises(TypeError):
        pack([np.ones(100_000), threading.Lock()], big_store)
    assert big_store.stats().objects == 0


def test_unpack_of_a_deleted_object_leaks_no_reference(big_store: ObjectStore) -> None:
    packed = pack([np.ones(100_000), np.ones(100_000)], big_store)
    delete_objects(big_store, packed.object_ids[1:])
    with pytest.raises(ObjectNotFound):
        unpack(packed.header, packed.object_ids, big_store)
    assert big_store.stats().references == 0


def test_malformed_headers_are_value_errors(big_store: ObjectStore) -> None:
    packed = pack(np.ones(100_000), big_store)
    with pytest.raises(ValueError, match="1 store objects, 0 ids"):
        unpack(packed.header, [], big_store)
    with pytest.raises(ValueError, match="pass the store"):
        unpack(packed.header, packed.object_ids, None)
    with pytest.raises(ValueError, match="not a packed value"):
        unpack(pickle.dumps(1), [], big_store)
    with pytest.raises(ValueError, match="shorter"):
        unpack_inline(b"SX")
    with pytest.raises(ValueError, match="version 9"):
        unpack_inline(b"SXPV\x09" + packed.header[5:])
    with pytest.raises(ValueError, match="use unpack"):
        unpack_inline(packed.header)


# ------------------------------------------------------------------ without a store


def test_inline_round_trip() -> None:
    value = {"a": np.arange(100_000), "f": np.asfortranarray(np.ones((300, 300))), "b": b"x"}
    data = pack_inline(value)
    assert len(data) > 100_000 * 8
    for got in (unpack_inline(data), unpack(data, [], None)):
        assert_same_array(got["a"], value["a"])
        assert_same_array(got["f"], value["f"])
        assert got["a"].flags.writeable and got["b"] == b"x"


class Registered:
    """Pickled through a reducer registered with copyreg after the first pickling."""

    def __init__(self, value: int) -> None:
        self.value = value


def _rebuilt(value: int) -> Registered:
    return Registered(value * 10)


def test_a_copyreg_reducer_registered_later_is_used(big_store: ObjectStore) -> None:
    """The plain dispatch table (plain_dispatch_table) is made again when copyreg's changes."""
    import copyreg

    got, _ = round_trip(big_store, Registered(1))
    assert got.value == 1  # no reducer yet: pickled as it is
    copyreg.pickle(Registered, lambda r: (_rebuilt, (r.value,)))
    try:
        got, _ = round_trip(big_store, Registered(2))
        assert got.value == 20, "the reducer registered after the first pickling was not used"
        assert unpack_inline(pack_inline(Registered(3))).value == 30
    finally:
        del copyreg.dispatch_table[Registered]
    got, _ = round_trip(big_store, Registered(4))
    assert got.value == 4  # and its removal counts too


def test_inert_types_and_classes_by_reference_skip_the_reducer(big_store: ObjectStore) -> None:
    seen: list[Any] = []

    def reducer(obj: Any) -> Any:
        seen.append(obj)
        return NotImplemented

    value = [len, Registered(5), Registered]
    got, _ = round_trip(big_store, value, reducer=reducer)
    assert got[0] is len and got[1].value == 5 and got[2] is Registered
    assert any(o is len for o in seen) is False, "a builtin function is inert by default"
    assert any(o is Registered for o in seen) and any(type(o) is Registered for o in seen)
    seen.clear()
    got, _ = round_trip(
        big_store, value, reducer=reducer, inert=frozenset({type(len), Registered}), by_reference=frozenset({Registered})
    )
    assert got[0] is len and got[1].value == 5 and got[2] is Registered
    assert seen == [], f"asked about {seen}"


# ------------------------------------------------------------------ across processes


def test_unpack_after_the_packer_exited(spawn: Spawn, region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 32 * MiB) as store:
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=pack_and_exit, args=(store.name, child_end))
        p.start()
        result = parent_end.recv()
        p.join()
        assert "error" not in result, result.get("error")
        assert p.exitcode == 0
        store.reap()
        got = unpack(result["header"], result["ids"], store)
        assert got["pid"] == p.pid
        assert_same_array(got["array"], np.arange(1 << 20, dtype=np.int64))
        assert in_store(store, got["array"])


@pytest.mark.timeout(120)
def test_unpacking_200_mb_costs_shared_not_private_memory(
    spawn: Spawn, region_name: Callable[[], str]
) -> None:
    with ObjectStore.create(region_name(), 256 * MiB) as store:
        array = np.arange(25_000_000, dtype=np.int64)  # 200 MB
        packed = pack(array, store)
        want = int(array.sum())
        del array
        parent_end, child_end = spawn.Pipe()
        args = (store.name, packed.header, packed.object_ids, child_end)
        p = spawn.Process(target=unpack_and_measure, args=args)
        p.start()
        result = parent_end.recv()
        p.join()
        assert "error" not in result, result.get("error")
        assert result["nbytes"] == 200_000_000 and result["total"] == want
        assert not result["writeable"]
        assert result["anon_kib"] < 20 * 1024, result  # far less than 200 MB private
        assert result["shmem_kib"] > 150 * 1024, result  # the pages it read are shared
