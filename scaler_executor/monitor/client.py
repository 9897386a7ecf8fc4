"""A read-only connection to a daemon: fetch statistics snapshots, change nothing.

::

    Monitor(address, credentials=FILE)      scaler-daemon
    ─────────────────────────────────       ─────────────
    Hello(role=monitor) ───────────────►    welcomed as a monitor (a monitor key where
                        ◄──── Welcome       security is on: scaler-keys issue --role monitor)
    snapshot(): StatsRequest ──────────►    one snapshot shared by all monitors, built at most
                        ◄────── Stats       every MONITOR_SNAPSHOT_SECONDS (scheduler/core_events.py)
    history(): HistoryRequest ─────────►    one history shared by all monitors, built at most
                        ◄──── History       every MONITOR_HISTORY_SECONDS

The daemon accepts nothing from a monitor but Heartbeat, Goodbye, StatsRequest and HistoryRequest (the
role's table in protocol/messages.py, checked for every message); this class has no way to
send anything else.  A monitor that stops reading is dropped by the daemon, never waited
for; one silent past the daemon's liveness limit is forgotten.  Either way the next
``snapshot()`` or ``history()`` is answered ``UNKNOWN_PEER`` and this side says Hello again, once.

Single-threaded and synchronous: each call sends, then polls its own socket up to its
timeout.  Not thread-safe: use one Monitor per thread.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig, check_address
from scaler_executor.exceptions import ProtocolError
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.rejoin import is_unknown_peer
from scaler_executor.scheduler.stats import Statistics

if TYPE_CHECKING:
    from scaler_executor.security.client import ClientSecurity

__all__ = ["Monitor", "MonitorRefused"]


class MonitorRefused(ProtocolError):
    """The daemon refused this monitor (wrong key or role, version mismatch); the reason says why."""


class Monitor:
    """A monitor's connection to the daemon at ``address``.

    ``credentials``: a credential file issued with ``--role monitor`` (tcp:// with security
    on); ``insecure=True`` for a daemon run with ``--insecure``.  ipc:// needs neither.
    Without them, ``SCALER_CREDENTIALS``, ``SCALER_INSECURE`` and the config file apply, as
    for ``ScalerExecutor`` (``ClusterConfig.load``).
    Raises ``ConfigError`` for a bad address or credential, ``MonitorRefused`` when the
    daemon refuses the handshake, ``TimeoutError`` when it does not answer in ``timeout``.
    """

    def __init__(
        self,
        address: str,
        *,
        credentials: str | None = None,
        insecure: bool = False,
        name: str = "monitor",
        timeout: float = 10.0,
        security: ClientSecurity | None = None,
    ) -> None:
        from scaler_executor.security import for_connecting

        check_address(address)
        self.address = address
        self.name = name
        if security is None:  # ``security``: a key held in memory (scaler-daemon --dashboard's child)
            # As ScalerExecutor and scaler-worker do: SCALER_CREDENTIALS, SCALER_INSECURE and
            # the config file ($SCALER_CONFIG), with the arguments winning.
            config = ClusterConfig.load()
            if credentials is not None:
                config = config.replace(credentials=credentials)
            if insecure:
                config = config.replace(insecure=True)
            security = for_connecting(config, address, m.Role.MONITOR)
        self._sock: Any = channel.connect(address, hwm=16, linger=0, security=security)
        self._poller = channel.Poller()
        self._poller.register(self._sock.pollable)
        self.closed = False
        try:
            self._join(timeout)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, timeout: float = 10.0) -> Statistics:
        """The daemon's current statistics (at most ``MONITOR_SNAPSHOT_SECONDS`` old)."""
        return Statistics.from_message(self._ask(m.StatsRequest(), m.Stats, timeout))

    def history(self, timeout: float = 10.0) -> m.History:
        """The run's history (scheduler/history.py): the most recent task runs and the coarse
        series of the whole run.  Monitors share one, built at most every
        ``MONITOR_HISTORY_SECONDS`` (it is O(runs kept) to build: ask every few seconds)."""
        history: m.History = self._ask(m.HistoryRequest(), m.History, timeout)
        return history

    def _ask(self, request: Any, kind: type, timeout: float) -> Any:
        """Send ``request``, return the daemon's ``kind`` answering it; a late answer to an
        earlier request that timed out is read and dropped first (``_drain``)."""
        if self.closed:
            raise ValueError("this Monitor is closed")
        rejoin = self._drain()
        if rejoin:
            self._join(timeout)
        self._send(request)
        got = self._wait(kind, timeout)
        if got is None:  # the daemon had dropped us (slow, or silent too long): join again, once
            self._join(timeout)
            self._send(request)
            got = self._wait(kind, timeout)
            if got is None:
                raise MonitorRefused(f"daemon at {self.address} forgot this monitor again right after it joined")
        return got

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._send(m.Goodbye("monitor closed"))
        except (channel.SendError, ProtocolError):
            pass  # the daemon is gone or not reading: nothing to say goodbye to
        self._sock.close(0)
        self._poller.close()

    # ------------------------------------------------------------------ internals

    def _join(self, timeout: float) -> None:
        hello = m.Hello(
            m.Role.MONITOR, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
            self.name, os.getpid(), socket.gethostname(), 0, {}, [],
        )  # fmt: skip
        self._send(hello)
        if self._wait(m.Welcome, timeout) is None:
            raise MonitorRefused(f"daemon at {self.address} answered this monitor's Hello with UNKNOWN_PEER")

    def _drain(self) -> bool:
        """Read what came since the last call (a late answer to a timed-out request, the
        daemon's heartbeats) without waiting; True when the daemon has forgotten us."""
        forgotten = False
        while self._sock.readable():
            messages, _ = codec.decode(self._sock.recv())
            for message in messages:
                if type(message) is m.Refused:
                    if not is_unknown_peer(message.reason):
                        raise MonitorRefused(f"daemon at {self.address} refused this monitor: {message.reason}")
                    forgotten = True
        return forgotten

    def _send(self, message: Any) -> None:
        try:
            self._sock.send(codec.encode([message]))
        except channel.Again:
            raise TimeoutError(f"daemon at {self.address} is not reading (send queue full)") from None

    def _wait(self, kind: type, timeout: float) -> Any:
        """The next ``kind``; None when the daemon answered UNKNOWN_PEER (it forgot us)."""
        deadline = time.monotonic() + timeout
        while True:
            while self._sock.readable():
                messages, _ = codec.decode(self._sock.recv())
                for message in messages:
                    if type(message) is kind:
                        return message
                    if type(message) is m.Refused:
                        if is_unknown_peer(message.reason):
                            return None
                        raise MonitorRefused(f"daemon at {self.address} refused this monitor: {message.reason}")
                    if type(message) is m.Goodbye:
                        raise MonitorRefused(f"daemon at {self.address} said goodbye: {message.reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"daemon at {self.address} sent no {kind.__name__} within {timeout:g} s")
            self._poller.poll(self._sock.poll_timeout(min(left, 0.25) * 1000))
