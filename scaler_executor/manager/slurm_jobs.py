"""What the ``slurm`` adapter (manager/slurm.py) tells Slurm and reads back from it: the
options of a worker's job, its job script and job name, and the parsing of ``squeue`` and
``scontrol`` output; pure functions of their arguments (and of the files they name)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass

from scaler_executor.manager.adapter import (
    AdapterError,
    AdapterSetup,
    WorkerLaunch,
    worker_command,
)

DEFAULT_POLL_INTERVAL = 5.0  # one squeue per this many seconds, for all the adapter's jobs
DEFAULT_STARTUP_SECONDS = 10.0  # sbatch -> worker connected on an idle cluster, told to the daemon
LOG_TAIL_LINES = 20
# With a time limit, Slurm sends the worker SIGTERM this long before it (--signal=B:TERM@N):
# the worker stops taking tasks and hands back the ones it holds, which run elsewhere.
DEFAULT_DRAIN_SECONDS = 120
SIGNAL_RESOLUTION = 60.0  # Slurm may send that signal up to a minute earlier than asked
# Seconds of the drain the worker leaves unused (its --drain-seconds is the drain less this):
# its Goodbye, its processors' end and the job's own end must fit before the time limit.
WORKER_DRAIN_MARGIN = 10
_SEP = "\x1f"  # squeue field separator: cannot occur in a job name we chose
_SQUEUE_FORMAT = _SEP.join(["%i", "%j", "%T", "%r", "%N", "%e"])
# Job names: "<cluster>.<manager>.<suffix>". The cluster id has no ".", nor has the suffix, so
# a job name splits one way only (the manager's own name may hold "."): the id before the
# first ".", the suffix after the last. Slurm takes names up to 1024 characters; accounting
# keeps 255 and the log file's name (%x-%j.log) must stay under the file system's 255, so
# the adapter refuses names longer than this.
JOB_NAME_MAX = 200
_CLUSTER_ID = re.compile(r"[0-9A-Za-z]+")
_SUFFIX = r"[0-9A-Za-z_-]+"  # "<boot>-<n>" (adapter.worker_name), no "."


@dataclass(frozen=True, slots=True)
class SlurmOptions:
    """What each worker's job asks of Slurm, and where the adapter keeps its files."""

    log_dir: str  # the jobs' logs (and, briefly, their keys); must be visible from the nodes
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""  # Slurm's --time syntax: "30", "2:00:00", "1-00:00:00"
    cpus: int = 0  # --cpus-per-task; 0: the worker's processor count
    memory: str = ""  # --mem: "4G", "1000M"
    gres: str = ""  # --gres: "gpu:1"
    directives: tuple[str, ...] = ()  # more #SBATCH lines, e.g. "--constraint=skylake"
    python_env: str = ""  # a virtualenv or conda prefix to activate in the job ("" : this Python)
    drain_seconds: int = DEFAULT_DRAIN_SECONDS  # with time_limit: SIGTERM this long before it
    poll_interval: float = DEFAULT_POLL_INTERVAL
    startup_seconds: float = DEFAULT_STARTUP_SECONDS
    # The environment sbatch runs in, which the job inherits (sbatch's default --export=ALL);
    # None: the manager's own.
    environment: dict[str, str] | None = None


def job_script(setup: AdapterSetup, options: SlurmOptions, launch: WorkerLaunch) -> str:
    """The script ``sbatch`` is given for ``launch``: the worker in the job's foreground."""
    o = options
    template = setup.template
    python = "python" if o.python_env else sys.executable
    draining = bool(o.time_limit) and o.drain_seconds > 0
    # The worker finishes what it runs for the drain less a margin when the signal comes
    # (walltime without loss); without a time limit, SIGTERM (scancel) stops it at once.
    extra = ("--drain-seconds", str(worker_drain_seconds(o.drain_seconds))) if draining else ()
    command = worker_command(launch, template, python=python, extra=extra)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name(setup, launch.name)}"]
    lines.append(f"#SBATCH --output={os.path.join(os.path.abspath(o.log_dir), '%x-%j.log')}")
    lines += [
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={o.cpus or template.processors}",
    ]
    for flag, value in (("partition", o.partition), ("account", o.account), ("qos", o.qos),
                        ("time", o.time_limit), ("mem", o.memory), ("gres", o.gres)):  # fmt: skip
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    if draining:
        # "B:": to the batch shell only, which is the worker (exec below), not its processors.
        lines.append(f"#SBATCH --signal=B:TERM@{o.drain_seconds}")
    lines += [f"#SBATCH {d}" for d in o.directives]
    lines += ["set -e", f'echo "scaler: job $SLURM_JOB_ID, worker {launch.name}, on $(hostname)"']
    if o.python_env:
        env = shlex.quote(o.python_env)
        if os.path.exists(os.path.join(o.python_env, "bin", "activate")):
            lines.append(f"source {env}/bin/activate")
        else:  # a conda prefix
            lines.append(
                f'command -v conda >/dev/null || {{ echo "scaler: no conda to activate {env}" >&2; exit 1; }}'
            )
            lines.append(f'eval "$(conda shell.bash hook)" && conda activate {env}')
    if launch.credential is not None:
        key = shlex.quote(key_path(options, launch.name))
        lines += [f"exec < {key}", f"rm -f {key}"]  # the worker's stdin is its key; the file goes
    else:
        lines.append("exec < /dev/null")
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"


