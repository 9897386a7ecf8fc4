"""Objects fetched from the daemon in parts by a client and a worker on hosts of their own
(separate network stacks, a private /dev/shm each: tests/multihost/conftest.py), with CURVE
and without: every size from the store's threshold to 100 MB arrives whole both at the worker
(a task's argument) and back at the client (``ref.result()``)."""

from __future__ import annotations

import multihost_net as net
import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CHUNK = 4 << 20  # messages.OBJECT_CHUNK_BYTES
SIZES = [64 << 10, CHUNK, CHUNK + 1, 100_000_000]


@pytest.mark.parametrize("secure", [True, False], ids=["curve", "plain"])
def test_every_size_crosses_hosts_whole_in_parts(hosts: net.Hosts, secure: bool) -> None:
    cluster = net.Cluster(hosts, [], [], secure=secure)
    try:
        cluster.start_daemon()
        cluster.start_worker("w1")
        client = cluster.client()
        net.poll(lambda: client.call("stats")["stats"]["workers"] >= 1, 60, f"the worker joined\n{cluster.logs()}")
        before = client.call("stats")["stats"]
        answer = client.call("put_read", answer_within=240, sizes=SIZES)["objects"]
        for item in answer:
            assert item["objects"] == 1, item  # one store object of exactly that size
            assert item["remote"] == item["expect"] and item["back"] == item["expect"], item
        stats = client.call("stats")["stats"]
        # Each object out of the daemon's store twice (to the worker, back to the client),
        # and in once (the client's put): over the network, counted by the daemon.
        assert stats["object_bytes_sent"] - before["object_bytes_sent"] == 2 * sum(SIZES), stats
        assert stats["object_bytes_received"] - before["object_bytes_received"] == sum(SIZES), stats
        assert stats["object_sends_dropped"] == 0
    finally:
        cluster.stop()
