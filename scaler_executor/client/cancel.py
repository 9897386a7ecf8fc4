"""Cancellation: ``cancel()`` returns True only for a task that will never run.

::

    Future.cancel() ─► Cancels.request ─ the core's CancelRequested:
        UNSENT/PARKED (the daemon never had it) ─► NotifyCancelled: cancelled at once
        SENT ─► CancelTasks (without force) and AwaitAnswer: a user thread waits
                ≤ cancel_wait for TasksCancelled (CancelAnswered ─► AnswerCancel):
                dropped ─► cancelled and notified; refused ─► False
                (a client thread never waits, nor asks: False)
        LANE (running), or its result is being completed ─► no command: False

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

from scaler_executor.client.completion import CANCEL_MANY, CancelWait
from scaler_executor.client.events import (
    AwaitAnswer,
    CancelAnswered,
    CancelRequested,
    ForceCancelRequested,
    KillOnLane,
    NotifyCancelled,
)
from scaler_executor.client.state import TaskRecord
from scaler_executor.protocol import messages as m

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.future import TaskFuture


class Cancels:
    """The cancel side of one client agent (see the module doc): it reports the core's
    ``CancelRequested``, ``ForceCancelRequested`` and ``CancelAnswered`` and executes the
    commands (``NotifyCancelled``, ``AwaitAnswer``, ``AnswerCancel``, ``KillOnLane``)."""

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
        agent = self.agent
        record: TaskRecord | None = getattr(future, "_record", None)
        if record is None or record.owner is not agent.core:
            return future.cancel_now()
        own = threading.current_thread() in agent.completer.threads
        wait = None if own or agent._closed else CancelWait(1)  # (None: the core asks nobody)
        with agent.lock:
            commands = agent.core.handle(CancelRequested([record], wait, True))
        awaited: CancelWait | None = None
        for command in commands:
            match command:
                case NotifyCancelled():
                    return future.cancel_now()
                case AwaitAnswer(_, answer):
                    awaited = answer
                case _:
                    agent.execute([command])  # WAKE: the agent sends the CancelTasks
        if awaited is None:
            return False
        return awaited.result(agent.config.cancel_wait, record)

    def many(self, futures: list[Future[Any]], wait: float | None) -> None:
        """Cancel futures in one go (``shutdown(cancel_futures=True)``, a closed ``map``):
        every cancel to ask of the daemon travels in one message; waits up to ``wait``
        seconds (None: ``cancel_wait``) for the answer, on a user thread only."""
        agent = self.agent
        core = agent.core
        records = [
            record for future in futures
            if (record := getattr(future, "_record", None)) is not None and record.owner is core
            and not future.running() and not future.done()
        ]
        if not records:
            return
        group = CancelWait(0)
        with agent.lock:
            commands = core.handle(CancelRequested(records, group, False))
            for command in commands:
                if type(command) is AwaitAnswer:
                    group.expected = len(command.records)  # before the answer can come
        own = threading.current_thread() in agent.completer.threads
        for command in commands:
            match command:
                case NotifyCancelled(taken):
                    for record in taken:
                        record.future.cancel_now()
                case AwaitAnswer(asked, _):
                    group.results(0 if own else agent.config.cancel_wait if wait is None else wait, asked)
                case _:
                    agent.execute([command])

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
        agent = self.agent
        record = getattr(future, "_record", None)
        if record is None or record.owner is not agent.core:
            return False  # not one of ours
        with agent.lock:
            commands = agent.core.handle(ForceCancelRequested(record, True))
        if not commands:
            return False  # it finished meanwhile
        if type(commands[0]) is KillOnLane:
            if agent.lane.kill(record.n):
                return True
            with agent.lock:  # the lane closed: its tasks go to the daemon, which can be told
                commands = agent.core.handle(ForceCancelRequested(record, False))
        agent.execute(commands)
        return True

    def answered(self, message: m.TasksCancelled, _buffers: list[Any]) -> None:
        """The futures of dropped tasks are cancelled by the threads that wait for the
        answer, or on a pool thread if none waits any more."""
        with self.agent.lock:
            commands = self.agent.core.handle(CancelAnswered(message.cancelled, message.refused))
        self.agent.execute(commands)  # AnswerCancel, each
