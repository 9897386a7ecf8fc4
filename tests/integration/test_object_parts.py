"""Objects fetched from the daemon's store in parts (ObjectPart, ObjectPartsTaken), with real
processes on loopback tcp:// with CURVE on: a worker that fetches over the network
(``--fetch-objects-over-network``, as on another host) reads objects of every size whole, and
a peer speaking the codec by hand sees the daemon's window, other messages passing the
stream, and the daemon freeing what it held once that peer is gone.

(A client on another host, with its own /dev/shm, is in tests/multihost/test_parts_across_hosts.py.)
Waits are bounded (``wait_until``, ``result(timeout=...)``); nothing asserts how long anything took.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scaler_testing import wait_until
from test_objects import store_of
from test_security import CLIENT, WAIT, Cluster, RawPeer

from scaler_executor import ScalerExecutor
from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming
from scaler_executor.scheduler.object_stream import CHUNK_BYTES, WINDOW_PARTS

pytestmark = pytest.mark.timeout(180)

SIZES = [0, 1, CHUNK_BYTES, CHUNK_BYTES + 1, 100_000_000]
# What a task's argument can be: the store takes buffers from object_store_threshold (64 KiB).
TASK_SIZES = [64 << 10, CHUNK_BYTES, CHUNK_BYTES + 1, 100_000_000]


def array_of(size: int) -> np.ndarray:
    return (np.arange(size, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)


def digest(value: np.ndarray) -> tuple[int, str]:
    return value.nbytes, hashlib.sha256(memoryview(value)).hexdigest()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def _regions(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"scaler-{pid}-")]


def test_objects_of_every_size_reach_a_worker_that_fetches_them_whole(cluster: Cluster) -> None:
    """64 KiB (the store's threshold), one chunk, one chunk + 1 and 100 MB, each put in the
    store and read by a worker that fetches over the network: the bytes it hashes are the
    bytes put, and the daemon counts them on the network path."""
    alice = cluster.credential("alice", "client")
    remote = cluster.credential("remote", "worker")
    daemon = cluster.secure_daemon("--workers", "0", "--object-store-size", "512M")
    cluster.worker("--credentials", remote, "--fetch-objects-over-network", "--processors", "1")
    ex = ScalerExecutor(address=cluster.address, credentials=alice, config=CLIENT)
    try:
        assert wait_until(lambda: ex.statistics()["workers"] == 1, timeout=WAIT)
        before = ex.statistics()
        for size in TASK_SIZES:
            value = array_of(size)
            ref = ex.put(value)
            assert ex.submit(digest, ref).result(timeout=120) == digest(value), size
            del ref, value
        stats = ex.statistics()
        assert stats["objects_sent"] - before["objects_sent"] == len(TASK_SIZES), stats
        assert stats["object_bytes_sent"] - before["object_bytes_sent"] == sum(TASK_SIZES), stats
        assert stats["object_sends_dropped"] == 0
        assert wait_until(lambda: ex.statistics().store["objects"] == 0, timeout=WAIT), ex.statistics().store
    finally:
        ex.shutdown(wait=True)
    cluster.close()
    assert _regions(daemon.pid) == []


def test_one_answer_of_every_size_put_together_by_the_receiver(cluster: Cluster) -> None:
    """0 B, 1 B, one chunk, one chunk + 1 and 100 MB in one ObjectRequest, asked by a peer
    that puts them together as the agents do (protocol/chunks.Incoming) and takes each part:
    the small ones come whole in the ObjectData, the large ones in order before it."""
    alice = cluster.credential("alice", "client")
    tool = cluster.credential("tool", "client")
    daemon = cluster.secure_daemon("--workers", "0", "--object-store-size", "512M")
    # Threshold 0: every buffer is a store object, even an empty one (ex.put only).
    ex = ScalerExecutor(address=cluster.address, credentials=alice, config=CLIENT.replace(object_store_threshold=0))
    peer = RawPeer(cluster.address, tool)
    try:
        values = [array_of(size) for size in SIZES]
        refs = [ex.put(v) for v in values]
        ids = [oid for r in refs for oid in r.object_ids]  # (threshold 0: each ref's header too)
        store = store_of(ex)  # this client maps the store: what the peer gets must equal it
        expected = [bytes(store.get(oid)) for oid in ids]
        assert {len(e) for e in expected} >= set(SIZES)
        peer.hello(m.Role.CLIENT)
        assert peer.receive(m.Welcome) is not None, cluster.log()
        peer.send([m.ObjectRequest(ids)])
        incoming = Incoming()
        data, frames, parts = _take_all(peer, incoming)
        assert parts == sum(-(-len(e) // CHUNK_BYTES) for e in expected if len(e) > CHUNK_BYTES)
        assert data.object_ids == ids and data.found == [True] * len(ids) and len(frames) == len(ids)
        got = [bytes(incoming.take(oid, frame)) for oid, frame in zip(ids, frames, strict=True)]
        assert [len(g) for g in got] == [len(e) for e in expected]
        assert got == expected
        assert incoming.holding() == 0
    finally:
        peer.close()
        ex.shutdown(wait=True)
    cluster.close()
    assert _regions(daemon.pid) == []


def _take_all(peer: RawPeer, incoming: Incoming) -> tuple[m.ObjectData, list[object], int]:
    """Parts into ``incoming``, each taken at once, until the ObjectData that ends the answer."""
    parts = 0
    for _ in range(int(WAIT * 10)):
        peer.poller.poll(peer.sock.poll_timeout(100))
        while peer.sock.readable():
            messages, buffers = codec.decode(peer.sock.recv())
            for message in messages:
                if type(message) is m.ObjectPart:
                    incoming.part(message, buffers[0])
                    parts += 1
                    peer.send([m.ObjectPartsTaken(1)])
                elif type(message) is m.ObjectData:
                    return message, buffers, parts
    raise AssertionError(f"no ObjectData within {WAIT} s; parts so far: {parts}")


def _parts_then(peer: RawPeer, kind: type, count: int = 1) -> tuple[list[tuple[m.ObjectPart, int]], object]:
    """The ObjectParts (with their frames' sizes) that come until ``count`` messages of
    ``kind`` came (ObjectParts themselves when ``kind`` is ObjectPart), and the last of those."""
    parts: list[tuple[m.ObjectPart, int]] = []
    seen = 0
    for _ in range(int(WAIT * 10)):
        peer.poller.poll(peer.sock.poll_timeout(100))
        while peer.sock.readable():
            messages, buffers = codec.decode(peer.sock.recv())
            for message in messages:
                if type(message) is m.ObjectPart:
                    parts.append((message, memoryview(buffers[0]).nbytes))
                if type(message) is kind:
                    seen += 1
                    if seen == count:
                        return parts, message
    raise AssertionError(f"{seen} of {count} {kind.__name__} within {WAIT} s; parts so far: {len(parts)}")


def test_a_peer_gets_a_window_of_parts_other_messages_pass_them_and_its_loss_frees_them(cluster: Cluster) -> None:
    """A client-role peer asks for a 64 MiB object and takes no part: the daemon sends one
    window of parts and stops; a statistics request asked after them is answered at once (a
    large object no longer holds up every other message to its peer); one part taken, one
    more comes. The peer goes silent mid-stream: the daemon declares it lost, drops what it
    still had to send (object_sends_dropped) and with it its reader references, so the
    object is freed when its owner drops it, and no /dev/shm region is left at the end."""
    alice = cluster.credential("alice", "client")
    tool = cluster.credential("tool", "client")
    daemon = cluster.secure_daemon("--workers", "0", "--object-store-size", "256M")
    ex = ScalerExecutor(address=cluster.address, credentials=alice, config=CLIENT)
    peer = RawPeer(cluster.address, tool)
    try:
        size = 64 << 20
        ref = ex.put(array_of(size))
        (object_id,) = ref.object_ids
        peer.hello(m.Role.CLIENT)
        assert peer.receive(m.Welcome) is not None, cluster.log()
        peer.send([m.ObjectRequest([object_id])])
        parts, _ = _parts_then(peer, m.ObjectPart, WINDOW_PARTS)
        assert [(p.offset, p.total, n) for p, n in parts] == [
            (i * CHUNK_BYTES, size, CHUNK_BYTES) for i in range(WINDOW_PARTS)
        ]
        # Asked after the window was sent: answered while the stream waits, and no part
        # beyond the window came before the answer.
        peer.send([m.StatsRequest()])
        parts, stats = _parts_then(peer, m.Stats)
        assert parts == [] and isinstance(stats, m.Stats)
        peer.send([m.ObjectPartsTaken(1)])
        parts, _ = _parts_then(peer, m.ObjectPart, 1)
        assert [p.offset for p, _ in parts] == [WINDOW_PARTS * CHUNK_BYTES]
        peer.send([m.StatsRequest()])
        assert _parts_then(peer, m.Stats)[0] == []  # one part taken, one more came: no more
        assert ex.statistics()["object_sends_dropped"] == 0
        peer.close()  # silent from now on: lost after heartbeat_liveness intervals
        assert wait_until(lambda: ex.statistics()["object_sends_dropped"] == 1, timeout=WAIT), cluster.log()
        assert ex.statistics()["clients_lost"] == 1
        del ref
        assert wait_until(lambda: ex.statistics().store["objects"] == 0, timeout=WAIT), ex.statistics().store
        assert ex.statistics().store["references"] == 0
    finally:
        peer.close()
        ex.shutdown(wait=True)
    cluster.close()
    assert _regions(daemon.pid) == []
