"""Every message on the wire, in one place.

Who sends what, and why (C = client agent, D = daemon, W = worker agent,
M = monitor; every peer starts with ``Hello`` and gets ``Welcome`` or ``Refused``):

=====================  =======  ==========================================================
message                route    purpose
=====================  =======  ==========================================================
Hello                  *→D      handshake: role, versions, capacity; the only message an
                                unknown peer may send
Welcome                D→*      handshake accepted: the peer's id and the liveness settings
Refused                D→*      handshake or message refused, with the reason
Heartbeat              *↔*      fills silence; any message counts as a heartbeat
Goodbye                *↔*      orderly disconnect (the receiver forgets the sender); a
                                worker's lists the tasks it hands back never started
WorkerDraining         W→D      the worker drains (``--drain-seconds``, on SIGTERM): no
                                task for it any more; it hands back the tasks it lists
                                (never started), finishes the others, then says Goodbye;
                                sent again for tasks that came back to it unstarted later
RegisterFunction       C→D→W    a pickled callable shared by many tasks (sent once per map
                                or cached function, then referred to by ``fn_id``; also C→W
                                on a lane, before its first task there)
ReleaseFunctions       C→D→W    callables no task will refer to any more
RegisterOptions        C→D      an interned options record (``ex.options(...)``)
SubmitTasks            C→D      new tasks (or C→W on a worker's lane: worker/lanes.py)
SubmitAck              D→C      credit: that many submitted tasks were taken in (not
                                counting REPLY_DIRECT ones: at most one is outstanding,
                                outside the client's submit window; a journaled daemon
                                counts them too: its client keeps every submission)
TasksRunning           D→C      tasks dispatched to a worker (futures turn RUNNING)
DispatchTasks          D→W      tasks to run (plus callables the worker lacks)
CancelTasks            C→D→W    drop (or with ``force`` kill) tasks (C→W: a lane task's);
                                without ``force`` the daemon drops only tasks no worker
                                holds, and answers with TasksCancelled
TasksCancelled         D→C      the answer to a CancelTasks without ``force``: which tasks
                                will never run (dropped) and which may (at a worker,
                                finished, or unknown): ``Future.cancel()`` waits for it
TaskResults            W→D→C    outcomes, with attempt number and per-task facts (a
                                sequential caller's may also go processor→client as a
                                datagram: protocol/reply.py; then ``delivered`` is set;
                                a lane task's go W→C on the lane)
LaneStarted            W→D      lane tasks still running LANE_NOTICE after they came: the
                                daemon records them (load, task counts, monitors)
LaneDone               W→D      lane tasks that ended, for the daemon's counters (and the
                                records of those announced by LaneStarted), and how many
                                of each client's have ended in all (the statistics barrier)
LaneFlush              D→W      a client's StatsRequest waits for this worker's LaneDone:
                                send it now, and the next one without waiting
TaskRuns               W→D      the worker's task runs since its last one, in one opaque
                                blob (protocol/runlog.py), beside its heartbeats: the
                                daemon's history (task stream) without a per-task write
ReleaseObjects         C→D      object references dropped by the client (object store)
PinObjects             C→D      objects the client holds (ex.put, a map's shared argument)
ObjectRequest          W/C→D    a worker or client that cannot map the store asks for bytes
ObjectData             D→W/C    those bytes, one out-of-band frame per object (an empty one
                                for an object that came before it as ObjectParts)
ObjectPart             D→W/C    a chunk of an object larger than OBJECT_CHUNK_BYTES that was
                                asked for, one frame, in order (scheduler/object_stream.py)
ObjectPartsTaken       W/C→D    credit: the peer wrote that many parts; the daemon keeps at
                                most a window of parts unanswered per peer
ObjectChunk            C/W→D    part of an object a client or worker on another host puts (one frame);
                                a worker's large result names its task (scheduler/result_stream.py)
ObjectStored           D→C/W    that object is sealed in the store (or why it is not)
ResultPart             D→C      a chunk of a task's large result, forwarded to its client as it
                                reaches the daemon's store (one frame; before the TaskResult)
ResultPartsTaken       C→D      credit: the client received that many ResultParts; the daemon
                                keeps at most a window of them unanswered per client
ResultStreamEnded      D→C      no more ResultParts of that object: the client drops what came
                                (its result, if one comes, is read from the store)
ClusterBroken          D→C, W→D the cluster cannot run tasks (e.g. a failing initializer)
Seceded                W→D      running tasks that wait on sub-tasks: they no longer
                                count against the worker's capacity
StatsRequest           C/M→D    ask for a snapshot of the daemon's state (a client names
                                the lane results it has received, by worker: the daemon
                                answers once those workers' LaneDone counted them)
Stats                  D→C/M    the snapshot
HistoryRequest         C/M→D    ask for the run's history (for ``ex.report``)
History                D→C/M    the most recent task runs (worker, start, end, status) and
                                the coarse series of the whole run, with the daemon's config
TasksWithoutWorker     D→C      tasks of this client have waited ``no_worker_warning``
                                with no connected worker able to run them (once per
                                episode: scheduler/no_worker.py); the client warns
ManagerOffer           M→D      what a worker manager can provide: adapter, most workers,
                                each worker's processors, resources and tags, start-up time
WorkerStates           M→D      what became of the manager's workers (requested, pending
                                with the reason, running, draining, gone with how)
WorkerKeys             M→D      public keys for workers the manager is about to start: the
                                daemon admits them while the manager is connected
KeysAdmitted           D→M      those keys are admitted: the workers may be started
ScaleWorkers           D→M      the daemon's scaling decision: start this many more workers,
                                stop these (drained) ones
Resume                 C/W→D    to a daemon restarted on its journal (refused as UNKNOWN_PEER):
                                "I am peer N" with the token of its Welcome; answered with a
                                Welcome (scheduler/durable.py, docs/durability.rst)
ClientReport           C→D      after that Welcome: futures awaited, callables, options, the
                                submissions never acknowledged, the objects it holds, the
                                cancels never answered
WorkerReport           W→D      after that Welcome: tasks held, tasks finished unacknowledged
                                (their TaskResults follow again)
ResultsAck             C→D      TaskResults messages received since the Welcome: the daemon
                                forgets the copies it journaled for redelivery
ResultsJournaled       D→W      TaskResults messages of this worker journaled since its
                                Welcome: the worker forgets the copies it kept
=====================  =======  ==========================================================

Messages are ``typing.NamedTuple``s rather than frozen dataclasses: they are just
as immutable and slotted, msgpack packs tuples natively in C, and building one
from decoded fields costs a third of a frozen dataclass's ``__init__`` — which
matters at tens of thousands of tasks a second.  Field types are part of the
protocol: the codec derives its validation of untrusted input from them.

Identifiers are plain ``int``s on the wire.  A client's task ids carry the
client's id in their high bits (``client_id << TASK_ID_BITS | n``), so they are
unique across the cluster without coordination.
"""

