"""The client core's events (in) and commands (out): ``ClientCore.handle`` (``state.py``).

Events are what happened: a user submitted or cancelled, a result or a notice came, a
lane opened or was lost, the daemon answered or was lost, time passed.  Commands are
what the shell (``agent.py``, ``submit.py``, ``cancel.py``, ``completion.py``) must do:
send to the daemon or down a lane, settle or fail futures, mark them running, notify
them cancelled, wait for the daemon's answer to a cancel.  The shell decides nothing
about tasks; it executes commands with an exhaustive ``match``.

``docs/architecture.rst`` ("The client") has the table of which event yields which
command.  The hot paths call the core's ``handle_submit``, ``result_in`` and
``running_in`` directly (one command or None: no list is built per task);
``ClientCore.handle`` dispatches every event to the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from scaler_executor.protocol import messages as m

if TYPE_CHECKING:
    from collections.abc import Callable

    from scaler_executor.client.state import TaskItem, TaskRecord


# ---------------------------------------------------------------------------- events in


class Submitted(NamedTuple):
    """A call, pickled (``submit.py``), to run: a new task.  ``repack`` pickles it again
    (DEP_GONE), ``charge`` is what the pending limit charged for it (-1: nothing)."""

    future: Any
    fn_id: int
    options_id: int
    flags: int
    payload: bytes
    deps: list[int]
    objects: list[bytes]
    repack: tuple[Callable[[], Any], int] | None
    charge: int
    now: float


class Parked(NamedTuple):
    """A call whose argument is a running lane task's future: a task held here (PARKED)
    until that future is done (then ``Repickled``)."""

    future: Any
    now: float


class GraphTaskAdded(NamedTuple):
    """A task of a graph being built (``pickling.GraphBatch``): SENT from the start (the
    batch goes whole).  ``future`` None: an intermediate nobody awaits (a number only)."""

    future: Any
    now: float


class GraphSubmitted(NamedTuple):
    """A built graph's tasks, to go in one SubmitTasks."""

    items: list[TaskItem]


class Repickled(NamedTuple):
    """A task pickled again, a value inlined: a parked task whose argument is done, or a
    sent one whose dependency was gone (DEP_GONE)."""

    record: TaskRecord
    item: TaskItem
    repack: tuple[Callable[[], Any], int] | None


class TaskFailed(NamedTuple):
    """A task that could not be pickled again (or lost a dependency it cannot resend)."""

    record: TaskRecord
    error: BaseException


class CancelRequested(NamedTuple):
    """``cancel()`` of these tasks' futures.  ``wait``: the shell's waiter for the daemon's
    answer (``completion.CancelWait``), None if the caller may not wait (a client thread,
    a broken or closing agent): tasks the daemon holds are then not asked about.  ``join``:
    a task asked about earlier by another caller is awaited too (one ``cancel()``)."""

    records: list[TaskRecord]
    wait: Any
    join: bool


class ForceCancelRequested(NamedTuple):
    """``ex.cancel(f, force=True)`` of a running task.  ``lane`` False: killing it down
    its lane failed (the lane closed): ask the daemon."""

    record: TaskRecord
    lane: bool


class CancelAnswered(NamedTuple):
    """The daemon's ``TasksCancelled``: dropped and refused task ids."""

    cancelled: list[int]
    refused: list[int]


class ResultIn(NamedTuple):
    """A task's result came, by any route (the daemon, a lane, the reply inbox)."""

    result: m.TaskResult


class DaemonResults(NamedTuple):
    """A ``TaskResults`` message from the daemon, before its results are completed: what a
    journaled daemon's client keeps count of (the ResultsAck's count, the store objects
    held for us, submissions refused for a full journal).  Agent thread, no lock: only
    that thread touches these counts."""

    results: list[m.TaskResult]


class RunningIn(NamedTuple):
    """The daemon's running notice (``TasksRunning``) for these task ids."""

    task_ids: list[int]


class Acknowledged(NamedTuple):
    """The daemon's ``SubmitAck``: so many tasks taken (the submit window moves on)."""

    tasks: int


class Welcomed(NamedTuple):
    """The daemon's ``Welcome`` (our id, whether it journals, its restart's token), and the
    heartbeat interval (how often results are acknowledged to a journaled daemon).  A
    Welcome that answers our Resume yields ``SendToDaemon([ClientReport])``, to go before
    anything the outbox holds."""

    message: m.Welcome
    interval: float


class Tick(NamedTuple):
    """A turn of the agent with the daemon's queue free: send what the outbox holds (up to
    the submit window and one transmission), and a ResultsAck when one is due at ``now``."""

    now: float


class LaneOpened(NamedTuple):
    """A worker's lane is connected: tasks submitted alone may go down it."""


