"""A large result of a task on another host reaches its client while the daemon stores it
(scheduler/result_stream.py, client/pushed.py), across hosts on separate network stacks with
a private /dev/shm each, with CURVE and without: whole (SHA-256 of bytes with no period),
forwarded as it came (the daemon's counters), and stored too (a second task reads it from
the store); and a worker killed while it uploads a result: the client drops the partial
stream, the task runs again on another worker, its result is whole, and the daemon's store
keeps nothing of the partial object."""

from __future__ import annotations

import signal
import subprocess

import multihost_net as net
import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MB = 1_000_000


@pytest.mark.parametrize("secure", [True, False], ids=["curve", "plain"])
def test_a_large_result_is_forwarded_whole_and_stored_for_a_second_reader(make_cluster, secure: bool) -> None:
    cluster = make_cluster(workers=("w1",), secure=secure)
    client = cluster.ready_client()
    answer = client.call("result_twice", answer_within=240, size=40 * MB, seed=22)
    assert answer["back"] == answer["expect"] and answer["again"] == answer["expect"], answer
    stats = net.stats(client)
    figures = {k: v for k, v in stats.items() if k.startswith(("result_", "object"))}
    assert stats["result_streams_forwarded"] == 1 and stats["result_streams_stopped"] == 0, figures
    assert 40 * MB <= stats["result_bytes_forwarded"] < 40 * MB + 4096, figures
    # The second task read the stored copy through the daemon (its worker cannot map the
    # store); the client did not fetch the result: it had it as it came.
    assert 40 * MB <= stats["object_bytes_sent"] < 40 * MB + 4096, figures


def test_a_worker_killed_mid_upload_the_client_drops_the_stream_and_the_retry_is_whole(make_cluster) -> None:
    """w1's uplink is slowed (80 Mbit/s: 50 MB takes ~5 s) and w1 killed once the daemon has
    forwarded part of its result: the client is told to drop the stream, the task runs again
    on w2, the client's value is the retry's, whole, and nothing of the partial object stays
    in the daemon's store."""
    cluster = make_cluster(workers=("w1",))
    hosts = cluster.hosts
    client = cluster.ready_client()
    size = 50 * MB
    shape = ["tc", "-n", hosts.names["w1"], "qdisc"]
    subprocess.run([*shape, "add", "dev", "eth0", "root", "tbf", "rate", "80mbit", "burst", "256kb", "latency", "2s"], check=True)
    try:
        submitted = client.call("submit_result", size=size, seed=7)

        def streaming() -> bool:
            forwarded = net.stats(client)["result_bytes_forwarded"]
            return 0 < forwarded < size

        net.poll(streaming, 60, f"the result streaming from w1\n{cluster.logs()}")
        cluster.workers["w1"].stop(signal.SIGKILL)
        net.poll(lambda: net.stats(client)["workers_lost"] == 1, 60, f"w1 declared lost\n{cluster.logs()}")
        stats = net.stats(client)
        assert stats["result_streams_stopped"] == 1 and stats["result_streams_forwarded"] == 0, stats
        assert client.call("done", batch=submitted["batch"])["done"] == 0  # it waits to run again
    finally:
        subprocess.run([*shape, "del", "dev", "eth0", "root"], check=False)
    cluster.start_worker("w2")
    answer = client.call("wait_digest", answer_within=180, batch=submitted["batch"], timeout=150)
    assert answer == {"digest": submitted["expect"], "error": None}, answer
    stats = net.stats(client)
    assert stats["retried"] == 1 and stats["result_streams_forwarded"] == 1, stats
    # The partial object was aborted; the retry's was released once read.
    net.poll(lambda: client.call("stats")["store"]["objects"] == 0, 60, "the store emptied")
