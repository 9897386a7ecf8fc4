"""The worker manager process (``scaler-worker-manager``): the daemon decides, this executes.

::

    daemon ──ScaleWorkers(start=n)──►  name n workers, make each its own keypair
           ◄──WorkerKeys(name, public)  (secure daemons only; the secret stays here)
           ──KeysAdmitted(names)─────►  adapter.request(launches): key on each one's stdin
           ◄──WorkerStates────────────  adapter.poll(): requested, pending, running, gone
           ──ScaleWorkers(stop=names)─►  adapter.stop(names): drained by the daemon first

One thread, one poller: the daemon's connection and a timer that polls the adapter every
``POLL_SECONDS``. On SIGINT/SIGTERM, or when the daemon is gone for good, the adapter's
``shutdown`` stops every worker before the manager says Goodbye.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.manager.adapter import (
    CapacityAdapter,
    WorkerLaunch,
    WorkerReport,
    WorkerState,
    WorkerTemplate,
    new_boot,
    worker_name,
)
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m

log = logging.getLogger("scaler_executor.manager")

POLL_SECONDS = 0.5  # how often the adapter is asked what changed (it throttles its own queries)


class WorkerManager:
    def __init__(
        self,
        config: ClusterConfig,
        address: str,
        adapter: CapacityAdapter,
        template: WorkerTemplate,
        *,
        name: str,
        min_workers: int = 0,
        security: Any = None,
    ) -> None:
        """``security``: the manager's ClientSecurity on tcp:// (None: ipc:// or --insecure);
        with it, each worker gets its own short-lived key instead of a shared credential."""
        self.config = config
        self.address = address
        self.adapter = adapter
        self.template = template
        self.name = name
        self.min_workers = min_workers
        self.security = security
        self.info = adapter.info()
        self.boot = new_boot()  # names of this run never repeat a previous run's
        self.serial = 0
        self.states: dict[str, WorkerState] = {}  # the workers this manager runs or asked for
        self.awaiting_keys: dict[str, WorkerLaunch] = {}  # named, keys sent, not admitted yet
        self.stopping = False
        self.welcomed = False
        self.exit_code = 0
        self.last_send = 0.0
        self.last_recv = time.monotonic()
        self.sock = channel.connect(address, hwm=config.send_hwm, linger=0.2, security=security)
        self._signal_r, self._signal_w = os.pipe()
        os.set_blocking(self._signal_r, False)
        os.set_blocking(self._signal_w, False)

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._signal_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        adopted = self.adapter.adopt()
        self._absorb(adopted)
        self._hello()
        self._report(adopted)
        poller = channel.Poller()
        poller.register(self.sock.pollable)
        poller.register(self._signal_r)
        next_poll = 0.0
        interval = self.config.heartbeat_interval
        silence_limit = max(interval * self.config.heartbeat_liveness, self.config.daemon_loss_timeout)
        try:
            while not self.stopping:
                now = time.monotonic()
                timeout = max(0.0, min(next_poll, self.last_send + interval) - now)
                ready = poller.poll(self.sock.poll_timeout(timeout * 1000))
                if self.sock.pollable in ready or getattr(self.sock, "buffered", False):
                    self._on_daemon()
                if self._signal_r in ready:
                    try:
                        os.read(self._signal_r, 512)
                    except BlockingIOError:
                        pass
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + POLL_SECONDS
                    self._report(self.adapter.poll())
                if now - self.last_recv > silence_limit:
                    log.error("manager %s: no word from the daemon at %s for %.0f s; stopping its workers", self.name, self.address, now - self.last_recv)
                    self.exit_code = 1
                    break
                if now - self.last_send >= interval:
                    self._send([m.Heartbeat(0, 0)])
        finally:
            self._shutdown()
        return self.exit_code

    def _shutdown(self) -> None:
        log.info("manager %s: stopping its %d worker(s)", self.name, len(self.states))
        self.adapter.shutdown()
        gone = [m.WorkerChange(n, "gone", "", "", "its manager stopped", "", 0.0, False) for n in self.states]
        self.states.clear()
        try:
            self._send(([m.WorkerStates(gone)] if gone else []) + [m.Goodbye("manager stopping")])
        except channel.SendError:
            pass
        self.sock.close(linger=0.5)
        os.close(self._signal_r)
        os.close(self._signal_w)

    # ------------------------------------------------------------------ the daemon

    def _hello(self) -> None:
        t = self.template
        hello = m.Hello(
            m.Role.MANAGER, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
            self.name, os.getpid(), socket.gethostname(), 0, {}, [],
        )  # fmt: skip
        offer = m.ManagerOffer(
            self.info.kind, self.info.max_workers, self.min_workers, t.processors, dict(t.resources), sorted(t.tags),
            self.info.startup_seconds, self.info.where, sorted(self.states),
        )  # fmt: skip
        self._send([hello, offer])

    def _send(self, messages: list[Any]) -> None:
        try:
            self.sock.send(codec.encode(messages))
        except channel.Again:
            log.warning("manager %s: the daemon is not keeping up; %d message(s) dropped", self.name, len(messages))
        self.last_send = time.monotonic()

    def _on_daemon(self) -> None:
        while self.sock.readable():
            try:
                frames = self.sock.recv()
            except channel.Again:
                return
            self.last_recv = time.monotonic()
            try:
                messages, _ = codec.decode(frames)
            except codec.DecodeError as exc:
                log.warning("manager %s: dropped a bad transmission from the daemon: %s", self.name, exc)
                continue
            for message in messages:
                self._on_message(message)

    def _on_message(self, message: Any) -> None:
        match message:
            case m.Welcome(peer_id=peer_id):
                self.welcomed = True
                log.info("manager %s joined the daemon at %s as manager %d", self.name, self.address, peer_id)
            case m.Refused(reason=reason) if reason.startswith("unknown peer"):
                log.warning("manager %s: the daemon does not know it (restarted?); joining again", self.name)
                self._hello()
                self._report([WorkerReport(n, s) for n, s in self.states.items()])
            case m.Refused(reason=reason) if not self.welcomed:
                log.error("manager %s: the daemon refused it: %s", self.name, reason)
                self.exit_code = 2
                self.stopping = True
            case m.Refused(reason=reason):
                log.warning("manager %s: the daemon refused a message: %s", self.name, reason)
            case m.ScaleWorkers(start=start, stop=stop):
                if stop:
                    self._stop(stop)
                if start:
                    self._start(start)
            case m.KeysAdmitted(names=names):
                launches = [launch for n in names if (launch := self.awaiting_keys.pop(n, None)) is not None]
                if launches:
                    self.adapter.request(launches)
            case m.Heartbeat() | m.Goodbye():
                if type(message) is m.Goodbye:
                    log.warning("manager %s: the daemon said goodbye: %s", self.name, message.reason)
                    self.exit_code = 1
                    self.stopping = True
            case _:
                log.debug("manager %s: ignored %s from the daemon", self.name, type(message).__name__)

    # ------------------------------------------------------------------ decisions

    def _start(self, count: int) -> None:
        count = min(count, self.info.max_workers - len(self.states))
        if count <= 0:
            return
        launches = []
        for _ in range(count):
            self.serial += 1
            launches.append(WorkerLaunch(worker_name(self.name + "-", self.boot, self.serial), self.address, None))
        log.info("manager %s: starting %d worker(s)", self.name, count)
        if self.security is None:
            for launch in launches:
                self.states[launch.name] = WorkerState.REQUESTED
            self._send([m.WorkerStates([_change(WorkerReport(x.name, WorkerState.REQUESTED)) for x in launches])])
            self.adapter.request(launches)
            return
        from scaler_executor.security.keys import Credential, keypair

        keys = []
        daemon_key = self.security.credential.daemon_public_key
        for launch in launches:
            public, secret = keypair()
            credential = Credential(launch.name, "worker", public, secret, daemon_key, "")
            self.awaiting_keys[launch.name] = WorkerLaunch(launch.name, launch.address, credential)
            self.states[launch.name] = WorkerState.REQUESTED
            keys.append(m.WorkerKey(launch.name, public))
        self._send([m.WorkerKeys(keys)])

    def _stop(self, names: list[str]) -> None:
        never = [n for n in names if self.awaiting_keys.pop(n, None) is not None]
        if never:
            self._report([WorkerReport(n, WorkerState.GONE, reason="cancelled before it started") for n in never])
        rest = [n for n in names if n in self.states and n not in never]
        if rest:
            log.info("manager %s: stopping %d worker(s): %s", self.name, len(rest), ", ".join(rest))
            self.adapter.stop(rest)

    def _absorb(self, reports: list[WorkerReport]) -> None:
        for report in reports:
            if report.state is WorkerState.GONE:
                self.states.pop(report.name, None)
            else:
                self.states[report.name] = report.state

    def _report(self, reports: list[WorkerReport]) -> None:
        if not reports:
            return
        self._absorb(reports)
        for report in reports:
            if report.state is WorkerState.GONE:
                log.info("manager %s: worker %s (%s) gone: %s", self.name, report.name, report.job or "-", report.reason or "ended")
            elif report.state is WorkerState.PENDING:
                log.info("manager %s: worker %s pending: %s", self.name, report.name, report.reason or "no reason given")
        self._send([m.WorkerStates([_change(r) for r in reports])])


def _change(report: WorkerReport) -> m.WorkerChange:
    return m.WorkerChange(
        report.name, report.state.value, report.job, report.host, report.reason, report.log_tail, report.ends_at,
        report.infrastructure,
    )  # fmt: skip
