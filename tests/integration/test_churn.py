"""Churn: 50 clients connect to a standalone daemon, submit, and are SIGKILLed.

A client that vanishes without a Goodbye is lost when its connection drops (ipc) or, at
the latest, ``client_timeout`` after its last message (tcp: the daemon hears nothing more):
then its queued tasks are dropped, its functions released and its record freed, and tasks
a worker already holds are dropped when their result comes. The test checks the end state
(the daemon's statistics back to zero, everything counted lost), not how fast it came, and
samples the daemon's memory across the rounds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from scaler_testing import FAST, child_env, wait_until

from scaler_executor import ScalerExecutor

CLIENTS = 50
AT_ONCE = 5
CLIENT_TIMEOUT = 3.0
# A bound on waits that must end (the machine may be loaded), never a measured time.
BOUND = 120.0

CLIENT = """
import sys, time
from scaler_executor import ScalerExecutor
from scaler_executor.config import ClusterConfig

address = sys.argv[1]
ex = ScalerExecutor(address=address, config=ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50,
                    insecure=address.startswith("tcp://")))

def work(i, pad):
    time.sleep(0.01)
    return i

futures = [ex.submit(work, i, b"x" * 1000) for i in range(200)]  # a registered function
futures += [ex.submit(lambda i: i, i) for i in range(50)]  # inline callables
futures[0].result(timeout=60)  # the daemon holds the rest, queued or at the worker
print("submitted", flush=True)
time.sleep(600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    def __init__(self, transport: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxc-")
        self.script = os.path.join(self.dir, "client.py")
        with open(self.script, "w") as f:
            f.write(CLIENT)
        if transport == "ipc":
            self.address = f"ipc://{self.dir}/d.sock"
        else:
            self.address = f"tcp://127.0.0.1:{free_port()}"
        args = ["--address", self.address, "--workers", "1", "--client-timeout", str(CLIENT_TIMEOUT)]
        args += ["--heartbeat-interval", "0.1", "--heartbeat-liveness", "10"]
        if transport == "tcp":
            args.append("--insecure")
        self.proc = subprocess.Popen([sys.executable, "-m", "scaler_executor.cli.daemon", *args], env=child_env())
        self.clients: list[subprocess.Popen[bytes]] = []

    def observer(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, config=FAST.replace(insecure=self.address.startswith("tcp://")))

    def client(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, self.script, self.address], env=child_env(), stdout=subprocess.PIPE
        )
        self.clients.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.clients:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        tree: list[psutil.Process] = []
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for child in tree:
            try:
                child.wait(10)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(params=["ipc", "tcp"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    d = Daemon(request.param)
    try:
        yield d
    finally:
        d.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vanished_clients_are_freed(daemon: Daemon) -> None:
    rss: list[int] = []
    with daemon.observer() as observer:
        process = psutil.Process(daemon.proc.pid)

        def stats() -> dict[str, Any]:
            return observer.statistics(timeout=BOUND)

        def settled() -> bool:
            s = stats()
            return s["clients"] == 1 and s["tasks"] == 0 and s["functions"] == 0

        for _first in range(0, CLIENTS, AT_ONCE):
            batch = [daemon.client() for _ in range(AT_ONCE)]
            for proc in batch:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert line == b"submitted\n", f"client {proc.pid} exited with {proc.wait()} before submitting"
            for proc in batch:
                proc.send_signal(signal.SIGKILL)
            for proc in batch:
                proc.wait()
            assert wait_until(settled, timeout=BOUND, interval=0.2), stats()
            rss.append(process.memory_info().rss)
        final = stats()
    assert final["clients_lost"] == CLIENTS, final
    assert final["clients"] == 1 and final["tasks"] == 0 and final["functions"] == 0, final
    print(f"daemon RSS after each round of {AT_ONCE} clients (MiB): {[round(r / 2**20, 1) for r in rss]}")
    # Bounded memory: nothing per client survives it. The first round warms the daemon's
    # allocator up; later rounds may not add more than a small, fixed slack.
    assert max(rss[1:]) - rss[0] < 32 * 2**20, rss
