"""``scaler-worker-manager --adapter local`` with real processes on loopback tcp://, security on.

A ``scaler-daemon --workers 0 --security DIR`` gets all its capacity from managers. Each
manager holds a ``manager`` key; its workers get short-lived keys of their own (none is
written to the key directory). Waits are bounded (``wait_until``, ``result(timeout=...)``);
nothing asserts how long anything took.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from scaler_testing import child_env, listening_or_exited, wait_until

from scaler_executor import ClusterConfig, ScalerExecutor
from scaler_executor.security.keys import SecurityDir

pytestmark = pytest.mark.timeout(180)

FLAGS = ("--heartbeat-interval", "0.2", "--heartbeat-liveness", "25", "--log-level", "INFO")
CLIENT = ClusterConfig(heartbeat_interval=0.2, heartbeat_liveness=25, daemon_loss_timeout=30.0)
WAIT = 60.0  # bound on any single wait on a loaded machine; never a timing assertion


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def where(seconds: float) -> str:
    """The name of the worker that ran this task (a processor keeps its worker's argv)."""
    time.sleep(seconds)
    argv = psutil.Process().cmdline()
    return argv[argv.index("--name") + 1]


def workers_named(prefix: str) -> list[psutil.Process]:
    """Worker agents (not their zygotes or processors) whose name starts with ``prefix``."""
    found = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        try:
            argv = p.info["cmdline"] or []
            if "scaler_executor.cli.worker" in argv and "--name" in argv and argv[argv.index("--name") + 1].startswith(prefix):
                parent = psutil.Process(p.info["ppid"])
                if "scaler_executor.cli.worker" not in parent.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        except (psutil.Error, IndexError):
            continue
    return found


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keys = SecurityDir.init(str(tmp / "keys"))
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

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

    def daemon(self, *managers: str) -> subprocess.Popen[bytes]:
        """Keys are issued first: a running daemon re-reads its allow-list only every second."""
        self.credential("alice", "client")
        for name in managers:
            self.credential(name, "manager")
        proc = self._start(
            "scaler_executor.cli.daemon", "--address", self.address, "--security", self.keys.path, "--workers", "0",
            "--scale-down-idle", "1",
        )  # fmt: skip
        assert wait_until(listening_or_exited(proc, int(self.address.rsplit(":", 1)[1])), timeout=WAIT)
        assert proc.poll() is None, self.log(proc)
        return proc

    def manager(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        path = str(self.tmp / f"{name}.cred")
        return self._start(
            "scaler_executor.cli.manager", self.address, "--adapter", "local", "--credentials", path, "--name", name, *args
        )

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, credentials=str(self.tmp / "alice.cred"), config=CLIENT)

    def close(self) -> None:
        for proc in reversed(self.procs):  # managers (and their workers) first, then the daemon
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        child.kill()
                    proc.kill()
                    proc.wait()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="scaler-mgr-test-") as tmp:
        c = Cluster(Path(tmp))
        try:
            yield c
        finally:
            c.close()
            assert wait_until(lambda: not workers_named(f"t{os.getpid()}"), timeout=WAIT), "a manager left workers behind"


def stat(ex: ScalerExecutor, key: str) -> int:
    return int(ex.statistics().get(key, 0))


def test_a_burst_scales_up_and_idle_workers_scale_down(cluster: Cluster) -> None:
    name = f"t{os.getpid()}a"
    cluster.daemon(name)
    manager = cluster.manager(name, "--max-workers", "3")
    with cluster.client() as ex:
        assert wait_until(lambda: stat(ex, "managers") == 1, timeout=WAIT), cluster.log(manager)
        assert stat(ex, "workers") == 0, "a manager with no demand starts nothing"
        (typed,) = ex.statistics().managers  # the snapshot's typed view of it
        assert (typed.name, typed.kind, typed.connected, typed.max_workers, typed.running) == (name, "local", True, 3, 0)
        ran = [f.result(timeout=WAIT) for f in [ex.submit(where, 0.3) for _ in range(24)]]
        assert all(w.startswith(name + "-") for w in ran)
        assert len(set(ran)) > 1, f"the burst ran on one worker only: {set(ran)}"
        assert wait_until(lambda: stat(ex, "workers") == 0, timeout=WAIT), "idle workers were not stopped"
        (typed,) = ex.statistics().managers
        assert typed.failed == 0 and typed.last_error is None, typed  # stopped when asked: no failure
        assert wait_until(lambda: not workers_named(name), timeout=WAIT)
        assert stat(ex, "failed") == 0
    # The workers' keys lived in the daemon's memory only: the key directory has the two issued.
    assert sorted(e.name for e in cluster.keys.entries()) == ["alice", name]
    assert "scaling down" in "".join(cluster.log(p) for p in cluster.procs[:1])


def test_two_managers_with_different_resources_serve_the_tasks_that_need_them(cluster: Cluster) -> None:
    cpu, gpu = f"t{os.getpid()}cpu", f"t{os.getpid()}gpu"
    cluster.daemon(cpu, gpu)
    cluster.manager(cpu, "--max-workers", "2", "--processors", "3")  # room for the 6 plain tasks
    cluster.manager(gpu, "--max-workers", "1", "--resources", "gpu=1")
    with cluster.client() as ex:
        assert wait_until(lambda: stat(ex, "managers") == 2, timeout=WAIT)
        # Plain work first: the policy asks the plain manager, and leaves the GPU one idle.
        plain_ran = {f.result(timeout=WAIT) for f in [ex.submit(where, 0.1) for _ in range(6)]}
        assert all(w.startswith(cpu + "-") for w in plain_ran), f"plain work started GPU workers: {plain_ran}"
        assert not workers_named(gpu)
        # GPU work runs only where there are GPUs (once one exists, the allocation policy may
        # give it plain tasks too: it has processors to spare).
        gpu_ran = {f.result(timeout=WAIT) for f in [ex.options(resources={"gpu": 1}).submit(where, 0.1) for _ in range(4)]}
        assert all(w.startswith(gpu + "-") for w in gpu_ran), gpu_ran


def test_a_killed_manager_leaves_no_worker_and_a_restarted_one_serves_again(cluster: Cluster) -> None:
    name = f"t{os.getpid()}k"
    cluster.daemon(name)
    manager = cluster.manager(name, "--max-workers", "2")
    with cluster.client() as ex:
        futures = [ex.submit(where, 0.2) for _ in range(8)]
        assert all(f.result(timeout=WAIT).startswith(name + "-") for f in futures)
        long = [ex.submit(where, 3.0) for _ in range(2)]  # busy workers when the manager dies
        assert wait_until(lambda: len(workers_named(name)) == 2, timeout=WAIT)
        manager.send_signal(signal.SIGKILL)
        manager.wait()
        # The workers' lifelines closed with the manager: they stop, the daemon loses them.
        assert wait_until(lambda: not workers_named(name), timeout=WAIT), "workers outlived their killed manager"
        assert wait_until(lambda: stat(ex, "workers") == 0, timeout=WAIT)
        # Restarted under the same name (and key), it gets the work again, the lost tasks too.
        cluster.manager(name, "--max-workers", "2")
        more = [ex.submit(where, 0.1) for _ in range(4)]
        assert all(f.result(timeout=WAIT).startswith(name + "-") for f in more + long)