def worker_drain_seconds(drain_seconds: int) -> int:
    """The worker's ``--drain-seconds`` for a job signalled ``drain_seconds`` before its time
    limit: the drain less WORKER_DRAIN_MARGIN, at least 0 (stop at once).  Slurm may signal
    up to SIGNAL_RESOLUTION earlier, which only leaves the worker more time."""
    return max(0, drain_seconds - WORKER_DRAIN_MARGIN)


def key_path(options: SlurmOptions, name: str) -> str:
    """Where a worker's key waits for its job to start (mode 0600, removed as the job starts)."""
    return os.path.join(os.path.abspath(options.log_dir), f".{name}.key")


def job_name(setup: AdapterSetup, worker: str) -> str:
    """The Slurm job name of ``worker``: ``<cluster>.<manager>.<suffix>``, where the worker's
    name is ``setup.prefix`` (``<manager>-``) followed by ``suffix``. AdapterError for a
    worker name the adapter could not find again by it."""
    _check_cluster(setup)
    suffix = worker[len(setup.prefix) :]
    if not worker.startswith(setup.prefix) or not re.fullmatch(_SUFFIX, suffix):
        raise AdapterError(
            f"worker name {worker!r} is not {setup.prefix!r} followed by letters, digits, "
            "'-' and '_': its Slurm job could not be told from other managers' jobs"
        )
    name = f"{setup.cluster}.{_manager(setup)}.{suffix}"
    _check_prefix(name)
    if len(name) > JOB_NAME_MAX:
        raise AdapterError(
            f"Slurm job name {name!r} is {len(name)} characters, more than {JOB_NAME_MAX}; "
            "give the manager a shorter --name"
        )
    return name


def _manager(setup: AdapterSetup) -> str:
    """The manager's name: its workers' prefix without the "-" that ends it."""
    return setup.prefix.removesuffix("-")


def _check_cluster(setup: AdapterSetup) -> None:
    if not _CLUSTER_ID.fullmatch(setup.cluster):
        raise AdapterError(
            f"cluster id {setup.cluster!r} is not letters and digits (adapter.cluster_id()): "
            "without it the Slurm adapter cannot tell its jobs from another cluster's"
        )


def _check_prefix(name: str) -> None:
    if not name or any(c.isspace() or c in "/,\\'\"" + _SEP for c in name):
        raise AdapterError(
            f"{name!r} cannot be a Slurm job name; use letters, digits, '-', '_' and '.'"
        )


def _parse_queue(out: str) -> dict[str, tuple[str, str, str, str, str]]:
    queued = {}
    for line in out.splitlines():
        parts = line.split(_SEP)
        if len(parts) == 6:
            queued[parts[0]] = (parts[1], parts[2], parts[3], parts[4], parts[5])
    return queued


def _scontrol_fields(text: str) -> dict[str, str]:
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def _parse_time(value: str) -> float:
    """squeue's %e ("2026-12-01T23:10:00", "N/A", "Unknown") as time.time(), 0 if none."""
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _hint(err: str) -> str:
    lower = err.lower()
    if "partition" in lower:
        return "; check --slurm-partition (sinfo lists the partitions)"
    if "account" in lower:
        return "; check --slurm-account (sacctmgr show assoc user=$USER lists yours)"
    if "qos" in lower:
        return "; check --slurm-qos"
    if "time limit" in lower:
        return "; check --slurm-time against the partition's MaxTime (sinfo -o '%P %l')"
    return ""
