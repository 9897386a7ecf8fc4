"""``TaskFuture``: the future ``submit`` returns, a ``concurrent.futures.Future`` that is cheap while pending.

A standard ``Future`` costs ~1.6 KB at birth, ~1.35 KB of it the ``threading.Condition``
(its RLock, its waiter deque's first block, the bound methods it keeps in its
``__dict__``).  A task spends most of its life pending, and nothing touches its
future's condition until someone waits on it, asks its state, or completes it.  So
``TaskFuture`` makes the condition, and the two lists (waiters of
``concurrent.futures.wait`` and done-callbacks), on first use of any of them: ~0.1 KB
per pending task instead of ~1.6 KB.  And a future nobody waits on before it is done (a
burst of ``submit`` whose results are read later) never gets them: its running notice and
its result are applied under one module lock instead of its condition (``mark_running``,
``settle_unmade``), and ``result()`` reads a finished future without a lock.  Making the
condition on the running notice was the client's largest cost per task in such a burst.

Everything else is the standard class: every method is ``Future``'s own, reading the
same attributes, so ``wait``, ``as_completed``, ``asyncio.wrap_future`` and code that
checks ``isinstance(f, Future)`` see a normal future.  Each member is set with one
atomic ``dict.setdefault``, so two threads touching a fresh future at once get the
same condition; after that, attribute lookup finds them in the instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
    RUNNING,
)
from typing import Any, TypeVar

T = TypeVar("T")

# The members Future.__init__ makes that TaskFuture makes on first use.
LAZY_MEMBERS = ("_condition", "_waiters", "_done_callbacks")
_WAITING = (PENDING, RUNNING)

# Taken to make a future's lazy members, and by the transitions a future goes through while
# it has none (``mark_running``, ``settle_unmade``): every other reader or writer of
# ``_state`` holds the future's condition, which it has to make first, so while a future has
# no condition, holding this lock excludes all of them.  Held for a few hundred nanoseconds,
# and nothing that could start the cyclic collector (a container's allocation) runs under it.
_FIRST_USE = threading.Lock()


class _MadeOnFirstUse:
    """A non-data descriptor for one lazy member: it makes all of them on first use.

    Being a non-data descriptor (no ``__set__``), it is consulted only while the
    instance has no attribute of its name; once made, the instance's own attribute
    hides it, so later lookups cost what any attribute costs.  (A ``__getattr__``
    would do the same but turn off CPython's attribute-access specialisation for
    every attribute of the class: measurably slower on the completion path.)
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, future: Any, owner: type | None = None) -> Any:
        if future is None:
            return self
        # Installed under _FIRST_USE: a transition made without the condition (mark_running,
        # settle_unmade) is over before the condition exists, or waits until it does.  Made
        # before taking it: nothing allocated under that lock can start a collection, whose
        # finalizers (a map iterator's, say, cancelling futures) would take it again.
        members = future.__dict__
        waiters: list[Any] = []
        callbacks: list[Any] = []
        condition = threading.Condition()
        with _FIRST_USE:
            if "_condition" not in members:  # (else another thread's won: ours are dropped)
                members["_waiters"] = waiters
                members["_done_callbacks"] = callbacks
                members["_condition"] = condition
        return members[self.name]


