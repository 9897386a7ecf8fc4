"""A processor runs each task with its client's ``multiprocessing`` authkey, when it has it.

``multiprocessing.Manager()`` proxies in a task's arguments (or in a by-value function's
globals) connect to their manager as they are unpickled, with
``multiprocessing.current_process().authkey``; a proxy keeps the key it was built with.
The key is set from the client's key file (``client/authkey.py`` says how the path travels
and why the key itself never does) before the task's function and arguments are unpickled,
and the processor's own key is back once the task ends, so a later task of another client
never runs with it.

A proxy that cannot connect (no key here because the client is on another host, a key file
this user cannot read) fails with :class:`~scaler_executor.exceptions.ProxyUnavailable`
saying why, instead of the raw ``AuthenticationError`` or ``FileNotFoundError``.
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
from types import TracebackType

from scaler_executor.exceptions import ProxyUnavailable


class ClientKeys:
    """The authkeys of this processor's clients, read once per key file."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.errors: dict[str, OSError] = {}
        self.process = multiprocessing.current_process()  # this process's for good (a fork's own)

    def use(self, key_file: str) -> bytes | None:
        """Set the authkey of the task's client; returns the key to restore (None: unchanged)."""
        if not key_file:
            return None
        key = self.keys.get(key_file)
        if key is None:
            if key_file in self.errors:
                return None
            try:
                with open(key_file, "rb") as f:
                    key = f.read()
            except OSError as exc:
                self.errors[key_file] = exc
                return None
            self.keys[key_file] = key
        # About 0.5 us for the set and the restore together, per task of a client on this host.
        process = self.process
        saved: bytes = process.authkey
        process.authkey = key
        return saved

    def restore(self, saved: bytes | None) -> None:
        if saved is not None:
            self.process.authkey = saved

    def explain(self, exc: BaseException, key_file: str, what: str) -> BaseException:
        """``exc``, or a ProxyUnavailable that says why, when ``exc`` came from a manager
        proxy connecting while ``what`` (the arguments, the function) was unpickled."""
        if not _from_manager(exc.__traceback__):
            return exc
        host = socket.gethostname()
        if not key_file:
            reason = (
                f"this worker (host {host}) is not on the client's host, and a client's "
                "multiprocessing authkey is never given to processors on other hosts: with it, a "
                "worker could run code in the client through the manager's pickle protocol (and a "
                "manager on a Unix socket, the default, cannot be reached from another host anyway)"
            )
            fix = "run the task on a worker on the client's host, or pass plain values and return results instead"
        elif key_file in self.errors:
            reason = (
                f"this processor (host {host}) could not read the client's authkey file {key_file} "
                f"({self.errors[key_file].strerror}): the worker runs as another user than the client"
            )
            fix = "run the worker as the client's user"
        else:
            return exc  # the key was set: the manager itself is gone or refused (the error says which)
        error = ProxyUnavailable(
            f"a multiprocessing.Manager() proxy in {what} cannot connect to its manager: {reason}; {fix}"
        )
        error.__cause__ = exc
        return error


def _from_manager(tb: TracebackType | None) -> bool:
    managers = sys.modules.get("multiprocessing.managers")
    if managers is None:
        return False
    name = managers.__file__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == name:
            return True
        tb = tb.tb_next
    return False
