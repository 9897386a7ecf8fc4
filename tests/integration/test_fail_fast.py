"""Failing fast, in one line (issue 21): a client pointed where no daemon answers, and a
cluster whose queued tasks no worker can run, each with the message the user sees.

Real sockets and processes: the "daemons" that never answer are a bare listening socket
and a socket file nobody accepts on; the no-worker cases run a standalone scaler-daemon
and scaler-worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from scaler_testing import child_env, fast_config, wait_until

from scaler_executor import DaemonLost, NoWorkerWarning, ScalerExecutor

pytestmark = pytest.mark.timeout(120)

QUICK = fast_config(connect_timeout=0.5, insecure=True)  # tcp:// without keys here; security has its own tests


def refused(address: str) -> str:
    with pytest.raises(DaemonLost) as caught:
        ScalerExecutor(address=address, config=QUICK)
    text = str(caught.value)
    assert address in text and "connect_timeout" in text
    return text


def test_nothing_listening_on_a_tcp_port_raises_in_the_constructor() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = refused(f"tcp://127.0.0.1:{port}")
    assert f"nothing listens on 127.0.0.1 port {port}: the daemon is not started, or the port is wrong" in text


def test_a_tcp_listener_that_never_answers_the_handshake_names_keys_as_a_cause() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        text = refused(f"tcp://127.0.0.1:{listener.getsockname()[1]}")
    assert "did not answer the handshake" in text and "security keys" in text


def test_an_ipc_path_with_no_socket_file(tmp_path: Any) -> None:
    path = tmp_path / "daemon.sock"
    text = refused(f"ipc://{path}")
    assert f"there is no socket file {path}" in text


def test_an_ipc_socket_file_left_by_a_dead_daemon(tmp_path: Any) -> None:
    path = str(tmp_path / "daemon.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, as after a SIGKILL
    text = refused(f"ipc://{path}")
    assert f"nothing accepts connections on {path}" in text


def test_an_unresolvable_host() -> None:
    assert "does not resolve" in refused("tcp://no-such-host.invalid:8786")


# --------------------------------------------------------------------------- no worker


class Standalone:
    """A scaler-daemon with no workers of its own, and scaler-workers started by the test."""

    FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "50", "--insecure")

    def __init__(self, transport: str = "ipc", *daemon_args: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="sff-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        if transport == "ipc":
            self.address = f"ipc://{self.sock_path}"
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.daemon = proc = self._start(
            "scaler_executor.cli.daemon", "--address", self.address, "--no-worker-warning", "1", *daemon_args
        )
        if transport == "ipc":
            assert wait_until(lambda: os.path.exists(self.sock_path) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"

    def _start(self, module: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", module, *args, *self.FLAGS], env=child_env())
        self.procs.append(proc)
        return proc

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self._start("scaler_executor.cli.worker", self.address, *args)

    def close(self) -> None:
        seen: set[int] = set()
        for proc in self.procs:
            try:
                seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in seen:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(params=["ipc"])
def standalone(request: pytest.FixtureRequest) -> Iterator[Standalone]:
    cluster = Standalone(request.param)
    try:
        yield cluster
    finally:
        cluster.close()


def wait_for_warning(caught: list[warnings.WarningMessage], timeout: float = 30.0) -> str:
    assert wait_until(lambda: any(w.category is NoWorkerWarning for w in caught), timeout=timeout), (
        "no NoWorkerWarning came"
    )
    (warning,) = [w for w in caught if w.category is NoWorkerWarning]
    return str(warning.message)


def wait_for_workers(ex: ScalerExecutor, count: int) -> None:
    assert wait_until(lambda: ex.statistics()["workers"] == count, timeout=60, interval=0.05), "the worker never joined"


def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def test_tasks_with_no_worker_warn_once_and_run_when_one_joins(standalone: Standalone) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ScalerExecutor(address=standalone.address, config=QUICK.replace(connect_timeout=30.0)) as ex:
            futures = [ex.submit(pow, 2, k) for k in range(3)]
            text = wait_for_warning(caught)
            assert "3 task(s) have waited" in text and f"for a worker at {standalone.address}" in text
            assert "no worker is connected" in text and "scaler-worker" in text
            stats = ex.statistics()
            assert (stats["tasks_without_worker"], stats["no_worker_episodes"]) == (3, 1)
            standalone.worker()
            assert [f.result(timeout=60) for f in futures] == [1, 2, 4]
            assert ex.statistics()["tasks_without_worker"] == 0
        assert len([w for w in caught if w.category is NoWorkerWarning]) == 1


def wait_for_file(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.01)
    return "done"


def test_the_only_worker_dying_warns_and_a_new_worker_runs_the_task(standalone: Standalone, tmp_path: Any) -> None:
    gate = str(tmp_path / "gate")
    first = standalone.worker()
    with ScalerExecutor(address=standalone.address, config=QUICK.replace(connect_timeout=30.0)) as ex:
        wait_for_workers(ex, 1)  # (a slow start would be an episode of its own)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert ex.submit(pow, 3, 2).result(timeout=60) == 9
            future = ex.submit(wait_for_file, gate)  # runs until the test opens the gate
            assert wait_until(future.running, timeout=30)
            first.kill()  # SIGKILL: its task goes back to the queue, and no worker is left
            text = wait_for_warning(caught)
            assert "1 task(s) have waited" in text and "no worker is connected" in text
            standalone.worker()
            open(gate, "w").close()
            assert future.result(timeout=60) == "done"


def test_tasks_needing_a_resource_no_worker_has_say_which(standalone: Standalone) -> None:
    standalone.worker("--resources", "cpu=2")
    with ScalerExecutor(address=standalone.address, config=QUICK.replace(connect_timeout=30.0)) as ex:
        wait_for_workers(ex, 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert ex.submit(pow, 2, 2).result(timeout=60) == 4  # plain tasks run
            gpu = ex.options(resources={"gpu": 1}).submit(pow, 2, 3)
            try:
                text = wait_for_warning(caught)
                assert "1 task(s) have waited" in text and "no connected worker has gpu=1" in text
                assert ex.statistics()["tasks_without_worker"] == 1
            finally:
                gpu.cancel()  # else shutdown would wait for it forever


# --------------------------------------------------------------------------- a daemon that dies

# So long that only the fast path can fail the futures before the test's own timeout.
PATIENT = QUICK.replace(connect_timeout=30.0, daemon_loss_timeout=300.0)


@pytest.mark.parametrize("standalone", ["ipc", "tcp"], indirect=True)
def test_a_killed_daemon_fails_pending_futures_long_before_daemon_loss_timeout(standalone: Standalone) -> None:
    standalone.worker()
    ex = ScalerExecutor(address=standalone.address, config=PATIENT)
    try:
        wait_for_workers(ex, 1)
        future = ex.submit(sleepy, 300.0)
        assert wait_until(future.running, timeout=60)
        standalone.daemon.kill()
        error = future.exception(timeout=60)
        assert isinstance(error, DaemonLost)
        assert f"the daemon at {standalone.address} is gone (it died or was stopped)" in str(error)
        assert "connection refused" in str(error)
        with pytest.raises(DaemonLost):
            ex.submit(pow, 2, 2)
    finally:
        ex.shutdown(wait=True)


@pytest.mark.parametrize("standalone", ["ipc", "tcp"], indirect=True)
def test_a_stalled_daemon_that_still_listens_is_not_declared_gone(standalone: Standalone) -> None:
    standalone.worker()
    with ScalerExecutor(address=standalone.address, config=PATIENT) as ex:
        wait_for_workers(ex, 1)
        assert ex.submit(pow, 2, 3).result(timeout=60) == 8
        future = ex.submit(sleepy, 0.5)
        standalone.daemon.send_signal(signal.SIGSTOP)  # silent, but its socket still accepts
        try:
            time.sleep(3.0)  # the scenario: several silence thresholds (2 heartbeats) and probes
        finally:
            standalone.daemon.send_signal(signal.SIGCONT)
        assert future.result(timeout=60) == "done"
        assert ex.submit(pow, 2, 4).result(timeout=60) == 16


def test_a_client_past_max_peers_is_refused_in_its_constructor_saying_why() -> None:
    cluster = Standalone("ipc", "--max-peers", "1")
    try:
        with ScalerExecutor(address=cluster.address, config=fast_config()) as first:
            assert first.statistics()["clients"] == 1
            with pytest.raises(DaemonLost, match=r"refused this client: the daemon already has 1 peers, its max_peers"):
                ScalerExecutor(address=cluster.address, config=fast_config())
    finally:
        cluster.close()
