"""A put streamed by a peer that cannot map the store (ObjectChunk without a task), cut short
by the peer's loss: the core tells the loop (AbortPuts) and the store frees the partial
object; a peer that finished its puts, or never put, costs nothing."""

from __future__ import annotations

import pytest
from core_testing import CommandsCluster
from core_testing import DEADLINE

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core import AbortPuts, StoreChunk
from scaler_executor.scheduler.objects import HostStore

pytestmark = pytest.mark.timeout(30)

OID, OID2 = b"\x01" * 16, b"\x02" * 16


@pytest.fixture
def cluster() -> CommandsCluster:
    return CommandsCluster()


def test_a_client_lost_mid_put_has_its_puts_aborted(cluster: CommandsCluster) -> None:
    cluster.client(b"c1")
    cluster.client(b"c2")
    cluster.send(b"c1", m.ObjectChunk(OID, 0, 3 * m.OBJECT_CHUNK_BYTES))
    assert cluster.others == [StoreChunk(b"c1", OID, 0, 3 * m.OBJECT_CHUNK_BYTES)]
    cluster.now += DEADLINE + 0.1
    cluster.keepalive(b"c2")
    cluster.tick()
    assert cluster.stat("clients_lost") == 1
    assert cluster.others == [AbortPuts(b"c1")]


def test_a_worker_that_put_and_left_and_a_client_that_never_put(cluster: CommandsCluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.send(b"w1", m.ObjectChunk(OID, 0, 100))
    cluster.send(b"w1", m.Goodbye("done"))
    assert AbortPuts(b"w1") in cluster.others, "(its unfinished puts: the store knows which)"
    cluster.send(b"c1", m.Goodbye("done"))
    assert not any(type(c) is AbortPuts for c in cluster.others), "nothing to abort for a peer that never put"


def test_the_store_aborts_only_the_lost_peers_unfinished_puts(host_store: HostStore) -> None:
    assert host_store.write_chunk(b"c1", OID, 0, 100, b"x" * 10) is None
    assert host_store.write_chunk(b"c2", OID2, 0, 100, b"y" * 10) is None
    assert host_store.write_chunk(b"c1", b"\x03" * 16, 0, 4, b"done") == ""  # sealed: stays
    assert host_store.abort_peer(b"c1") == 1
    assert list(host_store.partial) == [OID2]
    found, _ = host_store.read((OID, b"\x03" * 16))
    assert found == [False, True]
    assert host_store.abort_peer(b"c1") == 0
