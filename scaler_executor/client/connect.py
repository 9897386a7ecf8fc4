"""Is a running daemon there?  The first handshake, and a dead daemon told from a quiet one.

*The first handshake*: how long a client waits, and what it says when no Welcome comes.

A client's channel connects without blocking and retries until a daemon binds (ZeroMQ's
reconnect, or the ipc channel's own), so an address where nothing listens looks, from
the inside, exactly like a daemon that is slow to answer.  Two things make that visible:

* ``ScalerExecutor(address=...)`` waits in its constructor for the daemon's Welcome, up
  to ``connect_timeout``, and raises :class:`~scaler_executor.exceptions.DaemonLost` if
  none came (``wait_for_welcome``).  A Dask ``Client`` does the same with the scheduler;
  an executor whose constructor returns and whose every future fails later, for a typo in
  the address, is the worse trap.  The embedded cluster's constructor does not wait: its
  daemon is our own child, whose exit the agent watches, and its start is part of the
  cold start the first task pays anyway.
* Once ``connect_timeout`` passed without a Welcome, every future fails with the same
  error (``watchdog.check_daemon``; the constructor's wait ends there too).

The message names the address and the likely cause.  To tell the causes apart, the
failing client probes the address once, on the way to the error: for ``ipc://``, whether
the socket file exists and accepts; for ``tcp://``, whether the host resolves and a plain
TCP connection is accepted (refused: nothing listens; no answer: a firewall drops the
packets, or the host is down).  Something that accepts a TCP connection but never answers
the handshake is not a daemon of ours, a daemon whose security keys this client lacks (a
failed CURVE handshake is silent on the connecting side, libzmq#2227), or a stalled one.

*After a Welcome* (``ListenerProbe``): a client hears from its daemon at least every
heartbeat interval of the daemon's.  When it has heard nothing for two of them, it asks
the daemon's address, without blocking, whether anything listens there, about once a
second: a refused connection (or, for ``ipc://``, a socket file gone) is positive
evidence that the daemon process is gone, not a link that is slow or down, and the
client fails its futures at once instead of after ``daemon_loss_timeout``
(bench/daemon_loss.py: 15 s before, about a second now).  A daemon restarted without a
journal would not know this client anyway (its futures fail on its answer then); silence
with no refusal (a cut link, a stalled daemon, a host gone) keeps the full
``daemon_loss_timeout``.  A daemon with a journal says so in its Welcome (``journal``,
``grace``): it may be restarted on it, so its client asks this probe only once the daemon
has been silent for the grace period too, and fails its futures after
``max(daemon_loss_timeout, grace + 2 heartbeats)`` (client/resume.py, docs/durability.rst).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
from typing import Protocol
from urllib.parse import urlsplit

from scaler_executor.exceptions import BrokenScalerExecutor, DaemonLost

PROBE_SECONDS = 1.0  # most the diagnosis's own TCP connect waits (it runs only on the way to an error)
# How often a silent daemon's address is asked whether anything listens: each probe costs
# the daemon an accepted connection that closes at once, and a dead daemon is found within
# one interval of the silence threshold (two of its heartbeat intervals).
PROBE_EVERY = 1.0


class _Agent(Protocol):
    welcome: threading.Event
    finished: threading.Event
    @property
    def broken(self) -> BaseException | None: ...

    def break_with(self, exc: BaseException) -> None: ...


def wait_for_welcome(agent: _Agent, address: str, timeout: float) -> None:
    """Return once the daemon welcomed ``agent``; else raise the error its futures got.

    The agent fails itself after ``timeout`` (``connect_timeout``); the wait here allows a
    little more so that its message, with the diagnosis, is the one raised, and the agent's
    threads are gone when this raises.

    Raises:
        DaemonLost: no Welcome within ``timeout`` (the message says why, as far as known),
            or the daemon refused this client.
        BrokenScalerExecutor: the client agent failed otherwise.
    """
    if not agent.welcome.wait(timeout + PROBE_SECONDS + 5.0) or agent.broken is not None:
        if agent.broken is None:  # the agent's own timer did not fire (its thread is stuck)
            agent.break_with(DaemonLost(no_welcome(address, timeout)))
        agent.finished.wait(PROBE_SECONDS + 5.0)
        error = agent.broken
        if isinstance(error, BrokenScalerExecutor):
            raise type(error)(*error.args) from None
        raise BrokenScalerExecutor(str(error))


def no_welcome(address: str, waited: float) -> str:
    """The one-line message of a client that heard no Welcome from ``address``."""
    return (
        f"no scaler-daemon answered at {address} within {waited:.1f} s (connect_timeout): "
        f"{likely_cause(address)}; check that scaler-daemon runs there and the address is right "
        "(or raise connect_timeout if it is only slow)"
    )


def likely_cause(address: str) -> str:
    if address.startswith("ipc://"):
        return _ipc_cause(address[len("ipc://") :])
    if address.startswith("tcp://"):
        return _tcp_cause(address)
    return "the address has no tcp:// or ipc:// scheme"


def _ipc_cause(path: str) -> str:
    if not os.path.exists(path):
        return f"there is no socket file {path}: no daemon was started there, or the path is wrong"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PROBE_SECONDS)
    try:
        sock.connect(path)
    except ConnectionRefusedError:
        return f"nothing accepts connections on {path}: its daemon died or was stopped and left the socket file"
    except PermissionError:
        return f"this user may not connect to {path}: it belongs to another user's daemon"
    except OSError as exc:
        return f"connecting to {path} fails ({exc.strerror or exc})"
    finally:
        sock.close()
    return f"something accepts connections on {path} but did not answer the handshake: not a scaler-daemon, or one that is stalled"


def _tcp_cause(address: str) -> str:
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        return f"{address} is not tcp://HOST:PORT"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return f"the host name {host!r} does not resolve"
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.settimeout(PROBE_SECONDS)
    try:
        sock.connect(where)
    except ConnectionRefusedError:
        return f"nothing listens on {host} port {port}: the daemon is not started, or the port is wrong"
    except TimeoutError:
        return f"{host} port {port} does not answer at all: a firewall drops the packets, or the host is down or wrong"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return f"{host} cannot be reached from here (no route): the host is down or wrong, or a firewall rejects it"
        return f"connecting to {host} port {port} fails ({exc.strerror or exc})"
    finally:
        sock.close()
    return (
        f"something listens on {host} port {port} but did not answer the handshake: not a scaler-daemon "
        "(wrong port), a daemon that does not accept this client's security keys (a refused CURVE "
        "handshake is silent), or a stalled daemon"
    )


class ListenerProbe:
    """Asks, without blocking, whether anything still listens at a welcomed daemon's address.

    ``check(now)`` from the agent's turn, only while the daemon has been silent past
    ``silent_after``: returns why the daemon is certainly gone (its connection is refused,
    its socket file is gone), or None (it listens, or no answer yet: the usual timeout).
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.silent_after = float("inf")  # two of the daemon's heartbeat intervals, from its Welcome
        self._target: tuple[int, object] | None = None  # (family, sockaddr), None: cannot probe
        self._sock: socket.socket | None = None  # a probe in flight (tcp)
        self._next = 0.0
        if address.startswith("ipc://"):
            self._target = (socket.AF_UNIX, address[len("ipc://") :])
        elif address.startswith("tcp://"):
            try:
                parts = urlsplit(address)
                host, port = parts.hostname, parts.port
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM) if host and port else []
            except (ValueError, OSError):
                infos = []  # then only the timeout tells
            if infos:
                self._target = (infos[0][0], infos[0][4])

    @property
    def asking(self) -> bool:
        """A tcp probe is in flight: its answer comes with a later ``check``."""
        return self._sock is not None

    def welcomed(self, daemon_heartbeat_interval: float) -> None:
        self.silent_after = 2 * daemon_heartbeat_interval

    def check(self, now: float) -> str | None:
        if self._target is None:
            return None
        if self._sock is not None:
            return self._finish()
        if now < self._next:
            return None
        self._next = now + PROBE_EVERY
        family, where = self._target
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.connect(where)  # type: ignore[arg-type]  # a sockaddr of the family's kind
        except BlockingIOError:  # tcp: in progress, or an ipc backlog that is full (someone listens)
            if family == socket.AF_UNIX:
                sock.close()
                return None
            self._sock = sock
            return self._finish()
        except FileNotFoundError:
            sock.close()
            return f"its socket file {where} is gone"
        except ConnectionRefusedError:
            sock.close()
            return "nothing accepts connections at its address any more (connection refused)"
        except OSError:
            sock.close()  # unreachable, no route...: not proof that it is gone
            return None
        sock.close()  # something listens: a stalled or restarted daemon, the usual timeout decides
        return None

    def _finish(self) -> str | None:
        sock = self._sock
        assert sock is not None
        _, writable, _ = select.select([], [sock], [], 0)
        if not writable:
            return None  # no answer yet
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        sock.close()
        self._sock = None
        if error == errno.ECONNREFUSED:
            return "nothing listens on its port any more (connection refused)"
        return None

    def quiet(self) -> None:
        """The daemon spoke again: drop a probe in flight."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        self.quiet()
