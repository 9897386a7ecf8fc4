"""The first handshake with a running daemon: how long a client waits, and what it says
when no Welcome comes.

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
  error (the agent's ``_check_daemon``; the constructor's wait ends there too).

The message names the address and the likely cause.  To tell the causes apart, the
failing client probes the address once, on the way to the error: for ``ipc://``, whether
the socket file exists and accepts; for ``tcp://``, whether the host resolves and a plain
TCP connection is accepted (refused: nothing listens; no answer: a firewall drops the
packets, or the host is down).  Something that accepts a TCP connection but never answers
the handshake is not a daemon of ours, a daemon whose security keys this client lacks (a
failed CURVE handshake is silent on the connecting side, libzmq#2227), or a stalled one.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from typing import Protocol
from urllib.parse import urlsplit

from scaler_executor.exceptions import BrokenScalerExecutor, DaemonLost

PROBE_SECONDS = 1.0  # most the diagnosis's own TCP connect waits (it runs only on the way to an error)


class _Agent(Protocol):
    welcome: threading.Event
    finished: threading.Event
    broken: BaseException | None

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
