"""Security on loopback tcp://, with real processes: keys, roles, revocation, clear failures.

Every case starts a real ``scaler-daemon --security DIR`` (and real ``scaler-worker``s) on
127.0.0.1 and talks to it with real credentials made by ``scaler-keys``. Waits are bounded
(``wait_until``, ``result(timeout=...)``); nothing asserts how long anything took.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest
from scaler_testing import child_env, listening_or_exited, socket_dir, wait_until

from scaler_executor import ClusterConfig, ScalerExecutor, __version__
from scaler_executor._compat import python_version
from scaler_executor.exceptions import ConfigError, DaemonLost
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.security.client import ClientSecurity
from scaler_executor.security.keys import SecurityDir, load_credential

pytestmark = pytest.mark.timeout(120)

FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "50", "--log-level", "INFO")
CLIENT = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=20.0)
WAIT = 30.0  # bound on any single wait on a loaded machine; never a timing assertion


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def square(x: int) -> int:
    return x * x


def total(data: bytes) -> int:
    return sum(data[::4096])


class Cluster:
    """A key directory, a tcp daemon and workers, with their logs; all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keys = SecurityDir.init(str(tmp / "keys"))
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.daemon_proc: subprocess.Popen[bytes] | None = None

    def credential(self, name: str, role: str) -> str:
        path = str(self.tmp / f"{name}.cred")
        self.keys.issue(name, role, path)
        return path

    def _start(self, module: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"log-{len(self.procs)}.txt"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args, *FLAGS], env=child_env(), stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def daemon(self, *args: str) -> subprocess.Popen[bytes]:
        proc = self._start("scaler_executor.cli.daemon", "--address", self.address, *args)
        assert wait_until(listening_or_exited(proc, int(self.address.rsplit(":", 1)[1])), timeout=WAIT)
        assert proc.poll() is None, self.log(proc)
        self.daemon_proc = proc
        return proc

    def secure_daemon(self, *args: str) -> subprocess.Popen[bytes]:
        return self.daemon("--security", self.keys.path, *args)

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self._start("scaler_executor.cli.worker", self.address, *args)

    def log(self, proc: subprocess.Popen[bytes] | None = None) -> str:
        proc = proc or self.daemon_proc
        assert proc is not None
        return self.logs[proc.pid].read_text(errors="replace")

    def client(self, credentials: str) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, credentials=credentials, config=CLIENT)

    def close(self) -> None:
        for proc in reversed(self.procs):  # workers first, then the daemon
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="scaler-sec-test-") as tmp:
        c = Cluster(Path(tmp))
        try:
            yield c
        finally:
            c.close()


