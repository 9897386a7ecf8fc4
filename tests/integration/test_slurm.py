"""The Slurm capacity adapter on a real single-node Slurm (``.ci/slurm``).

The session's Slurm is started by the ``slurm`` fixture (tests/integration/conftest.py,
shared with test_slurm_managers.py) with ``.ci/slurm start`` (and stopped on every exit
path), unless one is already up, which is then used and left running. Where
Slurm cannot be started the tests skip with the reason, and fail under ``CI=true``
(``requires_system``). Each case drives ``SlurmAdapter`` through its contract, against a real
``scaler-daemon --security DIR --workers 0`` whose workers are the Slurm jobs, and a real
client. Waits are bounded; nothing asserts how long anything took.
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

import pytest
from scaler_testing import child_env, wait_until
from slurm_testing import free_port

from scaler_executor import ClusterConfig, ScalerExecutor
from scaler_executor.manager.adapter import (
    AdapterError,
    AdapterSetup,
    WorkerLaunch,
    WorkerReport,
    WorkerState,
    WorkerTemplate,
    cluster_id,
)
from scaler_executor.manager.slurm import SlurmAdapter, SlurmOptions
from scaler_executor.security.keys import SecurityDir, load_credential

pytestmark = pytest.mark.timeout(150)

FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "50", "--log-level", "INFO")
CLIENT = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=30.0)
WAIT = 60.0  # bound on one wait on a loaded machine (jobs start ~1 s apart on an idle one)
POLL = 0.3  # the adapter's squeue interval in these tests
# The cluster id in the job names (scaler-worker-manager derives it from the daemon's address
# and key); another cluster sharing this Slurm has another.
CLUSTER = cluster_id(f"test-slurm-{os.getpid()}")
OTHER_CLUSTER = cluster_id(f"test-slurm-{os.getpid()}-other")


def job_of_worker(x: int) -> tuple[int, str]:
    return x * x, os.environ.get("SLURM_JOB_ID", "")


def hold_then_report(marker: str) -> str:
    """Note which job runs it, wait for the test's go, and say which job finished it."""
    with open(marker, "a") as f:
        f.write(os.environ.get("SLURM_JOB_ID", "") + "\n")
    while not os.path.exists(marker + ".go"):
        time.sleep(0.05)
    return os.environ.get("SLURM_JOB_ID", "")


class Daemon:
    """A secure tcp daemon with no workers of its own, its key directory and a client key."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keys = SecurityDir.init(str(tmp / "keys"))
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.client_key = str(tmp / "client.cred")
        self.keys.issue("client", "client", self.client_key)
        self.log = tmp / "daemon.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address,
                 "--security", self.keys.path, "--workers", "0", *FLAGS],
                env=child_env(), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        port = int(self.address.rsplit(":", 1)[1])

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return self.proc.poll() is not None

        assert wait_until(listening, timeout=WAIT)
        assert self.proc.poll() is None, self.log.read_text()

    def launches(self, names: list[str]) -> list[WorkerLaunch]:
        """Worker keys in the allow-list, as a manager would make them; returns once the
        daemon has re-read the list with them in it (it says so in its log)."""
        made = []
        for name in names:
            path = str(self.tmp / f"{name}.cred")
            self.keys.issue(name, "worker", path)
            made.append(WorkerLaunch(name, self.address, load_credential(path)))
        allowed = f"({sum(not e.revoked for e in self.keys.entries())} keys allowed)"
        assert wait_until(lambda: allowed in self.log.read_text(), timeout=WAIT), (
            self.log.read_text()[-2000:]
        )
        return made

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, credentials=self.client_key, config=CLIENT)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def daemon(slurm: int) -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="scaler-slurm-test-") as tmp:
        d = Daemon(Path(tmp))
        try:
            yield d
        finally:
            d.close()


class Adapters:
    """Every adapter a test makes, shut down at its end (no job left in the queue)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.made: list[SlurmAdapter] = []
        self.seen: dict[int, list[WorkerReport]] = {}

    def make(
        self, prefix: str, max_workers: int = 4, cluster: str = CLUSTER, **options: object
    ) -> SlurmAdapter:
        setup = AdapterSetup(
            f"{prefix}-{os.getpid()}-", max_workers, WorkerTemplate(processors=1), cluster
        )
        adapter = SlurmAdapter(
            setup,
            SlurmOptions(
                log_dir=str(self.log_dir), poll_interval=POLL, environment=child_env(), **options
            ),  # type: ignore[arg-type]
        )
        self.made.append(adapter)
        self.seen[id(adapter)] = []
        return adapter

    def poll(self, adapter: SlurmAdapter) -> list[WorkerReport]:
        reports = adapter.poll()
        self.seen[id(adapter)] += reports
        return reports

    def wait_for(self, adapter: SlurmAdapter, name: str, state: WorkerState) -> WorkerReport:
        found: list[WorkerReport] = []

        def reached() -> bool:
            self.poll(adapter)
            found[:] = [r for r in self.seen[id(adapter)] if r.name == name and r.state is state]
            return bool(found)

        assert wait_until(reached, timeout=WAIT, interval=0.1), (
            name,
            state,
            self.seen[id(adapter)],
            self.logs(),
        )
        return found[-1]

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )

    def shutdown(self) -> None:
        for adapter in self.made:
            adapter.shutdown()


