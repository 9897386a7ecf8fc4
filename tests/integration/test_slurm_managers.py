"""``scaler-worker-manager --adapter slurm`` on a real single-node Slurm, through the daemon.

test_slurm.py drives ``SlurmAdapter`` directly; here every worker comes from the daemon's own
scaling: a ``scaler-daemon --security DIR --workers 0`` on loopback tcp://, one or two real
``scaler-worker-manager ADDRESS --adapter slurm`` processes (each with its ``manager`` key, its
job logs under the test's temporary directory, the jobs running this Python), and a client.
The session's Slurm is the ``slurm`` fixture (tests/integration/conftest.py): skipped where it
cannot be started, a failure under ``CI=true``.

Every process is stopped, every job of the test's managers cancelled (``scancel``, waited for
until it left ``squeue``) and every file removed on every exit path. Waits are bounded
(``wait_until``, ``result(timeout=...)``); nothing asserts how long anything took.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from scaler_testing import child_env, listening_or_exited, wait_until
from slurm_testing import cancel_jobs_of, free_port, manager_jobs

from scaler_executor import ClusterConfig, ScalerExecutor, task_info
from scaler_executor.security.keys import SecurityDir

FLAGS = ("--heartbeat-interval", "0.2", "--heartbeat-liveness", "25", "--log-level", "INFO")
CLIENT = ClusterConfig(heartbeat_interval=0.2, heartbeat_liveness=25, daemon_loss_timeout=30.0)
WAIT = 60.0  # bound on one wait on a loaded machine (sbatch -> RUNNING is ~1 s on an idle one)
# Each manager's Slurm options: its jobs' logs in the test's directory, one squeue per 0.3 s,
# a start-up estimate near this Slurm's. The jobs run this Python (the job script's default:
# the manager's interpreter; sbatch passes the manager's environment, PYTHONPATH included).
SLURM = ("--slurm-poll-interval", "0.3", "--slurm-startup-seconds", "2")


def where(seconds: float) -> tuple[str, str]:
    """(Slurm job name, job id) of the job whose worker ran this task."""
    time.sleep(seconds)
    return os.environ.get("SLURM_JOB_NAME", ""), os.environ.get("SLURM_JOB_ID", "")


def held(directory: str) -> str:
    """Note each run (one file per run: a rerun shows as a second file), wait for the test's
    go, and return the job id that ran it."""
    job = os.environ.get("SLURM_JOB_ID", "")
    Path(directory, f"run-{job}-{os.getpid()}-{time.time_ns()}").touch()
    while not os.path.exists(os.path.join(directory, "go")):
        time.sleep(0.05)
    return job


def manager_of(job_name: str) -> str:
    """The manager's name in a job name ``<cluster>.<manager>.<boot>-<n>`` (no "." in the
    test's manager names)."""
    return job_name.split(".")[1]


def stat(ex: ScalerExecutor, key: str) -> int:
    return int(ex.statistics().get(key, 0))


