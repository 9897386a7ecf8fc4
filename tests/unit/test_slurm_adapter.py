"""The Slurm adapter's own logic, through its runner seam (a scripted Slurm): the job
script, one throttled squeue for all jobs, pending reasons, final states, the options.

The adapter on a real Slurm is tests/integration/test_slurm.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from scaler_testing import wait_until

from scaler_executor.manager import slurm
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
from scaler_executor.security.keys import Credential

SEP = "\x1f"
CLUSTER = cluster_id("tcp://d:1", "DPUB")


class FakeSlurm:
    """Answers sbatch/squeue/scontrol/scancel as a one-node Slurm would, and records calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[str]] = []
        self.scripts: list[str] = []
        self.queue: dict[str, tuple[str, str, str]] = {}  # id -> name, state, reason
        self.final: dict[str, str] = {}  # id -> scontrol text
        self.refuse = ""
        self.next_id = 100
        self.ends: dict[str, str] = {}  # id -> squeue's %e (end time), "N/A" if absent

    def __call__(
        self, argv: Sequence[str], stdin: str | None, timeout: float, env: dict[str, str] | None
    ) -> tuple[int, str, str]:
        with self.lock:
            self.calls.append(list(argv))
            if argv[0] == "sbatch":
                if self.refuse:
                    return 1, "", self.refuse
                assert stdin is not None
                self.scripts.append(stdin)
                job_id = str(self.next_id)
                self.next_id += 1
                name = next(
                    line.split("=", 1)[1]
                    for line in stdin.splitlines()
                    if line.startswith("#SBATCH --job-name=")
                )
                self.queue[job_id] = (name, "PENDING", "None")
                return 0, job_id + "\n", ""
            if argv[0] == "squeue":
                only = set(argv[argv.index("-j") + 1].split(",")) if "-j" in argv else None
                lines = [
                    SEP.join([i, n, s, r, "node1" if s == "RUNNING" else "", self.ends.get(i, "N/A")])
                    for i, (n, s, r) in self.queue.items()
                    if only is None or i in only
                ]
                return 0, "\n".join(lines) + "\n", ""
            if argv[0] == "scontrol":
                return 0, self.final.get(argv[-1], ""), ""
            if argv[0] == "scancel":
                for job_id in argv[1:]:
                    if self.queue.pop(job_id, None) is not None:
                        self.final[job_id] = (
                            f"JobId={job_id} JobState=CANCELLED Reason=None ExitCode=0:15"
                        )
                return 0, "", ""
            raise AssertionError(argv)

    def count(self, command: str) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c[0] == command)


def adapter_with(
    tmp_path: Path, fake: FakeSlurm, max_workers: int = 8, **options: object
) -> SlurmAdapter:
    setup = AdapterSetup(
        "c1-m1-",
        max_workers,
        WorkerTemplate(processors=2, resources={"gpu": 1}, tags=frozenset({"big"})),
        CLUSTER,
    )
    return SlurmAdapter(
        setup,
        SlurmOptions(log_dir=str(tmp_path), **{"poll_interval": 1000.0, **options}),
        runner=fake,
    )  # type: ignore[arg-type]


def launch(name: str, secure: bool = False) -> WorkerLaunch:
    credential = Credential(name, "worker", "PUB", "SEC", "DPUB") if secure else None
    return WorkerLaunch(name, "tcp://d:1", credential)


def poll_until(adapter: SlurmAdapter, predicate: object, seen: list[WorkerReport]) -> None:
    def done() -> bool:
        seen.extend(adapter.poll())
        return bool(predicate(seen))  # type: ignore[operator]

    assert wait_until(done, timeout=10), seen


def test_the_job_script_runs_the_worker_in_the_foreground_with_every_option(tmp_path: Path) -> None:
    options = SlurmOptions(
        log_dir=str(tmp_path), partition="gpu", account="proj7", qos="high", time_limit="2:00:00",
        memory="4G", gres="gpu:1", directives=("--constraint=skylake",),
    )  # fmt: skip
    setup = AdapterSetup(
        "c1-m1-",
        4,
        WorkerTemplate(processors=2, resources={"gpu": 1}, tags=frozenset({"big"})),
        CLUSTER,
    )
    script = slurm.job_script(setup, options, launch("c1-m1-0", secure=True))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in (f"--job-name={CLUSTER}.c1-m1.0", "--partition=gpu", "--account=proj7", "--qos=high", "--time=2:00:00",
                     "--mem=4G", "--gres=gpu:1", "--cpus-per-task=2", "--constraint=skylake"):  # fmt: skip
        assert f"#SBATCH {expected}" in lines, expected
    key = str(tmp_path / ".c1-m1-0.key")
    assert lines[-3:-1] == [f"exec < {key}", f"rm -f {key}"]  # the key becomes stdin, the file goes
    last = lines[-1]
    assert (
        last.startswith("exec ") and "scaler_executor.cli.worker tcp://d:1 --name c1-m1-0" in last
    )
    assert "--credentials-stdin" in last and "SEC" not in script  # the key is never in the script