# No ``from __future__ import annotations`` here: typing.NamedTuple compiles each field's
# annotation when it is a string (ForwardRef), ~2 ms of this module's import for its ~70 records.

from typing import NamedTuple, NewType

ClientId = NewType("ClientId", int)
WorkerId = NewType("WorkerId", int)
TaskId = NewType("TaskId", int)
FunctionId = NewType("FunctionId", int)

PROTOCOL_VERSION = 5  # 2: a journaled daemon's Welcome fields and the resume messages (46-50); 3: TaskRuns (62), Welcome.runs, LaneDone without runs; 4: ObjectChunk.task_id/attempt, ResultPart (65), ResultPartsTaken (66), ResultStreamEnded (67); 5: LaneDone.clients, StatsRequest.lanes, LaneFlush (68)
TASK_ID_BITS = 40  # 10^12 tasks per client before ids wrap


class Role:
    """Roles a peer may declare in ``Hello``; the role decides what it may send."""

    CLIENT = "client"
    WORKER = "worker"
    MONITOR = "monitor"  # read-only: may only ask for statistics
    MANAGER = "manager"  # a worker manager: offers capacity, starts and stops workers (docs/managers.rst)
    ALL = frozenset({CLIENT, WORKER, MONITOR, MANAGER})


class Status:
    """Outcome codes of ``TaskResult.status``."""

    OK = 0  # payload: the pickled return value
    ERROR = 1  # payload: the pickled exception the task raised (or a RemoteError)
    PROCESSOR_DIED = 2  # W→D only; payload: utf-8 description of how it died
    CANCELLED = 3  # dropped before it ran; payload empty
    WORKER_LOST = 4  # D→C: retries exhausted; payload: msgpack [message, [attempt lines]]
    TIMEOUT = 5  # killed after task_timeout; payload: utf-8 description
    FORCE_CANCELLED = 6  # killed by cancel(force=True); payload: utf-8 description
    REJECTED = 7  # D→C: the daemon refused the task; payload: utf-8 reason
    DEP_FAILED = 8  # D→C: a dependency failed, the task never ran; payload: msgpack [dep id, status, payload]
    DEP_GONE = 9  # D→C: a dependency had already finished and been forgotten; payload: msgpack [dep id]
    ALL = frozenset(range(10))


