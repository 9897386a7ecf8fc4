"""multiprocessing interop: ``Manager()`` proxies as task arguments, as with ProcessPoolExecutor.

Processors on the client's host run its tasks with its ``multiprocessing`` authkey (read from a
file only the client's user can read; only its path travels, and only to workers on the
client's host).  Checked here with real managers, the embedded cluster, a running cluster
shared by two client processes with different authkeys, and a worker on "another host" (a
UTS namespace with its own host name: the daemon treats it as another host, while the
manager's Unix socket stays reachable, so only the withheld key can make the task fail).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scaler_testing import FAST, child_env, wait_until

from scaler_executor import ScalerExecutor
from scaler_executor.exceptions import ProxyUnavailable

pytestmark = pytest.mark.timeout(120)


def fill(q: Any, d: Any, ev: Any, lock: Any, x: int) -> int:
    with lock:
        q.put(x)
        d[x] = x * x
    ev.set()
    return x


def through_containers(box: dict[str, Any]) -> int:
    q, (d, [ev]) = box["q"], box["rest"]
    q.put("hello")
    d["seen"] = True
    ev.set()
    return len(box["big"])


def authkey() -> bytes:
    return bytes(multiprocessing.current_process().authkey)


@pytest.fixture(scope="module")
def manager() -> Iterator[Any]:
    with multiprocessing.Manager() as m:
        yield m


def test_proxies_as_arguments_of_submit_and_map(manager: Any, executor: ScalerExecutor) -> None:
    q, d, ev, lock = manager.Queue(), manager.dict(), manager.Event(), manager.Lock()
    assert list(executor.map(fill, [q] * 6, [d] * 6, [ev] * 6, [lock] * 6, range(6))) == list(range(6))
    assert sorted(q.get(timeout=10) for _ in range(6)) == list(range(6))
    assert dict(d) == {x: x * x for x in range(6)}
    assert ev.is_set()
    # One at a time: a sequential caller's tasks take the worker's lane, not the daemon.
    for x in range(3):
        assert executor.submit(fill, q, d, ev, lock, 10 + x).result(timeout=30) == 10 + x
    assert sorted(q.get(timeout=10) for _ in range(3)) == [10, 11, 12]


def test_proxies_inside_containers_and_large_arguments(manager: Any, executor: ScalerExecutor) -> None:
    """Nested in a dict and a list, next to an array large enough to go through the store
    (then the arguments are unpickled from a store header)."""
    q, d, ev = manager.Queue(), manager.dict(), manager.Event()
    big = np.zeros(1 << 18)  # 2 MiB: out-of-band, through the object store
    box = {"q": q, "rest": (d, [ev]), "big": big}
    assert executor.submit(through_containers, box).result(timeout=30) == big.size
    assert q.get(timeout=10) == "hello" and d["seen"] and ev.is_set()


def test_proxy_in_a_by_value_functions_globals(manager: Any, executor: ScalerExecutor) -> None:
    """A lambda (pickled by value) whose closure holds a proxy: unpickled with the function."""
    q = manager.Queue()
    put = lambda x: q.put(x * 2)  # noqa: E731 - a by-value function is the point
    executor.submit(put, 21).result(timeout=30)
    assert q.get(timeout=10) == 42


def test_the_key_is_the_clients_only_while_its_task_runs(executor: ScalerExecutor) -> None:
    assert executor.submit(authkey).result(timeout=30) == authkey()


@pytest.mark.parametrize("make", [multiprocessing.Queue, multiprocessing.Lock, multiprocessing.Event])
def test_objects_only_inheritance_can_pass_say_so(make: Any, executor: ScalerExecutor) -> None:
    with pytest.raises(RuntimeError, match="through inheritance") as info:
        executor.submit(fill, make(), None, None, None, 0).result(timeout=30)  # fails in submit or in the future
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "args[0]" in note and "never to a cluster's processors" in note
    assert "multiprocessing.Manager()" in note


# --------------------------------------------------------------------------- a running cluster


class Cluster:
    """A ``scaler-daemon`` and ``scaler-worker``\\ s started by hand; ``close()`` stops them."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxm-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{self.sock_path}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, env=child_env(), start_new_session=True)
        self.procs.append(proc)
        return proc

    def daemon(self) -> None:
        proc = self.start([sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address,
                           "--heartbeat-interval", "0.1"])
        assert wait_until(lambda: os.path.exists(self.sock_path) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"

    def worker(self, *prefix: str) -> None:
        self.start([*prefix, sys.executable, "-m", "scaler_executor.cli.worker", self.address,
                    "--processors", "1", "--heartbeat-interval", "0.1"])

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.daemon()
        yield c
    finally:
        c.close()


SECOND_CLIENT = textwrap.dedent(
    """
    import multiprocessing, sys
    from scaler_executor import ClusterConfig, ScalerExecutor

    def fill(q, d, x):
        q.put(x)
        d[x] = bytes(multiprocessing.current_process().authkey).hex()
        return x

    if __name__ == "__main__":
        with multiprocessing.Manager() as m, ScalerExecutor(address=sys.argv[1], config=ClusterConfig(heartbeat_interval=0.1)) as ex:
            q, d = m.Queue(), m.dict()
            assert list(ex.map(fill, [q] * 4, [d] * 4, range(4))) == [0, 1, 2, 3]
            assert sorted(q.get(timeout=10) for _ in range(4)) == [0, 1, 2, 3]
            mine = bytes(multiprocessing.current_process().authkey).hex()
            assert set(d.values()) == {mine}, (d, mine)
            print("KEY", mine, flush=True)
    """
)


def test_two_clients_with_their_own_managers_share_one_worker(cluster: Cluster, manager: Any) -> None:
    """One processor runs both clients' tasks, each with its own client's key."""
    cluster.worker()
    with ScalerExecutor(address=cluster.address, config=FAST) as ex:
        other = subprocess.run(
            [sys.executable, "-c", SECOND_CLIENT, cluster.address], env=child_env(), capture_output=True, timeout=90
        )
        q, d, ev, lock = manager.Queue(), manager.dict(), manager.Event(), manager.Lock()
        assert list(ex.map(fill, [q] * 4, [d] * 4, [ev] * 4, [lock] * 4, range(4))) == list(range(4))
        assert sorted(q.get(timeout=10) for _ in range(4)) == list(range(4))
        assert ex.submit(authkey).result(timeout=30) == authkey()
    assert other.returncode == 0, other.stderr.decode()
    their_key = other.stdout.decode().split("KEY ")[1].strip()
    assert bytes.fromhex(their_key) != authkey()


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "hostname", "scaler-elsewhere"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare --uts (root) to give a worker another host name")
def test_a_proxy_on_another_host_fails_saying_why(cluster: Cluster, manager: Any) -> None:
    cluster.worker("unshare", "--uts", "sh", "-c", 'hostname scaler-elsewhere && exec "$@"', "sh")
    with ScalerExecutor(address=cluster.address, config=FAST) as ex:
        assert ex.submit(authkey).result(timeout=60) != authkey()  # the key never went there
        with pytest.raises(ProxyUnavailable) as info:
            ex.submit(fill, manager.Queue(), manager.dict(), manager.Event(), manager.Lock(), 1).result(timeout=30)
    text = str(info.value)
    assert "not on the client's host" in text and "scaler-elsewhere" in text
    assert "never given to processors on other hosts" in text
    assert "AuthenticationError" in str(info.value.__cause__)  # the raw error, in the remote traceback


PROGRESS: Any = None


def remember(queue: Any) -> None:
    global PROGRESS
    PROGRESS = queue


def report(x: int) -> int:
    PROGRESS.put(x)
    return x


def test_a_proxy_in_the_initializers_arguments(manager: Any) -> None:
    """The usual progress pattern: every processor gets the queue through the initializer."""
    q = manager.Queue()
    with ScalerExecutor(max_workers=2, initializer=remember, initargs=(q,), config=FAST) as ex:
        assert list(ex.map(report, range(5))) == list(range(5))
        assert ex.submit(authkey).result(timeout=30) == authkey()
    assert sorted(q.get(timeout=10) for _ in range(5)) == list(range(5))


def send(conn: Any) -> None:
    conn.send("hi")


def test_a_pipe_end_is_refused_in_the_client(executor: ScalerExecutor) -> None:
    """cloudpickle would copy a Connection's bare descriptor number, which in a processor is
    another file (its socket to the worker agent, say): refused before it travels."""
    a, b = multiprocessing.Pipe()
    with a, b:
        for call in (lambda: executor.submit(send, b), lambda: executor.submit(lambda: b.send(1))):
            with pytest.raises(TypeError, match="Pipe") as info:
                call().result(timeout=30)
            assert "multiprocessing.Manager().Queue()" in str(info.value)
        assert executor.submit(authkey).result(timeout=30) == authkey()  # the worker is fine