def test_a_python_env_is_activated_in_the_job(tmp_path: Path) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").touch()
    setup = AdapterSetup("p-", 1, WorkerTemplate(processors=1), CLUSTER)
    script = slurm.job_script(
        setup, SlurmOptions(log_dir=str(tmp_path), python_env=str(tmp_path / "venv")), launch("p-0")
    )
    assert f"source {tmp_path / 'venv'}/bin/activate" in script
    assert script.splitlines()[-1].startswith("exec python -m scaler_executor.cli.worker")


def test_one_squeue_per_interval_serves_every_job(tmp_path: Path) -> None:
    fake = FakeSlurm()
    adapter = adapter_with(tmp_path, fake)
    try:
        adapter.request([launch(f"c1-m1-{i}") for i in range(8)])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: sum(r.state is WorkerState.PENDING for r in s) == 8, seen)
        before = fake.count("squeue")
        for _ in range(200):  # many polls inside one interval: no further squeue
            adapter.poll()
        assert fake.count("squeue") == before
        assert fake.count("scontrol") == 0 and fake.count("sacct") == 0
    finally:
        adapter.shutdown()


def test_pending_jobs_count_as_capacity_and_keep_their_reason(tmp_path: Path) -> None:
    fake = FakeSlurm()
    adapter = adapter_with(tmp_path, fake, max_workers=2, poll_interval=0.01)
    try:
        adapter.request([launch("c1-m1-0"), launch("c1-m1-1")])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: sum(r.state is WorkerState.PENDING for r in s) == 2, seen)
        with fake.lock:
            fake.queue = {i: (n, "PENDING", "Resources") for i, (n, _, _) in fake.queue.items()}
        poll_until(adapter, lambda s: sum(r.reason == "Resources" for r in s) == 2, seen)
        with pytest.raises(AdapterError, match="max_workers is 2"):
            adapter.request([launch("c1-m1-2")])
        assert fake.count("sbatch") == 2
    finally:
        adapter.shutdown()


def test_a_job_that_left_the_queue_is_looked_up_once_and_reported_with_its_fate(
    tmp_path: Path,
) -> None:
    fake = FakeSlurm()
    (tmp_path / "c1-m1-0-100.log").write_text("starting\nTraceback: boom\n")
    adapter = adapter_with(tmp_path, fake, poll_interval=0.01)
    try:
        adapter.request([launch("c1-m1-0")])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: any(r.state is WorkerState.PENDING for r in s), seen)
        with fake.lock:
            del fake.queue["100"]
            fake.final["100"] = (
                f"JobId=100 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 StdOut={tmp_path}/c1-m1-0-100.log"
            )
        poll_until(adapter, lambda s: any(r.state is WorkerState.GONE for r in s), seen)
        gone = seen[-1]
        assert gone.reason == "Slurm job 100 FAILED, exit code 1:0 (NonZeroExitCode)"
        assert gone.log_tail.endswith("Traceback: boom") and not gone.infrastructure
        for _ in range(20):
            adapter.poll()
        assert fake.count("scontrol") == 1
    finally:
        adapter.shutdown()


def test_stop_cancels_only_the_named_jobs_and_shutdown_the_rest(tmp_path: Path) -> None:
    fake = FakeSlurm()
    adapter = adapter_with(tmp_path, fake, poll_interval=0.01)
    adapter.request([launch("c1-m1-0"), launch("c1-m1-1", secure=True)])
    seen: list[WorkerReport] = []
    poll_until(adapter, lambda s: sum(r.state is WorkerState.PENDING for r in s) == 2, seen)
    adapter.stop(["c1-m1-0", "not-mine"])
    poll_until(adapter, lambda s: any(r.state is WorkerState.GONE for r in s), seen)
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "100"]]
    gone = [r for r in seen if r.state is WorkerState.GONE]
    assert gone[0].name == "c1-m1-0" and "scancel" in gone[0].reason and not gone[0].infrastructure
    assert (tmp_path / ".c1-m1-1.key").exists()
    adapter.shutdown()
    assert ["scancel", "101"] in fake.calls and fake.queue == {}
    assert not (tmp_path / ".c1-m1-1.key").exists()


