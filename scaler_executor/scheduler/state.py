"""The daemon's records and the task state machine, as data.

A task's life in the daemon (the table below is the spec; ``transition``
enforces it and an illegal move raises :class:`IllegalTransition` carrying the
task's recent story)::

    WAITING ──deps ready──► PENDING ──dispatch──► DISPATCHED ──result──► (gone), or FINISHED
                                                                   while dependents need it
                              ▲                      │  │
                              │   worker/processor   │  └─cancel──► CANCELLING ──result/lost──► (gone)
                              └──── died, retries ◄──┘
                                    left: RETRYING

``RETRYING`` is queued exactly like ``PENDING``; it is its own state so that the
record (and the monitor) tell a first attempt from a repeat.

``UNCLAIMED`` exists only in a daemon restarted on its journal (scheduler/durable.py): a
task reloaded without a journaled dispatch may still be at a worker that has not reported
yet (queued there, running, or its result kept), so it is in no ready queue and at no
worker until a worker's report claims it (``claimed``: ``DISPATCHED`` there, under the
attempt it had) or the recovery ends without a claim (``unclaimed``: ``PENDING`` under a new
attempt).  Placement, scaling and the unsatisfiable-task expiry never see it; a cancel
asked meanwhile is held until one or the other (docs/durability.rst)::

    UNCLAIMED ──claimed──► DISPATCHED       UNCLAIMED ──unclaimed──► PENDING
        └──cancel (its client lost, or it is no longer wanted)──► (gone)
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from scaler_executor.protocol.messages import DEFAULT_OPTIONS, TaskOptions

# What a constrained task needs: ((resource, quantity), ...) and (tag, ...), both sorted.
ConstraintKey = tuple[tuple[tuple[str, float], ...], tuple[str, ...]]


def constraint_key(resources: dict[str, float], tags: list[str]) -> ConstraintKey | None:
    if not resources and not tags:
        return None
    return tuple(sorted(resources.items())), tuple(sorted(set(tags)))


def describe_key(key: ConstraintKey) -> str:
    parts = [f"{name}={quantity:g}" for name, quantity in key[0]]
    if key[1]:
        parts.append("tags " + ",".join(key[1]))
    return " ".join(parts)


class TaskState(enum.Enum):
    WAITING = "waiting"  # for dependencies (graphs, futures as arguments)
    PENDING = "pending"  # ready, queued in the daemon
    RETRYING = "retrying"  # ready again after a failed attempt
    DISPATCHED = "dispatched"  # sent to a worker (queued there or running)
    CANCELLING = "cancelling"  # cancel forwarded to the worker, its answer awaited
    FINISHED = "finished"  # done, its result kept for dependents that have not finished
    DONE = "done"  # terminal: the record is dropped
    UNCLAIMED = "unclaimed"  # reloaded after a restart, maybe at a worker that has not reported

    # Members are singletons compared by identity, so identity hashing is consistent;
    # Enum's own __hash__ is a Python-level call, paid in every transition-table lookup,
    # queue-membership test and count update (several per task on the daemon's path).
    __hash__ = object.__hash__


S = TaskState

# (state, event) -> next state.  Anything missing is illegal.
TRANSITIONS: dict[tuple[TaskState, str], TaskState] = {
    (S.WAITING, "deps-ready"): S.PENDING,
    (S.WAITING, "cancel"): S.DONE,
    (S.WAITING, "dep-failed"): S.DONE,
    (S.WAITING, "dep-gone"): S.DONE,
    (S.PENDING, "dispatch"): S.DISPATCHED,
    (S.PENDING, "cancel"): S.DONE,
    (S.PENDING, "reject"): S.DONE,
    (S.RETRYING, "dispatch"): S.DISPATCHED,
    (S.RETRYING, "cancel"): S.DONE,
    (S.RETRYING, "reject"): S.DONE,
    (S.DISPATCHED, "result"): S.DONE,
    (S.DISPATCHED, "result-kept"): S.FINISHED,
    (S.FINISHED, "released"): S.DONE,
    (S.DISPATCHED, "attempt-failed"): S.RETRYING,
    (S.DISPATCHED, "retries-exhausted"): S.DONE,
    (S.DISPATCHED, "returned"): S.PENDING,  # its worker left and handed it back unstarted
    # Its worker left (Goodbye) or the infrastructure ended it while it may have been running:
    # queued again without a charge against its retries (never for max_retries=0: it fails).
    (S.DISPATCHED, "interrupted"): S.PENDING,
    (S.DISPATCHED, "cancel"): S.CANCELLING,
    (S.CANCELLING, "result"): S.DONE,
    (S.CANCELLING, "attempt-failed"): S.DONE,
    (S.CANCELLING, "retries-exhausted"): S.DONE,
    (S.CANCELLING, "returned"): S.DONE,
    (S.CANCELLING, "interrupted"): S.DONE,
    (S.CANCELLING, "cancel"): S.CANCELLING,
    # A restarted daemon's reloaded task whose dispatch was not journaled (durable.py):
    (S.UNCLAIMED, "claimed"): S.DISPATCHED,  # a worker's report says it holds it or its result
    (S.UNCLAIMED, "unclaimed"): S.PENDING,  # the recovery ended and nobody claimed it: new attempt
    (S.UNCLAIMED, "cancel"): S.DONE,  # its client left, or no longer wants it
}

# (state, event) -> (next state, the story's entry for it): the entry is made once here,
# not formatted per transition (two per task, on the daemon's path).
_STEPS: dict[tuple[TaskState, str], tuple[TaskState, str]] = {
    key: (new, f"{key[1]}:{new.value}") for key, new in TRANSITIONS.items()
}
STORY_LENGTH = 8  # transitions kept per task, for IllegalTransition's message
_NAMES = {state: state.value for state in TaskState}  # Enum's .value is a Python-level property

QUEUED_STATES = frozenset({S.PENDING, S.RETRYING})
AT_WORKER_STATES = frozenset({S.DISPATCHED, S.CANCELLING})


class IllegalTransition(RuntimeError):
    """A (state, event) pair the table does not allow: a bug, reported with the task's story."""


