"""The bottom layer of the worker agent (agent.py explains the layers): its tunables and the
state every layer shares: the connection, the processors' records, the queue, the tasks held.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from scaler_executor._compat import DAEMON_ADDRESS_ENV
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import channel
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming
from scaler_executor.protocol.rejoin import Backoff
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.worker import processor as proc
from scaler_executor.worker.fetches import Fetches
from scaler_executor.worker.lanes import Lanes
from scaler_executor.worker.memory import OomCounter
from scaler_executor.worker.processes import Processor
from scaler_executor.worker.resume import WorkerResume
from scaler_executor.worker.zygote import ZygoteHandle, start_zygote

log = logging.getLogger("scaler_executor.worker")

PICKLE_5 = b"\x80\x05"  # how a pickle stream of protocol 5 begins (PROTO 5): streamed to tasks as it comes
FN_MEANS_MAX = 4096  # callables timed at once (their releases remove them; this bounds a leak)
EXIT_STATUS_GRACE = 1.0  # seconds to wait for the zygote's report of how a processor died
RESPAWN_BACKOFF = (0.0, 0.0, 0.1, 0.5, 2.0)  # after consecutive processors died without a task done

MEMORY_SAMPLE_SECONDS = 0.1
RESULT_LINGER = 0.001  # most a result waits for others when the worker is saturated
# A worker holding no task sends its task runs (protocol/runlog.py) at once, not at its next
# heartbeat, so that the end of a burst shows in the dashboard and a report without waiting;
# at most this often, so that a sequential caller (idle after every task) costs the daemon
# one TaskRuns per this many seconds, not one per task.
RUNS_IDLE_SECONDS = 0.05
RESULT_BATCH = 64  # results that go at once, saturated or not
HOUSEKEEPING_SECONDS = 0.005  # timers' resolution under load (deadlines, respawns, silence)
ZYGOTE_WARM_IDLE = 0.2  # seconds without a task before the zygote may spend CPU on imports
DRAIN_MARGIN = 1.0  # seconds of drain_seconds kept for the Goodbye and the processors' end


def _error(text: str) -> bytes:
    """A task error raised in the agent, in the wire form of a task's exception."""
    return proc.dump_exception(RuntimeError(text))


