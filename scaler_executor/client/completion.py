"""Completion: the one place where the client's futures are settled.

Every ``set_result``, ``set_exception`` and running/cancelled transition of a task's
future goes through this module (``settle``, ``Completion``) or ``TaskFuture``'s own
methods (``mark_running``, ``cancel_now``, ``settle_if_no_callbacks``) that it calls.
A result or a running notice is an event for the client core (``state.py``:
``result_in``, ``running_in``, ``handle``); ``Completion.execute`` carries out the
commands it returns (``Settle``, ``Resend``, ``MarkRunning``, ``FailTasks``).

::

    result read by the agent thread ─► Completer: a pool thread settles it, runs callbacks
    result picked up by its own caller (routes.ReplyInbox) ─► settled on that thread,
        unless the future has done-callbacks: those run on a pool thread

* ``Completer`` is the client's thread pool: one thread holds the agent role (socket,
  heartbeats, outbox) and never runs user code; the others complete futures.
* A result whose decoding raises anything fails its future (``ResultUnreadable``); a
  done-callback that raises (``SystemExit`` included) is logged and the thread goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scaler_executor.client import serialization as ser
from scaler_executor.client.events import (
    Broken,
    Command,
    Fail,
    FailTasks,
    MarkRunning,
    Resend,
    Settle,
)
from scaler_executor.client.forward import Forwarder
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.state import TaskRecord
from scaler_executor.exceptions import BrokenScalerExecutor, ResultUnreadable
from scaler_executor.protocol import messages as m
from scaler_executor.protocol import output as capture
from scaler_executor.protocol.messages import Status

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent

log = logging.getLogger("scaler_executor.client")



@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What is known about a finished task (``scaler_executor.task_info(future)``).

    Times are wall-clock seconds (``time.time()``); ``started``/``finished`` come from the
    worker's clock.  ``peak_memory`` is the highest private memory (RssAnon) of the process
    that ran it, sampled every 100 ms and at the end of tasks of 10 ms or more; 0 if unknown.

    ``stdout``, ``stderr``: what a task submitted with ``capture_output=True`` wrote to
    them (at most ``capture_output_limit`` bytes each: head and tail around a note), also
    when it failed, and up to its death when its process died; ``logs``: its log records
    as ``(created, levelname, logger name, message)``.  None without ``capture_output``.
    A task whose process died has no worker facts (``worker`` is "", times are 0).
    """

    task_id: int
    worker: str
    submitted: float
    started: float
    finished: float
    attempts: int
    peak_memory: int
    stdout: str | None = None
    stderr: str | None = None
    logs: tuple[tuple[float, str, str, str], ...] | None = None

    @property
    def queued_seconds(self) -> float:
        return max(0.0, self.started - self.submitted) if self.started else 0.0

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)


def task_info_of(future: Future[Any]) -> TaskInfo | None:
    facts = getattr(future, "_scaler_facts", None)
    output = getattr(future, "_scaler_output", None)
    if output is None:
        return None if facts is None else TaskInfo(*facts)
    if facts is None:
        facts = (0, "", 0.0, 0.0, 0.0, 0, 0)
    stdout, stderr, logs = capture.decode(output)
    return dataclasses.replace(TaskInfo(*facts), stdout=stdout, stderr=stderr, logs=logs)


def settle(future: Future[Any], ok: bool, value: Any) -> None:
    """Complete ``future`` (PENDING or RUNNING) with a value or an exception; a future
    cancelled meanwhile stays cancelled."""
    if isinstance(future, TaskFuture):
        if future.settle_unmade(ok, value):
            return
        future.mark_running()
    elif not future.running() and not future.set_running_or_notify_cancel():
        return
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except InvalidStateError:
        pass  # cancelled before it was marked running


