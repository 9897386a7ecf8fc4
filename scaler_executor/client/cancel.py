"""Cancellation: ``cancel()`` returns True only for a task that will never run.

::

    Future.cancel() ─► Cancels.request ─ core.cancel(record):
        "taken"  (UNSENT/PARKED: the daemon never had it) ─► cancelled and notified at once
        "ask"    (SENT) ─► CancelTasks (without force); a user thread waits ≤ cancel_wait
                 for TasksCancelled: dropped ─► cancelled and notified; refused ─► False
                 (a client thread never waits: False)
        "no"     (LANE: running; or its result is being completed) ─► False

* Cancels made together (``shutdown(cancel_futures=True)``, a closed ``map``: ``many``)
  travel in one message and share one ``CancelWait``.
* A task the daemon dropped after its canceller stopped waiting is cancelled (and its
  future notified) on a pool thread when the answer comes.
* ``force`` (``ex.cancel(f, force=True)``) kills a running task's processor: down the
  lane for a lane task, through the daemon otherwise.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from scaler_executor.client.completion import CANCEL_MANY, CANCELLED, CancelWait
from scaler_executor.client.state import FORCE_CANCEL, TaskRecord
from scaler_executor.protocol import messages as m

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.future import TaskFuture


class Cancels:
    """The cancel side of one client agent (see the module doc)."""

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent

    def request(self, future: TaskFuture[Any]) -> bool:
        """``cancel()`` of a PENDING future of ours (the hook every future shares: one
        bound method, where a ``partial`` per future cost ~200 bytes of each pending task).

        True only if the task will never run.  A task the client still holds (in the
        outbox, or parked) is taken back on the spot.  One the daemon may hold is asked
        of the daemon (``CancelTasks``, answered by ``TasksCancelled``), and a user thread
        waits up to ``cancel_wait`` for the answer; on a thread of the client's own (a
        done-callback, a ``map`` iterator closed there) it never waits and answers False.
        """
        record: TaskRecord | None = getattr(future, "_record", None)
        if record is None or record.owner is not self.agent.core:
            return future.cancel_now()
        with self.agent.lock:
            verdict = self.agent.core.cancel(record)
            wait: CancelWait | None = record.cancel
            own = threading.current_thread() in self.agent.completer.threads
            if verdict == "ask" and wait is None and not own and self.agent.broken is None and not self.agent._closed:
                wait = CancelWait(1)
                self.agent.core.ask_cancel(record, wait)
                asked = True
            else:
                asked = False
        if verdict == "taken":
            return future.cancel_now()
        if verdict == "no" or wait is None or own:
            return False
        if asked:
            self.agent.wake()
        return wait.result(self.agent.config.cancel_wait, record)

    def many(self, futures: list[Future[Any]], wait: float | None) -> None:
        """Cancel futures in one go (``shutdown(cancel_futures=True)``, a closed ``map``):
        every cancel to ask of the daemon travels in one message; waits up to ``wait``
        seconds (None: ``cancel_wait``) for the answer, on a user thread only."""
        taken: list[TaskFuture[Any]] = []
        asked: list[TaskRecord] = []
        group = CancelWait(0)
        core = self.agent.core
        with self.agent.lock:
            for future in futures:
                record = getattr(future, "_record", None)
                if record is None or record.owner is not core or future.running() or future.done():
                    continue
                verdict = core.cancel(record)
                if verdict == "taken":
                    taken.append(record.future)
                elif verdict == "ask" and record.cancel is None and self.agent.broken is None:
                    group.expected += 1
                    core.ask_cancel(record, group)
                    asked.append(record)
        if asked:
            self.agent.wake()
        for future in taken:
            future.cancel_now()
        if asked:
            own = threading.current_thread() in self.agent.completer.threads
            group.results(0 if own else self.agent.config.cancel_wait if wait is None else wait, asked)

    def later(self, futures: list[Future[Any]]) -> None:
        """``many`` on a pool thread: for code a finalizer may run (a ``map``
        iterator closed by the garbage collector), which must take no lock: the thread it
        runs on may hold the agent's lock already."""
        self.agent.completer.put(CANCEL_MANY, futures)

    def force(self, future: Future[Any], force: bool) -> bool:
        """``Future.cancel()``, plus killing the process running it when ``force``."""
        if future.cancel():
            return True
        if not force or future.done():
            return False
        record = getattr(future, "_record", None)
        if record is None or record.owner is not self.agent.core or self.agent.core.records.get(record.n) is not record:
            return False  # not one of ours, or it finished meanwhile
        if self.agent.lane.holds(record.n) and self.agent.lane.kill(record.n):
            return True
        self.agent.core.outbox.append((FORCE_CANCEL, record.n))
        if self.agent.resume.journal:  # named again when resuming: its daemon may be down now
            with self.agent.lock:
                self.agent.resume.force_cancelled(self.agent.core, record.n)
        self.agent.wake()
        return True

    def answered(self, message: m.TasksCancelled, _buffers: list[Any]) -> None:
        """The futures of dropped tasks are cancelled by the threads that wait for the
        answer, or on a pool thread if none waits any more."""
        with self.agent.lock:
            answers = self.agent.core.cancel_answered(message)
        for record, verdict in answers:
            wait, record.cancel = record.cancel, None
            if wait.answer(record, verdict) and verdict:
                self.agent.completer.put(CANCELLED, record.future)