class Cluster:
    """A secure daemon with no workers, its managers (Slurm adapter) and a client key."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keys = SecurityDir.init(str(tmp / "keys"))
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.logs_dir = tmp / "slurm-logs"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.managers: list[
            str
        ] = []  # names: their jobs are cancelled at the end whatever happened

    def _start(self, module: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"log-{len(self.procs)}.txt"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args, *FLAGS],
                env=child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def daemon(self, *managers: str, idle: float = 1.0) -> subprocess.Popen[bytes]:
        """Keys first: a running daemon re-reads its allow-list only every second."""
        self.keys.issue("alice", "client", str(self.tmp / "alice.cred"))
        for name in managers:
            self.keys.issue(name, "manager", str(self.tmp / f"{name}.cred"))
            self.managers.append(name)
        proc = self._start(
            "scaler_executor.cli.daemon", "--address", self.address, "--security", self.keys.path,
            "--workers", "0", "--scale-down-idle", str(idle),
        )  # fmt: skip
        assert wait_until(listening_or_exited(proc, int(self.address.rsplit(":", 1)[1])), timeout=WAIT)
        assert proc.poll() is None, self.log(proc)
        return proc

    def manager(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self._start(
            "scaler_executor.cli.manager", self.address, "--adapter", "slurm",
            "--credentials", str(self.tmp / f"{name}.cred"), "--name", name,
            "--slurm-log-dir", str(self.logs_dir), *SLURM, *args,
        )  # fmt: skip

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def job_logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.logs_dir.glob("*.log"))
        )

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(
            address=self.address, credentials=str(self.tmp / "alice.cred"), config=CLIENT
        )

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM (a manager then scancels its jobs and waits, up to 30 s, for them to
        leave the queue); killed with its children if it does not end in time."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
                proc.wait()

    def close(self) -> None:
        try:
            for proc in reversed(
                self.procs
            ):  # managers first (they cancel their jobs), then the daemon
                self.stop(proc)
        finally:
            # Whatever the managers did (killed, failed to start): no job of theirs is left.
            cancel_jobs_of(self.managers)


@pytest.fixture
def cluster(slurm: int) -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="scaler-slurm-mgr-test-") as tmp:
        c = Cluster(Path(tmp))
        try:
            yield c
        finally:
            c.close()  # before the directory goes: the jobs write their logs into it


# =========================================================================== cases


@pytest.mark.timeout(120)
def test_a_burst_scales_up_through_sbatch_and_idle_jobs_leave_the_queue(cluster: Cluster) -> None:
    name = f"s{os.getpid()}b"
    cluster.daemon(name)
    manager = cluster.manager(name, "--max-workers", "3", "--processors", "1")
    with cluster.client() as ex:
        assert wait_until(lambda: stat(ex, "managers") == 1, timeout=WAIT), cluster.log(manager)
        assert stat(ex, "workers") == 0 and not manager_jobs([name]), "no demand, no job"
        futures = [ex.submit(where, 0.5) for _ in range(18)]
        ran = [f.result(timeout=WAIT) for f in futures]
        jobs = {job for _, job in ran}
        # Every task ran in a Slurm job of this manager, the burst on more than one of them
        # and never on more than --max-workers.
        assert all(job and manager_of(job_name) == name for job_name, job in ran), ran
        assert 1 < len(jobs) <= 3, (jobs, cluster.job_logs())
        assert all(task_info(f).worker.startswith(name + "-") for f in futures)  # type: ignore[union-attr]
        # Idle workers scale down: drained, scancelled, out of squeue.
        assert wait_until(lambda: stat(ex, "workers") == 0, timeout=WAIT), (
            "idle workers were not stopped"
        )
        assert wait_until(lambda: not manager_jobs([name]), timeout=WAIT, interval=0.3), (
            manager_jobs([name])
        )
        assert stat(ex, "failed") == 0
    assert "scaling down" in cluster.log(cluster.procs[0])
    assert manager.poll() is None, cluster.log(manager)  # the manager keeps offering capacity


@pytest.mark.timeout(150)
def test_a_manager_killed_and_restarted_adopts_its_running_jobs(cluster: Cluster) -> None:
    name = f"s{os.getpid()}k"
    runs = cluster.tmp / "runs"
    runs.mkdir()
    daemon = cluster.daemon(name, idle=120.0)  # no scale-down while the test looks on
    manager = cluster.manager(name, "--max-workers", "2", "--processors", "1")
    try:
        with cluster.client() as ex:
            assert wait_until(lambda: stat(ex, "managers") == 1, timeout=WAIT), cluster.log(manager)
            # A burst brings up the manager's two jobs.
            assert all(
                manager_of(n) == name
                for n, _ in [
                    f.result(timeout=WAIT) for f in [ex.submit(where, 0.5) for _ in range(8)]
                ]
            )
            assert wait_until(
                lambda: stat(ex, "workers") == 2 and len(manager_jobs([name])) == 2, timeout=WAIT
            ), (manager_jobs([name]), cluster.log(manager))
            jobs = set(manager_jobs([name]))
            busy = ex.submit(held, str(runs))  # a worker busy when the manager dies
            assert wait_until(lambda: len(list(runs.glob("run-*"))) == 1, timeout=WAIT)

            manager.send_signal(signal.SIGKILL)
            manager.wait(WAIT)
            assert wait_until(
                lambda: f"manager {name!r} lost" in cluster.log(daemon), timeout=WAIT
            ), cluster.log(daemon)
            # Its jobs are not cancelled, and their workers keep serving without it: the task
            # that was running finishes (once: no rerun, no retry), and new tasks run there.
            assert {i for i, (_, s) in manager_jobs([name]).items() if s == "RUNNING"} == jobs
            (runs / "go").touch()
            assert busy.result(timeout=WAIT) in jobs
            assert len(list(runs.glob("run-*"))) == 1 and task_info(busy).attempts == 1  # type: ignore[union-attr]
            meanwhile = [f.result(timeout=WAIT) for f in [ex.submit(where, 0.1) for _ in range(6)]]
            assert {job for _, job in meanwhile} <= jobs

            # Restarted with the same name and key (so the same cluster id in its job names):
            # it adopts both jobs, and submits none.
            again = cluster.manager(name, "--max-workers", "2", "--processors", "1")
            assert wait_until(lambda: cluster.log(again).count("adopted job") == 2, timeout=WAIT), (
                cluster.log(again)
            )
            assert wait_until(
                lambda: cluster.log(daemon).count(f"manager {name!r} offers") == 2, timeout=WAIT
            )
            assert stat(ex, "managers") == 1
            after = [f.result(timeout=WAIT) for f in [ex.submit(where, 0.1) for _ in range(6)]]
            assert {job for _, job in after} <= jobs
            assert stat(ex, "workers") == 2 and stat(ex, "failed") == 0
            assert set(manager_jobs([name])) == jobs, "a job was cancelled or a duplicate submitted"
            assert not re.search(r"starting \d+ worker", cluster.log(again)), cluster.log(again)
        # A manager that stops cancels every job it knows, the adopted ones too.
        cluster.stop(again)
        assert not manager_jobs([name])
    finally:
        (runs / "go").touch()  # whatever happened, the held task waits no longer


@pytest.mark.timeout(120)
def test_two_managers_with_different_resources_serve_the_tasks_that_need_them(
    cluster: Cluster,
) -> None:
    cpu, gpu = f"s{os.getpid()}cpu", f"s{os.getpid()}gpu"
    cluster.daemon(cpu, gpu)
    # Room for the 6 plain tasks in the plain manager's two workers (3 processors on a
    # one-CPU job each), so the policy leaves the GPU manager idle for them. The node has
    # 4 CPUs; all three jobs fit at once.
    cluster.manager(cpu, "--max-workers", "2", "--processors", "3", "--slurm-cpus", "1")
    cluster.manager(
        gpu, "--max-workers", "1", "--processors", "1", "--resources", "gpu=1", "--tags", "cuda"
    )
    with cluster.client() as ex:
        assert wait_until(lambda: stat(ex, "managers") == 2, timeout=WAIT)
        plain = [f.result(timeout=WAIT) for f in [ex.submit(where, 0.1) for _ in range(6)]]
        assert all(manager_of(n) == cpu for n, _ in plain), f"plain work ran on GPU jobs: {plain}"
        assert all(manager_of(n) == cpu for n, _ in manager_jobs([cpu, gpu]).values()), (
            "plain work started a GPU job"
        )
        # Work that needs a GPU, or the cuda tag, runs only in the GPU manager's job (once it
        # exists, the allocation policy may give it plain tasks too).
        needs = [ex.options(resources={"gpu": 1}).submit(where, 0.1) for _ in range(4)]
        needs += [ex.options(tags={"cuda"}).submit(where, 0.1) for _ in range(2)]
        ran = [f.result(timeout=WAIT) for f in needs]
        assert all(manager_of(n) == gpu and job for n, job in ran), ran
        assert all(task_info(f).worker.startswith(gpu + "-") for f in needs)  # type: ignore[union-attr]
        assert stat(ex, "failed") == 0
