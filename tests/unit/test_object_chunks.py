"""A put streamed in chunks by a client or worker on another host (ObjectChunk): the core
accepts it from those roles (StoreChunk), and the daemon's store writes the chunks in place."""

from __future__ import annotations

from core_testing import joining

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core import Received, Scheduler, StoreChunk
from scaler_executor.scheduler.objects import HostStore

OID = b"\x07" * 16


def test_core_turns_a_clients_or_workers_chunk_into_a_store_command_and_drops_a_monitors() -> None:
    core = Scheduler(ClusterConfig())
    core.handle(*joining())
    for peer in (b"c", b"w"):
        commands = core.handle(Received(peer, [m.ObjectChunk(OID, 0, 10)], 2.0))
        assert [c for c in commands if type(c) is StoreChunk] == [StoreChunk(peer, OID, 0, 10)]
    commands = core.handle(Received(b"m", [m.ObjectChunk(OID, 0, 10)], 3.0))
    assert not [c for c in commands if type(c) is StoreChunk]
    assert core.statistics()["refused"] == 1  # a monitor may not put
    for key in ("objects_sent", "object_bytes_sent", "objects_received", "object_bytes_received"):
        assert core.statistics()[key] == 0  # present before any object moved


def test_chunks_in_order_make_one_sealed_object(host_store: HostStore) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    assert host_store.write_chunk(b"c", OID, 0, len(data), data[:4096]) is None
    assert host_store.write_chunk(b"c", OID, 4096, len(data), memoryview(data)[4096:8192]) is None
    assert host_store.write_chunk(b"c", OID, 8192, len(data), data[8192:]) == ""
    found, buffers = host_store.read((OID,))
    assert found == [True] and bytes(buffers[0]) == data
    assert not host_store.partial


def test_an_empty_object_is_one_chunk(host_store: HostStore) -> None:
    assert host_store.write_chunk(b"c", OID, 0, 0, b"") == ""
    assert host_store.read((OID,))[0] == [True]


def test_a_chunk_out_of_order_or_from_another_peer_aborts_the_object(host_store: HostStore) -> None:
    assert host_store.write_chunk(b"c", OID, 0, 100, b"x" * 10) is None
    assert "out of order" in host_store.write_chunk(b"other", OID, 10, 100, b"x" * 10)
    assert host_store.read((OID,))[0] == [False] and not host_store.partial
    assert "out of order" in host_store.write_chunk(b"c", OID, 50, 100, b"x" * 10)  # no object began
    assert "larger than" in host_store.write_chunk(b"c", OID, 0, 5, b"x" * 10)


def test_an_object_larger_than_the_store_is_refused_with_the_reason(host_store: HostStore) -> None:
    error = host_store.write_chunk(b"c", OID, 0, 1 << 30, b"x" * 10)
    assert error and "cannot create the object in the daemon's store" in error


def test_a_plain_pickle_streamed_into_the_store_reads_back_with_its_header(host_store: HostStore) -> None:
    """What a worker on another host sends for a large result: the pickle as one object,
    and a header that says the stream is in the store."""
    import pickle

    from scaler_executor.objstore import payload as packing

    value = {"a": b"x" * 100_000, "b": list(range(10))}
    stream = pickle.dumps(value, protocol=5)
    assert host_store.write_chunk(b"w", OID, 0, len(stream), stream) == ""
    assert packing.unpack(packing.stream_in_store_header(), [OID], host_store.store) == value
