"""The ``slurm`` capacity adapter of ``scaler-worker-manager``: one Slurm job per worker
(manager/adapter.py is the contract; docs/managers.rst says it in prose).

Each worker is one ``sbatch`` of a job script whose foreground process is the worker
(``exec python -m scaler_executor.cli.worker ...``), so ``scancel`` and the walltime reach
the worker itself. The job's name is ``<cluster>.<manager>.<suffix>`` (``job_name``): the
cluster's id (``AdapterSetup.cluster``, a hash of the daemon's address and key), the
manager's name, and what follows the manager's name in the worker's name
(``<boot>-<n>``); e.g. worker ``pool-3f9a1c-7`` of manager ``pool`` is job
``1b2c3d4e.pool.3f9a1c-7``. A job is this adapter's only if its whole name has that form
with this cluster's id and this manager's name (``owner_of``, anchored at both ends, never a
prefix test): that is how a restarted manager finds its jobs again, and why manager
``pool`` never takes the jobs of manager ``pool-gpu``, nor those of another cluster's
``pool`` on the same Slurm.

What the lessons of submitit and dask-jobqueue taught, kept here:

* **One query for all jobs, throttled.** Job states come from one ``squeue`` of this user's
  jobs per ``poll_interval`` (filtered by the name prefix here, not by Slurm), never one call
  per job; a job that left the queue is looked up once with ``scontrol show job`` for its
  final state and exit code. No ``sacct``: it needs accounting, and polling it is what
  floods slurmctld (submitit #1759).
* **Slurm calls never block the manager's loop.** ``sbatch``, ``squeue``, ``scontrol`` and
  ``scancel`` run, with timeouts, in the adapter's own thread; ``poll`` hands their results
  over. A busy slurmctld that answers ``sbatch`` late (submitit #1659) delays a worker, not
  the manager's heartbeats.
* **Pending is not running.** A queued job is reported PENDING with Slurm's reason
  (``Resources``, ``Priority``, ``QOSMaxJobsPerUserLimit``...), and counts against
  ``max_workers`` like a running one, so a full queue is never answered with more jobs
  (dask-jobqueue #11).
* **A job that dies says why.** GONE carries Slurm's state and exit code (and the tail of the
  job's log when it ended on its own), so a worker that failed before it could connect is
  not a silent loss (dask-jobqueue #498).

The worker's key (``WorkerLaunch.credential``) goes into a file in the log directory, mode
0600, that the job script opens as the worker's standard input and removes before it
starts the worker; the adapter removes it too if the job never ran.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import logging
import os
import queue
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaler_executor.manager.adapter import (
    AdapterError,
    AdapterInfo,
    AdapterSetup,
    CapacityAdapter,
    WorkerLaunch,
    WorkerReport,
    WorkerState,
    WorkerTemplate,
    new_boot,
    worker_name,
)

# What the adapter tells Slurm (options, job script, job name) and reads back: slurm_jobs.py.
from scaler_executor.manager.slurm_jobs import (
    _SQUEUE_FORMAT,
    _SUFFIX,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_STARTUP_SECONDS,
    SIGNAL_RESOLUTION,
    WORKER_DRAIN_MARGIN,
    SlurmOptions,
    _check_cluster,
    _check_prefix,
    _hint,
    _manager,
    _one_line,
    _parse_queue,
    _parse_time,
    _scontrol_fields,
    _tail,
    job_name,
    job_script,
    key_path,
)
from scaler_executor.manager.slurm_jobs import (  # the module's public names before the split
    JOB_NAME_MAX as JOB_NAME_MAX,
)
from scaler_executor.manager.slurm_jobs import (
    LOG_TAIL_LINES as LOG_TAIL_LINES,
)
from scaler_executor.manager.slurm_jobs import (
    worker_drain_seconds as worker_drain_seconds,
)

log = logging.getLogger("scaler_executor.manager")

SBATCH_TIMEOUT = 60.0  # a loaded slurmctld answers late; later than this is a failed submission
QUERY_TIMEOUT = 30.0
SHUTDOWN_WAIT = 30.0  # shutdown waits this long for its cancelled jobs to leave the queue

# squeue's states that mean a job still waits for its allocation / holds it.
_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_HOLDING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
# Final states caused by the infrastructure or an operator, not by what the worker ran.
_INFRASTRUCTURE = {"CANCELLED", "PREEMPTED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}

# (argv, stdin, timeout, environment) -> (returncode, stdout, stderr): how Slurm's commands run.
Runner = Callable[
    [Sequence[str], "str | None", float, "dict[str, str] | None"], "tuple[int, str, str]"
]


def run_command(
    argv: Sequence[str], stdin: str | None, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run one Slurm command; a timeout or a missing command is a failure with a message."""
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer in {timeout:g} s (slurmctld busy or down?)"
    except OSError as exc:
        return 127, "", f"cannot run {argv[0]}: {exc}; is Slurm's client (slurm-client) installed?"
    return done.returncode, done.stdout, done.stderr


