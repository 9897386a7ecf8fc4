"""A daemon that can die (docs/durability.rst): SIGKILLed with work in flight and restarted on
its journal, its clients' pending futures complete, exactly once, with the right value.

Tasks record each run in a file (durable_tasks.record, O_APPEND): no id may appear twice
unless its worker died too.  Waits are bounds, never assertions on timing.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import wait

import psutil
import pytest
from durable_tasks import add, record, runs
from scaler_testing import FAST, child_env, wait_until

from scaler_executor import ScalerExecutor
from scaler_executor.exceptions import WorkerLost

pytestmark = pytest.mark.timeout(300)

GRACE = "60"  # restart_grace: generous, so that a slow machine still gets everyone back
CLIENT = FAST.replace(daemon_loss_timeout=10.0)


class Cluster:
    """A standalone ``scaler-daemon --journal`` and its ``scaler-worker``s; always cleaned up."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxj-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{self.sock_path}"
        self.journal = os.path.join(self.dir, "journal")
        self.runs = os.path.join(self.dir, "runs")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()
        self.regions: set[str] = set()  # journaled store regions its daemons used
        self.log = open(os.path.join(self.dir, "log"), "wb")  # noqa: SIM115 - closed in close()

    def start(self, *args: str, module: str) -> subprocess.Popen[bytes]:
        flags = ["--heartbeat-interval", "0.1", "--heartbeat-liveness", "20"]
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, *flags], env=child_env(), stdout=self.log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def use_tcp(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.insecure = ["--insecure"]

    insecure: list[str] = []  # noqa: RUF012 - replaced per instance (use_tcp)
    port = 0

    def fresh(self, proc: subprocess.Popen[bytes]) -> bool:
        """The socket is the new daemon's (not the file a killed one left)."""
        if self.port:
            return True
        try:
            return any(c.laddr == self.sock_path for c in psutil.Process(proc.pid).net_connections("unix"))
        except psutil.NoSuchProcess:
            return False

    def listening(self) -> bool:
        if not self.port:
            return os.path.exists(self.sock_path)
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def daemon(self, *args: str) -> subprocess.Popen[bytes]:
        # (A SIGKILLed daemon leaves its socket file: the restarted one removes it.)
        proc = self.start(
            "--address", self.address, "--journal", self.journal, "--restart-grace", GRACE, *self.insecure, *args,
            module="scaler_executor.cli.daemon",
        )
        assert wait_until(lambda: (self.listening() and self.fresh(proc)) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}: {self.text()}"
        self.note_region()
        return proc

    def note_region(self) -> None:
        """The store region the journal's daemon keeps (its STORE note): removed in close()."""
        try:
            with open(os.path.join(self.journal, "STORE")) as f:
                self.regions.add(f.read().strip())
        except OSError:
            pass

    def worker(self, processors: int = 2) -> subprocess.Popen[bytes]:
        return self.start(
            self.address, "--processors", str(processors), *self.insecure, module="scaler_executor.cli.worker"
        )

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def text(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-5000:]

    def close(self) -> None:
        for proc in self.procs:
            try:
                self.seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.log.close()
        # A daemon stopped with tasks journaled (SIGTERM pauses it) or killed keeps its region
        # for a restart that will not come: this test's, removed here (never another's).
        from scaler_executor.objstore import ObjectStore

        for name in self.regions:
            ObjectStore.unlink_name(name, tempfile.gettempdir())
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@contextlib.contextmanager
def _finally(action: Callable[[], None]) -> Iterator[None]:
    try:
        yield
    finally:
        action()


def _twice(path: str) -> dict[int, int]:
    return {i: n for i, n in collections.Counter(runs(path)).items() if n > 1}


def test_pending_running_and_finished_futures_survive_a_sigkilled_daemon(cluster: Cluster) -> None:
    daemon = cluster.daemon()
    cluster.worker()
    cluster.worker()
    n = 10_000
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        futures = [ex.submit(record, i, cluster.runs, 0.0005) for i in range(n)]
        # Some done, some running, many pending: the daemon dies now.
        assert wait_until(lambda: len(runs(cluster.runs)) >= n // 4, timeout=120), cluster.text()
        cluster.kill(daemon)
        done_at_kill = sum(f.done() for f in futures)
        assert done_at_kill < n, "everything finished before the kill: the test proved nothing"
        cluster.daemon()
        _finished, pending = wait(futures, timeout=240)
        assert not pending, f"{len(pending)} futures never completed; log: {cluster.text()}"
        assert [f.result() for f in futures] == [2 * i for i in range(n)]
        print(f"{done_at_kill} of {n} futures done at the kill")
    assert cluster.text().count("resumed with the daemon") == 2, cluster.text()  # both workers, no rejoin
    assert _twice(cluster.runs) == {}, "tasks ran twice though no worker died"
    assert sorted(set(runs(cluster.runs))) == list(range(n))


def test_a_worker_that_never_returns_has_its_tasks_retried_elsewhere(cluster: Cluster) -> None:
    daemon = cluster.daemon("--restart-grace", "3")
    doomed = cluster.worker(processors=1)
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        futures = [ex.submit(record, i, cluster.runs, 0.2) for i in range(6)]
        assert wait_until(lambda: len(runs(cluster.runs)) >= 1, timeout=60), cluster.text()
        cluster.kill(daemon)
        for p in psutil.Process(doomed.pid).children(recursive=True):
            p.kill()
        cluster.kill(doomed)  # it never comes back
        cluster.daemon("--restart-grace", "3")
        cluster.worker(processors=2)
        _finished, pending = wait(futures, timeout=120)
        assert not pending, cluster.text()
        assert [f.result() for f in futures] == [2 * i for i in range(6)]


def test_at_most_once_tasks_that_may_have_started_fail_clearly_across_a_restart(cluster: Cluster) -> None:
    daemon = cluster.daemon("--restart-grace", "3")
    doomed = cluster.worker(processors=1)
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        future = ex.options(max_retries=0).submit(record, 7, cluster.runs, 30)
        assert wait_until(lambda: runs(cluster.runs) == [7], timeout=60), cluster.text()
        cluster.kill(daemon)
        for p in psutil.Process(doomed.pid).children(recursive=True):
            p.kill()
        cluster.kill(doomed)
        cluster.daemon("--restart-grace", "3")
        cluster.worker(processors=1)
        with pytest.raises(WorkerLost, match="max_retries=0 lets a task run at most once"):
            future.result(timeout=120)
    assert runs(cluster.runs) == [7]


def test_a_graph_in_flight_survives_a_restart(cluster: Cluster) -> None:
    daemon = cluster.daemon()
    cluster.worker()
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        first = ex.submit(record, 1, cluster.runs, 1.0)
        second = ex.submit(add, first, 10)
        third = ex.submit(add, second, first)
        assert wait_until(lambda: runs(cluster.runs) == [1], timeout=60), cluster.text()
        cluster.kill(daemon)
        cluster.daemon()
        assert third.result(timeout=120) == (2 + 10) + 2
        assert second.result() == 12
    assert runs(cluster.runs) == [1]


def test_a_journal_of_another_version_is_refused(cluster: Cluster) -> None:
    from scaler_executor.scheduler.journal import open_journal

    writer, _ = open_journal(cluster.journal, package_version="0.0.0-elsewhere")
    writer.append([(b"n", (5).to_bytes(8, "big"))])
    writer.close()
    proc = cluster.start(
        "--address", cluster.address, "--journal", cluster.journal, module="scaler_executor.cli.daemon"
    )
    assert proc.wait(60) != 0
    text = cluster.text()
    assert cluster.journal in text and "0.0.0-elsewhere" in text, text


def test_a_journal_with_a_garbled_record_is_refused_naming_it(cluster: Cluster) -> None:
    """A record intact on disk (its checksum right) whose value makes no sense for its key
    (here a worker whose capacity is a string): the daemon exits at once naming the journal,
    the key and the fix; no traceback."""
    import msgpack

    from scaler_executor.scheduler.journal import open_journal
    from scaler_executor.scheduler.loop import journal_version

    writer, _ = open_journal(cluster.journal, package_version=journal_version())
    writer.append([(b"n", (3).to_bytes(8, "big")), (b"w" + (2).to_bytes(8, "big"), msgpack.packb(["w", "two", {}, [], 1, "h", b"t"]))])
    writer.close()
    proc = cluster.start(
        "--address", cluster.address, "--journal", cluster.journal, module="scaler_executor.cli.daemon"
    )
    assert proc.wait(60) != 0
    text = cluster.text()
    assert cluster.journal in text and repr(b"w" + (2).to_bytes(8, "big")) in text and "capacity" in text, text
    assert "move the journal directory away" in text and "Traceback" not in text, text


def test_a_journal_abandoned_while_its_daemon_is_down_is_discarded_with_its_region(cluster: Cluster) -> None:
    daemon = cluster.daemon()
    (region,) = cluster.regions
    assert os.path.exists(f"/dev/shm/{region}")
    discard = [sys.executable, "-m", "scaler_executor.cli.daemon", "--journal", cluster.journal, "--discard"]
    in_use = subprocess.run(discard, env=child_env(), capture_output=True, text=True, timeout=120)
    assert in_use.returncode == 2 and f"pid {daemon.pid}" in in_use.stderr, in_use.stderr
    cluster.kill(daemon)
    assert os.path.exists(f"/dev/shm/{region}"), "a killed journaled daemon's region is kept for its restart"
    done = subprocess.run(discard, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(f"/dev/shm/{region}") and not os.path.exists(cluster.journal), done.stdout


# --------------------------------------------------------------------------- the embedded cluster


def _embedded_daemon(ex: ScalerExecutor) -> psutil.Process:
    directory = os.path.dirname(ex._address[len("ipc://") :])
    for p in psutil.Process().children():
        try:
            if "scaler_executor.cli.daemon" in p.cmdline() and any(directory in part for part in p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("no embedded daemon")


def _local_workers(daemon: psutil.Process) -> set[int]:
    return {c.pid for c in daemon.children() if "scaler_executor.cli.worker" in c.cmdline()}


def test_the_embedded_cluster_restarts_its_sigkilled_daemon_and_futures_complete(tmp_path) -> None:
    path = str(tmp_path / "runs")
    n = 10_000
    # A grace far beyond the bounds below: workers that waited it out after a clean
    # shutdown (instead of leaving on the daemon's Goodbye) fail the last assertion.
    with ScalerExecutor(max_workers=2, journal=tmp_path / "journal", config=CLIENT.replace(restart_grace=600.0)) as ex:
        futures = [ex.submit(record, i, path, 0.0005) for i in range(n)]
        assert wait_until(lambda: len(runs(path)) >= n // 4, timeout=120)
        daemon = _embedded_daemon(ex)
        workers = _local_workers(daemon)
        assert workers
        daemon.kill()
        daemon.wait(30)
        done_at_kill = sum(f.done() for f in futures)
        assert done_at_kill < n, "everything finished before the kill: the test proved nothing"
        _finished, pending = wait(futures, timeout=240)
        assert not pending, f"{len(pending)} futures never completed"
        assert [f.result() for f in futures] == [2 * i for i in range(n)]
        restarted = _embedded_daemon(ex)
        assert restarted.pid != daemon.pid
        # Its workers outlived the daemon and were kept: none was started in their place.
        assert all(psutil.pid_exists(pid) for pid in workers)
        assert not _local_workers(restarted)
    assert _twice(path) == {}, "tasks ran twice though no worker died"
    assert sorted(set(runs(path))) == list(range(n))
    assert wait_until(lambda: not any(psutil.pid_exists(pid) for pid in workers), timeout=60), (
        "workers outlived the executor's clean shutdown (waiting for a restart that cannot come)"
    )


def test_a_clean_stop_of_a_journaled_embedded_cluster_says_nothing_of_a_restart(tmp_path, capfd) -> None:
    """Its workers' lifelines close as the cluster stops: cleanly, so no worker may say it
    waits for its daemon's restart (that is for a daemon that died)."""
    for _ in range(3):  # (the line came in most stops, not all: a race between the Goodbye and the lifeline)
        with ScalerExecutor(max_workers=1, journal=tmp_path / "journal", config=CLIENT.replace(log_level="INFO")) as ex:
            assert ex.submit(add, 1, 2).result(timeout=60) == 3
    err = capfd.readouterr().err
    assert err.count("joined the daemon at") >= 3, err  # the workers' logs are here
    assert "waiting for the daemon's restart" not in err, err


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def tiny_disk() -> Iterator[str]:
    """A 2 MiB tmpfs for the journal, unmounted (and its mount point removed) on every exit path."""
    from scaler_testing import requires_system

    where = tempfile.mkdtemp(prefix="scaler-durable-tmpfs-")
    try:
        if os.geteuid() != 0:
            requires_system("needs root to mount a tmpfs (a real full disk for the journal)")
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", where],
                             capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            requires_system(f"mount -t tmpfs is not permitted here ({run.stderr.strip()})")
        try:
            yield where
        finally:
            subprocess.run(["umount", "-l", where], check=True, timeout=30)
    finally:
        os.rmdir(where)


def test_a_full_journal_refuses_new_submissions_clearly_and_loses_nothing(cluster: Cluster, tiny_disk: str) -> None:
    from scaler_executor.exceptions import TaskError

    cluster.journal = os.path.join(tiny_disk, "journal")
    cluster.daemon()
    cluster.worker(processors=1)
    filler = os.path.join(tiny_disk, "filler")
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        assert ex.submit(add, 1, 2).result(timeout=60) == 3
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for size in (65536, 4096, 1):  # to the last byte: the disk is full now
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)
        held = []
        refused = None
        for i in range(2000):  # bounded: the daemon learns at its next write that it is full
            future = ex.submit(add, i, 1)
            try:
                error = future.exception(timeout=0.05)
            except TimeoutError:
                held.append((i, future))  # accepted before the daemon found its journal full
                continue
            if error is None:
                continue  # a write that still fitted
            refused = future
            break
        assert refused is not None, "no submission was refused on a full disk"
        with pytest.raises(TaskError, match=r"journal full: journal .* is full"):
            refused.result()
        os.unlink(filler)  # room again: what was held is written and runs, new work is accepted
        assert [f.result(timeout=60) for _, f in held] == [i + 1 for i, _ in held]
        assert ex.submit(add, 5, 5).result(timeout=60) == 10


# --------------------------------------------------------------------------- objects


def test_objects_put_by_the_client_survive_a_restart_and_go_when_released(cluster: Cluster) -> None:
    import gc

    import numpy as np
    from durable_tasks import total

    daemon = cluster.daemon()
    cluster.worker()
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        values = np.arange(1_000_000, dtype=np.int64)  # 8 MB: in the host's store
        ref = ex.put(values)
        object_ids = list(ref.object_ids)
        assert object_ids, "the value did not go to the store"
        store = ex._agent.packer.store
        region = store.name
        futures = [ex.submit(total, ref, i, cluster.runs, 0.05) for i in range(40)]
        assert wait_until(lambda: len(runs(cluster.runs)) >= 3, timeout=60), cluster.text()
        cluster.kill(daemon)
        cluster.daemon()
        expected = int(values.sum())
        assert [f.result(timeout=120) for f in futures] == [expected + i for i in range(40)]
        assert ex._agent.packer.store.name == region  # the restarted daemon kept the region
        assert ex.submit(total, ref, 100, cluster.runs).result(timeout=60) == expected + 100
        del ref, futures
        gc.collect()
        assert wait_until(lambda: not set(object_ids) & set(store.list_ids()), timeout=60), "released objects stayed"
    assert _twice(cluster.runs) == {}


def test_releases_and_cancels_made_while_the_daemon_is_down_reach_its_restart(cluster: Cluster) -> None:
    """A client's releases (an object, a callable) and a cancel made while its daemon is
    down go nowhere; its report to the restarted daemon says them (scheduler/reconcile.py):
    the object and the callable are freed, the task is cancelled and never runs."""
    import gc

    import numpy as np

    daemon = cluster.daemon()
    cluster.worker(processors=1)  # no "gpu": the gpu tasks wait at the daemon
    gpu = {"gpu": 1.0}
    gpu_worker: list[subprocess.Popen[bytes]] = []

    def start_gpu_worker() -> None:
        if not gpu_worker:
            gpu_worker.append(cluster.start(
                cluster.address, "--processors", "1", "--resources", "gpu=1", module="scaler_executor.cli.worker"
            ))

    with ScalerExecutor(address=cluster.address, config=CLIENT.replace(cancel_wait=0.5)) as ex, _finally(start_gpu_worker):
        # (On any way out the gpu tasks get a worker: the executor's shutdown waits for them.)
        kept = ex.put(np.arange(1_000_000, dtype=np.int64))
        dropped = ex.put(np.arange(1_000_000, dtype=np.int64) + 1)
        kept_ids, dropped_ids = set(kept.object_ids), set(dropped.object_ids)
        assert kept_ids and dropped_ids, "the values did not go to the store"
        store = ex._agent.packer.store
        mapped = ex.map(add, [1, 2], [10, 20])  # its callable is registered while it lives
        assert next(mapped) == 11
        victim = ex.options(resources=gpu).submit(record, 99, cluster.runs)
        control = ex.options(resources=gpu).submit(record, 100, cluster.runs)
        before = ex.statistics().counters
        assert before["tasks"] == 2 and before["objects"] == len(kept_ids | dropped_ids), before
        cluster.kill(daemon)
        # While it is down: a cancel (no answer can come: False, as the contract allows),
        # an object released, a map's callable released.
        assert victim.cancel() is False
        del dropped, mapped
        gc.collect()
        cluster.daemon()
        assert wait_until(victim.cancelled, timeout=60), f"the cancel never reached the restarted daemon: {cluster.text()}"
        after = ex.statistics().counters
        assert after["tasks"] == 1, after  # the control task, still waiting for a gpu worker
        assert after["functions"] == before["functions"] - 1, (before, after)
        assert after["objects"] == len(kept_ids), after
        assert wait_until(lambda: not dropped_ids & set(store.list_ids()), timeout=60), f"the released object stayed: {cluster.text()}"
        assert kept_ids <= set(store.list_ids())
        start_gpu_worker()
        assert control.result(timeout=120) == 200
        assert int(np.asarray(ex.submit(np.sum, kept).result(timeout=60))) == int(np.arange(1_000_000).sum())
    assert runs(cluster.runs) == [100], "the task cancelled while the daemon was down ran"


def test_statistics_and_a_report_asked_while_the_daemon_is_down_are_answered_after_its_restart(
    cluster: Cluster, tmp_path
) -> None:
    """Requests sent between the daemon's death and the client's Resume reach nobody; the
    resumed client asks the restarted daemon again.  Each answer goes to the oldest waiter,
    so a lost request would leave every later caller one answer short: the requests that
    timed out during the outage are answered after the restart, and so are new ones."""
    daemon = cluster.daemon()
    cluster.worker(processors=1)
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        assert ex.submit(add, 1, 2).result(timeout=60) == 3
        cluster.kill(daemon)
        with pytest.raises(TimeoutError):
            ex.statistics(timeout=1.0)
        with pytest.raises(TimeoutError):
            ex.report(tmp_path / "lost.html", timeout=1.0)
        cluster.daemon()
        assert ex.submit(add, 2, 3).result(timeout=120) == 5
        assert ex.statistics(timeout=60).counters["finished"] >= 1
        assert os.path.getsize(ex.report(tmp_path / "report.html", timeout=60)) > 0


def test_a_tcp_daemon_resumes_its_peers_on_new_connections(cluster: Cluster) -> None:
    """Over ZeroMQ each reconnection has a new routing id: the Resume's token, not the
    connection, tells the restarted daemon who is back."""
    cluster.use_tcp()
    daemon = cluster.daemon()
    cluster.worker()
    n = 2000
    with ScalerExecutor(address=cluster.address, config=CLIENT.replace(insecure=True)) as ex:
        futures = [ex.submit(record, i, cluster.runs, 0.002) for i in range(n)]
        assert wait_until(lambda: len(runs(cluster.runs)) >= n // 4, timeout=120), cluster.text()
        cluster.kill(daemon)
        assert sum(f.done() for f in futures) < n
        cluster.daemon()
        _done, pending = wait(futures, timeout=240)
        assert not pending, cluster.text()
        assert [f.result() for f in futures] == [2 * i for i in range(n)]
    assert "resumed with the daemon" in cluster.text()
    assert _twice(cluster.runs) == {}


def test_a_dask_style_graph_computed_with_get_survives_a_restart(cluster: Cluster) -> None:
    import threading

    daemon = cluster.daemon()
    cluster.worker()
    # A chain of slow steps (each records its run), then a sum over all of them: the
    # intermediates have no future of their own; the daemon keeps their results for dependents.
    dsk: dict[str, object] = {"x0": (record, 0, cluster.runs, 0.3)}
    for i in range(1, 8):
        dsk[f"x{i}"] = (add, f"x{i - 1}", (record, i, cluster.runs, 0.3))
    dsk["total"] = (sum, [f"x{i}" for i in range(8)])
    out: dict[str, object] = {}
    with ScalerExecutor(address=cluster.address, config=CLIENT) as ex:
        thread = threading.Thread(target=lambda: out.update(value=ex.get(dsk, "total")), daemon=True)
        thread.start()
        assert wait_until(lambda: len(runs(cluster.runs)) >= 3, timeout=60), cluster.text()
        cluster.kill(daemon)
        cluster.daemon()
        thread.join(120)
        assert not thread.is_alive(), cluster.text()
    chain = [0]
    for i in range(1, 8):
        chain.append(chain[-1] + 2 * i)
    assert out["value"] == sum(chain)
    assert _twice(cluster.runs) == {}
