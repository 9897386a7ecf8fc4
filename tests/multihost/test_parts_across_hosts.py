"""Objects fetched from the daemon in parts by a client and a worker on hosts of their own
(separate network stacks, a private /dev/shm each: tests/multihost/conftest.py), with CURVE
and without: every size from the store's threshold to 100 MB arrives whole both at the worker
(a task's argument) and back at the client (``ref.result()``); a worker killed while an object
streams to it costs the daemon nothing afterwards."""

from __future__ import annotations

import signal
import subprocess

import multihost_net as net
import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CHUNK = 4 << 20  # messages.OBJECT_CHUNK_BYTES
SIZES = [64 << 10, CHUNK, CHUNK + 1, 100_000_000]


@pytest.mark.parametrize("secure", [True, False], ids=["curve", "plain"])
def test_every_size_crosses_hosts_whole_in_parts(make_cluster, secure: bool) -> None:
    cluster = make_cluster(workers=("w1",), secure=secure)
    client = cluster.ready_client()
    before = net.stats(client)
    answer = client.call("put_read", answer_within=240, sizes=SIZES)["objects"]
    for item in answer:
        assert item["objects"] == 1, item  # one store object of exactly that size
        assert item["remote"] == item["expect"] and item["back"] == item["expect"], item
    stats = net.stats(client)
    # Each object out of the daemon's store twice (to the worker, back to the client),
    # and in once (the client's put): over the network, counted by the daemon.
    assert stats["object_bytes_sent"] - before["object_bytes_sent"] == 2 * sum(SIZES), stats
    assert stats["object_bytes_received"] - before["object_bytes_received"] == sum(SIZES), stats
    assert stats["object_sends_dropped"] == 0


MB100 = 100_000_000


def test_bytes_and_large_results_cross_hosts_whole(make_cluster) -> None:
    """Bytes values (a pickle stream in one store object, which the client unpickles from
    the parts as they came) and large results of a task on another host (pickled into a
    memfd by its processor, streamed from it by the worker's agent): whole (SHA-256, over
    bytes with no period, so a part out of place shows), and over the network (counters)."""
    cluster = make_cluster(workers=("w1",), secure=False)
    sizes = [CHUNK + 1, MB100]
    client = cluster.ready_client()
    before = net.stats(client)
    answer = client.call("bytes_read", answer_within=240, sizes=sizes)["objects"]
    for item in answer:
        assert item["remote"] == item["expect"] and item["back"] == item["expect"], item
        assert item["result"] == item["expect_result"], item
    stats = net.stats(client)
    # In: each put and each result (a pickle a little larger than its bytes); out: each
    # put to the worker and back to the client from the store, and each result forwarded
    # to the client as it came (scheduler/result_stream.py), not fetched from the store.
    received = stats["object_bytes_received"] - before["object_bytes_received"]
    sent = stats["object_bytes_sent"] - before["object_bytes_sent"]
    forwarded = stats["result_bytes_forwarded"] - before["result_bytes_forwarded"]
    figures = {k: v for k, v in stats.items() if k.startswith(("result_", "object"))}
    assert 2 * sum(sizes) <= received < 2 * sum(sizes) + 4096, figures
    assert 2 * sum(sizes) <= sent < 2 * sum(sizes) + 4096, figures
    assert sum(sizes) <= forwarded < sum(sizes) + 4096, figures
    assert stats["result_streams_forwarded"] - before["result_streams_forwarded"] == len(sizes), figures
    assert stats["result_streams_stopped"] == 0, figures
    assert stats["object_sends_dropped"] == 0


def test_a_worker_killed_mid_stream_leaves_the_daemon_nothing_to_free(make_cluster) -> None:
    """The link to w1 is slowed (80 Mbit/s: 100 MB takes ~10 s) so that w1 is killed while
    a 100 MB argument streams to it: the daemon drops what it still had to send
    (object_sends_dropped) and with it its references on the object, the task is retried on
    w2 and reads the object whole, and once the client drops the ref the store is empty."""
    cluster = make_cluster(workers=("w1",))
    hosts = cluster.hosts
    client = cluster.ready_client()
    kept = client.call("put_keep", answer_within=120, size=MB100)
    before = net.stats(client)["object_bytes_sent"]
    port = ["tc", "-n", hosts.switch, "qdisc"]
    subprocess.run([*port, "add", "dev", "p-w1", "root", "tbf", "rate", "80mbit", "burst", "256kb", "latency", "2s"], check=True)
    try:
        batch = client.call("submit_ref", ref=kept["ref"])["batch"]

        def streaming() -> bool:
            sent = net.stats(client)["object_bytes_sent"] - before
            return 0 < sent < MB100

        net.poll(streaming, 60, f"the object streaming to w1\n{cluster.logs()}")
        cluster.workers["w1"].stop(signal.SIGKILL)
        net.poll(lambda: net.stats(client)["object_sends_dropped"] == 1, 60,
                 f"the daemon dropping its sends to w1\n{cluster.logs()}")
        assert net.stats(client)["workers_lost"] == 1
        assert client.call("done", batch=batch)["done"] == 0  # (its task waits to run again)
    finally:
        subprocess.run([*port, "del", "dev", "p-w1", "root"], check=False)
    cluster.start_worker("w2")
    answer = client.call("wait", answer_within=180, batch=batch, timeout=150)
    assert answer["errors"] == [None] and answer["results"] == [kept["expect"]], answer
    client.call("drop_ref", ref=kept["ref"])
    net.poll(lambda: client.call("stats")["store"]["objects"] == 0, 60, "the store emptied")
    assert client.call("stats")["store"]["references"] == 0


def test_a_small_result_passes_a_large_object_streaming_to_its_client(make_cluster) -> None:
    """The link to the client is slowed (160 Mbit/s: 100 MB takes ~5 s) while it reads a
    100 MB object back: a no-op task's result reaches it before the read ends, behind at most
    the daemon's window of parts (as one 100 MB frame, the result would have waited for all of it)."""
    cluster = make_cluster(workers=("w1",))
    hosts = cluster.hosts
    client = cluster.ready_client()
    kept = client.call("put_keep", answer_within=120, size=MB100)
    client.call("wait", batch=client.call("submit", fn="noop", args=[[0]])["batch"], timeout=60)  # warm
    port = ["tc", "-n", hosts.switch, "qdisc"]
    subprocess.run([*port, "add", "dev", "p-client", "root", "tbf", "rate", "160mbit", "burst", "256kb", "latency", "2s"], check=True)
    try:
        answer = client.call("read_while_task", answer_within=300, ref=kept["ref"])
    finally:
        subprocess.run([*port, "del", "dev", "p-client", "root"], check=False)
    assert answer["digest"] == kept["expect"], answer
    assert answer["read_still_going"], "the no-op's result waited for the whole object"
