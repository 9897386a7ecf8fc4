"""The reconnection policy (scaler_executor/protocol/rejoin.py) on real separate network
stacks: links cut at a host's switch port, a daemon killed and started again."""

from __future__ import annotations

import time

import multihost_net as net
import pytest
from multihost_net import LIVENESS_LIMIT

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _run_on_both(cluster, client: net.Driver) -> None:
    batch = client.call("submit", fn="where", args=[[i] for i in range(40)])["batch"]
    answer = client.call("wait", batch=batch, timeout=60)
    assert answer["errors"] == [None] * 40, answer["errors"]
    assert {r[1] for r in answer["results"]} == {cluster.hosts.names["w1"], cluster.hosts.names["w2"]}


def _hold_on_both(client: net.Driver, count: int, seconds: float) -> int:
    """``count`` tasks holding their processors; returns once four run (two per worker)."""
    batch = client.call("submit", fn="hold", args=[[seconds, i] for i in range(count)])["batch"]
    net.poll(lambda: client.call("running", batch=batch)["running"] >= 4, 60, "four tasks running")
    return batch


def test_drop_shorter_than_liveness_loses_and_retries_nothing(make_cluster) -> None:
    """Policy (a): a worker's and the client's links go down for a fifth of the liveness
    limit while tasks run; everything resumes, nothing is retried or lost."""
    cluster = make_cluster()
    client = cluster.ready_client(workers=2)
    batch = _hold_on_both(client, 8, 2.0)
    cluster.hosts.cut("w1")
    cluster.hosts.cut("client")
    time.sleep(LIVENESS_LIMIT / 5)  # the drop itself (the stimulus), not a wait for a condition
    cluster.hosts.restore("w1")
    cluster.hosts.restore("client")
    answer = client.call("wait", batch=batch, timeout=60)
    assert answer["errors"] == [None] * 8, answer["errors"]
    stats = net.stats(client)
    assert (stats["retried"], stats["workers_lost"], stats["clients_lost"]) == (0, 0, 0), stats
    for role in ("w1", "w2"):
        assert "joining again" not in cluster.workers[role].log(), cluster.workers[role].log()


def test_worker_link_cut_tasks_finish_elsewhere_and_it_rejoins(make_cluster) -> None:
    """Policy (b): a worker's link stays down past the liveness limit; its tasks are retried
    on the other worker; when the link is back it discards what it held and joins again."""
    cluster = make_cluster()
    client = cluster.ready_client(workers=2)
    w1_agent = cluster.workers["w1"].pid
    batch = _hold_on_both(client, 8, 2.0)
    cluster.hosts.cut("w1")
    net.poll(lambda: net.stats(client)["workers_lost"] >= 1, 4 * LIVENESS_LIMIT + 30, f"w1 declared lost\n{cluster.logs()}")
    answer = client.call("wait", batch=batch, timeout=90)
    assert answer["errors"] == [None] * 8, answer["errors"]
    stats = net.stats(client)
    assert stats["retried"] >= 2 and stats["workers"] == 1, stats  # w1 ran two when its link went
    cluster.hosts.restore("w1")
    net.poll(lambda: net.stats(client)["workers"] == 2, 60, f"w1 joined again\n{cluster.logs()}")
    assert cluster.workers["w1"].pid == w1_agent and cluster.workers["w1"].alive()  # the same process
    _run_on_both(cluster, client)
    w1_log = cluster.workers["w1"].log()
    assert w1_log.count("joining again") == 1, w1_log  # the lost link logged once


def test_daemon_restart_without_journal(make_cluster) -> None:
    """Policy (c): the daemon is killed and started again on the same address; the client's
    pending futures fail with DaemonLost as soon as the new daemon says it does not know the
    client, or the old one's refused port shows it died (long before daemon_loss_timeout), and
    both workers join the new daemon."""
    cluster = make_cluster()
    client = cluster.ready_client(workers=2, daemon_loss_timeout=120.0)
    batch = _hold_on_both(client, 6, 60.0)
    cluster.kill_daemon()
    restarted = time.monotonic()
    cluster.start_daemon()
    answer = client.call("wait", batch=batch, timeout=90)
    failed_after = time.monotonic() - restarted
    assert [e[0] if e else None for e in answer["errors"]] == ["DaemonLost"] * 6, answer["errors"]
    # Not the client's daemon_loss_timeout (whose text names it) but one of the two ways the
    # client learns at once that its tasks are gone: the new daemon's answer that it does not
    # know this client, or, when the client's probe of a silent daemon comes before the new
    # one has bound the port, the refused connection that tells a dead daemon from a slow one.
    text = answer["errors"][0][1]
    assert "daemon_loss_timeout" not in text, text
    assert "no longer knows this client" in text or "connection refused" in text, text
    client.call("close")
    again = cluster.ready_client(workers=2)
    serving_after = time.monotonic() - restarted
    _run_on_both(cluster, again)
    for role in ("w1", "w2"):
        text = cluster.workers[role].log()
        assert text.count("does not know this worker") == 1, text  # once, not once per refusal
    print(f"\ndaemon restart: futures failed after {failed_after:.2f} s, both workers serving after {serving_after:.2f} s")