class TaskFlags:
    """Bits of ``TaskSpec.flags``: how the processor interprets the payload."""

    CALL = 0  # payload pickles (args, kwargs) for fn(*args, **kwargs)
    CHUNK = 1  # payload pickles a list of args tuples; the result is the list of results
    INLINE_FN = 2  # fn_id is 0 and payload pickles (fn, args, kwargs) (uncached callables)
    NO_RESULT = 4  # a graph intermediate: its result stays in the cluster for its dependents
    PACKED = 8  # payload is an object-store header (objstore.payload) referring to TaskSpec.objects
    WRITABLE = 16  # the task gets private writable copies of store buffers (ex.options(writable=True))
    # A sequential caller's task: its processor may send the result straight to the
    # client's reply socket (TaskDispatch.reply_to) as well as to its agent.  The daemon
    # keeps the path it has for everything else and sends the client nothing for it (but,
    # under a journal, its SubmitAck: scheduler/durable.py).
    REPLY_DIRECT = 32
    # Submitted again after its first attempt, on a worker's lane (worker/lanes.py), did
    # not end (its process died, or the worker left): the daemon counts that attempt.
    LANE_RETRY = 64
    # The daemon's own record of a task that runs on a worker's lane (LaneStarted): never
    # dispatched, retried or answered by the daemon.
    ON_LANE = 128
    # ex.options(capture_output=True): the processor captures the task's stdout, stderr and
    # log records (worker/capture.py) and returns them in TaskResult.output.
    CAPTURE = 256


# --------------------------------------------------------------------------- records


class TaskOptions(NamedTuple):
    """Per-task scheduling options (``ex.options(...)``); travels whole."""

    resources: dict[str, float]
    tags: list[str]
    priority: int
    task_timeout: float | None
    max_retries: int | None


DEFAULT_OPTIONS = TaskOptions({}, [], 0, None, None)


class TaskSpec(NamedTuple):
    """A task as the client submits it."""

    task_id: int
    fn_id: int  # 0 with TaskFlags.INLINE_FN
    options_id: int  # 0 = default options
    flags: int
    payload: bytes
    deps: list[int]  # task ids whose results this task needs (graphs, futures as args)
    objects: list[bytes]  # object-store ids the payload refers to
    parent: int  # id of the task that submitted this one, 0 for none


class DepValue(NamedTuple):
    """The (pickled) result of a dependency, handed to the worker with its dependent."""

    task_id: int
    payload: bytes
    objects: list[bytes]  # object-store ids the payload refers to (then it is a store header)


class TaskDispatch(NamedTuple):
    """A task as the daemon hands it to a worker."""

    task_id: int
    attempt: int
    fn_id: int
    flags: int
    payload: bytes
    objects: list[bytes]
    task_timeout: float | None
    deps: list[DepValue]
    # The client's reply socket when the task has TaskFlags.REPLY_DIRECT and the client
    # runs on this worker's host; "" otherwise.
    reply_to: str = ""
    # The client's multiprocessing authkey file when the client runs on this worker's host;
    # "" otherwise (see client/authkey.py: the path travels, never the key).
    authkey_file: str = ""


class TaskFacts(NamedTuple):
    """What the worker observed while running a task."""

    worker: str
    started: float  # wall-clock (time.time()) start
    finished: float
    peak_memory: int  # bytes of private memory, 0 if unknown


NO_FACTS = TaskFacts("", 0.0, 0.0, 0)
NO_OBJECTS: list[bytes] = []

# A NamedTuple's constructor is a Python function around this C call. On the paths taken
# once per task (the client's outbox and send, the daemon's dispatch, the worker's result)
# records are made with it directly, every field given (no defaults apply): about half
# the cost (docs/performance.rst, "On 3 December").
make = tuple.__new__


