"""How long after its daemon dies does a pending future fail with ``DaemonLost``?

A script, not a test::

    PYTHONPATH=. python bench/daemon_loss.py                  # embedded, ipc and tcp, 5 runs each
    PYTHONPATH=. python bench/daemon_loss.py --modes tcp --runs 3

For each run: a fresh daemon with one local worker, a fresh client, one task that sleeps
(running on the worker), then SIGKILL to the daemon (only the daemon: its worker lives
on, as a worker on another host would), and the time from the kill to the future's
failure, read on the thread that waits on it.  Modes:

* ``embedded``: ``ScalerExecutor()``, whose daemon is its own child over ``ipc://``;
* ``ipc``: a standalone ``scaler-daemon --address ipc://...``, joined with ``address=``;
* ``tcp``: the same over ``tcp://127.0.0.1``, secured as by default (``scaler-keys init``,
  a client credential, ``scaler-daemon --security``).

The client runs with the default configuration (what a user gets), unless
``--daemon-loss-timeout`` says otherwise.  The worker the kill orphaned is killed after
each run.  Prints every run, then the median and the spread (min–max) per mode.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from scaler_executor import ClusterConfig, DaemonLost, ScalerExecutor

MODES = ("embedded", "ipc", "tcp")
TASK_SECONDS = 120.0  # far longer than any detection: the task is still running at the kill


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keys(directory: str) -> tuple[str, str]:
    """A cluster's security directory and a client credential in it (scaler-keys)."""
    security, credential = os.path.join(directory, "keys"), os.path.join(directory, "client.cred")
    command = [sys.executable, "-m", "scaler_executor.cli.keys"]
    subprocess.run([*command, "init", security], check=True, capture_output=True)
    subprocess.run([*command, "issue", security, "bench", "--role", "client", "--output", credential], check=True, capture_output=True)
    return security, credential


def start_daemon(address: str, sock_path: str | None, security: str | None = None) -> subprocess.Popen[bytes]:
    extra = ["--security", security] if security is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address, "--workers", "1", *extra],
        env={k: v for k, v in os.environ.items() if not k.startswith("SCALER_")},
    )
    if sock_path is not None:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    return proc


def one_run(mode: str, config: ClusterConfig) -> tuple[float, str]:
    """Seconds from SIGKILL of the daemon to DaemonLost in a pending future, and its message."""
    directory = tempfile.mkdtemp(prefix="sdl-")
    daemon: Any = None
    try:
        if mode == "embedded":
            ex = ScalerExecutor(max_workers=1, config=config)
        else:
            security: str | None = None
            credential: str | None = None
            if mode == "ipc":
                sock_path: str | None = os.path.join(directory, "d.sock")
                address = f"ipc://{sock_path}"
            else:
                sock_path, address = None, f"tcp://127.0.0.1:{free_port()}"
                security, credential = keys(directory)
            daemon = start_daemon(address, sock_path, security)
            ex = ScalerExecutor(address=address, credentials=credential, config=config.replace(connect_timeout=30.0))
        future = ex.submit(time.sleep, TASK_SECONDS)
        deadline = time.monotonic() + 60
        while not future.running() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert future.running(), "the task did not start"
        if mode == "embedded":
            daemon = _embedded_daemon()
        proc = psutil.Process(daemon.pid)
        orphans = proc.children(recursive=True)
        killed = time.monotonic()
        os.kill(daemon.pid, signal.SIGKILL)
        concurrent.futures.wait([future], timeout=120)
        seconds = time.monotonic() - killed
        error = future.exception(timeout=0)
        assert isinstance(error, DaemonLost), f"expected DaemonLost, got {error!r}"
        ex.shutdown(wait=True)
        for child in orphans:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(orphans, timeout=10)
        if isinstance(daemon, subprocess.Popen):
            daemon.wait(10)
        return seconds, str(error)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _embedded_daemon() -> psutil.Process:
    for child in psutil.Process().children():
        if "scaler_executor.cli.daemon" in " ".join(child.cmdline()):
            return child
    raise RuntimeError("no embedded daemon among this process's children")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--daemon-loss-timeout", type=float, default=None, help="the client's (default: its default)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    config = ClusterConfig()
    if args.daemon_loss_timeout is not None:
        config = config.replace(daemon_loss_timeout=args.daemon_loss_timeout)
    load = os.getloadavg()
    print(
        f"# {platform.node()} {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f}, "
        f"Python {platform.python_version()}, daemon_loss_timeout={config.daemon_loss_timeout:g} s"
    )
    figures: dict[str, list[float]] = {mode: [] for mode in modes}
    message: dict[str, str] = {}
    for run in range(args.runs):  # modes alternate, so a burst of load hits all of them alike
        for mode in modes:
            seconds, text = one_run(mode, config)
            figures[mode].append(seconds)
            message[mode] = text
            print(f"run {run + 1} {mode:>8}: {seconds * 1000:9.1f} ms", flush=True)
    print()
    print(f"{'mode':>8}  {'median':>10}  {'min':>10}  {'max':>10}  message")
    for mode in modes:
        xs = figures[mode]
        print(
            f"{mode:>8}  {statistics.median(xs) * 1000:8.1f}ms  {min(xs) * 1000:8.1f}ms  {max(xs) * 1000:8.1f}ms  "
            f"{message[mode]}"
        )


if __name__ == "__main__":
    main()