def test_a_refused_sbatch_is_one_clear_line_with_the_fix(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.refuse = "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified\n"
    adapter = adapter_with(tmp_path, fake, partition="nope")
    try:
        adapter.request([launch("c1-m1-0", secure=True)])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: any(r.state is WorkerState.GONE for r in s), seen)
        reason = seen[-1].reason
        assert reason.startswith(
            "sbatch refused the job: sbatch: error: invalid partition specified: nope"
        )
        assert (
            reason.endswith("check --slurm-partition (sinfo lists the partitions)")
            and "\n" not in reason
        )
        assert not (tmp_path / ".c1-m1-0.key").exists()
    finally:
        adapter.shutdown()


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    slurm.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--slurm-cpus", "-1"), "--slurm-cpus -1 is negative"),
        (("--slurm-poll-interval", "0"), "--slurm-poll-interval 0 must be > 0"),
        (
            ("--slurm-directive", "constraint=x"),
            "is not an sbatch option; write it as --option=value",
        ),
        (("--slurm-python-env", "/no/such/env"), "is not a directory"),
        (("--slurm-drain-seconds", "30"), "--slurm-drain-seconds needs --slurm-time"),
        (
            ("--slurm-time", "10", "--slurm-drain-seconds", "-1"),
            "--slurm-drain-seconds -1 is negative",
        ),
    ],
)
def test_bad_options_are_named_with_their_fix(
    argv: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    setup = AdapterSetup("p-", 1, WorkerTemplate(processors=1), CLUSTER)
    with pytest.raises(AdapterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slurm.from_args(parsed(*argv, "--slurm-log-dir", str(tmp_path)), setup)


def test_print_job_script_shows_the_script_and_exits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = AdapterSetup("c1-m1-", 1, WorkerTemplate(processors=1), CLUSTER)
    with pytest.raises(SystemExit) as exit_:
        slurm.from_args(
            parsed(
                "--print-job-script", "--slurm-partition", "gpu", "--slurm-log-dir", str(tmp_path)
            ),
            setup,
        )
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "#SBATCH --partition=gpu" in out and "--credentials-stdin" in out
    # The first worker of a run, named as the manager names it: <name>-<boot>-1, and its job
    # <cluster>.<name>.<boot>-1 (the boot is each run's own).
    worker = re.search(r" --name (c1-m1-([0-9a-f]{6})-1) ", out)
    assert worker is not None, out
    assert f"#SBATCH --job-name={CLUSTER}.c1-m1.{worker[2]}-1\n" in out


def test_a_time_limit_signals_the_worker_alone_ahead_of_it(tmp_path: Path) -> None:
    setup = AdapterSetup("p-", 1, WorkerTemplate(processors=1), CLUSTER)
    limited = slurm.job_script(
        setup, SlurmOptions(log_dir=str(tmp_path), time_limit="30", drain_seconds=90), launch("p-0")
    )
    assert "#SBATCH --signal=B:TERM@90" in limited.splitlines()
    unlimited = slurm.job_script(setup, SlurmOptions(log_dir=str(tmp_path)), launch("p-0"))
    assert "--signal" not in unlimited and "--time" not in unlimited


def test_a_time_limit_lets_the_worker_finish_its_running_tasks_within_the_drain(tmp_path: Path) -> None:
    """Walltime without loss: the worker gets --drain-seconds, the drain less a margin, so
    that the tasks it runs at the signal end before the job does; none without a time limit
    (scancel stops it at once, as before), and 0 for a drain shorter than the margin."""
    setup = AdapterSetup("p-", 1, WorkerTemplate(processors=1), CLUSTER)

    def command(**options: Any) -> list[str]:
        script = slurm.job_script(setup, SlurmOptions(log_dir=str(tmp_path), **options), launch("p-0"))
        return shlex.split(script.splitlines()[-1])

    limited = command(time_limit="30", drain_seconds=90)
    assert limited[limited.index("--drain-seconds") + 1] == str(90 - slurm.WORKER_DRAIN_MARGIN) == "80"
    short = command(time_limit="30", drain_seconds=5)
    assert short[short.index("--drain-seconds") + 1] == "0"
    assert "--drain-seconds" not in command() and "--drain-seconds" not in command(time_limit="30", drain_seconds=0)


def test_print_job_script_names_the_managers_daemon_and_an_insecure_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = AdapterSetup("c1-m1-", 1, WorkerTemplate(processors=1), CLUSTER)
    args = parsed("--print-job-script", "--slurm-log-dir", str(tmp_path))
    args.daemon, args.insecure = "tcp://head:8786", True  # as scaler-worker-manager parses them
    with pytest.raises(SystemExit):
        slurm.from_args(args, setup)
    last = capsys.readouterr().out.splitlines()[-1]
    assert "scaler_executor.cli.worker tcp://head:8786" in last and last.endswith("--insecure")


# ---------------------------------------------------------------- which jobs are this adapter's


def manager(
    tmp_path: Path, fake: FakeSlurm, name: str, cluster: str = CLUSTER, max_workers: int = 8
) -> SlurmAdapter:
    """The Slurm adapter of a manager called ``name`` (``--name``) of the cluster ``cluster``."""
    setup = AdapterSetup(f"{name}-", max_workers, WorkerTemplate(processors=1), cluster)
    return SlurmAdapter(setup, SlurmOptions(log_dir=str(tmp_path), poll_interval=1000.0), runner=fake)


def submitted(adapter: SlurmAdapter, fake: FakeSlurm, names: list[str]) -> dict[str, str]:
    """Submit ``names`` through ``adapter``; worker name -> job id once sbatch answered."""
    adapter.request([launch(n) for n in names])
    seen: list[WorkerReport] = []
    poll_until(adapter, lambda s: {r.name for r in s if r.state is WorkerState.PENDING} == set(names), seen)
    return {r.name: r.job for r in seen if r.state is WorkerState.PENDING}


def cancelled(fake: FakeSlurm) -> set[str]:
    with fake.lock:
        return {job for call in fake.calls if call[0] == "scancel" for job in call[1:]}


def test_job_names_carry_the_cluster_and_the_manager_delimited(tmp_path: Path) -> None:
    fake = FakeSlurm()
    pool = manager(tmp_path, fake, "pool")
    try:
        assert pool.job_name("pool-3f9a1c-7") == f"{CLUSTER}.pool.3f9a1c-7"
        assert pool.owner_of(f"{CLUSTER}.pool.3f9a1c-7") == "pool-3f9a1c-7"
        other = cluster_id("tcp://elsewhere:8786", "DPUB")
        assert len(CLUSTER) == 8 and other != CLUSTER
        for foreign in (
            "pool-3f9a1c-7",  # the old format, a bare prefix
            f"{CLUSTER}.pool-gpu.3f9a1c-7",  # manager pool-gpu
            f"{CLUSTER}.pool.gpu.3f9a1c-7",  # manager pool.gpu
            f"{CLUSTER}.pool.3f9a1c-7.x",  # more after the suffix
            f"x{CLUSTER}.pool.3f9a1c-7",  # more before the cluster
            f"{other}.pool.3f9a1c-7",  # another cluster's manager pool
            f"{CLUSTER}.pool.",  # no suffix
        ):
            assert pool.owner_of(foreign) is None, foreign
        with pytest.raises(AdapterError, match="is not 'pool-' followed by"):
            pool.request([launch("pool-gpu.1")])
        with pytest.raises(AdapterError, match="more than 200"):
            manager(tmp_path, fake, "p" * 200).request([launch("p" * 200 + "-1")])
        with pytest.raises(AdapterError, match="cluster id"):
            manager(tmp_path, fake, "pool", cluster="")
    finally:
        pool.shutdown()


def test_a_manager_never_adopts_nor_cancels_the_jobs_of_a_longer_named_manager(
    tmp_path: Path,
) -> None:
    fake = FakeSlurm()
    gpu = manager(tmp_path, fake, "pool-gpu")
    theirs = submitted(gpu, fake, ["pool-gpu-a1b2c3-1", "pool-gpu-a1b2c3-2"])
    pool = manager(tmp_path, fake, "pool")
    ours = submitted(pool, fake, ["pool-d4e5f6-1"])

    restarted = manager(tmp_path, fake, "pool")  # pool's manager restarted: adopts its own only
    adopted = restarted.adopt()
    assert {r.name: r.job for r in adopted} == ours
    restarted.shutdown()
    assert cancelled(fake) == set(ours.values())
    with fake.lock:
        assert set(theirs.values()) <= set(fake.queue)  # pool-gpu's jobs still queued
    pool.shutdown()
    assert cancelled(fake) == set(ours.values())
    gpu.shutdown()


def test_a_manager_never_adopts_nor_cancels_another_clusters_jobs_of_its_own_name(
    tmp_path: Path,
) -> None:
    fake = FakeSlurm()
    elsewhere = cluster_id("tcp://other-head:8786", "OTHER-DAEMON-KEY")
    # Two clusters whose managers keep the default name, on one login host and one Slurm.
    other = manager(tmp_path, fake, "manager-login1", elsewhere)
    theirs = submitted(other, fake, ["manager-login1-a1b2c3-1"])
    ours = submitted(manager(tmp_path, fake, "manager-login1"), fake, ["manager-login1-d4e5f6-1"])

    restarted = manager(tmp_path, fake, "manager-login1")
    adopted = restarted.adopt()
    assert {r.name: r.job for r in adopted} == ours
    restarted.shutdown()
    assert cancelled(fake) == set(ours.values())
    with fake.lock:
        assert set(theirs.values()) <= set(fake.queue)
    other.shutdown()


def test_a_restarted_manager_adopts_its_own_jobs_with_their_states(tmp_path: Path) -> None:
    fake = FakeSlurm()
    first = manager(tmp_path, fake, "pool")
    ours = submitted(first, fake, ["pool-d4e5f6-1", "pool-d4e5f6-2"])
    with fake.lock:
        job = ours["pool-d4e5f6-1"]
        fake.queue[job] = (fake.queue[job][0], "RUNNING", "None")
    # The first run died (no shutdown); the next one, same name and same daemon, finds them.
    # cluster_id is a function of the daemon's address and key only, so it is the same.
    again = manager(tmp_path, fake, "pool", cluster_id("tcp://d:1", "DPUB"))
    adopted = {r.name: r for r in again.adopt()}
    assert {n: r.job for n, r in adopted.items()} == ours
    assert adopted["pool-d4e5f6-1"].state is WorkerState.RUNNING
    assert adopted["pool-d4e5f6-1"].host == "node1"
    assert adopted["pool-d4e5f6-2"].state is WorkerState.PENDING
    again.shutdown()
    assert cancelled(fake) == set(ours.values())
    with fake.lock:
        assert fake.queue == {}


def test_a_running_job_near_its_time_limit_is_reported_draining_so_its_replacement_comes_first(
    tmp_path: Path,
) -> None:
    """Once a job's end is within drain + Slurm's signal resolution + a replacement's start-up,
    it is reported draining while it still runs: the daemon counts it out and asks for its
    replacement ahead of the end.  A job far from its end stays running."""
    fake = FakeSlurm()
    adapter = adapter_with(tmp_path, fake, poll_interval=0.01, time_limit="30", drain_seconds=60, startup_seconds=20)
    lead = 60 + 60 + 20
    try:
        adapter.request([launch("c1-m1-0"), launch("c1-m1-1")])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: sum(r.state is WorkerState.PENDING for r in s) == 2, seen)
        def at(seconds: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + seconds))

        with fake.lock:
            (near, far) = sorted(fake.queue)
            fake.queue = {i: (n, "RUNNING", "None") for i, (n, _, _) in fake.queue.items()}
            fake.ends = {near: at(lead - 30), far: at(lead + 600)}
        poll_until(adapter, lambda s: any(r.state is WorkerState.DRAINING for r in s), seen)
        draining = [r for r in seen if r.state is WorkerState.DRAINING]
        assert [r.job for r in draining] == [near]
        assert "time limit ends in" in draining[0].reason and "replacement" in draining[0].reason
        assert draining[0].ends_at > time.time()
        latest = {r.job: r.state for r in seen}
        assert latest[far] is WorkerState.RUNNING
    finally:
        adapter.shutdown()


def test_a_job_that_pended_for_a_reason_drains_for_its_time_limit_not_that_reason(
    tmp_path: Path,
) -> None:
    """The reason a job pended (``Resources``) is over once it runs: a job near its time
    limit is reported draining for that limit, not for why it once waited."""
    fake = FakeSlurm()
    adapter = adapter_with(tmp_path, fake, poll_interval=0.01, time_limit="1", drain_seconds=50, startup_seconds=5)
    try:
        adapter.request([launch("c1-m1-0")])
        seen: list[WorkerReport] = []
        poll_until(adapter, lambda s: any(r.state is WorkerState.PENDING for r in s), seen)
        with fake.lock:
            (job,) = fake.queue
            fake.queue[job] = (fake.queue[job][0], "PENDING", "Resources")
        poll_until(adapter, lambda s: any(r.reason == "Resources" for r in s), seen)
        with fake.lock:
            fake.queue[job] = (fake.queue[job][0], "RUNNING", "None")
            fake.ends[job] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 60))
        poll_until(adapter, lambda s: any(r.state is WorkerState.DRAINING for r in s), seen)
        draining = next(r for r in seen if r.state is WorkerState.DRAINING)
        assert "time limit ends in" in draining.reason, draining
    finally:
        adapter.shutdown()
