"""The core's vocabulary: the events the loop hands it, the commands it returns, and the
constants and small helpers its layers share (core.py explains the layers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Role, Status, TaskFlags
from scaler_executor.scheduler.managers import AdmitKeys, WithdrawKeys
from scaler_executor.scheduler.object_stream import CreditObjects, EndObjectSends
from scaler_executor.scheduler.result_stream import AbortPartial, ForwardStored
from scaler_executor.scheduler.state import TaskRecord

log = logging.getLogger("scaler_executor.daemon")

EWMA_WEIGHT = 0.2  # weight of the newest task duration in a worker's mean
NOTICE_DELAY = 0.002  # longest a submit ack or running notice waits to travel with results
# Most a peer's reported figure (a count, bytes, seconds) may be: thousands of them still sum
# within msgpack's 64-bit integers, which the snapshot is encoded in.
MAX_FIGURE = 2**52
MAX_NAME = 256  # characters of a peer's name or host in its Hello: they reach logs and Refused
ID_MASK = (1 << m.TASK_ID_BITS) - 1  # the per-client part of a task or function id
# Monitors share one snapshot built at most this often, however many watch or however often
# they ask: the daemon's monitoring cost is bounded by this, not by its watchers.
MONITOR_SNAPSHOT_SECONDS = 0.5
# Monitors (dashboards) share one history, rebuilt at most this often: building one is
# O(runs kept), up to 20,000, so a monitor asking in a loop cannot make the daemon do it
# in a loop.  A client's request (ex.report) is always answered fresh.
MONITOR_HISTORY_SECONDS = 2.0
REFUSAL_LOG_SECONDS = 60.0  # a refusal is logged once per peer and kind in this long
MAX_REFUSAL_KEYS = 4096
# What a worker may say of a task; the others are the daemon's to say (REJECTED, WORKER_LOST, ...).
WORKER_STATUSES = frozenset(
    {Status.OK, Status.ERROR, Status.PROCESSOR_DIED, Status.CANCELLED, Status.TIMEOUT, Status.FORCE_CANCELLED}
)
# What a task without store objects or dependencies records: one shared empty tuple, not
# the two empty lists the codec decoded (112 bytes of each pending task).
NONE: tuple[()] = ()
# The TaskSpec flags a client may set (ON_LANE is the daemon's own; no other bit is defined).
CLIENT_FLAGS = (
    TaskFlags.CHUNK | TaskFlags.INLINE_FN | TaskFlags.NO_RESULT | TaskFlags.PACKED | TaskFlags.WRITABLE
    | TaskFlags.REPLY_DIRECT | TaskFlags.LANE_RETRY | TaskFlags.CAPTURE
)
# How a cancel held for an UNCLAIMED task is applied (Scheduler.hold_cancel): its client
# awaits the answer (TasksCancelled), and/or it was asked with force.
CANCEL_ANSWER = 1
CANCEL_FORCE = 2
NO_CLIENT = b""  # the owner of a task whose client is gone (no ZeroMQ identity is empty)

# --------------------------------------------------------------------------- events / commands


@dataclass(frozen=True, slots=True)
class Received:
    peer: bytes
    messages: list[Any]
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing happened, but ``wakeup_at()`` has passed: deferred notices are due."""

    now: float


@dataclass(frozen=True, slots=True)
class PeerUnreachable:
    """The transport could not deliver to ``peer`` (it disconnected)."""

    peer: bytes
    now: float


@dataclass(frozen=True, slots=True)
class WorkerExited:
    """A worker process that this daemon's host started has exited (seen by the local manager)."""

    pid: int
    host: str
    how: str  # "killed by signal SIGKILL", "exit code 1", ...
    now: float


@dataclass(frozen=True, slots=True)
class LocalWorkers:
    """The worker processes the daemon's local manager runs now (started or starting)."""

    pids: frozenset[int]
    host: str
    now: float


@dataclass(frozen=True, slots=True)
class Send:
    peer: bytes
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class StartWorkers:
    """Ask the local manager for ``count`` more workers (autoscaling)."""

    count: int


@dataclass(frozen=True, slots=True)
class StopWorkers:
    """Stop these local worker processes; they were drained (hold no task) first."""

    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeleteObjects:
    """Nothing holds these objects any more: delete them from the host's store."""

    object_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SendObjects:
    """Read these objects from the store and send their bytes to ``peer``: ObjectData, after
    ObjectParts for large ones (scheduler/object_stream.py)."""

    peer: bytes
    object_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class StoreChunk:
    """Write the chunk that came with ``peer``'s ObjectChunk into the store (the loop holds
    its bytes: the core never sees buffers); answer ObjectStored when it ends the object.
    ``forward``: also send the chunk to that client as ResultPart of task ``task_id``
    (a large result forwarded as it comes: scheduler/result_stream.py)."""

    peer: bytes
    object_id: bytes
    offset: int
    total: int
    forward: bytes = b""
    task_id: int = 0


@dataclass(frozen=True, slots=True)
class AbortPuts:
    """``peer`` (a client or worker that streamed puts: ObjectChunk without a task) is gone:
    abort every object it had not finished putting, so a put cut short leaks no store space."""

    peer: bytes


Event = Received | Tick | Wake | PeerUnreachable | WorkerExited | LocalWorkers
Command = (
    Send | StartWorkers | StopWorkers | DeleteObjects | SendObjects | StoreChunk | CreditObjects | EndObjectSends
    | AbortPartial | AbortPuts | ForwardStored | AdmitKeys | WithdrawKeys
)


def refusal_for(hello: m.Hello) -> str | None:
    """Why a peer's handshake is refused, or None.  Pickles need equal Python and cloudpickle."""
    if hello.role not in Role.ALL:
        return f"unknown role {hello.role[:32]!r}; expected one of {sorted(Role.ALL)}"
    if len(hello.name) > MAX_NAME or len(hello.host) > MAX_NAME:
        return f"a peer's name and host may have at most {MAX_NAME} characters"
    if hello.protocol != m.PROTOCOL_VERSION:
        return f"protocol {hello.protocol} != daemon's {m.PROTOCOL_VERSION}"
    mismatches = []
    if hello.python != python_version():
        mismatches.append(f"Python {hello.python} (daemon: {python_version()})")
    if hello.cloudpickle != cloudpickle.__version__:
        mismatches.append(f"cloudpickle {hello.cloudpickle} (daemon: {cloudpickle.__version__})")
    if hello.package != __version__:
        mismatches.append(f"scaler-executor {hello.package} (daemon: {__version__})")
    if mismatches:
        return (
            f"version mismatch: {hello.role} {hello.name!r} runs {', '.join(mismatches)}; "
            "install the same versions of Python, cloudpickle and scaler-executor everywhere"
        )
    if hello.role == Role.WORKER and hello.capacity < 1:
        return f"worker {hello.name!r} declared capacity {hello.capacity}; it must run at least one task"
    return None


def _figure(value: int) -> int:
    """A peer's reported figure within [0, MAX_FIGURE]."""
    return value if 0 <= value <= MAX_FIGURE else (0 if value < 0 else MAX_FIGURE)


def _dep_value(dep: TaskRecord) -> m.DepValue:
    assert dep.result is not None
    return m.DepValue(dep.task_id, dep.result, dep.result_objects or m.NO_OBJECTS)


def _pack_lost(text: str, failures: list[str]) -> bytes:
    return _packb([text, failures])


def _packb(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)