class RawPeer:
    """A peer speaking this project's codec over a secured channel, as a tool might."""

    def __init__(self, address: str, credentials: str) -> None:
        self.sock = channel.connect(
            address, hwm=100, linger=0, security=ClientSecurity(load_credential(credentials), address)
        )
        self.poller = channel.Poller()
        self.poller.register(self.sock.pollable)

    def hello(self, role: str) -> None:
        self.send([
            m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
                    f"raw-{role}", os.getpid(), socket.gethostname(), 0, {}, [])
        ])  # fmt: skip

    def send(self, batch: list[Any]) -> None:
        self.sock.send(codec.encode(batch))

    def receive(self, kind: type, timeout: float = WAIT) -> Any:
        """The next message of ``kind`` (others are skipped), or None when none came in ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poller.poll(self.sock.poll_timeout(100))
            while self.sock.readable():
                messages, _ = codec.decode(self.sock.recv())
                for message in messages:
                    if type(message) is kind:
                        return message
        return None

    def close(self) -> None:
        self.sock.close()


# =========================================================================== the secure path


def test_a_secure_cluster_runs_tasks_with_ephemeral_worker_keys_and_objects(cluster: Cluster) -> None:
    """--workers N gets keys of its own (no file); a standalone worker with its credential
    fetches a stored argument over the authenticated channel."""
    alice = cluster.credential("alice", "client")
    remote = cluster.credential("remote-worker", "worker")
    cluster.secure_daemon("--workers", "1")
    with cluster.client(alice) as ex:
        assert list(ex.map(square, range(20))) == [x * x for x in range(20)]
        cluster.worker("--credentials", remote, "--fetch-objects-over-network", "--name", "remote")
        assert wait_until(lambda: ex.statistics()["workers"] == 2, timeout=WAIT)
        data = bytes(range(256)) * 4096  # 1 MiB: through the store, fetched by the remote worker
        futures = [ex.submit(total, data) for _ in range(8)]
        assert [f.result(timeout=WAIT) for f in futures] == [total(data)] * 8
        stats = ex.statistics()
    # (not security_refused_handshakes: the test's own readiness probe, a bare TCP connect,
    # may count as one)
    assert stats["security_refused_role"] == 0 and stats["security_refused_revoked"] == 0
    assert [e.name for e in cluster.keys.entries()] == ["alice", "remote-worker"]  # the local worker's key is in memory only


# =========================================================================== roles


def test_a_worker_key_cannot_submit(cluster: Cluster) -> None:
    worker_key = cluster.credential("w1", "worker")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon("--workers", "1")
    # The constructor waits for the daemon's answer (connect_timeout): the refusal comes from it.
    with pytest.raises(DaemonLost, match=r"has role worker: it cannot join as a client"):
        cluster.client(worker_key)
    assert wait_until(lambda: "refused Hello as client from worker key 'w1'" in cluster.log())
    assert " at 127.0.0.1" in cluster.log()
    with cluster.client(alice) as ex:
        assert ex.statistics()["security_refused_role"] >= 1
        assert ex.submit(square, 3).result(timeout=WAIT) == 9  # the cluster serves on


def test_a_client_key_cannot_register_as_a_worker(cluster: Cluster) -> None:
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon()
    worker = cluster.worker("--credentials", alice)
    assert worker.wait(WAIT) == 2
    assert "has role client: it cannot join as a worker" in cluster.log(worker)
    assert "refused Hello as worker from client key 'alice'" in cluster.log()
    with cluster.client(alice) as ex:
        assert ex.statistics()["workers"] == 0  # it never received a dispatch


def test_a_monitor_key_reads_statistics_and_nothing_else(cluster: Cluster) -> None:
    mon = cluster.credential("mon", "monitor")
    cluster.secure_daemon("--workers", "1")
    with pytest.raises(DaemonLost, match="has role monitor: it cannot join as a client"):
        cluster.client(mon)  # the constructor waits for the daemon's answer
    peer = RawPeer(cluster.address, mon)
    try:
        peer.hello("monitor")
        assert peer.receive(m.Welcome) is not None
        task = m.TaskSpec(1, 0, 0, 0, cloudpickle.dumps((square, (2,), {})), [], [], 0)
        peer.send([m.RegisterFunction(7, b"x"), m.SubmitTasks([task]), m.StatsRequest()])
        stats = peer.receive(m.Stats)
        assert stats is not None
        snapshot = stats.snapshot
        assert snapshot["submitted"] == 0 and snapshot["security_refused_role"] >= 2
    finally:
        peer.close()
    assert wait_until(lambda: "refused RegisterFunction from monitor key 'mon'" in cluster.log())


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark (VmHWM): a peak no sampling can miss."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_authenticated_clients_oversized_batch_is_dropped_without_growing_the_daemon(cluster: Cluster) -> None:
    noisy = cluster.credential("noisy", "client")
    alice = cluster.credential("alice", "client")
    daemon = cluster.secure_daemon("--workers", "1")
    peer = RawPeer(cluster.address, noisy)
    try:
        peer.hello("client")
        assert peer.receive(m.Welcome) is not None
        before = _peak_rss(daemon.pid)
        n = 2_000_000  # 10 MB of heartbeats, written directly: ~550 MB once decoded
        peer.sock.send([codec.VERSION_FRAME, b"\xdd" + n.to_bytes(4, "big") + b"\x92\x04\x92\x00\x00" * n])
        peer.send([m.StatsRequest()])  # answered after the batch: one connection keeps order
        stats = peer.receive(m.Stats)
        assert stats is not None, cluster.log()
        assert stats.snapshot["dropped_messages"] >= 1
        grown = _peak_rss(daemon.pid) - before
        # The frame itself (and its decrypted copy) may be held: 10 MB each.
        assert grown < 100 << 20, f"the daemon's peak grew by {grown >> 20} MB"
        # A message nested just short of msgpack's stack limit: the error text's repr of it
        # raised RecursionError, out of the daemon's loop, which ended.
        peer.sock.send([codec.VERSION_FRAME, b"\x91\x91" + b"\x91" * 1000 + b"\x00"])
        peer.send([m.StatsRequest()])
        stats = peer.receive(m.Stats)
        assert stats is not None, cluster.log()
        assert stats.snapshot["dropped_messages"] >= 2
    finally:
        peer.close()
    assert wait_until(lambda: "a batch of 2000000 messages" in cluster.log())
    with cluster.client(alice) as ex:
        assert ex.submit(square, 3).result(timeout=WAIT) == 9  # the cluster serves on
    assert daemon.poll() is None


# =========================================================================== clear failures


def test_no_credential_on_tcp_is_a_clear_error(cluster: Cluster) -> None:
    cluster.secure_daemon()
    with pytest.raises(ConfigError, match=r"no credential was given: a client needs one.*scaler-keys issue"):
        ScalerExecutor(address=cluster.address, config=CLIENT)
    worker = cluster.worker()
    assert worker.wait(WAIT) != 0
    assert "no credential was given: a worker needs one" in cluster.log(worker)


def test_a_wrong_daemon_key_is_named_as_the_likely_cause(cluster: Cluster, tmp_path: Path) -> None:
    other = SecurityDir.init(str(tmp_path / "other"))
    stranger = str(tmp_path / "stranger.cred")
    other.issue("stranger", "client", stranger)
    cluster.secure_daemon()
    with pytest.raises(DaemonLost, match=r"likely the wrong daemon key") as info:
        cluster.client(stranger)
    assert cluster.address in str(info.value)
    assert wait_until(lambda: "a peer failed the CURVE handshake" in cluster.log())
    worker_cred = str(tmp_path / "w.cred")
    other.issue("w", "worker", worker_cred)
    worker = cluster.worker("--credentials", worker_cred)
    assert worker.wait(WAIT) == 2
    assert "likely the wrong daemon key" in cluster.log(worker)


def test_a_revoked_key_is_refused_at_the_handshake(cluster: Cluster) -> None:
    carol = cluster.credential("carol", "client")
    cluster.keys.revoke("carol")
    cluster.secure_daemon()
    with pytest.raises(DaemonLost, match=r"refused at the handshake.*not in the daemon's allow-list"):
        cluster.client(carol)
    assert wait_until(lambda: "refused a connection from 127.0.0.1: key SHA256:" in cluster.log())


def test_revocation_reaches_connections_that_passed_the_handshake(cluster: Cluster) -> None:
    """Revoked while connected: the client's futures fail and the worker stops, within the
    daemon's next reads of the allow-list; no restart."""
    carol = cluster.credential("carol", "client")
    alice = cluster.credential("alice", "client")
    w1 = cluster.credential("w1", "worker")
    cluster.secure_daemon()
    worker = cluster.worker("--credentials", w1)
    with cluster.client(carol) as ex, cluster.client(alice) as watcher:
        assert ex.submit(square, 4).result(timeout=WAIT) == 16
        pending = ex.submit(time.sleep, 10 * WAIT)  # still pending when the revocation lands
        cluster.keys.revoke("carol")
        with pytest.raises(DaemonLost, match="was revoked"):
            pending.result(timeout=WAIT)
        cluster.keys.revoke("w1")
        assert worker.wait(WAIT) == 2
        assert "was revoked" in cluster.log(worker)
        assert wait_until(lambda: watcher.statistics()["workers"] == 0, timeout=WAIT)
    assert "expelled peer" in cluster.log()