@dataclass(slots=True)
class _Job:
    name: str
    job_id: str = ""  # "" until sbatch answered
    state: WorkerState = WorkerState.REQUESTED
    reason: str = ""
    host: str = ""
    ends_at: float = 0.0
    cancelled: bool = False  # by this adapter (stop/shutdown)
    missing_since: float = 0.0
    key_file: str = ""


@dataclass(slots=True)
class _Results:
    """What the Slurm thread found, for poll to apply (only poll touches the job table)."""

    submitted: list[tuple[str, int, str, str]] = field(default_factory=list)  # name, rc, out, err
    queue: dict[str, tuple[str, str, str, str, str]] | None = (
        None  # job id -> name, state, reason, node, end
    )
    queue_error: str = ""
    final: dict[str, str] = field(default_factory=dict)  # job id -> scontrol output ("" : unknown)


class SlurmAdapter:
    """Workers as Slurm jobs, one ``sbatch`` each (see the module's docstring)."""

    def __init__(
        self, setup: AdapterSetup, options: SlurmOptions, runner: Runner = run_command
    ) -> None:
        _check_prefix(setup.prefix)
        _check_cluster(setup)
        self.setup = setup
        manager = re.escape(_manager(setup))
        # This adapter's jobs, and (to say so in the log) jobs of this manager's name that
        # belong to another cluster; both anchored at both ends.
        self._mine = re.compile(rf"{re.escape(setup.cluster)}\.{manager}\.(?P<suffix>{_SUFFIX})")
        self._namesake = re.compile(rf"[0-9A-Za-z]+\.{manager}\.{_SUFFIX}")
        # Jobs this manager's name had before job names carried the cluster (named as the
        # worker, "<manager>-<boot>-<n>"): never adopted, only named in the log.
        self._old_format = re.compile(rf"{re.escape(setup.prefix)}[0-9a-f]{{6}}-[0-9]+")
        self.options = options
        self.runner = runner
        self.user = getpass.getuser()
        self.jobs: dict[str, _Job] = {}
        self.reports: list[WorkerReport] = []
        self.calls: Counter[str] = (
            Counter()
        )  # Slurm commands run, by name: for statistics and benchmarks
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._results = _Results()
        self._query_in_flight = False
        self._last_query = -float("inf")
        self._thread = threading.Thread(target=self._serve, name="slurm-calls", daemon=True)
        self._thread.start()
        Path(options.log_dir).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ the contract

    def info(self) -> AdapterInfo:
        where = (
            f"partition {self.options.partition}"
            if self.options.partition
            else "the default partition"
        )
        return AdapterInfo(
            "slurm", self.setup.max_workers, self.options.startup_seconds, f"Slurm, {where}"
        )

    def owner_of(self, job_name: str) -> str | None:
        """The worker whose job ``job_name`` is, if the job is this adapter's: its whole name
        is this cluster's id, this manager's name and a worker's suffix (``job_name``);
        None for any other job, however its name begins."""
        match = self._mine.fullmatch(job_name)
        return self.setup.prefix + match["suffix"] if match else None

    def job_name(self, worker: str) -> str:
        """The Slurm job name of ``worker`` (one of this adapter's names)."""
        return job_name(self.setup, worker)

    def adopt(self) -> list[WorkerReport]:
        """This adapter's jobs (``owner_of``) still queued or running, left by a previous
        run of this manager: kept, and reported as they are."""
        rc, out, err = self._run(
            ["squeue", "-h", "-u", self.user, "-o", _SQUEUE_FORMAT], None, QUERY_TIMEOUT
        )
        if rc != 0:
            raise AdapterError(f"squeue failed: {_one_line(err)}; is slurmctld reachable (sinfo)?")
        found = []
        namesakes, old_format = [], []
        for job_id, (job_name_, state, reason, node, end) in _parse_queue(out).items():
            name = self.owner_of(job_name_)
            if name is None:
                if self._namesake.fullmatch(job_name_):
                    namesakes.append(job_id)
                elif self._old_format.fullmatch(job_name_):
                    old_format.append(job_id)
                continue
            if name in self.jobs:
                continue
            job = _Job(name, job_id)
            self._apply_queued(job, state, reason, node, end)
            self.jobs[name] = job
            found.append(self._report(job))
            log.info("slurm: adopted job %s (%s), %s", job_id, name, job.state.value)
        if namesakes:
            log.info(
                "slurm: left alone job(s) %s: named for a manager %r of another cluster (or of "
                "this one reached by another address or key); this one's id is %s",
                ",".join(namesakes), _manager(self.setup), self.setup.cluster,
            )  # fmt: skip
        if old_format:
            log.warning(
                "slurm: job(s) %s are named like this manager's workers by an older version "
                "(no cluster id in the name): not adopted; scancel them if they are this manager's",
                ",".join(old_format),
            )
        return found

    def request(self, launches: list[WorkerLaunch]) -> None:
        live = sum(1 for job in self.jobs.values() if job.state is not WorkerState.GONE)
        if live + len(launches) > self.setup.max_workers:
            raise AdapterError(
                f"asked for {len(launches)} more workers with {live} queued or running; "
                f"max_workers is {self.setup.max_workers}"
            )
        for launch in launches:
            if launch.name in self.jobs:
                raise AdapterError(
                    f"worker name {launch.name!r} is already in use by job {self.jobs[launch.name].job_id}"
                )
            job_name(self.setup, launch.name)  # checks that the job can be found again
            job = _Job(launch.name)
            script = self.job_script(launch)
            if launch.credential is not None:
                job.key_file = self._key_path(launch.name)
                fd = os.open(job.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(launch.credential.to_line() + "\n")
            self.jobs[launch.name] = job
            self.reports.append(self._report(job))
            self._work.put(functools.partial(self._submit, launch.name, script))

    def poll(self) -> list[WorkerReport]:
        now = time.monotonic()
        with self._lock:
            results, self._results = self._results, _Results()
            if (
                not self._query_in_flight
                and now - self._last_query >= self.options.poll_interval
                and any(
                    job.state is not WorkerState.GONE and job.job_id for job in self.jobs.values()
                )
            ):
                self._query_in_flight = True
                self._last_query = now
                self._work.put(self._query)
        for name, rc, out, err in results.submitted:
            self._apply_submitted(name, rc, out, err)
        if results.queue is not None:
            self._apply_queue(results.queue)
        elif results.queue_error:
            log.warning("slurm: %s", results.queue_error)
        for job_id, text in results.final.items():
            self._apply_final(job_id, text)
        reports, self.reports = self.reports, []
        return reports

    def stop(self, names: list[str]) -> None:
        ids = []
        for name in names:
            job = self.jobs.get(name)
            if job is None or job.state is WorkerState.GONE or job.cancelled:
                continue
            job.cancelled = True
            if job.job_id:
                ids.append(job.job_id)
                self._set(job, WorkerState.DRAINING, "scancel")
            # else: sbatch has not answered yet; _apply_submitted cancels it when it does
        if ids:
            self._work.put(lambda: self._cancel(ids))

    def shutdown(self) -> None:
        """Cancel every job this adapter knows and wait (bounded) until none is queued."""
        for job in self.jobs.values():
            job.cancelled = True
        self._work.put(None)  # the thread finishes the sbatch calls already asked for, then ends
        self._thread.join(SBATCH_TIMEOUT + QUERY_TIMEOUT)
        self._apply_left_over()
        ids = [
            job.job_id
            for job in self.jobs.values()
            if job.job_id and job.state is not WorkerState.GONE
        ]
        if ids:
            self._cancel(ids)
        deadline = time.monotonic() + SHUTDOWN_WAIT
        while ids:
            rc, out, err = self._run(
                ["squeue", "-h", "-j", ",".join(ids), "-o", "%i"], None, QUERY_TIMEOUT
            )
            if (rc == 0 and not out.strip()) or "invalid job id" in err.lower():
                break
            if time.monotonic() > deadline:
                log.warning(
                    "slurm: jobs %s still queued %.0f s after scancel", ",".join(ids), SHUTDOWN_WAIT
                )
                break
            time.sleep(0.2)
        for job in self.jobs.values():
            self._remove_key(job)
            if job.state is not WorkerState.GONE:
                self._set(
                    job,
                    WorkerState.GONE,
                    f"Slurm job {job.job_id or '(never submitted)'} cancelled: its manager stopped",
                )

    # ------------------------------------------------------------------ the job script

    def job_script(self, launch: WorkerLaunch) -> str:
        """The script ``sbatch`` is given for ``launch`` (``--print-job-script`` shows it)."""
        return job_script(self.setup, self.options, launch)

    # ------------------------------------------------------------------ the Slurm thread

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            try:
                work()
            except Exception:  # a bug here must not stop every later Slurm call
                log.exception("slurm: a Slurm call failed")

    def _run(self, argv: Sequence[str], stdin: str | None, timeout: float) -> tuple[int, str, str]:
        self.calls[argv[0]] += 1
        return self.runner(argv, stdin, timeout, self.options.environment)

    def _submit(self, name: str, script: str) -> None:
        rc, out, err = self._run(["sbatch", "--parsable"], script, SBATCH_TIMEOUT)
        with self._lock:
            self._results.submitted.append((name, rc, out, err))

    def _query(self) -> None:
        rc, out, err = self._run(
            ["squeue", "-h", "-u", self.user, "-o", _SQUEUE_FORMAT], None, QUERY_TIMEOUT
        )
        with self._lock:
            self._query_in_flight = False
            if rc == 0:
                self._results.queue = _parse_queue(out)
            else:
                self._results.queue_error = f"squeue failed: {_one_line(err)}"

    def _look_up(self, job_id: str) -> None:
        rc, out, _ = self._run(["scontrol", "show", "job", "-o", job_id], None, QUERY_TIMEOUT)
        with self._lock:
            self._results.final[job_id] = out if rc == 0 else ""

    def _cancel(self, ids: list[str]) -> None:
        rc, _, err = self._run(["scancel", *ids], None, QUERY_TIMEOUT)
        if rc != 0:
            log.warning("slurm: scancel %s failed: %s", " ".join(ids), _one_line(err))

    def _apply_left_over(self) -> None:
        """Apply the sbatch answers the (stopped) Slurm thread left, starting no new call."""
        with self._lock:
            results, self._results = self._results, _Results()
        for name, rc, out, err in results.submitted:
            self._apply_submitted(name, rc, out, err)

    # ------------------------------------------------------------------ applying results

    def _apply_submitted(self, name: str, rc: int, out: str, err: str) -> None:
        job = self.jobs[name]
        if rc != 0:
            self._remove_key(job)
            self._set(
                job,
                WorkerState.GONE,
                f"sbatch refused the job: {_one_line(err) or f'exit {rc}'}{_hint(err)}",
            )
            log.error("slurm: %s: %s", name, job.reason)
            return
        job.job_id = out.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
        job.state = WorkerState.PENDING
        log.info("slurm: submitted job %s for worker %s", job.job_id, name)
        if job.cancelled:  # stopped before sbatch answered
            self._set(job, WorkerState.DRAINING, "scancel")
            self._work.put(lambda: self._cancel([job.job_id]))
        else:
            self.reports.append(self._report(job))

    def _apply_queue(self, queued: dict[str, tuple[str, str, str, str, str]]) -> None:
        by_id = {
            job.job_id: job
            for job in self.jobs.values()
            if job.job_id and job.state is not WorkerState.GONE
        }
        for job_id, job in by_id.items():
            entry = queued.get(job_id)
            if entry is None:
                if not job.missing_since:
                    job.missing_since = time.monotonic()
                    self._work.put(functools.partial(self._look_up, job_id))
                continue
            _, state, reason, node, end = entry
            before = (job.state, job.reason, job.host)
            self._apply_queued(job, state, reason, node, end)
            if (job.state, job.reason, job.host) != before:
                self.reports.append(self._report(job))
                if job.state is WorkerState.PENDING and job.reason:
                    log.info("slurm: job %s (%s) pending: %s", job_id, job.name, job.reason)

    def _apply_queued(self, job: _Job, state: str, reason: str, node: str, end: str) -> None:
        if job.cancelled:
            job.state = WorkerState.DRAINING
        elif state in _WAITING:
            job.state = WorkerState.PENDING
            job.reason = "" if reason in ("None", "(null)") else reason
        elif state in _HOLDING:
            job.ends_at = _parse_time(end)
            left = self._time_left(job)
            if left is not None:
                # Reported draining now, while it still runs: the daemon counts it out and
                # asks for its replacement, which comes up as this one drains.
                if job.state is not WorkerState.DRAINING:  # said once, not again each poll
                    job.state = WorkerState.DRAINING
                    job.reason = f"its time limit ends in {left:.0f} s: a replacement is asked for ahead of it"
            else:
                job.state = WorkerState.RUNNING
                job.reason = ""
        job.host = node if node not in ("", "(null)") else job.host
        job.ends_at = _parse_time(end)

    def _time_left(self, job: _Job) -> float | None:
        """Seconds to a running job's time limit once it is time to ask for its replacement
        (the drain, Slurm's signal resolution and a replacement's start-up from the end),
        else None."""
        if not self.options.time_limit or not job.ends_at:
            return None
        left = job.ends_at - time.time()
        lead = self.options.drain_seconds + SIGNAL_RESOLUTION + self.options.startup_seconds
        return max(0.0, left) if left <= lead else None

    def _apply_final(self, job_id: str, text: str) -> None:
        job = next((j for j in self.jobs.values() if j.job_id == job_id), None)
        if job is None or job.state is WorkerState.GONE:
            return
        fields = _scontrol_fields(text)
        state = fields.get("JobState", "")
        if (
            state in _WAITING or state in _HOLDING
        ):  # back in the queue (requeued) or a race: look again
            job.missing_since = 0.0
            return
        exit_code = fields.get("ExitCode", "")
        how = f"Slurm job {job_id} {state or 'left the queue (Slurm no longer knows it)'}"
        if exit_code:
            how += f", exit code {exit_code}"
        fault = fields.get("Reason", "")
        if fault and fault not in ("None", "(null)"):
            how += f" ({fault})"
        infrastructure = state in _INFRASTRUCTURE and not job.cancelled
        drain = self.options.drain_seconds + SIGNAL_RESOLUTION
        if (
            self.options.time_limit
            and state == "COMPLETED"
            and job.ends_at
            and time.time() >= job.ends_at - drain
        ):
            how += ", drained ahead of its time limit"
            infrastructure = True
        if job.cancelled:
            how += " after this manager's scancel"
        tail = ""
        if not job.cancelled:
            tail = _tail(
                fields.get("StdOut")
                or os.path.join(self.options.log_dir, f"{self.job_name(job.name)}-{job_id}.log")
            )
        self._remove_key(job)
        self._set(job, WorkerState.GONE, how, log_tail=tail, infrastructure=infrastructure)
        if job.cancelled:
            log.info("slurm: %s (%s): %s", job.name, job_id, how)
        else:
            log.warning(
                "slurm: worker %s ended: %s%s",
                job.name,
                how,
                f"; its log ends:\n{tail}" if tail else "",
            )

    # ------------------------------------------------------------------ helpers

    def _set(
        self,
        job: _Job,
        state: WorkerState,
        reason: str,
        log_tail: str = "",
        infrastructure: bool = False,
    ) -> None:
        job.state, job.reason = state, reason
        self.reports.append(self._report(job, log_tail, infrastructure))

    def _report(self, job: _Job, log_tail: str = "", infrastructure: bool = False) -> WorkerReport:
        return WorkerReport(
            job.name,
            job.state,
            job.job_id,
            job.host,
            job.reason,
            log_tail,
            job.ends_at,
            infrastructure,
        )

    def _key_path(self, name: str) -> str:
        return key_path(self.options, name)

    def _remove_key(self, job: _Job) -> None:
        if job.key_file:
            try:
                os.unlink(job.key_file)
            except FileNotFoundError:
                pass
            job.key_file = ""


# ---------------------------------------------------------------------- --adapter slurm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("slurm adapter")
    group.add_argument(
        "--slurm-partition",
        default="",
        metavar="NAME",
        help="the partition to submit to (default: Slurm's)",
    )
    group.add_argument("--slurm-account", default="", metavar="NAME", help="the account to charge")
    group.add_argument("--slurm-qos", default="", metavar="NAME", help="the quality of service")
    group.add_argument(
        "--slurm-time", default="", metavar="LIMIT", help="each job's time limit, e.g. 2:00:00"
    )
    group.add_argument(
        "--slurm-cpus",
        type=int,
        default=0,
        metavar="N",
        help="CPUs per job (default: --processors)",
    )
    group.add_argument(
        "--slurm-memory", default="", metavar="SIZE", help="memory per job (sbatch --mem), e.g. 4G"
    )
    group.add_argument(
        "--slurm-gres", default="", metavar="SPEC", help="generic resources per job, e.g. gpu:1"
    )
    group.add_argument(
        "--slurm-directive",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more #SBATCH line, e.g. --constraint=skylake (repeatable)",
    )
    group.add_argument(
        "--slurm-log-dir",
        default="scaler-slurm-logs",
        metavar="DIR",
        help="the jobs' logs (default ./scaler-slurm-logs)",
    )
    group.add_argument(
        "--slurm-python-env",
        default="",
        metavar="DIR",
        help="a virtualenv or conda prefix the job activates",
    )
    group.add_argument(
        "--slurm-poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help=f"one squeue for all jobs per this interval (default {DEFAULT_POLL_INTERVAL:g})",
    )
    group.add_argument(
        "--slurm-startup-seconds",
        type=float,
        default=DEFAULT_STARTUP_SECONDS,
        metavar="SECONDS",
        help=f"how long sbatch to a joined worker takes, told to the daemon (default {DEFAULT_STARTUP_SECONDS:g})",
    )
    group.add_argument(
        "--slurm-drain-seconds",
        type=int,
        default=DEFAULT_DRAIN_SECONDS,
        metavar="SECONDS",
        help="with --slurm-time: a worker stops taking tasks and hands back those it has not started this "
        "long before its job's time limit, and finishes the ones it runs within this less "
        f"{WORKER_DRAIN_MARGIN} s (its --drain-seconds) (default {DEFAULT_DRAIN_SECONDS}; Slurm may signal "
        "up to a minute earlier)",
    )
    group.add_argument(
        "--print-job-script",
        action="store_true",
        help="print the job script of one worker and exit",
    )


def options_from_args(args: argparse.Namespace) -> SlurmOptions:
    if args.slurm_cpus < 0:
        raise AdapterError(
            f"--slurm-cpus {args.slurm_cpus} is negative; give a count >= 1, or 0 for --processors"
        )
    if args.slurm_poll_interval <= 0:
        raise AdapterError(
            f"--slurm-poll-interval {args.slurm_poll_interval:g} must be > 0 seconds"
        )
    if args.slurm_startup_seconds < 0:
        raise AdapterError(
            f"--slurm-startup-seconds {args.slurm_startup_seconds:g} is negative; give seconds >= 0"
        )
    if args.slurm_drain_seconds < 0:
        raise AdapterError(
            f"--slurm-drain-seconds {args.slurm_drain_seconds} is negative; give seconds >= 0"
        )
    if args.slurm_drain_seconds != DEFAULT_DRAIN_SECONDS and not args.slurm_time:
        raise AdapterError(
            "--slurm-drain-seconds needs --slurm-time: without a time limit there is nothing to drain before"
        )
    for directive in args.slurm_directive:
        if not directive.startswith("-"):
            raise AdapterError(
                f"--slurm-directive {directive!r} is not an sbatch option; write it as --option=value"
            )
    if args.slurm_python_env and not os.path.isdir(args.slurm_python_env):
        raise AdapterError(
            f"--slurm-python-env {args.slurm_python_env!r} is not a directory; give a virtualenv or conda prefix"
        )
    return SlurmOptions(
        log_dir=args.slurm_log_dir,
        partition=args.slurm_partition,
        account=args.slurm_account,
        qos=args.slurm_qos,
        time_limit=args.slurm_time,
        cpus=args.slurm_cpus,
        memory=args.slurm_memory,
        gres=args.slurm_gres,
        directives=tuple(args.slurm_directive),
        python_env=args.slurm_python_env,
        drain_seconds=args.slurm_drain_seconds,
        poll_interval=args.slurm_poll_interval,
        startup_seconds=args.slurm_startup_seconds,
    )


def from_args(args: argparse.Namespace, setup: AdapterSetup) -> CapacityAdapter:
    options = options_from_args(args)
    if args.print_job_script:
        print(
            # scaler-worker-manager's ADDRESS is args.daemon; --insecure: no key to hand over.
            print_job_script(
                setup,
                options,
                getattr(args, "daemon", "") or "tcp://DAEMON:PORT",
                secure=not getattr(args, "insecure", False),
            ),
            end="",
        )
        raise SystemExit(0)
    return SlurmAdapter(setup, options)


def print_job_script(
    setup: AdapterSetup, options: SlurmOptions, address: str, secure: bool = True
) -> str:
    """The job script of the first worker a run of the manager would start, without
    submitting it; its ``<boot>`` is made anew here, as each run makes its own."""
    from scaler_executor.security.keys import Credential

    name = worker_name(setup.prefix, new_boot(), 1)
    credential = Credential(name, "worker", "PUBLIC", "SECRET", "DAEMON") if secure else None
    return job_script(setup, options, WorkerLaunch(name, address, credential))


__all__ = [
    "SlurmAdapter",
    "SlurmOptions",
    "WorkerTemplate",
    "add_arguments",
    "from_args",
    "job_name",
    "job_script",
    "print_job_script",
    "run_command",
]
