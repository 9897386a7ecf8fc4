"""``pack`` copies a large pickle stream once, straight into the store.

The pickler's writes are kept as references (``payload._Parts``) and copied end to end
into one store object, so a large ``bytes`` costs no private copy on the way. Private
copies are measured with ``tracemalloc`` (deterministic: it traces every allocation of
Python objects); the user's value is made before tracing starts, so only what ``pack``
allocates counts.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from scaler_executor.objstore import ObjectStore
from scaler_executor.objstore.payload import (
    delete_objects,
    pack,
    pack_inline,
    unpack,
    unpack_inline,
)

MiB = 1 << 20
SIZE = 32 * MiB


@pytest.fixture
def store(region_name: Callable[[], str]) -> Iterator[ObjectStore]:
    store = ObjectStore.create(region_name(), 128 * MiB)
    try:
        yield store
        store.validate()
    finally:
        store.unlink()
        store.close()


VALUES: dict[str, Callable[[], Any]] = {
    "bytes": lambda: b"\x01" * SIZE,
    "bytearray": lambda: bytearray(b"\x02") * SIZE,
    "bytes among small values": lambda: {"head": list(range(100)), "data": b"\x03" * SIZE, "tail": "end"},
    "two large bytes": lambda: (b"\x04" * (SIZE // 2), b"\x05" * (SIZE // 2)),
}


@pytest.mark.parametrize("name", list(VALUES))
def test_a_large_stream_is_copied_once_into_the_store(store: ObjectStore, name: str) -> None:
    value = VALUES[name]()
    tracemalloc.start()
    try:
        packed = pack(value, store)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < SIZE // 8, f"pack of {name} made {peak / SIZE:.2f} private copies"
    assert len(packed.object_ids) == 1 and store.stats().data_bytes >= SIZE
    assert unpack(packed.header, packed.object_ids, store) == value
    delete_objects(store, packed.created)


def test_in_band_buffers_in_a_large_stream_round_trip(store: ObjectStore) -> None:
    """Arrays under the threshold are written in band as PickleBuffers (C, Fortran and
    datetime ones), many of them making a stream large enough for the store."""
    small = [
        np.arange(6000, dtype=np.int64).reshape(60, 100),
        np.asfortranarray(np.arange(6000, dtype=np.float64).reshape(60, 100)),
        np.arange(6000).astype("datetime64[s]"),
    ]
    value = small * 10  # about 1.4 MB in band: one stream object
    packed = pack(value, store)
    assert len(packed.object_ids) == 1  # the stream, no out-of-band buffer
    got = unpack(packed.header, packed.object_ids, store)
    assert len(got) == len(value)
    for a, b in zip(got, value, strict=True):
        assert a.dtype == b.dtype and a.flags.f_contiguous == b.flags.f_contiguous
        np.testing.assert_array_equal(a, b)
    delete_objects(store, packed.created)
    inline = unpack_inline(pack_inline(value))
    for a, b in zip(inline, value, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_small_value_is_a_header_with_in_band_buffers(store: ObjectStore) -> None:
    value = [np.asfortranarray(np.ones((10, 20))), b"abc"]
    packed = pack(value, store)
    assert packed.object_ids == []
    got = unpack(packed.header, [], store)
    np.testing.assert_array_equal(got[0], value[0])
    assert got[1] == b"abc"