class TaskResult(NamedTuple):
    """The outcome of one attempt at a task."""

    task_id: int
    attempt: int
    status: int
    payload: bytes
    facts: TaskFacts
    objects: list[bytes]  # object-store ids a large result lives in (then payload is a store header)
    # W→D: the processor already sent this result to the client's reply socket (the
    # daemon does its bookkeeping, keeps the payload if dependents need it, sends nothing).
    delivered: bool = False
    # W→D→C: a CAPTURE task's output, msgpack [stdout, stderr, [[created, level, logger,
    # message], ...]] (worker/capture.py), bounded by capture_output_limit; b"": none.
    output: bytes = b""


class FunctionBlob(NamedTuple):
    fn_id: int
    payload: bytes


# --------------------------------------------------------------------------- messages


class Hello(NamedTuple):
    role: str
    protocol: int
    python: str  # "3.11"
    cloudpickle: str
    package: str
    name: str
    pid: int
    host: str
    capacity: int  # processors (workers); 0 for others
    resources: dict[str, float]
    tags: list[str]
    # A client's reply socket (a unix datagram socket in a 0700 directory) where processors
    # on its host may send the results of its sequential tasks; "" for none.
    reply_to: str = ""
    # A client's file (mode 0600, in a 0700 directory) holding its multiprocessing authkey,
    # for processors on its host; "" for none.  Only the path travels (client/authkey.py).
    authkey_file: str = ""


class Welcome(NamedTuple):
    peer_id: int
    heartbeat_interval: float
    heartbeat_liveness: int
    object_store: str  # name of the daemon host's shared-memory region, "" if none
    # A daemon with a journal (docs/durability.rst) survives its own restart: a peer then
    # waits up to ``grace`` seconds for it and resumes with ``Resume(peer_id, token)``.
    journal: bool = False
    grace: float = 0.0
    token: bytes = b""  # this peer's secret for Resume (random, journaled with the peer)
    # A worker's only: task runs it keeps for the daemon's history between two TaskRuns
    # (protocol/runlog.py; the daemon's history_runs, capped); 0: it records none.
    runs: int = 0


class Refused(NamedTuple):
    reason: str


class Heartbeat(NamedTuple):
    queued: int
    running: int
    # A worker's own figures (0 from other peers): its processors' private memory in bytes
    # (the sum the worker's memory limit is checked against), that limit (0: none), and the
    # CPU its processors used per second since its last heartbeat (1.0: one core busy).
    memory: int = 0
    memory_limit: int = 0
    cpu: float = 0.0
    # A worker's only: the host store it maps ("" for none) and that store's figures, read
    # without its lock (ObjectStore.usage): bytes allocated, capacity, objects.  Every worker
    # mapping one store reports the same store: see scheduler/stats.py Statistics.stores.
    store: str = ""
    store_bytes: int = 0
    store_capacity: int = 0
    store_objects: int = 0


class TaskAttempt(NamedTuple):
    task_id: int
    attempt: int


class Goodbye(NamedTuple):
    reason: str
    # A worker's only: the tasks (and attempts) it hands back that never started, i.e. never
    # went to one of its processors.  The daemon runs them again at no charge; any other task
    # the worker held may have started, and counts as interrupted (max_retries=0: it fails).
    unstarted: list[TaskAttempt] = []  # noqa: RUF012 - a NamedTuple default, never mutated


class WorkerDraining(NamedTuple):
    # The tasks (and attempts) the worker hands back that never started, as in Goodbye: the
    # daemon runs them elsewhere at no charge, dispatches nothing more to this worker, and
    # keeps the rest assigned to it (their results count as usual).  Sent once when the
    # drain begins, then again for each task that comes back to it unstarted (a processor's
    # prefetched ones, recalled; a dispatch that crossed the first one).
    unstarted: list[TaskAttempt]


class RegisterFunction(NamedTuple):
    fn_id: int
    payload: bytes


class ReleaseFunctions(NamedTuple):
    fn_ids: list[int]


class RegisterOptions(NamedTuple):
    options_id: int
    options: TaskOptions


class SubmitTasks(NamedTuple):
    tasks: list[TaskSpec]


class SubmitAck(NamedTuple):
    # Shadows tuple.count(), which nothing calls on a message; the name is kept because
    # the client reads it and is being reworked elsewhere (issue 20).
    count: int  # type: ignore[assignment]


class TasksRunning(NamedTuple):
    task_ids: list[int]


class DispatchTasks(NamedTuple):
    functions: list[FunctionBlob]
    tasks: list[TaskDispatch]


class CancelTasks(NamedTuple):
    task_ids: list[int]
    force: bool


