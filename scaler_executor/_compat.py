"""Small facts every process needs at start-up, kept free of heavy imports.

Also what the client, the worker and the managers share that is not wire protocol (the
daemon address a task's processes see, how a child process ended): this module is
below all of them, so none has to import another for it.
"""

from __future__ import annotations

import os
import platform
import signal
from typing import Any


def python_version() -> str:
    """'3.11': the part of the version that must match for pickles to travel."""
    return ".".join(platform.python_version_tuple()[:2])


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
