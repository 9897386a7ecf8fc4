"""A processor runs each task with its client's ``multiprocessing`` authkey, when it has it.

``multiprocessing.Manager()`` proxies in a task's arguments (or in a by-value function's
globals) connect to their manager as they are unpickled, with
``multiprocessing.current_process().authkey``; a proxy keeps the key it was built with.
The key is set from the client's key file (``client/authkey.py`` says how the path travels
and why the key itself never does) before the task's function and arguments are unpickled.
It is switched only when a task's client differs from the previous task's: the processor's
own key is back before a task of another client, or one without a key file, starts, so no
task runs with another client's key, while a run of one client's tasks (the usual case)
costs a string comparison a task instead of setting and restoring the key around each
(``docs/performance.rst``, "Won back").  Between two tasks the processor runs no user code.

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
    """The authkeys of this processor's clients, read once per key file; ``key_file`` names
    the one set now ("": the processor's own)."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.errors: dict[str, OSError] = {}
        self.process = multiprocessing.current_process()  # this process's for good (a fork's own)
        self.key_file = ""
        self.own: bytes = b""  # the processor's key while a client's is set

    def use(self, key_file: str) -> None:
        """Run the next task with the key of its client (``key_file``; "" or a file that
        cannot be read: the processor's own key)."""
        if key_file == self.key_file:
            return
        key = self._read(key_file) if key_file else None
        process = self.process
        if self.key_file:
            process.authkey = self.own
            self.key_file = ""
        if key is not None:
            self.own = process.authkey
            process.authkey = key
            self.key_file = key_file

    def release(self) -> None:
        """The processor's own key back."""
        self.use("")

    def _read(self, key_file: str) -> bytes | None:
        key = self.keys.get(key_file)
        if key is None and key_file not in self.errors:
            try:
                with open(key_file, "rb") as f:
                    key = self.keys[key_file] = f.read()
            except OSError as exc:
                self.errors[key_file] = exc
        return key

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