class TaskResults(NamedTuple):
    results: list[TaskResult]


class TasksCancelled(NamedTuple):
    """The daemon's answer to a ``CancelTasks`` without ``force``."""

    cancelled: list[int]  # dropped before any worker held them: they never run
    refused: list[int]  # at a worker, finished or unknown: they may run (their results come)


class ReleaseObjects(NamedTuple):
    object_ids: list[bytes]


class PinObjects(NamedTuple):
    """The client holds these objects (``ex.put``, a map's shared argument) until it releases them."""

    object_ids: list[bytes]


class ObjectRequest(NamedTuple):
    """A worker without access to the daemon host's store asks for objects' bytes."""

    object_ids: list[bytes]


class ObjectData(NamedTuple):
    """The bytes of objects, one out-of-band frame each, in order; missing ones have found=False."""

    object_ids: list[bytes]
    found: list[bool]


# A put's chunk: large enough that a chunk's own cost (a message, a poll, a store call) is
# small beside moving it, small enough that the daemon's copy of one is no burden.
OBJECT_CHUNK_BYTES = 4 << 20


class ObjectChunk(NamedTuple):
    """Bytes ``offset`` onwards of object ``object_id`` of ``total`` bytes, as the one
    out-of-band frame of its transmission: a client that cannot map the store streams a
    put in chunks (the one at offset 0 creates the object, the one that ends it seals it).

    ``task_id`` (0 for a put): a worker streams a large result this way before its
    TaskResult, naming the task and attempt, so that the daemon forwards each chunk to the
    task's client as it comes (ResultPart) while it stores the object."""

    object_id: bytes
    offset: int
    total: int
    task_id: int = 0
    attempt: int = 0


class ObjectPart(NamedTuple):
    """Bytes ``offset`` onwards of object ``object_id`` of ``total`` bytes, as the one
    out-of-band frame of its transmission: the daemon's answer to an ObjectRequest streams
    each object larger than OBJECT_CHUNK_BYTES this way, in order, before the ObjectData
    that ends the answer (protocol/chunks.py puts them together)."""

    object_id: bytes
    offset: int
    total: int


class ObjectPartsTaken(NamedTuple):
    """The peer has written ``parts`` more ObjectParts: the daemon may send that many more."""

    parts: int


class ResultPart(NamedTuple):
    """Bytes ``offset`` onwards of object ``object_id`` of ``total`` bytes, the result of task
    ``task_id`` being streamed into the daemon's store, as the one out-of-band frame of its
    transmission: forwarded as the daemon receives it, in order, before the TaskResult that
    names the object (scheduler/result_stream.py; client/pushed.py reads it as it comes)."""

    task_id: int
    object_id: bytes
    offset: int
    total: int


class ResultPartsTaken(NamedTuple):
    """The client received ``parts`` more ResultParts: the daemon may forward that many more."""

    parts: int


class ResultStreamEnded(NamedTuple):
    """No more ResultParts of ``object_id`` come (the worker was lost, the client fell behind
    the window, the result did not name it): the client drops its parts, and reads the
    result from the store if its TaskResult comes."""

    object_id: bytes
    reason: str


class ObjectStored(NamedTuple):
    """The answer to the last chunk of an object (or to a chunk that failed): "" or why."""

    object_id: bytes
    error: str


class ClusterBroken(NamedTuple):
    reason: str
    payload: bytes  # pickled exception with remote traceback, may be empty


class Seceded(NamedTuple):
    task_ids: list[int]


class LaneStarted(NamedTuple):
    """Lane tasks (worker/lanes.py) still running a moment after they came: from now on
    the daemon counts them as this worker's, until LaneDone names them."""

    task_ids: list[int]


class LaneEnds(NamedTuple):
    client_id: int
    ended: int


class LaneDone(NamedTuple):
    """Tasks that came down this worker's lanes (worker/lanes.py) and ended since the last
    report, for the daemon's counters."""

    finished: int
    failed: int
    retried: int  # their processor died: the client submits them again through the daemon
    delivered: int  # of those that ended, results the processor sent straight to the client
    seconds: float  # their run time, summed
    announced: list[int]  # those of them a LaneStarted named
    # (Their runs for the daemon's history go in the worker's TaskRuns, with its other tasks'.)
    # The first few that failed (at most worker/lanes.py LANE_FAILURES per report, payloads of
    # at most 64 KiB, no objects): the daemon's recent failures, with their tracebacks.
    failures: list[TaskResult] = []  # noqa: RUF012
    # Each client's lane tasks that have ended here, in all (cumulative, not since the last
    # report: a daemon restarted on its journal learns them from the next one).  A client's
    # StatsRequest.lanes is answered once these reach what it has seen.
    clients: list[LaneEnds] = []  # noqa: RUF012