@pytest.fixture
def adapters(slurm: int, tmp_path: Path) -> Iterator[Adapters]:
    made = Adapters(tmp_path / "slurm-logs")
    try:
        yield made
    finally:
        made.shutdown()


def queued(adapter: SlurmAdapter) -> dict[str, str]:
    """job id -> state of the jobs squeue lists that are ``adapter``'s by their name."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True
    ).stdout
    return {
        i: s
        for i, n, s in (line.split() for line in out.splitlines())
        if adapter.owner_of(n) is not None
    }


# =========================================================================== cases


def test_sbatch_workers_join_a_secure_daemon_and_run_tasks(
    daemon: Daemon, adapters: Adapters
) -> None:
    adapter = adapters.make("join")
    names = [f"{adapter.setup.prefix}{i}" for i in range(2)]
    t0 = time.monotonic()
    adapter.request(daemon.launches(names))
    with daemon.client() as ex:
        results = [ex.submit(job_of_worker, i) for i in range(20)]
        values = [f.result(timeout=WAIT) for f in results]
        joined = time.monotonic() - t0
    assert [v for v, _ in values] == [i * i for i in range(20)]
    jobs = {adapters.wait_for(adapter, n, WorkerState.RUNNING).job for n in names}
    assert {job for _, job in values} <= jobs and all(jobs)
    # The job scripts are the workers: no key file is left beside the logs.
    assert not list(adapters.log_dir.glob(".*.key"))
    print(f"\nsbatch -> first tasks done on Slurm workers: {joined:.1f} s")

    # Scale-down: the adapter scancels the (idle) worker it is told to; its job leaves squeue.
    adapter.stop([names[0]])
    gone = adapters.wait_for(adapter, names[0], WorkerState.GONE)
    assert "scancel" in gone.reason and not gone.infrastructure
    assert gone.job not in queued(adapter)
    adapter.shutdown()
    assert queued(adapter) == {}


def test_a_job_scancelled_mid_task_has_its_task_retried_elsewhere(
    daemon: Daemon, adapters: Adapters, tmp_path: Path
) -> None:
    adapter = adapters.make("cancel")
    names = [f"{adapter.setup.prefix}{i}" for i in range(2)]
    adapter.request(daemon.launches(names))
    jobs = [adapters.wait_for(adapter, n, WorkerState.RUNNING).job for n in names]
    marker = str(tmp_path / "ran")
    with daemon.client() as ex:
        # Both workers joined before the task goes out, so a retry has somewhere to go.
        assert {
            j
            for _, j in (
                f.result(timeout=WAIT) for f in [ex.submit(job_of_worker, i) for i in range(8)]
            )
        } == set(jobs)
        future = ex.submit(hold_then_report, marker)
        assert wait_until(lambda: os.path.exists(marker), timeout=WAIT)
        first = Path(marker).read_text().split()[0]
        subprocess.run(["scancel", first], check=True)  # an operator, not the manager
        gone = adapters.wait_for(adapter, names[jobs.index(first)], WorkerState.GONE)
        Path(marker + ".go").touch()
        finished_on = future.result(timeout=WAIT)
    assert finished_on != first and finished_on in jobs
    assert "CANCELLED" in gone.reason and gone.infrastructure, gone


def test_more_demand_than_the_node_pends_with_its_reason_and_is_not_over_submitted(
    slurm: int, daemon: Daemon, adapters: Adapters
) -> None:
    adapter = adapters.make("pend", max_workers=3, cpus=slurm)  # one job fills the node
    names = [f"{adapter.setup.prefix}{i}" for i in range(3)]
    adapter.request(daemon.launches(names))

    def two_pending_with_reason() -> bool:
        adapters.poll(adapter)
        last = {r.name: r for r in adapters.seen[id(adapter)]}
        pending = [r for r in last.values() if r.state is WorkerState.PENDING and r.reason]
        return len(pending) == 2 and sum(r.state is WorkerState.RUNNING for r in last.values()) == 1

    assert wait_until(two_pending_with_reason, timeout=WAIT, interval=0.1), adapters.seen[
        id(adapter)
    ]
    reasons = {
        r.reason for r in adapters.seen[id(adapter)] if r.state is WorkerState.PENDING and r.reason
    }
    assert reasons <= {"Resources", "Priority"}, reasons
    with pytest.raises(AdapterError, match="max_workers is 3"):
        adapter.request(daemon.launches([f"{adapter.setup.prefix}3"]))
    assert len(queued(adapter)) == 3


def test_a_bad_partition_is_a_clear_refusal(daemon: Daemon, adapters: Adapters) -> None:
    adapter = adapters.make("badpart", partition="no-such-partition")
    name = f"{adapter.setup.prefix}0"
    adapter.request(daemon.launches([name]))
    gone = adapters.wait_for(adapter, name, WorkerState.GONE)
    assert "sbatch refused the job" in gone.reason and "partition" in gone.reason.lower()
    assert "--slurm-partition" in gone.reason and "sinfo" in gone.reason
    assert "\n" not in gone.reason
    assert not list(adapters.log_dir.glob(".*.key"))  # its key did not outlive the refusal


def test_a_restarted_manager_adopts_its_jobs_and_no_one_elses(
    daemon: Daemon, adapters: Adapters
) -> None:
    first = adapters.make("adopt")
    # Another cluster's manager of the same name on this Slurm (its worker's own suffix
    # differs only because both join this one daemon here), and a manager whose name
    # starts with this one's prefix (adopt-PID-gpu-PID-...): neither's job is adopted or
    # cancelled.
    other = adapters.make("adopt", cluster=OTHER_CLUSTER)
    longer = adapters.make(f"adopt-{os.getpid()}-gpu")
    assert longer.setup.prefix.startswith(first.setup.prefix)
    names = [f"{first.setup.prefix}{i}" for i in range(2)]
    first.request(daemon.launches(names))
    other.request(daemon.launches([f"{other.setup.prefix}9"]))
    longer.request(daemon.launches([f"{longer.setup.prefix}0"]))
    jobs = {adapters.wait_for(first, n, WorkerState.RUNNING).job for n in names}
    # Queued is enough to be listed by squeue (pending first, then maybe running, as room allows).
    adapters.wait_for(other, f"{other.setup.prefix}9", WorkerState.PENDING)
    adapters.wait_for(longer, f"{longer.setup.prefix}0", WorkerState.PENDING)
    adapters.made.remove(first)  # the manager died: nothing of it runs shutdown

    again = adapters.make("adopt")
    adopted = again.adopt()
    assert {r.job for r in adopted} == jobs and {r.name for r in adopted} == set(names)
    assert all(r.state is WorkerState.RUNNING for r in adopted)
    with daemon.client() as ex:  # the adopted workers still serve
        assert [
            f.result(timeout=WAIT)[0] for f in [ex.submit(job_of_worker, i) for i in range(4)]
        ] == [0, 1, 4, 9]
    again.shutdown()
    assert queued(again) == {}
    # another cluster's job, and another manager's, on the same Slurm: untouched
    assert len(queued(other)) == 1 and len(queued(longer)) == 1


def test_a_worker_that_dies_at_start_is_reported_with_state_exit_code_and_log_tail(
    daemon: Daemon, adapters: Adapters, tmp_path: Path
) -> None:
    (tmp_path / "not-an-env").mkdir()  # neither a virtualenv nor (there is no conda) a conda prefix
    adapter = adapters.make("dies", python_env=str(tmp_path / "not-an-env"))
    name = f"{adapter.setup.prefix}0"
    adapter.request(daemon.launches([name]))
    gone = adapters.wait_for(adapter, name, WorkerState.GONE)
    assert "FAILED" in gone.reason and "exit code" in gone.reason and not gone.infrastructure, gone
    assert "no conda to activate" in gone.log_tail and "not-an-env" in gone.log_tail, gone.log_tail


def test_a_job_near_its_time_limit_drains_and_loses_no_task(
    daemon: Daemon, adapters: Adapters, tmp_path: Path
) -> None:
    # Slurm's shortest limit is a minute; SIGTERM 50 s before it reaches the worker ~10 s in
    # (or sooner: Slurm may signal up to a minute early).
    short = adapters.make("walltime", time_limit="1", drain_seconds=50)
    steady = adapters.make("steady")
    name = f"{short.setup.prefix}0"
    short.request(daemon.launches([name]))
    # A one-minute job is always within drain + Slurm's signal resolution + start-up of its
    # end: once it runs it is reported draining (its worker still serves), with its end time,
    # so that the daemon asks for its replacement at once.
    running = adapters.wait_for(short, name, WorkerState.DRAINING)
    assert running.ends_at > time.time() and running.job, running
    assert "its time limit ends in" in running.reason, running
    marker = str(tmp_path / "ran")
    with daemon.client() as ex:
        future = ex.submit(hold_then_report, marker)
        steady.request(daemon.launches([f"{steady.setup.prefix}0"]))
        replacement = adapters.wait_for(steady, f"{steady.setup.prefix}0", WorkerState.RUNNING).job
        gone = adapters.wait_for(short, name, WorkerState.GONE)
        Path(marker + ".go").touch()
        assert future.result(timeout=WAIT) == replacement
    assert "COMPLETED" in gone.reason and "drained ahead of its time limit" in gone.reason, gone
    assert gone.infrastructure
