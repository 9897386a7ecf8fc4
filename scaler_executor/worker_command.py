"""The command line of a local worker: what the daemon's LocalWorkerManager runs.

Below the roles (layer 2, beside the configuration): the embedded cluster's client
writes it for the daemon to start its first workers with before the daemon's own
imports (``cli/daemon.py``, ``--early-workers``), and the manager runs it for every
later worker; one function, so both start the same worker.
"""

from __future__ import annotations

import sys
from typing import IO

from scaler_executor.config import ClusterConfig


def worker_command(
    config: ClusterConfig,
    address: str,
    *,
    processors: int,
    workers_on_host: int,
    initializer_file: str | None = None,
    max_tasks_per_child: int | None = None,
    safe_path: bool | None = None,
    credentials_stdin: bool = False,
) -> list[str]:
    """The worker's command line; the settings travel as flags, so no file outlives a crash.

    ``safe_path``: run it with ``-P``; default: when this process runs with it.
    ``credentials_stdin``: its own key arrives as a line on its standard input (the
    lifeline pipe), never in a file; otherwise tcp:// without keys needs ``insecure``."""
    c = config
    if safe_path is None:
        safe_path = bool(sys.flags.safe_path)
    cmd = [
        sys.executable,
        # A daemon started with -P (the embedded cluster's, whose PYTHONPATH is the
        # client's whole sys.path) starts its workers the same way: see client/cluster.py.
        *(["-P"] if safe_path else []),
        "-m",
        "scaler_executor.cli.worker",
        address,
        "--processors",
        str(processors),
        "--lifeline",
        "--workers-on-host",
        str(workers_on_host),
        "--heartbeat-interval",
        repr(c.heartbeat_interval),
        "--heartbeat-liveness",
        str(c.heartbeat_liveness),
        "--daemon-loss-timeout",
        repr(c.daemon_loss_timeout),
        "--send-hwm",
        str(c.send_hwm),
        "--log-level",
        c.log_level,
        "--resources",
        c.worker_resources,
        "--tags",
        c.worker_tags,
        "--memory-limit",
        c.memory_limit,
        "--object-store-threshold",
        str(c.object_store_threshold),
        "--arrays-in-store",
        str(c.arrays_in_store),
        "--capture-output-limit",
        str(c.capture_output_limit),
    ]
    if credentials_stdin:
        cmd.append("--credentials-stdin")
    elif c.insecure:
        cmd.append("--insecure")
    if initializer_file:
        cmd += ["--initializer", initializer_file]
    if max_tasks_per_child:
        cmd += ["--max-tasks-per-child", str(max_tasks_per_child)]
    return cmd


# A local worker's standard input is its *lifeline*: the pipe closes when the process that
# started it (its daemon, or a worker manager) dies, however abruptly, and the worker stops
# (or, under a journaled daemon, waits for the daemon's restart: worker/resume.py).  A
# clean stop writes LIFELINE_STOP before closing it, so that the worker can tell "you are
# being stopped" (say nothing of a restart) from "whoever started you died".
LIFELINE_STOP = b"stop\n"


def close_lifeline(stdin: IO[bytes]) -> None:
    """Stop a local worker cleanly through its lifeline (``stdin``: the pipe's write end)."""
    try:
        stdin.write(LIFELINE_STOP)
        stdin.flush()
    except (OSError, ValueError):  # it exited already (EPIPE), or the pipe was closed
        pass
    try:
        stdin.close()
    except OSError:
        pass