class TaskRecord:
    """What the daemon keeps per task.  Slotted: tens of thousands may be pending."""

    __slots__ = (
        "task_id",
        "client",
        "fn_id",
        "options",
        "flags",
        "payload",
        "objects",
        "deps",
        "parent",
        "state",
        "attempt",
        "worker",
        "failures",
        "story",
        "queue_key",
        "queued_at",
        "waiting",
        "dependents",
        "holds",
        "result",
        "result_objects",
        "deps_released",
        "counts",
    )

    def __init__(
        self,
        task_id: int,
        client: bytes,
        fn_id: int,
        options: TaskOptions,
        flags: int,
        payload: bytes,
        objects: list[bytes] | tuple[()],  # as decoded, or the shared empty tuple
        deps: Sequence[int],
        parent: int,
        counts: dict[TaskState, int] | None = None,
    ) -> None:
        self.task_id = task_id
        self.client = client
        self.fn_id = fn_id
        self.options = options
        self.flags = flags
        self.payload = payload
        self.objects = objects
        self.deps = deps
        self.parent = parent
        self.state = S.PENDING
        self.attempt = 0
        self.worker: bytes | None = None
        self.failures: list[str] | None = None  # one line per failed attempt
        self.story: list[str] | None = None  # recent transitions, kept once a task moves twice
        self.queue_key: ConstraintKey | None = None  # resources/tags it needs; None = any worker
        self.queued_at = 0.0
        self.waiting = 0  # dependencies not finished yet
        # Tasks waiting for (or using) this one's result, in the order they came (a dict: a
        # dependent that lets go of it before it ends, cancelled or failed, leaves in O(1)).
        self.dependents: dict[int, None] | None = None
        self.holds = 0  # dependents not done yet: the result is kept while > 0
        self.result: bytes | None = None  # the pickled result, kept while FINISHED
        self.result_objects: list[bytes] | None = None  # store objects of that kept result
        self.deps_released = False  # its holds on its dependencies' results were dropped
        # The scheduler's tasks-per-state table, kept current by every state change while
        # the task is recorded (None once forgotten): statistics() without a walk.
        self.counts = counts
        if counts is not None:
            counts[S.PENDING] = counts.get(S.PENDING, 0) + 1

    def transition(self, event: str) -> TaskState:
        step = _STEPS.get((self.state, event))
        if step is None:
            raise IllegalTransition(
                f"task {self.task_id:#x}: event {event!r} is illegal in state {self.state.value}; "
                f"story: {' -> '.join(self.story or [self.state.value])}"
            )
        new, entry = step
        story = self.story
        if story is None:
            self.story = [_NAMES[self.state], entry]
        else:
            story.append(entry)
            if len(story) > 2 * STORY_LENGTH:
                del story[:-STORY_LENGTH]
        self.set_state(new)
        return new

    def set_state(self, new: TaskState) -> None:
        """Change state (``transition`` checks the table first), keeping the counts."""
        counts = self.counts
        if counts is not None:
            counts[self.state] -= 1
            counts[new] = counts.get(new, 0) + 1
        self.state = new

    def unrecord(self) -> None:
        """The scheduler forgot this task: it counts no more."""
        if self.counts is not None:
            self.counts[self.state] -= 1
            self.counts = None

    def __repr__(self) -> str:
        return f"<Task {self.task_id:#x} {self.state.value} attempt={self.attempt} worker={self.worker!r}>"