class LaneFlush(NamedTuple):
    """D→W: a client's statistics wait for this worker's lane tasks to be counted: send a
    LaneDone now (even of nothing new), and the next one as soon as a lane task ends."""


class StatsRequest(NamedTuple):
    # A client's: worker name -> the lane tasks' results it received from that worker's
    # lane (cumulative; worker/lanes.py).  The daemon answers once that worker's LaneDone
    # counted as many of this client's (or the worker is gone): a result the caller had is
    # in the counters it reads.  Empty for monitors, and for clients without a lane.
    lanes: dict[str, int] = {}  # noqa: RUF012


class WorkerStat(NamedTuple):
    """One worker as the daemon sees it (in Stats; see scheduler/stats.py for the meaning)."""

    name: str
    host: str
    pid: int
    processors: int
    tasks: int  # the daemon's tasks at it (announced lane tasks included)
    lane_tasks: int
    seceded: int
    queued: int  # as its last heartbeat said
    running: int
    mean_task_seconds: float  # -1.0: not timed yet
    peak_memory: int  # bytes of private memory its last task peaked at, 0 unknown
    last_heard: float  # seconds since its last message
    idle_for: float  # seconds since it last held no task, 0 while it holds some
    draining: bool
    broken: str
    memory: int = 0  # its processors' private memory now, bytes (its last heartbeat)
    memory_limit: int = 0  # 0: none
    cpu: float = 0.0  # cores its processors kept busy between its last two heartbeats
    store: str = ""  # the host store it maps ("" none), and its figures (its last heartbeat)
    store_bytes: int = 0
    store_capacity: int = 0
    store_objects: int = 0


class ClientStat(NamedTuple):
    name: str
    host: str
    tasks: int
    functions: int
    objects: int  # store objects it holds
    last_heard: float


class StatEvent(NamedTuple):
    """One of the daemon's recent notable events (failures, losses, retries)."""

    ago: float  # seconds before the snapshot
    kind: str
    task_id: int  # 0 when the event is no task's
    where: str  # the worker or client it concerns
    cause: str  # one line
    detail: str  # the tail of a traceback, or ""


class StatWindow(NamedTuple):
    """Tasks that ended in the last ``seconds`` (lane tasks included)."""

    seconds: float
    finished: int
    failed: int
    timed: int  # of them, those whose run time is known
    run_seconds: float  # their run time, summed
    max_seconds: float


class ManagerStat(NamedTuple):
    """One worker manager as the daemon sees it (in Stats; see scheduler/stats.py)."""

    name: str
    kind: str  # its adapter ("local", "slurm", ...), "" before its first offer
    connected: bool
    max_workers: int
    requested: int  # workers asked for, not started yet (not named, or named and not queued)
    starting: int  # workers pending: submitted, waiting for resources or starting
    running: int
    draining: int
    failed: int  # workers that ended without being asked to stop, not by the infrastructure
    pending_keys: int  # worker keys admitted whose worker has not joined yet
    pending_reason: str  # why its pending workers wait ("Resources", ...), "" for none
    last_error: str  # its last refusal or failed worker, "" for none
    last_error_ago: float  # seconds before the snapshot, -1.0 for none
    infrastructure_ends: int  # workers ended by the infrastructure (preemption, walltime)
    interrupted_tasks: int  # tasks interrupted on its workers and run again at no charge


class Stats(NamedTuple):
    snapshot: dict[str, int | float | str]  # the counters (keys of ex.statistics()[...])
    uptime: float = 0.0
    workers: list[WorkerStat] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    clients: list[ClientStat] = []  # noqa: RUF012
    events: list[StatEvent] = []  # noqa: RUF012
    windows: list[StatWindow] = []  # noqa: RUF012
    store: dict[str, int] = {}  # noqa: RUF012 - the host store's ObjectStoreStats, {} without one
    # Timed tasks' run times since the daemon started: a count per bucket of
    # protocol/runlog.py DURATION_BOUNDS (the last one past the largest bound), and their sum.
    durations: list[int] = []  # noqa: RUF012
    duration_sum: float = 0.0
    store_name: str = ""  # the host store's name (workers that map it report it by this name)
    managers: list[ManagerStat] = []  # noqa: RUF012