# =========================================================================== insecure


def test_tcp_without_security_needs_insecure_and_warns(cluster: Cluster) -> None:
    refused = cluster._start("scaler_executor.cli.daemon", "--address", cluster.address)
    assert refused.wait(WAIT) != 0
    assert "refusing to serve" in cluster.log(refused) and "--security DIR" in cluster.log(refused)
    cluster.daemon("--insecure", "--workers", "1")
    assert "WITHOUT security" in cluster.log()
    with ScalerExecutor(address=cluster.address, config=CLIENT.replace(insecure=True)) as ex:
        assert ex.submit(square, 6).result(timeout=WAIT) == 36
    assert wait_until(lambda: cluster.log().count("WITHOUT security") >= 2)  # the daemon's and its worker's


# =========================================================================== ipc modes


def test_a_standalone_ipc_socket_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    old = os.umask(0)
    try:
        router = channel.bind(f"ipc://{path}", hwm=10)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        router.close()


def test_the_embedded_cluster_is_private_to_its_user() -> None:
    old = os.umask(0)
    try:
        ex = ScalerExecutor(max_workers=1, config=CLIENT)
    finally:
        os.umask(old)
    with ex:
        import numpy as np

        arr = np.ones(1 << 20)
        assert ex.submit(np.sum, arr).result(timeout=WAIT) == arr.size  # through the store
        directory = socket_dir(ex)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        sockets = [e for e in os.scandir(directory) if stat.S_ISSOCK(e.stat().st_mode)]
        assert {e.name for e in sockets} >= {"daemon.sock"}
        for e in sockets:
            assert stat.S_IMODE(e.stat().st_mode) == 0o600, e.path
        segments = [e for e in os.scandir("/dev/shm") if e.name.startswith("scaler-") and e.stat().st_uid == os.getuid()]
        assert segments
        for e in segments:
            assert stat.S_IMODE(e.stat().st_mode) == 0o600, e.path
