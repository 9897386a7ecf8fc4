"""The fifth host: a peer on the same network as a daemon with keys (``--security``), across
network namespaces. It may be a peer without keys (plain pyzmq, or this project's own codec on
a socket without CURVE), one holding a credential of the wrong role, a client going after
another client's ids, one holding a wrong daemon key or a revoked key, or an authenticated
peer sending garbage. Each is refused, the refusal is logged where it is the daemon's to log,
code it sends runs nowhere, and the cluster serves on.

The rogue's own processes are ``multihost_rogue.py`` (its modes) or a driven client
(``multihost_client.py``) on the rogue host. A "marker" file under the cluster's key
directory (``/var/tmp``, which every host shares, unlike its private TMPDIR) is what code sent
by the rogue would create if it ran anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import multihost_net as net
import psutil
import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

ROGUE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_rogue.py")
MB = 1 << 20


def _serving(cluster: net.Cluster, client: net.Driver) -> None:
    """The cluster runs a task on a worker host: the daemon serves on."""
    batch = client.call("submit", fn="where", args=[[7]])["batch"]
    answer = client.call("wait", batch=batch, timeout=60)
    assert answer["errors"] == [None], (answer, cluster.logs())
    assert answer["results"][0][0] == 7


def _rogue(cluster: net.Cluster, *args: str) -> str:
    party = cluster.hosts.spawn("rogue", [sys.executable, ROGUE, args[0], cluster.address, *args[1:]])
    assert party.popen.wait(120) == 0, party.log()
    return party.log()


def _marker(cluster: net.Cluster) -> str:
    assert cluster.security is not None
    return os.path.join(cluster.security.root, "rogue-code-ran")


def _daemon_log(cluster: net.Cluster) -> str:
    assert cluster.daemon is not None
    return cluster.daemon.log()


# =========================================================================== no keys


def test_a_peer_without_keys_gets_nothing_and_its_code_runs_nowhere(make_cluster) -> None:
    """Plain pyzmq, then the project's codec on that socket: garbage, a Hello as client and
    as worker, a function and a task that would create a file, a statistics request. No
    answer comes, the daemon counts a refused handshake and nothing else changes."""
    cluster = make_cluster(workers=("w1",))
    client = cluster.ready_client()
    before = net.stats(client)
    marker = _marker(cluster)
    log = _rogue(cluster, "keyless", marker)
    assert "answers 0" in log, log
    net.poll(lambda: net.stats(client)["security_refused_handshakes"] > before["security_refused_handshakes"], 60,
             "the daemon counted the keyless peer's failed handshake")
    after = net.stats(client)
    assert after["clients"] == 1 and after["workers"] == 1, after
    assert after["submitted"] == before["submitted"] and after["dropped_messages"] == before["dropped_messages"]
    assert after["refused"] == before["refused"]  # nothing of it was decoded, so nothing to refuse
    _serving(cluster, client)
    assert not os.path.exists(marker)
    assert "a peer failed the CURVE handshake" in _daemon_log(cluster)


def test_a_flood_before_the_handshake_does_not_grow_the_daemon(make_cluster) -> None:
    """Issue 22's probe (one 40 MB transmission of 8 M heartbeats grew an open daemon from
    146 MB to 2 GB), from four keyless sockets at once, and 40 MB of raw bytes on a TCP
    connection: with CURVE nothing is read beyond a greeting, and the daemon's resident
    memory ends near where it started."""
    cluster = make_cluster(workers=("w1",))
    client = cluster.ready_client()
    _serving(cluster, client)
    assert cluster.daemon is not None
    daemon = psutil.Process(cluster.daemon.pid)  # ip netns exec / unshare / sh exec into it
    assert "scaler_executor.cli.daemon" in " ".join(daemon.cmdline())
    start = daemon.memory_info().rss
    party = cluster.hosts.spawn("rogue", [sys.executable, ROGUE, "flood", cluster.address, "4"])
    peak = start
    while party.alive():
        peak = max(peak, daemon.memory_info().rss)
        try:
            party.popen.wait(0.05)
        except subprocess.TimeoutExpired:  # still flooding: sample again
            pass
    assert party.popen.returncode == 0, party.log()
    assert "flooded" in party.log(), party.log()
    _serving(cluster, client)
    end = daemon.memory_info().rss
    print(f"\ndaemon RSS: start {start / MB:.0f} MB, peak {peak / MB:.0f} MB, end {end / MB:.0f} MB; {party.log()}")
    assert end - start < 64 * MB and peak - start < 128 * MB, (start, peak, end)
    assert net.stats(client)["clients"] == 1


# =========================================================================== roles


def test_a_worker_key_cannot_submit_and_a_client_key_cannot_serve(make_cluster) -> None:
    cluster = make_cluster(workers=("w1",), parties={"stolen-worker": "worker", "stolen-client": "client"})
    client = cluster.ready_client()
    assert cluster.security is not None
    # The constructor waits for the daemon's answer: the refusal is the ScalerExecutor's own
    # DaemonLost, raised in the rogue host's client process (the harness reports it).
    with pytest.raises(AssertionError, match=r"(?s)failed in 'open'.*DaemonLost.*has role worker: it cannot join as a client"):
        cluster.client(credentials=cluster.security.credential("stolen-worker", "worker"), host="rogue")
    fake = cluster.start_worker("rogue", ["--credentials", cluster.security.credential("stolen-client", "client")])
    assert fake.popen.wait(60) == 2, fake.log()
    assert "has role client: it cannot join as a worker" in fake.log()
    log = _daemon_log(cluster)
    assert "refused Hello as client from worker key 'stolen-worker'" in log, log
    assert "refused Hello as worker from client key 'stolen-client'" in log, log
    assert f" at {cluster.hosts.addresses['rogue']}" in log  # the refusal names the rogue's address
    stats = net.stats(client)
    assert stats["security_refused_role"] >= 2 and stats["workers"] == 1 and stats["submitted"] == 0, stats
    _serving(cluster, client)


def test_a_client_cannot_register_release_or_cancel_another_clients_ids(make_cluster) -> None:
    """The victim holds tasks running and queued and a registered function; the intruder (a
    client credential on the rogue host) registers over, releases and cancels every id under
    other clients' prefixes: refused and logged, the victim's tasks and function work on."""
    cluster = make_cluster(workers=("w1",), parties={"intruder": "client"})
    victim = cluster.ready_client()
    _serving(cluster, victim)  # `where` is registered: its function id is the victim's
    held = victim.call("submit", fn="hold", args=[[1.0, i] for i in range(8)])["batch"]  # 2 run, 6 queue
    net.poll(lambda: victim.call("running", batch=held)["running"] >= 1, 60, "the victim's tasks running")
    assert cluster.security is not None
    marker = _marker(cluster)
    log = _rogue(cluster, "intruder", cluster.security.credential("intruder", "client"), marker)
    assert "cancelled 0" in log, log
    answer = victim.call("wait", batch=held, timeout=120)
    assert answer["errors"] == [None] * 8, answer["errors"]
    assert [r[0] for r in answer["results"]] == list(range(8))
    _serving(cluster, victim)  # its function still is its own (not released, not replaced)
    assert not os.path.exists(marker)
    daemon_log = _daemon_log(cluster)
    for what in ("register-function", "release-functions", "cancel-tasks"):
        assert f"refused {what} from client 'intruder'" in daemon_log, (what, daemon_log[-3000:])
    assert net.stats(victim)["refused"] >= 3


# =========================================================================== clear errors


def test_a_wrong_daemon_key_and_a_revoked_key_are_named(make_cluster) -> None:
    cluster = make_cluster(workers=("w1",), parties={"carol": "client"}, revoked=("carol",))
    client = cluster.ready_client()
    assert cluster.security is not None
    other = os.path.join(cluster.security.root, "other-cluster")
    net.keys("init", other)
    stranger = os.path.join(cluster.security.root, "stranger.cred")
    net.keys("issue", other, "stranger", "--role", "client", "--output", stranger)
    for credential, expect in (
        (stranger, "likely the wrong daemon key"),
        (cluster.security.credential("carol", "client"), "not in the daemon's allow-list"),
    ):
        # The constructor waits for the daemon's answer: its DaemonLost names the cause.
        with pytest.raises(AssertionError, match=r"(?s)failed in 'open'.*DaemonLost: the daemon at (\S+) .*") as caught:
            cluster.client(credentials=credential, host="rogue")
        assert expect in str(caught.value) and cluster.address in str(caught.value), caught.value
    log = _daemon_log(cluster)
    assert f"refused a connection from {cluster.hosts.addresses['rogue']}: key SHA256:" in log, log
    assert net.stats(client)["submitted"] == 0
    _serving(cluster, client)


# =========================================================================== authenticated garbage


def test_garbage_and_oversized_frames_from_an_authenticated_peer_do_not_stop_the_daemon(make_cluster) -> None:
    limit = 8 * MB
    cluster = make_cluster(workers=("w1",), parties={"noisy": "client"}, daemon_flags=["--max-message-size", str(limit)])
    client = cluster.ready_client()
    before = net.stats(client)["dropped_messages"]
    assert cluster.security is not None
    log = _rogue(cluster, "garbage", cluster.security.credential("noisy", "client"), str(4 * limit))
    dropped = int(log.split("dropped ", 1)[1].split()[0])
    assert dropped == before + 4, log  # each decoded, counted and dropped
    assert "disconnected after the oversized frame" in log, log  # ZMQ_MAXMSGSIZE: never held
    assert cluster.daemon is not None and cluster.daemon.alive()
    _serving(cluster, client)
    assert "dropped a bad transmission" in _daemon_log(cluster)