class AgentBase(ABC):
    """The state every layer of the agent shares (``__init__``).  Not an agent alone:
    ``WorkerAgent`` completes it."""

    # Made by WorkerAgent._join_layers, from the methods of the layers above this one.
    incoming: Incoming  # fetched objects that come in parts
    _daemon_handlers: dict[type, Callable[[Any], None]]  # what the daemon sends, by type

    def __init__(
        self,
        config: ClusterConfig,
        address: str,
        *,
        processors: int,
        name: str | None = None,
        initializer: bytes | None = None,
        max_tasks_per_child: int | None = None,
        lifeline_fd: int | None = None,
        resources: dict[str, float] | None = None,
        tags: list[str] | None = None,
        memory_limit: int | None = None,
        fetch_objects: bool = False,
        security: Any = None,  # a security.client.ClientSecurity on a secured tcp:// daemon
    ) -> None:
        if processors < 1:
            raise ValueError(f"a worker needs at least one processor, got {processors}")
        self.config = config
        self.address = address
        self.capacity = processors
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.max_tasks = max_tasks_per_child
        self.lifeline_fd = lifeline_fd
        self.resources = resources or {}
        self.tags = tags or []
        self.memory_limit = memory_limit
        self.fetch_objects = fetch_objects  # True: reach the daemon's store over the network only
        self.store_name = ""  # the daemon host's store, when this host can map it
        self.store: Any = None  # our handle on it
        self.threshold = config.object_store_threshold
        self.capture_dir = ""  # where processors capture tasks' fds 1/2 (worker/capture.py), made on first use
        self.fetches = Fetches()  # objects fetched over the network for held tasks, and who waits (fetches.py)
        self.oom = OomCounter()
        self.next_sample = 0.0
        self.memory_total = 0  # the processors' private memory at the last sample
        # CPU each live processor had used at the last heartbeat, and when: the next
        # heartbeat reports the cores they kept busy in between (a new processor counts
        # from its first sample, a gone one drops out).
        self.cpu_seen: dict[int, float] = {}
        self.cpu_at = 0.0
        self.last_heartbeat = 0.0
        self.runs_sent = 0.0  # when its last TaskRuns went
        self.next_housekeeping = 0.0
        # Tasks reach the cluster they run on through get_executor() (nested tasks).
        os.environ[DAEMON_ADDRESS_ENV] = address
        if not fetch_objects:
            # The store's module before the zygote's fork, so that the processors have it: a
            # processor's first task maps the store, and importing it there (cffi and the C
            # module: ~4 ms alone, ~13 ms beside a cold start's other processes) delayed the
            # first result, as did this agent's own import at the Welcome.
            import scaler_executor.objstore  # noqa: F401
        # Fork the zygote first: no thread and no ZeroMQ context may exist yet.
        self.zygote: ZygoteHandle = start_zygote(initializer, max_tasks_per_child, config.arrays_in_store)
        self.sock = channel.connect(address, hwm=config.send_hwm, linger=0.2, security=security)
        self.poller = channel.Poller()
        self.poller.register(self.sock.pollable)
        # Task runs for the daemon's history, recorded here and sent beside the heartbeats
        # (protocol/runlog.py): sized by the daemon's Welcome; lane tasks' go in it too.
        self.runlog = RunLog()
        self.lanes = Lanes(self.name, runs=self.runlog)  # where local clients submit sequential tasks (lanes.py)
        self.poller.register(self.zygote.control.fileno())
        self.processors: dict[int, Processor] = {}  # by fd
        self.stderr_of: dict[int, Processor] = {}  # by the fd of its stderr pipe
        self.by_pid: dict[int, Processor] = {}
        self.starting = 0
        self.queue: deque[m.TaskDispatch] = deque()
        self.held: dict[int, m.TaskDispatch] = {}  # every task this worker holds
        self.cancelled: set[tuple[int, int]] = set()  # (task, attempt) to answer CANCELLED
        self.functions: dict[int, bytes] = {}
        self.results: list[m.TaskResult] = []
        self.results_since = 0.0  # when the oldest result in self.results was ready
        self._frames_of_last_message: list[Any] = []  # codec.decode's out-of-band buffers
        self._pending_writes: dict[Processor, list[bytes]] | None = None  # see _to_processor
        self.outbox: list[object] = []
        self.resume = WorkerResume()  # a journaled daemon's restart (worker/resume.py)
        # Chunks of large results streamed to the daemon's store (_offload), sent before
        # the next batch; the daemon's store, as its Welcome named it ("" for none).
        self.raw_out: deque[list[Any]] = deque()
        self.daemon_store = ""
        self.mean_task: float | None = None  # EWMA of task durations; None until one finished
        self.fn_means: dict[int, float] = {}  # the same per callable (fn_id; 0: inline ones)
        self.straggler_watch = False  # housekeeping every HOUSEKEEPING_SECONDS: see _recall
        self.welcomed = False
        self.stopping = False
        self.drain_seconds = config.drain_seconds
        self.drain_requested = False  # SIGTERM came with drain_seconds > 0 (set by the handler)
        self.draining = False  # handing back what it never started, finishing the rest
        self.drain_deadline = 0.0
        self.orphaned = False  # the daemon that started us is stopping or gone
        self.broken: str | None = None
        self.exit_code = 0
        self.last_recv = time.monotonic()
        self.last_busy = self.last_recv  # when this worker last held a task (while not zygote_warm)
        self.zygote_warm = False  # asked the zygote to import what later processors need
        self.last_send = 0.0
        self.last_hello = 0.0
        self.connections_seen = 0  # the transport's connections when last looked (_flush)
        # Hello again until a Welcome (protocol/rejoin.py): from twice the heartbeat interval
        # (at least a second: a second Hello on a known connection makes the daemon forget
        # what it gave us) up to the silence limit, capped at 30 s.
        first = max(1.0, 2 * config.heartbeat_interval)
        self.rejoin = Backoff(first, max(first, min(30.0, config.heartbeat_interval * config.heartbeat_liveness)))
        self.next_hello = 0.0
        self.heartbeat_interval = config.heartbeat_interval
        self.idle_heartbeat = config.heartbeat_interval  # (until a Welcome names the daemon's limit)
        self.idle_reported = False  # our last heartbeat said we held nothing (_flush)
        self.daemon_silence_limit = max(config.heartbeat_interval * config.heartbeat_liveness, config.daemon_loss_timeout)
        self.died_in_a_row = 0
        self.respawn_at = 0.0
        self._signal_r, self._signal_w = os.pipe()
        os.set_blocking(self._signal_r, False)
        os.set_blocking(self._signal_w, False)
        self.poller.register(self._signal_r)
        if lifeline_fd is not None:
            self.poller.register(lifeline_fd)
        self._join_layers()

    @abstractmethod
    def _join_layers(self) -> None:
        """Bind what the layers above provide (WorkerAgent)."""

    def _capture_dir(self) -> str:
        if not self.capture_dir:
            self.capture_dir = tempfile.mkdtemp(prefix="scaler-capture-")
        return self.capture_dir