class Completion:
    """Completes futures from results, notices and failures of one client agent."""

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.core = agent.core
        config = agent.config
        self.forwarder = Forwarder(config.forward_output_rate) if config.forward_output else None

    def complete(self, result: m.TaskResult, quietly: bool = False) -> None:
        """Complete one future from its result (on a completion thread, where it runs its
        callbacks; or ``quietly`` on a caller's thread that picked its own result up,
        where callbacks, if any, are still handed to a pool thread)."""
        command = self.core.result_in(result)  # the core's command for it (state.py)
        if type(command) is Settle:  # (the common one, without execute's dispatch)
            self._settle(command.record, command.result, quietly)
        elif command is not None:
            self.execute(command, quietly)

    def execute(self, command: Command, quietly: bool = False) -> None:
        """Carry out one of the core's commands (``ClientCore.handle``)."""
        match command:
            case Settle(record, result):
                self._settle(record, result, quietly)
            case Resend(n):
                self.agent.resend(n)
            case MarkRunning(records):
                for record in records:
                    record.future.mark_running()
            case Fail(record, error):
                settle(record.future, False, error)
            case FailTasks(records, error):
                self._fail(records, error)
            case _:
                raise TypeError(f"not a command for completion.py: {command!r}")

    def _settle(self, record: TaskRecord, result: m.TaskResult, quietly: bool) -> None:
        future = record.future
        try:
            ok, value = self._outcome(result, record)
        except BaseException as exc:  # noqa: BLE001 - nothing may leave a future pending forever
            ok, value = False, ResultUnreadable(
                f"the client could not read the result of task {result.task_id:#x} "
                f"(status {result.status}): {exc!r}"
            )
            value.__cause__ = exc
        if ok is None:
            return  # cancelled, unrun (a dependency was cancelled)
        if quietly:
            if not future.settle_if_no_callbacks(ok, value):
                self.agent.completer.put(SET_RESULT, (future, ok, value))  # callbacks: a pool thread's
            return
        settle(future, ok, value)

    def _outcome(self, result: m.TaskResult, record: TaskRecord) -> tuple[Any, Any]:
        """(ok, value) of a result; (None, None) once its future was cancelled here."""
        future = record.future
        if result.status == Status.CANCELLED and future.cancel_now():
            return None, None  # a dependency was cancelled: so is this, unrun
        facts = result.facts
        if facts.worker:
            # A plain attribute on the future (built into a TaskInfo only when asked for):
            # a weak dictionary entry per task cost ~5% of the client's time at full rate.
            future._scaler_facts = (
                result.task_id, facts.worker, record.submitted, facts.started, facts.finished,
                result.attempt + 1, facts.peak_memory,
            )
        if result.output:
            future._scaler_output = result.output  # decoded when task_info() asks
            if self.forwarder is not None:
                stdout, stderr, _ = capture.decode(result.output)
                self.forwarder.forward(facts.worker or "(its process died)", result.task_id, stdout, stderr)
        if result.objects:
            try:
                return True, self.agent.packer.load_value(result.payload, result.objects)
            except Exception as exc:  # noqa: BLE001 - whatever reading the result raises is the future's exception
                exc.add_note(f"while reading the result of task {result.task_id:#x} from the object store")
                return False, exc
            finally:
                self.agent.release_objects(result.objects)  # our views keep them alive as long as needed
        ok, value = ser.outcome(result.status, result.payload, result.task_id)
        if not ok and result.output:
            stdout, stderr, _ = capture.decode(result.output)
            note = capture.tail_note(stdout, stderr)
            if note:
                value.add_note(note + "\n(all of it: scaler_executor.task_info(future).stdout / .stderr)")
        return ok, value

    def mark_running(self, task_ids: list[int]) -> None:
        running = self.core.running_in(task_ids)
        if running is not None:
            self.execute(running)

    def fail_all(self, exc: BaseException) -> None:
        agent = self.agent
        with agent.lock:
            commands = self.core.handle(Broken(exc))
        for command in commands:
            self.execute(command)
        for waiters in (agent.stats_waiters, agent.fetch_waiters, agent.history_waiters):
            while waiters:
                try:
                    waiters.popleft().set_exception(type(exc)(*exc.args))
                except InvalidStateError:
                    pass

    @staticmethod
    def _fail(records: list[TaskRecord], exc: BaseException) -> None:
        for record in records:
            if record.cancel is not None:
                record.cancel.event.set()  # no answer will come: cancel() returns False at once
            if record.future is not None:
                settle(record.future, False, type(exc)(*exc.args) if exc.__cause__ is None else exc)


class CancelWait:
    """The daemon's answer to cancels (``TasksCancelled``), awaited by the thread(s) that
    asked: one task's (``Future.cancel()``) or many's (``cancel_many``)."""

    __slots__ = ("lock", "event", "expected", "verdicts", "abandoned")

    def __init__(self, expected: int) -> None:
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.expected = expected
        self.verdicts: dict[int, bool] = {}
        self.abandoned = False

    def answer(self, record: TaskRecord, verdict: bool) -> bool:
        """Record the daemon's verdict; True if no thread waits for it any more (the
        caller then cancels a dropped task's future on a pool thread)."""
        with self.lock:
            self.verdicts[id(record)] = verdict
            if len(self.verdicts) >= self.expected:
                self.event.set()
            return self.abandoned

    def result(self, timeout: float, record: TaskRecord) -> bool:
        self.event.wait(timeout)
        with self.lock:
            verdict = self.verdicts.get(id(record))
            if verdict is None:
                self.abandoned = True  # a later answer cancels it on a pool thread
                return False
        return record.future.cancel_now() if verdict else False

    def results(self, timeout: float, asked: list[TaskRecord]) -> None:
        if timeout > 0:
            self.event.wait(timeout)
        with self.lock:
            dropped = [record.future for record in asked if self.verdicts.get(id(record))]
            self.abandoned = True
        for future in dropped:
            future.cancel_now()


RESULTS, RUNNING, FAIL_ALL, SET_RESULT = "results", "running", "fail-all", "set-result"
CANCELLED = "cancelled"  # a future whose task the daemon dropped after its canceller stopped waiting
CANCEL_MANY = "cancel-many"  # futures to cancel, handed over by code a finalizer may run
STUCK_SECONDS = 0.1  # a completion thread busy this long in one item is presumed in a slow callback
MAX_COMPLETION_THREADS = 32