class HistoryRequest(NamedTuple):
    pass


class TaskRun(NamedTuple):
    """One task run the daemon heard of (its TaskFacts): the report's task stream."""

    worker: str
    started: float  # wall clock (the worker's time.time())
    finished: float
    status: int  # Status


class TaskRuns(NamedTuple):
    """A worker's task runs since its last TaskRuns (sent beside its heartbeats), for the
    daemon's history and run-time figures: one blob the daemon stores as it came and decodes
    only when a history is asked for, and the run times summed up by the worker
    (protocol/runlog.py), so a task costs the daemon's loop nothing for them."""

    kept: int  # runs in ``runs``
    seen: int  # runs that ended since the last report: more than ``kept`` when its ring overflowed
    runs: bytes  # protocol/runlog.py pack: ``kept`` starts, ``kept`` ends (float64 LE), ``kept`` statuses
    # Its tasks that ended well with a run time (the daemon's own, not lane tasks'), since the
    # last report: how many, their seconds summed, the longest, a count per bucket of
    # protocol/runlog.py DURATION_BOUNDS ([] when none), and the last one's peak private memory.
    timed: int = 0
    seconds: float = 0.0
    longest: float = 0.0
    durations: list[int] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    peak_memory: int = 0


class SeriesBucket(NamedTuple):
    """One bucket of the run's coarse time series (scheduler/history.py)."""

    start: float  # seconds from the daemon's first recorded event to the bucket's start
    finished: int  # tasks that ended well in it
    failed: int  # tasks that failed in it
    memory: int  # the workers' total memory, bytes: the most seen in it
    workers: int  # workers connected: the most seen in it


class History(NamedTuple):
    runs: list[TaskRun]  # oldest first: the most recent scheduler/history.py RUNS
    runs_seen: int  # runs recorded since the start (more than len(runs) once the ring is full)
    bucket_seconds: float  # the series' bucket width now (it doubles as the run grows)
    series: list[SeriesBucket]  # oldest first; buckets in which nothing happened are left out
    config: dict[str, str]  # the daemon's configuration, each value as text
    uptime: float  # seconds since the daemon's first tick


class TasksWithoutWorker(NamedTuple):
    tasks: int  # this client's tasks queued with no worker able to run them
    waited: float  # seconds since the daemon first saw them so
    reason: str  # why, one clause per kind of task: "no worker is connected", "no worker has gpu=1"


class ManagerOffer(NamedTuple):
    """A worker manager's capacity (sent after Welcome, and again when it changes)."""

    kind: str  # the adapter: "local", "slurm", ...
    max_workers: int
    min_workers: int  # kept running even when idle
    processors: int  # per worker
    resources: dict[str, float]  # each worker's
    tags: list[str]  # each worker's
    startup_seconds: float  # estimate: request → worker connected
    where: str  # human-readable: "host h1", "partition gpu", ...
    # The workers it runs now (adopted after a restart): the daemon forgets the others it
    # had recorded for this manager, and withdraws their keys.
    adopted: list[str]


class WorkerChange(NamedTuple):
    """One change in one managed worker's life (manager/adapter.py: WorkerReport)."""

    name: str
    state: str  # requested | pending | running | draining | gone
    job: str
    host: str
    reason: str
    log_tail: str
    ends_at: float
    infrastructure: bool  # gone because of the infrastructure, not of what it ran


class WorkerStates(NamedTuple):
    changes: list[WorkerChange]


class WorkerKey(NamedTuple):
    name: str
    public_key: str  # Z85


class WorkerKeys(NamedTuple):
    keys: list[WorkerKey]


class KeysAdmitted(NamedTuple):
    names: list[str]


class ScaleWorkers(NamedTuple):
    start: int  # this many more workers
    stop: list[str]  # these workers (drained: they hold no task, or never ran)


class Resume(NamedTuple):
    """P→D, first message on a new connection to a daemon restarted on its journal: "I am
    the peer you welcomed as ``peer_id``" (``token`` from that Welcome proves it).  Answered
    with a Welcome; then the peer sends its report (ClientReport / WorkerReport)."""

    peer_id: int
    token: bytes


