"""The single-node Slurm the Slurm tests share (``.ci/slurm``), and helpers about its queue.

The ``slurm`` session fixture (tests/integration/conftest.py) is ``slurm_session()``: it
starts Slurm with ``.ci/slurm start`` unless one is already up (then it uses it and leaves it
running), stops what it started on every exit path, and skips where Slurm cannot be started
(a failure under ``CI=true``: ``requires_system``). Test modules import the helpers from here,
a module with a unique name (see scaler_testing.py on why not from conftest).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from scaler_testing import REPO, missing_system, requires_system, wait_until

SLURM_SCRIPT = os.path.join(REPO, ".ci", "slurm")
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "slurmctld", "slurmd", "munged")
SESSION_CPUS = "4"  # the node's CPU count when this session starts Slurm


@contextmanager
def slurm_session() -> Iterator[int]:
    """A running single-node Slurm for the block; yields the node's CPU count."""
    requires_system(missing_system(COMMANDS, root=True))
    started = False
    if subprocess.run([SLURM_SCRIPT, "status"], capture_output=True).returncode != 0:
        done = subprocess.run(
            [SLURM_SCRIPT, "start"],
            capture_output=True,
            text=True,
            env={**os.environ, "SLURM_CI_CPUS": SESSION_CPUS},
        )
        if done.returncode != 0:
            subprocess.run([SLURM_SCRIPT, "stop"], capture_output=True)
            requires_system(
                f"a single-node Slurm would not start (.ci/slurm start): {' '.join(done.stderr.split())[-400:]}"
            )
        started = True
    try:
        cpus = int(
            subprocess.run(
                ["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        )
        yield cpus
    finally:
        if started:
            subprocess.run([SLURM_SCRIPT, "stop"], capture_output=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def squeue() -> list[tuple[str, str, str]]:
    """(job id, job name, state) of every job in the queue."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [(i, n, s) for i, n, s in (line.split() for line in out.splitlines())]


def manager_jobs(managers: Iterable[str]) -> dict[str, tuple[str, str]]:
    """job id -> (job name, state) of the queued jobs of these managers (by name), whatever
    cluster id their names carry (``<cluster>.<manager>.<boot>-<n>``, docs/slurm.rst)."""
    pattern = re.compile(
        r"[0-9A-Za-z]+\.(?:" + "|".join(re.escape(m) for m in managers) + r")\.[0-9A-Za-z_-]+"
    )
    return {i: (n, s) for i, n, s in squeue() if pattern.fullmatch(n)}


def cancel_jobs_of(managers: Iterable[str], timeout: float = 30.0) -> list[str]:
    """scancel every queued job of these managers and wait (bounded) until none is left;
    returns the ids it cancelled (a test's cleanup: none, when the managers cleaned up)."""
    managers = list(managers)
    if not managers:
        return []
    left = list(manager_jobs(managers))
    if left:
        subprocess.run(["scancel", *left], capture_output=True, timeout=30)
        wait_until(lambda: not manager_jobs(managers), timeout=timeout, interval=0.2)
    return left