class Completer:
    """The client's thread pool: one thread holds the agent role, the others complete futures.

    The agent role (socket, heartbeats, outbox) is never held by a thread running user
    code: done-callbacks run only on threads that have handed the role on.

    * Work items are taken one at a time from a shared queue, so when a done-callback is
      slow, only its own future's item waits: the agent notices a thread stuck in one item
      (``check``) and starts another, which carries on with the rest.
    * The agent role stays on the first thread (``agent_thread``) for the agent's life.
      (A leader/follower hand-off of the role to an idle thread, and the agent thread
      completing a few "quiet" results itself, were removed: measured with every other
      fast path on, the hand-off's gain included zero and quiet results cost 8 % of burst
      throughput; docs/performance.rst.)
    * Order within a future is kept: a result arriving before its RUNNING notice marks
      the future running itself.
    """

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.completion = agent.completion
        self.work: deque[tuple[str, Any]] = deque()
        self.cond = threading.Condition()
        self.busy: dict[int, float] = {}  # thread ident -> when it took its current item
        self.threads: list[threading.Thread] = []
        self.idle = 0  # threads waiting for work
        self.stopping = False
        self.unkicked = False  # results queued since the last notify
        self.agent_thread: threading.Thread | None = None  # the thread holding the agent role
        # Set once every thread of start() runs: the agent role's first work (connect,
        # Hello, the reply inbox, the authkey) holds the interpreter lock for milliseconds,
        # and started beside the constructor it made the constructor wait for that lock.
        self._go = threading.Event()

    def start(self) -> None:
        try:
            self._start_thread(agent_role=True)
            self._start_thread()
        finally:  # also when the second thread cannot start: the agent thread must not wait forever
            self._go.set()

    def _start_thread(self, agent_role: bool = False) -> None:
        thread = threading.Thread(
            target=self._main, args=(agent_role,), name=f"scaler-client-{len(self.threads)}", daemon=True
        )
        self.threads.append(thread)
        if agent_role:
            self.agent_thread = thread
        thread.start()

    def put(self, kind: str, data: Any) -> None:
        self.work.append((kind, data))
        with self.cond:
            self.cond.notify()

    def put_results(self, results: list[m.TaskResult]) -> None:
        """Queue results; the agent calls ``kick`` once it is about to block.

        Woken earlier, a completion thread would only wait for the interpreter lock
        while the agent finishes its turn: kicked last, it runs as the agent blocks.
        """
        self.work.extend((RESULTS, r) for r in results)
        self.unkicked = True

    def kick(self) -> None:
        self.unkicked = False
        with self.cond:
            self.cond.notify()

    def check(self, now: float) -> None:
        """Start another thread if work waits while every other thread is stuck in one item."""
        if not self.work or len(self.threads) >= MAX_COMPLETION_THREADS:
            return
        busy = list(self.busy.values())
        if len(busy) >= len(self.threads) - 1 and all(now - since > STUCK_SECONDS for since in busy):
            self._start_thread()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def join(self) -> None:
        for thread in list(self.threads):
            if thread is not threading.current_thread():
                thread.join()

    def _main(self, agent_role: bool) -> None:
        block_signals()
        if agent_role:
            agent = self.agent
            self._go.wait()
            try:
                agent.start()
            except Exception as exc:
                log.exception("client agent could not start")
                agent.break_with(BrokenScalerExecutor(f"the client agent could not start: {exc!r}"))
                self.stop()
                agent.finished.set()
            else:
                agent.agent_turns()
        self._loop()

    def _complete(self, kind: str, data: Any) -> None:
        completion = self.completion
        try:
            if kind == RESULTS:
                completion.complete(data)
            elif kind == RUNNING:
                completion.mark_running(data)
            elif kind == FAIL_ALL:
                completion.fail_all(data)
            elif kind == SET_RESULT:  # the agent thread found done-callbacks to run: here
                future, ok, value = data
                settle(future, ok, value)
            elif kind == CANCELLED:
                data.cancel_now()
            elif kind == CANCEL_MANY:
                self.agent.cancels.many(data, 0)
            else:
                raise ValueError(f"unknown completion item {kind!r}")
        except BaseException:  # a bug (or SystemExit) must not end a thread that completes futures
            log.exception("client: failed to complete a future")

    def _loop(self) -> None:
        me = threading.get_ident()
        work = self.work
        while True:
            try:
                kind, data = work.popleft()
            except IndexError:
                with self.cond:
                    while not work and not self.stopping:
                        self.idle += 1
                        try:
                            self.cond.wait()
                        finally:
                            self.idle -= 1
                    if self.stopping and not work:
                        return
                continue
            self.busy[me] = time.monotonic()
            try:
                self._complete(kind, data)
            finally:
                del self.busy[me]
                kind = data = None  # type: ignore[assignment]  # hold no result while waiting for the next item (kind is rebound before use)


def block_signals() -> None:
    """Keep process-directed signals (Ctrl-C's SIGINT above all) off this background thread.

    The kernel delivers such a signal to any thread that does not block it; one delivered
    here would not wake the main thread blocked in ``future.result()``, and Ctrl-C would
    seem to do nothing.
    """
    signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
    )