class ClientReport(NamedTuple):
    """C→D after a resumed Welcome: what the client still awaits, and everything the daemon
    may not have journaled: its live callables and options, and every task it submitted
    that was never acknowledged (SubmitAck), in order.  The daemon ignores what it knows.
    What it did while its daemon was down (releases, cancels: sent to nowhere) is in it
    too, as state: what it no longer lists it released, or no longer awaits.  The daemon's
    reconciliation is scheduler/reconcile.py."""

    awaiting: list[int]  # task ids whose futures are pending (anything else of its it no longer wants)
    functions: list[FunctionBlob]  # every callable it holds (anything else of its it released)
    options: list[RegisterOptions]
    tasks: list[TaskSpec]
    objects: list[bytes]  # the store objects it holds (pins, results not read yet), once per hold
    cancels: list[int]  # awaited tasks it asked to cancel and got no answer for (TasksCancelled follows)
    forced: list[int]  # awaited tasks it asked to cancel with force (ex.cancel(f, force=True))


class WorkerReport(NamedTuple):
    """W→D after a resumed Welcome: the tasks it holds (queued or running) and those it
    finished whose results the daemon has not acknowledged; those results follow, sent again."""

    holding: list[TaskAttempt]
    finished: list[TaskAttempt]


class ResultsAck(NamedTuple):
    """C→D: TaskResults messages received since the last Welcome (cumulative): the daemon
    forgets the results it kept for redelivery across a restart."""

    received: int


class ResultsJournaled(NamedTuple):
    """D→W: TaskResults messages from this worker journaled since its last Welcome
    (cumulative): the worker forgets the results it kept to send again after a restart."""

    journaled: int


# Tags on the wire.  Append only: a tag is never reused for another message.
MESSAGE_TAGS: dict[type, int] = {
    Hello: 1,
    Welcome: 2,
    Refused: 3,
    Heartbeat: 4,
    Goodbye: 5,
    RegisterFunction: 6,
    ReleaseFunctions: 7,
    RegisterOptions: 8,
    SubmitTasks: 9,
    SubmitAck: 10,
    TasksRunning: 11,
    DispatchTasks: 12,
    CancelTasks: 13,
    TaskResults: 14,
    ReleaseObjects: 15,
    ClusterBroken: 16,
    StatsRequest: 17,
    Stats: 18,
    Seceded: 19,
    PinObjects: 20,
    ObjectRequest: 21,
    ObjectData: 22,
    LaneDone: 23,
    LaneStarted: 24,
    TasksCancelled: 25,
    ManagerOffer: 26,
    WorkerStates: 27,
    WorkerKeys: 28,
    KeysAdmitted: 29,
    ScaleWorkers: 30,
    ObjectChunk: 40,
    ObjectStored: 41,
    TasksWithoutWorker: 42,
    HistoryRequest: 43,
    History: 44,
    WorkerDraining: 45,
    Resume: 46,
    ClientReport: 47,
    WorkerReport: 48,
    ResultsAck: 49,
    ResultsJournaled: 50,
    ObjectPart: 56,
    ObjectPartsTaken: 57,
    TaskRuns: 62,
    ResultPart: 65,
    ResultPartsTaken: 66,
    ResultStreamEnded: 67,
    LaneFlush: 68,
}

# Which roles may send which messages to the daemon.
ACCEPTED_FROM: dict[str, frozenset[type]] = {
    Role.CLIENT: frozenset(
        {
            Heartbeat,
            Goodbye,
            RegisterFunction,
            ReleaseFunctions,
            RegisterOptions,
            SubmitTasks,
            CancelTasks,
            ReleaseObjects,
            PinObjects,
            ObjectRequest,
            ObjectPartsTaken,
            ObjectChunk,
            ResultPartsTaken,
            StatsRequest,
            HistoryRequest,
            ClientReport,
            ResultsAck,
        }
    ),
    Role.WORKER: frozenset(
        {
            Heartbeat,
            Goodbye,
            TaskResults,
            ClusterBroken,
            Seceded,
            ObjectRequest,
            ObjectPartsTaken,
            ObjectChunk,
            LaneDone,
            LaneStarted,
            WorkerDraining,
            WorkerReport,
            TaskRuns,
        }
    ),
    Role.MONITOR: frozenset({Heartbeat, Goodbye, StatsRequest, HistoryRequest}),
    Role.MANAGER: frozenset({Heartbeat, Goodbye, StatsRequest, ManagerOffer, WorkerStates, WorkerKeys}),
}