@dataclass(eq=False)
class WorkerRecord:
    peer: bytes
    worker_id: int
    name: str
    capacity: int  # processors: tasks it runs at once
    resources: dict[str, float]
    tags: frozenset[str]
    last_seen: float
    pid: int = 0
    host: str = ""
    inflight: dict[int, None] = field(default_factory=dict)  # ordered set of task ids
    functions: set[int] = field(default_factory=set)  # callables it has been sent
    mean_task_seconds: float | None = None  # EWMA of observed task durations
    broken: str | None = None  # set when it can no longer run tasks (e.g. initializer failed)
    used: dict[str, float] = field(default_factory=dict)  # resources held by its in-flight tasks
    seceded: set[int] = field(default_factory=set)  # in-flight tasks waiting on sub-tasks: not counted as load
    idle_since: float = 0.0  # when it last held no task
    draining: bool = False  # chosen to stop (autoscaling, a manager) or draining itself (WorkerDraining): gets no more tasks
    queued: int = 0  # as reported by its heartbeats
    running: int = 0
    memory: int = 0  # its processors' private memory, bytes (heartbeats)
    memory_limit: int = 0  # 0: none
    cpu: float = 0.0  # cores its processors kept busy (heartbeats)
    store: tuple[str, int, int, int] = ("", 0, 0, 0)  # the store it maps: name, bytes, capacity, objects (heartbeats)
    lane_ends: dict[int, int] = field(default_factory=dict)  # client id -> its lane tasks ended here (LaneDone.clients)

    def fits_ever(self, key: ConstraintKey) -> bool:
        """Could this worker ever run a task with these needs (ignoring what is in use)?"""
        resources, tags = key
        return self.tags.issuperset(tags) and all(self.resources.get(n, 0.0) >= q for n, q in resources)

    def fits_now(self, key: ConstraintKey) -> bool:
        resources, _ = key
        used = self.used
        return all(self.resources.get(n, 0.0) - used.get(n, 0.0) >= q - 1e-9 for n, q in resources)

    def __repr__(self) -> str:
        return f"<Worker {self.name} id={self.worker_id} inflight={len(self.inflight)}/{self.capacity}>"


