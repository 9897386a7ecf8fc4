"""Small facts every process needs at start-up, kept free of heavy imports.

Also what the client, the worker and the managers share that is not wire protocol (the
daemon address a task's processes see, how a child process ended): this module is
below all of them, so none has to import another for it.
"""

from __future__ import annotations

import math
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # not typing's: see scaler_executor/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def python_version() -> str:
    """'3.11': the part of the version that must match for pickles to travel."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"  # platform.python_version_tuple()'s, without importing platform


# Set by worker agents for the processes that run tasks: the daemon that get_executor() joins.
DAEMON_ADDRESS_ENV = "SCALER_DAEMON_ADDRESS"

# In a processor (a worker's child that runs tasks): its state, worker/processor.py's
# _ProcessorState, which code inside a task asks things of (get_executor secedes through
# it). None in every other process.
PROCESSOR: Any = None


def describe_wait_status(status: int) -> str:
    """'exit code 3', 'killed by signal SIGKILL', … from a waitpid status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        extra = " (segmentation fault)" if sig == signal.SIGSEGV else ""
        return f"killed by signal {name}{extra}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


def exited_within(pid: int, timeout: float, exited: Callable[[], bool]) -> bool:
    """Whether the child ``pid`` exits within ``timeout`` seconds; does not reap it.

    Waits on a pidfd, so it returns the moment the child exits: ``Popen.wait(timeout)``
    sleeps in steps of up to 50 ms instead, which a stopping cluster paid once per process
    it waited for.  Without pidfds (not Linux >= 5.3) it polls ``exited()`` (which may reap
    the child) every few milliseconds."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while not exited():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.005)
        return True
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(max(0, math.ceil(timeout * 1000))))
    finally:
        os.close(pidfd)
