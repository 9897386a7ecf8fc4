"""The ``local`` capacity adapter of ``scaler-worker-manager``: workers as processes on the
manager's host (manager/adapter.py is the contract).

Each worker's standard input is a pipe only this manager holds: its key arrives there as
one line, and then the pipe is its *lifeline* — when the manager dies, however abruptly,
the pipe closes and the worker stops. So a manager that is killed leaves nothing running;
a restarted one finds (by name prefix) only workers that had not noticed yet, and stops
them (``adopt``). (The daemon's embedded ``--workers N`` pool is ``manager/local.py``,
driven by the daemon's own loop.)
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import subprocess
import time

from scaler_executor._compat import describe_wait_status
from scaler_executor.manager.adapter import (
    AdapterInfo,
    AdapterSetup,
    CapacityAdapter,
    WorkerLaunch,
    WorkerReport,
    WorkerState,
    is_worker_of,
    worker_command,
)
from scaler_executor.worker_command import close_lifeline

log = logging.getLogger("scaler_executor.manager")

STOP_GRACE_SECONDS = 5.0  # a stopped worker says Goodbye, returning what it holds, within this
# A local worker is an interpreter and its imports: about a second on an idle machine.
DEFAULT_STARTUP_SECONDS = 2.0


class LocalAdapter:
    def __init__(self, setup: AdapterSetup, startup_seconds: float = DEFAULT_STARTUP_SECONDS) -> None:
        self.setup = setup
        self.startup_seconds = startup_seconds
        self.host = socket.gethostname()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.reports: list[WorkerReport] = []

    def info(self) -> AdapterInfo:
        return AdapterInfo("local", self.setup.max_workers, self.startup_seconds, f"host {self.host}")

    def adopt(self) -> list[WorkerReport]:
        """Workers of a previous run still alive (their lifeline closes as that run died, so
        they are on their way out): stopped here, and reported gone."""
        import psutil  # type: ignore[import-untyped]  # no stubs installed

        found = []
        for process in psutil.process_iter(["pid", "cmdline", "uids"]):
            try:
                cmdline = process.info["cmdline"] or []
                if "scaler_executor.cli.worker" not in cmdline or "--name" not in cmdline:
                    continue
                name = cmdline[cmdline.index("--name") + 1]
                if not is_worker_of(self.setup.prefix, name) or process.info["uids"].real != _uid():
                    continue
                process.terminate()
                found.append(WorkerReport(name, WorkerState.GONE, str(process.pid), self.host, "left behind by a previous run of its manager; stopped"))
            except (psutil.Error, IndexError):
                continue
        for report in found:
            log.warning("manager: stopped worker %s (pid %s), left behind by a previous run", report.name, report.job)
        return found

    def request(self, launches: list[WorkerLaunch]) -> None:
        for launch in launches:
            command = worker_command(launch, self.setup.template, extra=("--lifeline",))
            try:
                process = subprocess.Popen(command, stdin=subprocess.PIPE)
            except OSError as exc:
                self.reports.append(WorkerReport(launch.name, WorkerState.GONE, reason=f"could not start: {exc}"))
                continue
            self.processes[launch.name] = process
            assert process.stdin is not None
            if launch.credential is not None:
                try:
                    process.stdin.write((launch.credential.to_line() + "\n").encode("ascii"))
                    process.stdin.flush()  # ~200 bytes: the pipe takes it without blocking
                except BrokenPipeError:
                    pass  # it died at once; poll() reports it
            self.reports.append(WorkerReport(launch.name, WorkerState.RUNNING, str(process.pid), self.host))

    def poll(self) -> list[WorkerReport]:
        for name, process in list(self.processes.items()):
            code = process.poll()
            if code is None:
                continue
            del self.processes[name]
            if process.stdin is not None:
                process.stdin.close()
            status = -code if code < 0 else code << 8  # waitpid-style, for describe_wait_status
            self.reports.append(WorkerReport(name, WorkerState.GONE, str(process.pid), self.host, describe_wait_status(status)))
        reports, self.reports = self.reports, []
        return reports

    def stop(self, names: list[str]) -> None:
        for name in names:
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                process.send_signal(signal.SIGTERM)  # the worker says Goodbye, handing back what it holds
            except ProcessLookupError:
                continue
            self.reports.append(WorkerReport(name, WorkerState.DRAINING, str(process.pid), self.host))

    def shutdown(self) -> None:
        for process in self.processes.values():
            if process.stdin is not None:
                close_lifeline(process.stdin)  # a clean stop: not its manager's death (worker_command.py)
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for name, process in self.processes.items():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("manager: worker %s (pid %d) did not stop in %.0f s; killing it", name, process.pid, STOP_GRACE_SECONDS)
                process.kill()
                process.wait()
        self.processes.clear()


def _uid() -> int:
    import os

    return os.getuid()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--local-startup-seconds",
        type=float,
        default=DEFAULT_STARTUP_SECONDS,
        metavar="SECONDS",
        help=f"how long a local worker takes to join, told to the daemon (default {DEFAULT_STARTUP_SECONDS:g})",
    )


def from_args(args: argparse.Namespace, setup: AdapterSetup) -> CapacityAdapter:
    from scaler_executor.manager.adapter import AdapterError

    if args.local_startup_seconds < 0:
        raise AdapterError(f"--local-startup-seconds {args.local_startup_seconds:g} is negative; give seconds >= 0")
    return LocalAdapter(setup, args.local_startup_seconds)