@dataclass(eq=False)
class ClientRecord:
    peer: bytes
    client_id: int
    name: str
    last_seen: float
    tasks: set[int] = field(default_factory=set)
    functions: set[int] = field(default_factory=set)
    options: dict[int, TaskOptions] = field(default_factory=lambda: {0: DEFAULT_OPTIONS})
    objects: dict[bytes, int] = field(default_factory=dict)  # store objects it holds (pins, unread results)
    host: str = ""
    reply_to: str = ""  # its reply socket for results sent straight by processors on its host
    authkey_file: str = ""  # its multiprocessing authkey's file, named to workers on its host

    def __repr__(self) -> str:
        return f"<Client {self.name} id={self.client_id} tasks={len(self.tasks)}>"


class _ClientLane:
    """One client's ready tasks: highest priority first, FIFO within a priority."""

    __slots__ = ("priorities", "queues", "size")

    def __init__(self) -> None:
        self.queues: dict[int, deque[TaskRecord]] = {}
        self.priorities: list[int] = []  # sorted descending
        self.size = 0  # entries, live or lazily removed

    def push(self, task: TaskRecord, front: bool) -> None:
        priority = task.options.priority
        queue = self.queues.get(priority)
        if queue is None:
            queue = self.queues[priority] = deque()
            self.priorities.append(priority)
            self.priorities.sort(reverse=True)
        if front:
            queue.appendleft(task)
        else:
            queue.append(task)
        self.size += 1

    def pop(self) -> TaskRecord | None:
        """The first live entry, or None once every entry is gone."""
        for priority in self.priorities:
            queue = self.queues[priority]
            while queue:
                task = queue.popleft()
                self.size -= 1
                if task.state in QUEUED_STATES:
                    return task
        return None

    def head_priority(self) -> int:
        for priority in self.priorities:
            if self.queues[priority]:
                return priority
        return 0


class ReadyQueue:
    """Tasks ready to run: fair between clients, by priority within each client.

    Each client has a lane (highest ``priority`` first, FIFO within a priority); ``pop``
    takes one task from the lane whose turn it is and moves that lane to the back, so
    clients with ready tasks are served in rotation, one task each: a client that
    submitted 10^6 tasks holds up another's first task by at most one task per client,
    not by its backlog.  ``priority`` orders one client's tasks; it does not let one
    client jump another (docs/architecture.rst, Scheduling: "Fairness between clients").

    Cancelled entries are removed lazily (skipped when popped) so that cancel is
    O(1); ``live`` counts the entries that are still queued.  Every operation is O(1)
    but for a lane's walk over its priority levels (few).
    """

    def __init__(self) -> None:
        self._lanes: dict[bytes, _ClientLane] = {}
        self._turn: deque[bytes] = deque()  # clients whose lanes have entries, next first
        self.live = 0

    def push(self, task: TaskRecord, *, front: bool = False) -> None:
        lane = self._lanes.get(task.client)
        if lane is None:
            lane = self._lanes[task.client] = _ClientLane()
            self._turn.append(task.client)
        lane.push(task, front)
        self.live += 1

    def discard(self) -> None:
        """One queued entry stopped being live (it will be skipped when popped)."""
        self.live -= 1

    def pop(self) -> TaskRecord | None:
        turn, lanes = self._turn, self._lanes
        while turn:
            client = turn[0]
            lane = lanes[client]
            task = lane.pop()
            if lane.size:
                turn.rotate(-1)  # its next task waits for every other client's
            else:
                del lanes[client]
                turn.popleft()
            if task is not None:
                self.live -= 1
                return task
        return None

    def next_client(self) -> bytes | None:
        """The client whose turn it is (its lane may hold only lazily removed entries)."""
        return self._turn[0] if self._turn else None

    def head_priority(self) -> int:
        """The highest priority with a queued entry (an estimate: lazily removed entries count)."""
        return max((lane.head_priority() for lane in self._lanes.values()), default=0)

    def __len__(self) -> int:
        return self.live

    def entries(self) -> list[TaskRecord]:
        return [
            t
            for lane in self._lanes.values()
            for p in lane.priorities
            for t in lane.queues[p]
            if t.state in QUEUED_STATES
        ]