class TaskFuture(Future[T]):
    """A ``Future`` whose condition and lists are made on first use (see the module doc).

    ``_on_cancel``, when set, decides ``cancel()``: the client agent is asked whether the
    task can still be kept from running (it may have to ask the daemon) and, if so,
    cancels the future through ``cancel_now``.  Without it ``cancel()`` is the standard
    one, plus the notification of ``wait``/``as_completed`` waiters.

    This class is the only code of the client that touches ``Future``'s private fields;
    the rest uses the small API below (``has_callbacks``, ``add_waiter``,
    ``remove_waiter``, ``mark_running``, ``settle_if_no_callbacks``, ``cancel_now``).
    """

    _condition = _MadeOnFirstUse()
    _waiters = _MadeOnFirstUse()
    _done_callbacks = _MadeOnFirstUse()
    # Set (per instance) on a sequential caller's future whose result may come to the
    # client's reply socket: result() then reads that socket on the waiting thread.
    _pickup: Callable[[TaskFuture[Any], float | None], float | None] | None = None
    # The client core's record of its task (client/state.py), set when it is submitted.
    _record: Any = None

    def __init__(self) -> None:  # Future.__init__ without LAZY_MEMBERS
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._on_cancel: Callable[[TaskFuture[Any]], bool] | None = None

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:  # final: no lock (and no condition made) to read it
            return self._Future__get_result()  # type: ignore[attr-defined,no-any-return]
        pickup = self._pickup
        if pickup is not None and self._state in _WAITING:
            timeout = pickup(self, timeout)
        return super().result(timeout)

    def cancel(self) -> bool:
        """``Future.cancel()``, exact: True only if the task will never run; a cancelled
        future is notified at once (``wait`` and ``as_completed`` count it done)."""
        state = self._state
        if state in (CANCELLED, CANCELLED_AND_NOTIFIED):
            return True
        if state != PENDING:
            return False
        hook = self._on_cancel
        if hook is not None:
            return hook(self)
        return self.cancel_now()

    def cancel_now(self) -> bool:
        """Cancel a future that is still PENDING and notify its waiters; False if it was
        not PENDING (already running or done; a cancelled one counts as True)."""
        if not Future.cancel(self):
            return False
        with self._condition:
            if self._state == CANCELLED:
                Future.set_running_or_notify_cancel(self)  # CANCELLED_AND_NOTIFIED: waiters told
        return True

    def mark_running(self) -> bool:
        """PENDING -> RUNNING, atomically (several threads may try at once); False if it was
        not PENDING.  A cancelled future is left to ``cancel_now``'s notification.

        A future nobody has waited on, asked or given a callback has no condition yet, and
        gets none: nothing waits on it to be told (most running notices find their futures
        so, and making the condition was the largest cost of a notice)."""
        members = self.__dict__
        if "_condition" not in members:
            with _FIRST_USE:
                if "_condition" not in members:
                    if self._state != PENDING:
                        return False
                    self._state = RUNNING
                    return True
        with self._condition:
            if self._state != PENDING:
                return False
            return Future.set_running_or_notify_cancel(self)

    def settle_unmade(self, ok: bool, value: Any) -> bool:
        """Complete a future that has no condition yet (so no waiter and no done-callback)
        without making one; False (nothing done) if it has one: use the standard path.  A
        future cancelled meanwhile stays cancelled (True: nothing left to do)."""
        members = self.__dict__
        if "_condition" in members:
            return False
        with _FIRST_USE:
            if "_condition" in members:
                return False
            if self._state in _WAITING:
                if ok:
                    self._result = value
                else:
                    self._exception = value
                self._state = FINISHED
            return True

    def has_callbacks(self) -> bool:
        return bool(self.__dict__.get("_done_callbacks"))

    def settle_if_no_callbacks(self, ok: bool, value: Any) -> bool:
        """Complete the future unless that would run a done-callback; False if it has one.

        The check and the completion hold the future's (reentrant) lock, so an
        ``add_done_callback`` cannot slip in between.
        """
        if self.settle_unmade(ok, value):
            return True
        with self._condition:
            if self._done_callbacks:
                return False
            if self._state == PENDING:
                Future.set_running_or_notify_cancel(self)
            if self._state == RUNNING:
                if ok:
                    self.set_result(value)
                else:
                    self.set_exception(value)
            return True

    def add_waiter(self, waiter: Any) -> bool:
        """Add a ``concurrent.futures`` waiter; False (not added) if the future is done."""
        with self._condition:
            if self._state not in _WAITING:
                return False
            self._waiters.append(waiter)
            return True

    def remove_waiter(self, waiter: Any) -> None:
        with self._condition:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _invoke_callbacks(self) -> None:
        """As ``Future``'s, but a callback raising anything (``SystemExit`` and
        ``KeyboardInterrupt`` too, which would end the standard library's loop and the
        completing thread with it) is logged and the other callbacks still run."""
        for callback in self._done_callbacks:
            try:
                callback(self)
            except BaseException:  # noqa: BLE001 - a user's callback must not end the client's thread
                LOGGER.exception("exception calling callback for %r", self)