class LaneLost(NamedTuple):
    """Lane tasks that did not run to the end (their processor died, or the lane closed:
    ``closed``): to the daemon, each under a new number."""

    records: list[TaskRecord]
    closed: bool


class LaneRefused(NamedTuple):
    """A task routed down the lane could not be sent there: to the daemon instead."""

    record: TaskRecord


class Posted(NamedTuple):
    """A message for the daemon besides tasks (``state.PIN_OBJECTS`` ...): to the outbox.
    Lock-free (one ``deque.append``): finalizers post releases."""

    kind: int
    data: Any


class Answered(NamedTuple):
    """The daemon answered our oldest request of this ``kind`` (``state.STATS``,
    ``state.HISTORY``, ``state.FETCH_OBJECTS``): it is no longer asked again after a restart."""

    kind: int


class FunctionReleased(NamedTuple):
    """A registered callable is gone (its finalizer ran).  ``closing``: the executor is
    shutting down (nothing is released once no task is left)."""

    fn_id: int
    closing: bool


class DaemonLost(NamedTuple):
    """The executor broke (the daemon lost, refused or stopped; a bug): nothing more is
    sent, and every outstanding task is failed on a completion thread (``Broken``)."""

    error: BaseException


class Broken(NamedTuple):
    """Fail every outstanding task (on a completion thread, after the results read
    before the break were settled)."""

    error: BaseException


Event = (
    Submitted | Parked | GraphTaskAdded | GraphSubmitted | Repickled | TaskFailed | CancelRequested
    | ForceCancelRequested | CancelAnswered | ResultIn | DaemonResults | RunningIn | Acknowledged | Welcomed | Tick
    | LaneOpened | LaneLost | LaneRefused | Posted | Answered | FunctionReleased | DaemonLost | Broken
)


# ---------------------------------------------------------------------------- commands out


class Wake(NamedTuple):
    """The outbox holds something new: wake the agent (a no-op on the agent's thread)."""


WAKE = Wake()


class Discard(NamedTuple):
    """A task pickled again is no longer wanted (cancelled or completed meanwhile): drop
    the store objects its new pickle created."""


DISCARD = Discard()


class SendDownLane(NamedTuple):
    """Send ``item`` down the open lane; on success mark the future running (a cancel can
    no longer keep it from running), else report ``LaneRefused``."""

    record: TaskRecord
    item: TaskItem


class KillOnLane(NamedTuple):
    """Kill the running lane task (force cancel); if the lane closed, report
    ``ForceCancelRequested(record, lane=False)``."""

    record: TaskRecord


class SendToDaemon(NamedTuple):
    """One transmission to the daemon, in order."""

    messages: list[Any]


class ReleaseOnLane(NamedTuple):
    """The worker at the other end of the lane may drop callable ``fn_id``."""

    fn_id: int


class SetFlushed(NamedTuple):
    """Everything before these markers was handed to the daemon's route: set them."""

    events: list[Any]


class Settle(NamedTuple):
    """Complete ``record``'s future from ``result`` (its record has left the core)."""

    record: TaskRecord
    result: m.TaskResult


class Resend(NamedTuple):
    """DEP_GONE: a dependency finished before the daemon saw task ``n``: pickle it again,
    the value inlined (``submit.py``), then report ``Repickled``; its record stays."""

    n: int


class MarkRunning(NamedTuple):
    """Mark these records' futures running (no callback runs: any thread may do it)."""

    records: list[TaskRecord]


class Fail(NamedTuple):
    """Fail one record's future with ``error`` itself (its record has left the core)."""

    record: TaskRecord
    error: BaseException


class FailTasks(NamedTuple):
    """Fail these records' futures (and wake their cancellers) with a copy of ``error``."""

    records: list[TaskRecord]
    error: BaseException


class FailAll(NamedTuple):
    """Hand ``Broken(error)`` to a completion thread (after the results queued before)."""

    error: BaseException


class NotifyCancelled(NamedTuple):
    """These futures are cancelled: their tasks will never run.  Notify them now."""

    records: list[TaskRecord]


class AwaitAnswer(NamedTuple):
    """The daemon was asked to drop these tasks: the canceller waits (at most
    ``cancel_wait``) on ``wait`` for its answer."""

    records: list[TaskRecord]
    wait: Any


class AnswerCancel(NamedTuple):
    """Hand the daemon's verdict on ``record`` (``dropped``) to ``wait``; a dropped task
    whose canceller stopped waiting is cancelled (and notified) on a completion thread."""

    record: TaskRecord
    wait: Any
    dropped: bool


Command = (
    Wake | Discard | SendDownLane | KillOnLane | SendToDaemon | ReleaseOnLane | SetFlushed | Settle
    | Resend | MarkRunning | Fail | FailTasks | FailAll | NotifyCancelled | AwaitAnswer | AnswerCancel
)
