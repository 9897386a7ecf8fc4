"""The read-only monitor connection (scaler_executor.monitor) against a real secured daemon:
it reads snapshots with a monitor key, a monitor key cannot submit, a client key cannot
monitor, and a monitor that stops reading is dropped while the cluster keeps working."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scaler_testing import wait_until
from test_security import WAIT, Cluster, RawPeer

from scaler_executor import ScalerExecutor
from scaler_executor.exceptions import DaemonLost
from scaler_executor.monitor import Monitor, MonitorRefused
from scaler_executor.protocol import channel
from scaler_executor.protocol import messages as m

pytestmark = pytest.mark.timeout(180)
STALL_WAIT = 120.0  # filling a connection's buffers (ZeroMQ's queues and the kernel's) on a loaded machine


def fails(x: int) -> int:
    raise ValueError(f"no {x}")


def square(x: int) -> int:
    return x * x


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_a_monitor_sees_workers_tasks_and_failures(cluster: Cluster) -> None:
    mon = cluster.credential("mon", "monitor")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon("--workers", "1")
    with Monitor(cluster.address, credentials=mon) as monitor, cluster.client(alice) as ex:
        assert ex.submit(square, 3).result(timeout=WAIT) == 9
        with pytest.raises(ValueError, match="no 7"):
            ex.submit(fails, 7).result(timeout=WAIT)
        assert wait_until(lambda: monitor.snapshot()["failed"] == 1, timeout=WAIT)
        stats = monitor.snapshot()
        assert stats["finished"] >= 1 and stats["monitors"] == 1 and stats["clients"] == 1
        assert len(stats.workers) == 1 and stats.workers[0].processors >= 1
        (failure,) = stats.failures
        assert failure.cause.endswith("ValueError: no 7") and "fails" in failure.detail


def test_a_monitor_reads_its_credential_from_the_environment_and_the_argument_wins(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Like ScalerExecutor and scaler-worker (ClusterConfig.load), so scaler-top and
    # scaler-dashboard too, whose error text tells the user to set SCALER_CREDENTIALS.
    mon = cluster.credential("mon", "monitor")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon()
    monkeypatch.setenv("SCALER_CREDENTIALS", mon)
    with Monitor(cluster.address, timeout=WAIT) as monitor:
        assert monitor.snapshot()["monitors"] == 1
    # The argument wins over the environment: a client key is refused as a monitor.
    with pytest.raises(MonitorRefused, match="role client"):
        Monitor(cluster.address, credentials=alice, timeout=WAIT)
    monkeypatch.delenv("SCALER_CREDENTIALS")
    monkeypatch.setenv("SCALER_CONFIG", str(cluster.tmp / "scaler.toml"))
    (cluster.tmp / "scaler.toml").write_text(f"credentials = {mon!r}\n")
    with Monitor(cluster.address, timeout=WAIT) as monitor:
        assert monitor.snapshot()["monitors"] == 1


def test_a_monitor_watches_an_embedded_cluster_over_ipc() -> None:
    """ipc:// needs no key (the socket is the user's own): the same user can watch ``ex.address``."""
    with ScalerExecutor(max_workers=1) as ex:
        assert ex.submit(square, 2).result(timeout=WAIT) == 4
        with Monitor(ex.address) as monitor:
            assert wait_until(lambda: monitor.snapshot()["finished"] == 1, timeout=WAIT)
            stats = monitor.snapshot()
            assert stats["clients"] == 1 and stats["monitors"] == 1 and len(stats.workers) == 1


def test_a_monitor_reads_the_history_shared_among_monitors() -> None:
    """The task stream's runs and the run's series, as ``ex.report`` reads them; monitors get
    one history rebuilt at most every MONITOR_HISTORY_SECONDS, and snapshots still answer."""
    with ScalerExecutor(max_workers=1) as ex:
        assert list(ex.map(square, range(10))) == [x * x for x in range(10)]
        with Monitor(ex.address) as monitor:
            assert wait_until(lambda: monitor.history().runs_seen == 10, timeout=WAIT)
            history = monitor.history()
            assert len(history.runs) == 10 and {run.status for run in history.runs} == {m.Status.OK}
            assert all(run.started <= run.finished for run in history.runs)
            assert history.series and max(b.workers for b in history.series) == 1
            assert sum(b.finished for b in history.series) == 10
            assert monitor.snapshot()["finished"] == 10  # interleaved requests each get their own kind
            assert monitor.history().runs_seen == 10


def test_a_monitor_key_cannot_submit_and_a_client_key_cannot_monitor(cluster: Cluster) -> None:
    mon = cluster.credential("mon", "monitor")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon("--workers", "1")
    with pytest.raises(DaemonLost, match="has role monitor"):
        cluster.client(mon)  # the constructor waits for the daemon's answer
    with pytest.raises(MonitorRefused, match="role client"):
        Monitor(cluster.address, credentials=alice, timeout=WAIT)
    with Monitor(cluster.address, credentials=mon) as monitor:
        stats = monitor.snapshot()
        assert stats["submitted"] == 0 and stats["security_refused_role"] >= 1


def test_a_monitor_that_stops_reading_is_dropped_and_the_cluster_carries_on(cluster: Cluster) -> None:
    mon = cluster.credential("mon", "monitor")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon("--workers", "1", "--send-hwm", "4")
    stalled = RawPeer(cluster.address, mon)
    try:
        stalled.hello("monitor")
        assert stalled.receive(m.Welcome) is not None
        with cluster.client(alice) as ex:
            # Ask for snapshots and never read them: the daemon's queue to it fills, and it
            # is dropped rather than waited for (its backlog would grow without bound).
            # (The daemon answers a monitor once per turn, so each answer is one snapshot.)
            deadline = time.monotonic() + STALL_WAIT
            while "is not reading its snapshots; dropping it" not in cluster.log():
                assert time.monotonic() < deadline, cluster.log()
                for _ in range(200):
                    try:
                        stalled.send([m.StatsRequest()])
                    except channel.Again:
                        break  # our own queue to the daemon is full: let it catch up
                assert ex.submit(square, 4).result(timeout=WAIT) == 16
            assert ex.submit(square, 5).result(timeout=WAIT) == 25
    finally:
        stalled.close()
    with Monitor(cluster.address, credentials=mon) as monitor:  # monitors still welcome
        # A sequential caller's tasks ran down the worker's lane: the daemon counts them when
        # the worker's report comes, which may wait for company up to 50 ms (ex.statistics()
        # waits for it; a monitor, which received none of those results, does not).
        assert wait_until(lambda: monitor.snapshot()["finished"] >= 2, timeout=WAIT)
