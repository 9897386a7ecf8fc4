"""The client's pending limits: ``max_pending_tasks`` and ``max_pending_bytes``.

A task is *pending* from ``submit`` until its future completes (or the executor breaks):
it holds its pickled arguments here, a record in the daemon and, once sent, memory in the
daemon.  At a limit, ``submit`` on a user thread waits until a pending task completes
(``pending_full="block"``, unlike the standard pools, whose queues are unbounded) or
raises :class:`~scaler_executor.exceptions.PendingLimitReached` (``pending_full="raise"``).
On the client's own threads (the agent's and the completion threads, which run
done-callbacks) it always raises: they are the threads that complete tasks, so waiting
there for room would never end.

A task larger than ``max_pending_bytes`` by itself is admitted when nothing else is
pending, so no submit can wait for ever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from scaler_executor.exceptions import PendingLimitReached


class PendingLimit:
    """Counts pending tasks and their bytes; ``charge`` admits one, ``free`` releases it."""

    def __init__(self, max_tasks: int, max_bytes: int, block: bool, own_thread: Callable[[], bool]) -> None:
        self.max_tasks = max_tasks
        self.max_bytes = max_bytes
        self.block = block
        self._own_thread = own_thread
        # Taken directly on the way through (charge and free run once per task: through
        # Condition's own __enter__ and __exit__ the pair cost 0.7 us); the condition over it
        # only for a submit that waits for room.  Reentrant: a collection during ``charge``
        # may close a map iterator, whose cancels free their tasks on this thread.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self.tasks = 0
        self.bytes = 0
        self._waiting = 0
        self._closed = False

    def _full(self, size: int) -> bool:
        if self.tasks == 0:
            return False
        return self.tasks >= self.max_tasks or self.bytes + size > self.max_bytes

    def charge(self, size: int) -> None:
        """Admit one task of ``size`` bytes, waiting for room or raising at a limit."""
        with self._lock:
            tasks = self.tasks
            if tasks and (tasks >= self.max_tasks or self.bytes + size > self.max_bytes) and not self._closed:
                if not self.block or self._own_thread():
                    raise PendingLimitReached(self._describe(size))
                self._waiting += 1
                try:
                    while self._full(size) and not self._closed:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
            self.tasks += 1
            self.bytes += size

    def free(self, size: int) -> None:
        """A task charged ``size`` bytes is no longer pending."""
        with self._lock:
            self.tasks -= 1
            self.bytes -= size
            if self._waiting:
                self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting submit (the executor is shutting down or broke: it raises)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _describe(self, size: int) -> str:
        if self.tasks >= self.max_tasks:
            what = f"{self.tasks} tasks are pending (max_pending_tasks={self.max_tasks})"
        else:
            what = f"{self.bytes} bytes of arguments are pending and this task has {size} (max_pending_bytes={self.max_bytes})"
        where = (
            "on the client's own thread (a done-callback), which may not wait for room"
            if self._own_thread()
            else "and pending_full='raise'"
        )
        return (
            f"cannot submit: {what}, {where}; wait for some futures to complete first, "
            "or raise the limit"
        )
