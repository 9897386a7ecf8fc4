"""What the command-line programs share: logging set-up, security on tcp://, user errors.

A user's mistake (a bad flag value, an address without a scheme, an unreadable config file,
a port already taken) ends a command with one line on stderr naming the fix, never a
traceback: exit status 2 for what is wrong on the command line or in the configuration
(argparse's usage status), 1 for what the environment refuses (the port is in use).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, NoReturn

from scaler_executor.config import WARNED_ENV, ClusterConfig, config_from_args, warned_env
from scaler_executor.exceptions import ConfigError

if TYPE_CHECKING:
    from scaler_executor.security.client import ClientSecurity
    from scaler_executor.security.keys import SecurityDir

log = logging.getLogger("scaler_executor")

USAGE_ERROR = 2  # argparse's own status for a bad command line
FAILED = 1


def fail(prog: str, message: str, status: int = USAGE_ERROR) -> NoReturn:
    """End the command with ``prog: error: message`` on one line of stderr."""
    sys.stderr.write(f"{prog}: error: {' '.join(message.split())}\n")
    raise SystemExit(status)


class Parser(argparse.ArgumentParser):
    """argparse with the one-line error of every other user error: the usage of a command
    with thirty flags is twenty lines that bury the one that says what is wrong."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # one spelling per flag: no prefixes a new flag would break
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (--help lists every flag)")


def load_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ClusterConfig:
    """The configuration for ``args`` (flags > environment > file); a bad value or file ends
    the command with one line naming it.  Warnings about the environment (a near-miss
    ``SCALER_*`` variable) print as one ``prog: warning: ...`` line each."""

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        return f"{parser.prog}: warning: {message}\n"

    warnings.formatwarning = one_line  # this process is the command: its warnings are its own
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        fail(parser.prog, str(exc))
    # The workers this command starts inherit the variables, not the warning.
    inherited = set(filter(None, os.environ.get(WARNED_ENV, "").split(",")))
    if warned_env() - inherited:
        os.environ[WARNED_ENV] = ",".join(sorted(warned_env() | inherited))
    return config


def bind_failure(prog: str, address: str, exc: BaseException) -> None:
    """Exit with one line if ``exc`` is ``address`` refusing to bind (OSError or ZMQError,
    both with the system's ``errno``); return for anything else, which is a bug to show."""
    code = getattr(exc, "errno", None)
    if code == errno.EADDRINUSE:
        if address.startswith("ipc://"):
            fix = (
                f"another daemon serves it, or a killed one left its socket file: stop that daemon,"
                f" or remove {address[len('ipc://'):]} if none runs"
            )
        else:
            fix = "another process holds the port (another daemon?): stop it, or choose another port in --address"
        fail(prog, f"cannot listen on {address}: the address is already in use; {fix}", FAILED)
    if code in (errno.EADDRNOTAVAIL, errno.EACCES, errno.ENOENT, errno.ENODEV, errno.EINVAL):
        reason = getattr(exc, "strerror", None) or str(exc)
        fail(
            prog,
            f"cannot listen on {address}: {reason}; choose a host name or address of this machine, a port"
            " this user may bind (1024 and up), or for ipc:// a path in an existing, writable directory",
            FAILED,
        )


def setup_logging(config: ClusterConfig, role: str) -> None:
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def daemon_security(config: ClusterConfig, address: str) -> SecurityDir | None:
    """The daemon's security directory for ``address`` (None: ipc://, or --insecure, which
    warns); exits with the reason when tcp:// has neither."""
    from scaler_executor.security import for_daemon

    try:
        return for_daemon(config, address)
    except ConfigError as exc:
        fail("scaler-daemon", str(exc))


def connecting_security(config: ClusterConfig, address: str, role: str, program: str) -> ClientSecurity | None:
    """CURVE for a command connecting to ``address`` as ``role``; exits with the reason when
    tcp:// has neither a credential nor --insecure."""
    from scaler_executor.security import for_connecting

    try:
        return for_connecting(config, address, role)
    except ConfigError as exc:
        fail(program, str(exc))


def read_initializer(path: str | None, prog: str = "scaler-worker") -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        fail(prog, f"cannot read --initializer {path}: {exc.strerror or exc}; fix the path")


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
