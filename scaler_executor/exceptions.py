"""Every exception scaler-executor raises, in one place.

Two families, kept apart on purpose (CONVENTIONS §14):

* **Per-task failures** derive from :class:`TaskError`. They fail one future and
  leave the executor usable.  A task's *own* exception is not wrapped: it comes
  back with its original type and the remote traceback chained as its
  ``__cause__`` (a :class:`RemoteTraceback`).
* **Executor-wide failures** derive from :class:`BrokenScalerExecutor`, a
  :class:`concurrent.futures.BrokenExecutor`, so ``except BrokenExecutor:
  recreate()`` code written for the standard pools stays right.

Misuse (bad arguments, bad configuration) raises the ordinary built-in types
(``ValueError``, ``TypeError``) with a message that names the fix.
"""

from __future__ import annotations

from concurrent.futures import BrokenExecutor, CancelledError
from types import TracebackType

__all__ = [
    "BrokenScalerExecutor",
    "ConfigError",
    "ConfigWarning",
    "DaemonLost",
    "InitializerFailed",
    "NoWorkerWarning",
    "PendingLimitReached",
    "ProtocolError",
    "ProxyUnavailable",
    "RemoteError",
    "RemoteTraceback",
    "TaskCancelled",
    "TaskError",
    "TaskTimeout",
    "WorkerLost",
]


class ConfigError(ValueError):
    """A configuration value, key or file is invalid; the message names it and the fix."""


class ConfigWarning(UserWarning):
    """A setting was ignored but looks like a mistake (a near-miss ``SCALER_*`` variable)."""


class ProtocolError(Exception):
    """A peer sent something this side cannot accept (bad frames, wrong version, refusal)."""


# --------------------------------------------------------------------------- per task


class TaskError(Exception):
    """Base class of failures that belong to one task; the executor stays usable."""


class RemoteTraceback(Exception):
    """Carries the text of a traceback from the process that ran the task.

    Attached as ``__cause__`` of a task's exception so that the standard
    traceback display shows where the error happened remotely (the model is
    CPython's ``concurrent.futures.process._RemoteTraceback``).

    ``frames``: the remote frames as a real traceback object, when they could be rebuilt
    (``pdb.post_mortem(exc.__cause__.frames)``), else None.  Not ``__traceback__``: the
    standard display would print them before the text, which holds them already.
    """

    frames: TracebackType | None = None

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class RemoteError(TaskError):
    """A task raised an exception that could not travel back as itself.

    Raised when the exception could not be pickled in the worker or unpickled in
    the client; it keeps the original type's qualified name, its message and the
    remote traceback text.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str) -> None:
        super().__init__(type_name, message, traceback_text)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class WorkerLost(TaskError):
    """The processes that ran a task died on every attempt it was allowed.

    ``attempts`` lists one line per attempt: the worker and how it died.
    """

    def __init__(self, message: str, task_id: int = 0, attempts: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.attempts = attempts

    def __reduce__(self):  # type: ignore[no-untyped-def]  # keep fields across pickling
        return (type(self), (self.args[0], self.task_id, self.attempts))


class ProxyUnavailable(TaskError):
    """A ``multiprocessing.Manager()`` proxy reached a processor that cannot connect to its
    manager: one on another host than the client (the client's authkey never leaves its
    host) or running as another user.  The message says which; the cause is the raw error."""


class TaskTimeout(TaskError):
    """A task ran past its ``task_timeout`` and its processor was killed.

    Deliberately not a ``TimeoutError``: around ``result(timeout=...)`` that
    means "still running", which this is not.
    """


class ResultUnreadable(TaskError):
    """The client received a task's result but could not read it (its status or payload
    did not decode); the cause, when there is one, is the error that reading raised."""


class TaskCancelled(CancelledError):
    """A running task was cancelled with ``force=True`` and its processor killed."""


# --------------------------------------------------------------------------- executor-wide


class BrokenScalerExecutor(BrokenExecutor):
    """The executor cannot run tasks any more; create a new one."""


class InitializerFailed(BrokenScalerExecutor):
    """The ``initializer`` raised in a worker process; the remote traceback is the cause."""


class DaemonLost(BrokenScalerExecutor):
    """The connection to the scheduler daemon was lost (it died or stopped answering)."""


# --------------------------------------------------------------------------- warnings


class PendingLimitReached(RuntimeError):
    """``submit`` found ``max_pending_tasks`` or ``max_pending_bytes`` reached and may not
    wait for room: ``pending_full="raise"``, or on the client's own thread (a done-callback)."""


class NoWorkerWarning(UserWarning):
    """Tasks of this client have waited ``no_worker_warning`` seconds with no connected
    worker able to run them (no worker at all, or none with their resources or tags).
    Issued once per episode; ``warnings.simplefilter("ignore", NoWorkerWarning)`` silences it."""
