"""What the command-line programs share: logging set-up and the TCP warning."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from scaler_executor.config import ClusterConfig

log = logging.getLogger("scaler_executor")


def setup_logging(config: ClusterConfig, role: str) -> None:
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def check_tcp(config: ClusterConfig, address: str) -> None:
    """TCP reaches other hosts: say plainly that nothing authenticates them yet."""
    if not address.startswith("tcp://"):
        return
    if not config.allow_tcp_unauthenticated:
        raise SystemExit(
            f"refusing to use {address}: TCP without keys lets anyone who can reach the port run code "
            "here, and allow_tcp_unauthenticated is off. Use an ipc:// address, or allow it with "
            "--allow-tcp-unauthenticated on a trusted network."
        )
    log.warning(
        "%s is TCP without authentication: anyone who can reach this port can run code on the "
        "cluster. Use it only on a trusted network.",
        address,
    )


def read_initializer(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def tune_gc() -> None:
    """Garbage collection for a long-lived daemon or agent holding many records.

    What was imported at start-up is frozen out of every collection, and full collections
    become rare: the records these processes keep (tasks, workers) form no cycles, and a
    full pass over a million of them stalls the process for seconds — long enough for its
    peers to declare it dead. No collection first: after the imports it took ~17 ms (on the
    cold start's path, in the daemon and in each worker) to free a few dozen objects.
    """
    import gc

    gc.freeze()
    gc.set_threshold(20_000, 50, 1_000)


def exit_now(code: int) -> NoReturn:
    """End this daemon or worker process with ``code``, without the interpreter's finalization.

    By the time ``main`` returns, everything this process owns is stopped and closed (its
    children waited for, its sockets closed, its store region unlinked); what finalization
    would add is clearing a few hundred modules, ~10 ms of CPU per process on a 2-core VM
    and several times that when the machine is busy, paid in series by the worker and then
    the daemon while a client's ``shutdown()`` waits. So: flush the logs and the standard
    streams, then ``os._exit``. Not while ZeroMQ is loaded (tcp://): a socket's linger may
    still be delivering a Goodbye, which only a normal exit waits for.
    """
    if "zmq" in sys.modules:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone: nothing more to say
            pass
    os._exit(code)
