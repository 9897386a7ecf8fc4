"""The local-process capacity adapter: worker processes on the daemon's own host.

It keeps ``count`` workers alive: a worker that exits is reported (so the core
can blame its tasks precisely, with the exit code or signal, without waiting
for missed heartbeats) and replaced, with a back-off when workers die young
(a worker that cannot start must not become a fork bomb).

Each worker's standard input is a pipe whose other end only this process
holds: the *lifeline*.  If the daemon dies, however abruptly, the pipe closes
and the workers stop.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from scaler_executor._compat import describe_wait_status
from scaler_executor.config import ClusterConfig
from scaler_executor.manager.adopted import AdoptedWorker
from scaler_executor.manager.process import WorkerProcess
from scaler_executor.worker_command import close_lifeline, worker_command

if TYPE_CHECKING:
    from scaler_executor.security.keys import Credential, EphemeralKeys

log = logging.getLogger("scaler_executor.manager")

YOUNG_DEATH_SECONDS = 5.0  # a worker that dies sooner counts towards the back-off
BACKOFF = (0.0, 0.5, 1.0, 2.0, 5.0)
STOP_GRACE_SECONDS = 2.0


class LocalWorkerManager:
    def __init__(
        self,
        config: ClusterConfig,
        address: str,
        *,
        count: int,
        processors: int,
        minimum: int | None = None,
        initializer_file: str | None = None,
        max_tasks_per_child: int | None = None,
        keys: EphemeralKeys | None = None,
    ) -> None:
        """``keys``: on a secured tcp:// daemon, each worker's own key, sent on its stdin."""
        self.config = config
        self.keys = keys
        self.credentials: dict[int, Credential] = {}  # by pid, withdrawn when the worker exits
        self.address = address
        self.count = count  # the workers kept alive; with autoscaling, the most it may run
        self.minimum = minimum  # None: a fixed pool of `count`; else the daemon decides (autoscaling)
        self.processors = processors
        self.initializer_file = initializer_file
        self.max_tasks_per_child = max_tasks_per_child
        self.workers: dict[int, tuple[WorkerProcess | AdoptedWorker, float]] = {}
        self.young_deaths = 0
        self.next_start = 0.0
        self.stopping = False

    def command(self, safe_path: bool | None = None) -> list[str]:
        """The worker's command line (see :func:`~scaler_executor.worker_command.worker_command`)."""
        return worker_command(
            self.config,
            self.address,
            processors=self.processors,
            workers_on_host=self.count,
            initializer_file=self.initializer_file,
            max_tasks_per_child=self.max_tasks_per_child,
            safe_path=safe_path,
            credentials_stdin=self.keys is not None,
        )

    def adopt(self, processes: list[WorkerProcess]) -> None:
        """Keep workers started from this manager's command before it existed (cli/daemon.py)."""
        now = time.monotonic()
        for process in processes:
            self.workers[process.pid] = (process, now)

    def adopt_running(self, pids: list[int]) -> int:
        """Keep the local workers of an earlier daemon (this one restarted on its journal,
        manager/adopted.py) that still run; returns how many."""
        now = time.monotonic()
        adopted = 0
        for pid in pids:
            worker = AdoptedWorker.find(pid, self.address)
            if worker is not None and pid not in self.workers:
                self.workers[pid] = (worker, now)
                adopted += 1
        return adopted

    @property
    def initial_count(self) -> int:
        """The workers :meth:`start` keeps: all of them, or with autoscaling the minimum."""
        return self.count if self.minimum is None else self.minimum

    def start(self) -> None:
        while len(self.workers) < self.initial_count:
            self._start_one()

    def pids(self) -> frozenset[int]:
        return frozenset(self.workers)

    def start_more(self, count: int) -> None:
        """Autoscaling: start up to ``count`` more workers, never more than ``self.count`` in all."""
        for _ in range(min(count, self.count - len(self.workers))):
            self._start_one()

    def stop_some(self, pids: tuple[int, ...]) -> None:
        """Autoscaling: ask these (drained) workers to stop; poll() reports their exit."""
        for pid in pids:
            entry = self.workers.get(pid)
            if entry is not None:
                try:
                    entry[0].send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def _start_one(self) -> None:
        process = WorkerProcess(self.command())
        self.workers[process.pid] = (process, time.monotonic())
        if self.keys is not None and process.stdin is not None:
            credential = self.keys.issue(f"local-worker-{process.pid}")
            self.credentials[process.pid] = credential
            try:
                process.stdin.write((credential.to_line() + "\n").encode("ascii"))
                process.stdin.flush()  # ~200 bytes: the pipe takes it without blocking
            except BrokenPipeError:
                pass  # it died at once; poll() reports it

    def poll(self) -> list[tuple[int, str]]:
        """Workers that exited since the last call, as (pid, how); restarts replacements when due."""
        exited = []
        now = time.monotonic()
        for pid, (process, started) in list(self.workers.items()):
            code = process.poll()
            if code is None:
                continue
            del self.workers[pid]
            if (credential := self.credentials.pop(pid, None)) is not None and self.keys is not None:
                self.keys.withdraw(credential)  # a dead worker's key lets nobody in
            if process.stdin is not None:
                process.stdin.close()
            how = describe_wait_status(_wait_status(code))
            exited.append((pid, how))
            if not self.stopping and self.minimum is None:
                log.warning("local worker pid %d %s; starting a replacement", pid, how)
                if now - started < YOUNG_DEATH_SECONDS:
                    self.young_deaths += 1
                else:
                    self.young_deaths = 0
                self.next_start = now + BACKOFF[min(self.young_deaths, len(BACKOFF) - 1)]
        if not self.stopping and self.minimum is None and len(self.workers) < self.count and now >= self.next_start:
            self.start()
        return exited

    def stop(self) -> None:
        """Stop every worker: close lifelines and SIGTERM, then SIGKILL what remains after a grace."""
        self.stopping = True
        for process, _ in self.workers.values():
            if process.stdin is not None:
                close_lifeline(process.stdin)  # a clean stop: not its daemon's death (worker_command.py)
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process, _ in self.workers.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.warning("local worker pid %d did not stop in %.0f s; killing it", process.pid, STOP_GRACE_SECONDS)
                process.kill()
                process.wait()
        self.workers.clear()
        if self.keys is not None:
            for credential in self.credentials.values():
                self.keys.withdraw(credential)
        self.credentials.clear()


def _wait_status(returncode: int) -> int:
    """A waitpid-style status from a returncode (negative = signal)."""
    if returncode < 0:
        return -returncode  # WIFSIGNALED: low 7 bits hold the signal
    return returncode << 8
