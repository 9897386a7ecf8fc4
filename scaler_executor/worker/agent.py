"""The worker agent: one connection to the daemon, N processors doing the work.

::

    daemon ──DispatchTasks──► agent ──RUN──► processor 1..N (children of the zygote)
           ◄──TaskResults───        ◄─DONE──
                                      zygote ──SPAWNED/EXITED──► agent

* The agent is single-threaded: one ``channel.Poller`` over the daemon socket, the
  processors' sockets, the zygote's control socket, the lifeline and the
  signal wake-up pipe.
* A processor gets one task; when tasks are short (under 5 ms) three, and when
  they take well under a millisecond up to eight, as long as those queued behind
  the running one add up to at most 2 ms (they hide the agent's turnaround and
  share one write; a long task never has another queued behind it).
  The first task a processor holds is the one running: if it dies, that task
  failed (``PROCESSOR_DIED``, the daemon decides on a retry) and the others go
  back to the agent's queue without counting as an attempt.
* Results leave in one batch per loop iteration.  Heartbeats fill silence.
* Each task run (start, end, status) and run time goes into a RunLog
  (protocol/runlog.py), sent as one TaskRuns beside each heartbeat, for the daemon's
  history and figures: the daemon records nothing per task for them.
* ``task_timeout`` and ``cancel(force=True)`` kill the processor running the
  task; the zygote forks a replacement in a few milliseconds.
* Stopping: SIGINT, or SIGTERM without ``drain_seconds``, stops at once: held-back
  results, then a Goodbye listing the tasks no processor was given, and the processors
  are killed (the daemon counts what they ran as interrupted).  SIGTERM with
  ``drain_seconds`` (``--drain-seconds``; the Slurm manager sets it below its walltime
  drain) drains first: ``WorkerDraining`` hands back at once every task no processor
  started (the queue, and those queued inside processors, recalled exactly), no task is
  taken any more, the started ones run to their end and are reported, and the Goodbye
  comes when none is left or ``drain_seconds`` less DRAIN_MARGIN has passed.  A second
  SIGTERM or a SIGINT stops at once.  Lane tasks it holds run to their end too (see
  ``_drain``).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor._compat import DAEMON_ADDRESS_ENV, python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming, StreamError
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.rejoin import (
    Backoff,
    idle_heartbeat,
    is_not_resumable,
    is_unknown_peer,
)
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.worker import capture, handoff
from scaler_executor.worker import processor as proc
from scaler_executor.worker.dealing import MAX_DEPTH, recall_due, takes_more, task_depth
from scaler_executor.worker.fetches import Fetches
from scaler_executor.worker.lanes import Lane, Lanes
from scaler_executor.worker.memory import OomCounter, cpu_seconds, private_memory
from scaler_executor.worker.processes import Processor, size_text
from scaler_executor.worker.resume import WorkerResume
from scaler_executor.worker.zygote import EXITED, SPAWNED, ZygoteHandle, start_zygote

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


class WorkerAgent:
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
        # fetched objects that come in parts (protocol/chunks.py), written into memfds that
        # the processors map (worker/handoff.py)
        self.incoming = Incoming(
            allocate=handoff.allocate, write=handoff.write, finish=handoff.seal, started=self._object_started, abort=handoff.Unsealed.abort
        )
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
        self._daemon_handlers: dict[type, Callable[[Any], None]] = {
            m.DispatchTasks: self._on_dispatch,
            m.ObjectData: self._on_object_data,
            m.ObjectPart: self._on_object_part,
            m.CancelTasks: self._on_cancel_tasks,
            m.ReleaseFunctions: self._on_release_functions,
            m.Welcome: self._on_welcome,
            m.Refused: self._on_refused,
            m.Goodbye: self._on_goodbye,
            m.Heartbeat: self._on_heartbeat,
            m.ObjectStored: self._on_object_stored,
            m.ResultsJournaled: lambda message: self.resume.journaled(message.journaled),
            m.LaneFlush: lambda message: self.lanes.flush(),  # a client's statistics wait for our LaneDone
        }
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
        # Ask the zygote for the processors now: they fork and start while the rest of the
        # start-up and the handshake run (their first task carries the store's name).
        self._reconcile(time.monotonic())

    # ------------------------------------------------------------------ run

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._signal_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGTERM and self.drain_seconds > 0 and not self.drain_requested:
            self.drain_requested = True  # the loop starts the drain (_drain)
        else:
            self.stopping = True

    def run(self) -> int:
        self._hello()
        self._reconcile(time.monotonic())
        tick = min(self.config.heartbeat_interval / 2, 0.25)
        try:
            while not self.stopping:
                timeout = tick * 1000
                if self.queue and self.starting:
                    timeout = min(timeout, 50)
                if self.straggler_watch:
                    timeout = min(timeout, HOUSEKEEPING_SECONDS * 1000)
                if self.results:  # held back to travel together: at most RESULT_LINGER
                    left = self.results_since + RESULT_LINGER - time.monotonic()
                    timeout = min(timeout, math.ceil(max(0.0, left) * 1000))  # rounded up to whole ms
                lanes = self.lanes.by_pollable
                reading = bool(lanes) and not self.draining  # a draining worker reads no lane
                if reading and self.lanes.buffered():  # transmissions read earlier and not yet
                    timeout = 0  # handled: no poller sees them
                notice = self.lanes.next_notice(time.monotonic()) if lanes else None
                if notice is not None:  # a lane task to announce to the daemon
                    timeout = min(timeout, math.ceil(notice * 1000))
                report = self.lanes.report_due(time.monotonic()) if lanes or self.lanes.flush_now else None
                if report is not None:  # a LaneDone waiting for company (or asked for)
                    timeout = min(timeout, math.ceil(report * 1000))
                ready = self.poller.poll(self.sock.poll_timeout(timeout))
                if self.sock.buffered:
                    self._on_daemon()
                if reading:
                    for lane in self.lanes.buffered_lanes():
                        self._on_lane(lane)
                for target in ready:
                    self._on_ready(target)
                now = time.monotonic()
                if self.drain_requested:
                    self._drain(now)
                # Tasks and results first: timers and processor bookkeeping are not on a
                # task's path, and run every HOUSEKEEPING_SECONDS or after a structural event.
                self._assign(now)
                self._flush(now)
                if now >= self.next_housekeeping:
                    self.next_housekeeping = now + HOUSEKEEPING_SECONDS
                    self._housekeeping(now)
                    self._assign(now)  # tasks it handed back (a processor buried), if any
                    self._flush(now)
        finally:
            self._shutdown()
        return self.exit_code

    def _on_ready(self, target: Any) -> None:  # an fd or a channel's pollable, as Poller.poll gives them
        if target == self.sock.pollable:
            self._on_daemon()
            return
        p = self.processors.get(target)
        if p is not None:
            self._on_processor(p)
            return
        lane = self.lanes.by_pollable.get(target)
        if lane is not None:
            self._on_lane(lane)
            return
        self.next_housekeeping = 0.0  # anything but tasks and results: housekeeping at once
        if target == self.zygote.control.fileno():
            self._on_zygote()
        elif target == self._signal_r:
            try:
                os.read(self._signal_r, 512)
            except BlockingIOError:
                pass
        elif target == self.lifeline_fd and self.lifeline_fd is not None:
            try:
                said = os.read(self.lifeline_fd, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                said = b""
            if said:  # LIFELINE_STOP (worker_command.py): whoever started us stops us, cleanly
                log.info("worker %s: stopped by the process that started it", self.name)
                self.poller.unregister(self.lifeline_fd)
                # Its daemon removes its region itself, or keeps it for a restart on its journal.
                self.orphaned = not self.resume.journal
                self.stopping = True
                return
            self.orphaned = True
            if self.resume.journal:
                # Its daemon died, and has a journal: its client restarts it (the embedded
                # cluster), and this worker waits for it like any other (worker/resume.py).
                log.warning("worker %s: its daemon's lifeline closed; waiting for the daemon's restart", self.name)
                self.poller.unregister(self.lifeline_fd)
                return
            log.info("worker %s: lifeline closed, stopping", self.name)
            self.stopping = True
        else:
            p = self.stderr_of.get(target)
            if p is not None:
                self._on_stderr(p)

    # ------------------------------------------------------------------ daemon side

    def _hello(self) -> None:
        self.last_hello = time.monotonic()
        self.next_hello = self.last_hello + self.rejoin.next_delay()
        hello = m.Hello(
            m.Role.WORKER,
            m.PROTOCOL_VERSION,
            python_version(),
            cloudpickle.__version__,
            __version__,
            self.name,
            os.getpid(),
            socket.gethostname(),
            self.capacity,
            self.resources,
            self.tags,
        )
        self._send_now([hello])

    def _send_now(self, batch: list[object]) -> None:
        # At most SEND_BATCH_MESSAGES a transmission (the daemon refuses a batch over
        # codec.MAX_BATCH_MESSAGES): an outbox that grew while the daemon did not read can
        # hold more.
        step = codec.SEND_BATCH_MESSAGES
        for start in range(0, len(batch), step):
            try:
                self.sock.send(codec.encode(batch[start : start + step] if len(batch) > step else batch))
            except channel.Again:
                # The daemon is not keeping up (or not there): keep the rest for the next turn.
                self.outbox[:0] = batch[start:]
                return
            self.last_send = time.monotonic()
            if self.resume.journal:
                self.resume.sent(batch[start : start + step])

    def _on_daemon(self) -> None:
        sock, handlers = self.sock, self._daemon_handlers
        while sock.readable():
            try:
                frames = sock.recv()
            except channel.Again:
                return
            self.last_recv = time.monotonic()
            try:
                messages, buffers = codec.decode(frames)
            except codec.DecodeError as exc:
                log.warning("worker %s: dropped a bad transmission from the daemon: %s", self.name, exc)
                continue
            self._frames_of_last_message = buffers
            for message in messages:
                handler = handlers.get(type(message))
                if handler is None:
                    self._on_unexpected(message)
                else:
                    handler(message)
            # By the batch's last message, not the loop variable: an empty batch (which the
            # codec accepts) left that unbound, and the UnboundLocalError stopped the worker.
            if messages and type(messages[-1]) is not m.DispatchTasks:
                self.next_housekeeping = 0.0

    def _on_lane(self, lane: Lane) -> None:
        now = time.monotonic()
        for item in self.lanes.receive(lane, self.held, now):
            if type(item) is m.TaskDispatch:
                self.last_busy = now
                self.queue.append(item)
            elif type(item) is m.CancelTasks:
                self._cancel(item.task_ids, item.force)
            else:
                self._forget_functions(item.fn_ids)

    def _forget_functions(self, fn_ids: list[int]) -> None:
        """Processors that have any of these callables drop them, unless the daemon's table
        still has them (a lane released one the daemon also sent)."""
        ids = [fn_id for fn_id in fn_ids if fn_id not in self.functions]
        for fn_id in ids:
            self.fn_means.pop(fn_id, None)
        if ids:
            forget = msgpack.packb([proc.FORGET, ids])
            for p in self.processors.values():
                if p.eof_at is None and not p.functions.isdisjoint(ids):
                    p.functions.difference_update(ids)
                    self._to_processor(p, forget)

    # One handler per message type the daemon sends a worker (_on_daemon looks them up in
    # self._daemon_handlers, filled in __init__); any other type is dropped (_on_unexpected).

    def _on_dispatch(self, message: m.DispatchTasks) -> None:
        self.last_busy = self.last_recv
        for blob in message.functions:
            self.functions[blob.fn_id] = blob.payload
        if not self.fetch_objects:
            for task in message.tasks:
                self.held[task.task_id] = task
                self.queue.append(task)
            return
        request: list[bytes] = []
        for task in message.tasks:
            self.held[task.task_id] = task
            # (a draining worker hands it back: nothing to fetch)
            need = self.fetches.hold(task.task_id, () if self.draining else self._object_ids_of(task))
            request += need.request
            if need.ready:
                self.queue.append(task)  # (else parked until its objects arrive)
        if request:
            self.outbox.append(m.ObjectRequest(request))

    def _on_cancel_tasks(self, message: m.CancelTasks) -> None:
        self._cancel(message.task_ids, message.force)

    def _on_release_functions(self, message: m.ReleaseFunctions) -> None:
        ids = message.fn_ids
        for fn_id in ids:
            self.functions.pop(fn_id, None)
        self._forget_functions(ids)  # a lane task still queued gets it again from lanes.functions

    def _on_welcome(self, message: m.Welcome) -> None:
        self.daemon_store = message.object_store
        resumed = self.resume.welcomed(message)
        if self.welcomed and not resumed:
            # The answer to a repeated Hello: the daemon treated it as joining again and took
            # back what it had given us under the first Welcome.
            log.info("worker %s: welcomed again (a repeated Hello); discarding what it held", self.name)
            self._forget_daemon_state()
        self.welcomed = True
        self.runlog.resize(message.runs)
        self.rejoin.reset()
        self._reach_store(message.object_store)
        # Send at least as often as the daemon expects; judge its silence by its own pace.
        self.heartbeat_interval = min(self.config.heartbeat_interval, message.heartbeat_interval)
        self.idle_heartbeat = max(self.heartbeat_interval, idle_heartbeat(message.heartbeat_interval, message.heartbeat_liveness))
        self.daemon_silence_limit = max(
            self.config.heartbeat_interval * self.config.heartbeat_liveness,
            message.heartbeat_interval * message.heartbeat_liveness,
            self.config.daemon_loss_timeout,  # a daemon holding 10^6 tasks may pause to collect garbage
            self.resume.silence_limit(message.heartbeat_interval, message.heartbeat_liveness),
        )
        if resumed:
            self.orphaned = False  # its region is the restarted daemon's now: not ours to remove
            log.warning("worker %s resumed with the daemon at %s after its restart", self.name, self.address)
            # Not lane tasks (lanes.py): never the daemon's (a restarted one has no record of
            # them, and would cancel them as strays); they run on for their clients.
            lane_tasks = self.lanes.tasks
            holding = [m.TaskAttempt(t, task.attempt) for t, task in self.held.items() if t not in lane_tasks]
            # Finished and not sent yet: in the outbox (made while we waited) or still collecting.
            waiting = [r for message in self.outbox if type(message) is m.TaskResults for r in message.results]
            self._send_now(self.resume.report(holding, waiting + self.results))
            return
        log.info("worker %s joined the daemon at %s as worker %d", self.name, self.address, message.peer_id)

    def _on_refused(self, message: m.Refused) -> None:
        reason = message.reason
        if is_unknown_peer(reason):
            if is_not_resumable(reason):
                if self.welcomed or self.resume.resuming:
                    self.resume.forget()
                    self.welcomed = True  # (for _rejoin: the loss is logged once)
                    self._rejoin(f"the daemon at {self.address} cannot resume this worker ({reason})")
            elif self.resume.resuming:
                pass  # the refusals of what we sent before our Resume
            elif self.welcomed and (resume := self.resume.start()) is not None:
                log.warning("worker %s: the daemon at %s restarted; resuming on its journal", self.name, self.address)
                self.welcomed = False  # what we have to say waits for its Welcome
                self.next_hello = time.monotonic() + self.rejoin.next_delay()
                self._send_now([resume])
            elif self.welcomed:  # once per loss: the refusals of what we sent before our Hello follow
                self._rejoin(f"the daemon at {self.address} does not know this worker (restarted without a journal?)")
        else:
            log.error("worker %s: the daemon refused it: %s", self.name, reason)
            self.exit_code = 2
            self.stopping = True

    def _on_goodbye(self, message: m.Goodbye) -> None:
        log.info("worker %s: the daemon is stopping (%s)", self.name, message.reason)
        if self.lifeline_fd is not None or self.draining:
            self.stopping = True
        else:
            self._forget_daemon_state()

    def _on_object_stored(self, message: m.ObjectStored) -> None:
        if message.error:  # the result it held is lost: its client hears that reading it
            log.warning("worker %s: the daemon could not store a result: %s", self.name, message.error)

    def _offload(self, results: list[m.TaskResult]) -> list[m.TaskResult]:
        """Large results of processors that cannot map the store, streamed to the daemon's
        store in chunks (``ObjectChunk``, zero-copy frames) and sent as store headers, so
        that no message carries them whole: msgpack copies a 100 MB field into the body,
        and the daemon and the client would each decode and copy it again."""
        out = []
        for result in results:
            payload = result.payload
            if result.objects or result.status != Status.OK or len(payload) < max(self.threshold, m.OBJECT_CHUNK_BYTES):
                out.append(result)
                continue
            from scaler_executor.objstore.payload import stream_in_store_header

            object_id, view, step = os.urandom(16), memoryview(payload), m.OBJECT_CHUNK_BYTES
            for offset in range(0, len(view), step):
                # Naming the task: the daemon forwards each chunk to its client as it comes.
                chunk = m.ObjectChunk(object_id, offset, len(view), result.task_id, result.attempt)
                self.raw_out.append(codec.encode([chunk], [view[offset : offset + step]]))
            out.append(result._replace(payload=stream_in_store_header(), objects=[object_id]))
        return out

    def _send_raw(self) -> bool:
        """Send the chunks waiting in ``raw_out``; False if the daemon's queue is full."""
        while self.raw_out:
            try:
                self.sock.send(self.raw_out[0])
            except channel.Again:
                return False
            self.raw_out.popleft()
            self.last_send = time.monotonic()
        return True

    def _on_heartbeat(self, message: m.Heartbeat) -> None:
        pass  # only a sign of life: _on_daemon noted the time the transmission came

    def _on_unexpected(self, message: object) -> None:
        """A message the codec decodes but a worker has no use for (one meant for a client or
        the daemon): logged and dropped, a sign of life only, never a reason to stop."""
        log.warning("worker %s: dropped a %s from the daemon: not a message for a worker", self.name, type(message).__name__)

    # ------------------------------------------------------------------ objects

    def _reach_store(self, name: str) -> None:
        """Map the daemon host's store if this host has it; otherwise fetch over the network."""
        if not name or self.fetch_objects:
            self.fetch_objects = self.fetch_objects or bool(name)
            return
        try:
            from scaler_executor.objstore import ObjectStore

            store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
        except Exception as exc:  # noqa: BLE001  (whatever keeps us from mapping it, the network path works)
            log.info("worker %s cannot map the object store %s (%s): fetching objects over the network", self.name, name, exc)
            self.fetch_objects = True
            return
        if self.store is not None:
            self.store.close()
        self.store = store  # kept: it reaps what dead processors held (_bury)
        self.store_name = name

    def _object_ids_of(self, task: m.TaskDispatch) -> list[bytes]:
        ids = list(task.objects)
        for dep in task.deps:
            ids.extend(dep.objects)
        return ids

    def _on_object_part(self, message: m.ObjectPart) -> None:
        frames = self._frames_of_last_message
        self.incoming.part(message, frames[0] if frames else b"")
        self.outbox.append(m.ObjectPartsTaken(1))  # the daemon's window moves on

    def _object_started(self, object_id: bytes, memfd: handoff.Unsealed) -> None:
        """The first part of a fetched object is written: if it is a pickle stream (the
        objects ``pickle.load`` reads, not out-of-band buffers, which processors map whole),
        the tasks that wait for nothing else run now and read it as it comes (handoff.stream)."""
        if os.pread(memfd.fd, 2, 0) != PICKLE_5:
            return
        for task_id in self.fetches.started(object_id, memfd):
            self.queue.append(self.held[task_id])

    def _on_object_data(self, message: m.ObjectData) -> None:
        buffers = iter(self._frames_of_last_message)
        for object_id, found in zip(message.object_ids, message.found, strict=False):
            blob, why = None, "is no longer in the object store"
            if found:
                try:
                    # bytes, a view of a large frame (wire.recv) or of what came in parts: no copy
                    blob = self.incoming.take(object_id, next(buffers, b""))
                except StreamError as exc:
                    why = f"did not arrive whole ({exc})"
            arrival = self.fetches.arrived(object_id, blob)
            if blob is None and arrival.stream is not None:
                arrival.stream.abort(why)  # tasks reading it as it came fail on it (handoff.Streamed)
            text = f"object {object_id.hex()} of its arguments {why}"
            for task_id in arrival.failed:
                # Gone from the store (its owner released it), or cut short: it cannot run here.
                task = self.held.pop(task_id)
                self.results.append(m.TaskResult(task_id, task.attempt, Status.ERROR, _error(text), m.NO_FACTS, m.NO_OBJECTS))
            if arrival.readers:
                # Those queued to read it as it came, not yet at a processor, fail as parked
                # ones do (the others fail on their stream).
                readers = set(arrival.readers)
                for task in self.queue:
                    if task.task_id in readers and self.held.get(task.task_id) is task:
                        self._unhold(task.task_id)  # the queue passes over it
                        self.results.append(m.TaskResult(task.task_id, task.attempt, Status.ERROR, _error(text), m.NO_FACTS, m.NO_OBJECTS))
            for task_id in arrival.ready:
                self.queue.append(self.held[task_id])

    def _unhold(self, task_id: int) -> m.TaskDispatch:
        """A task this worker will not run or report again: out of ``held``, and its fetched
        objects dropped unless another held task reads them."""
        self.fetches.forget(task_id)
        return self.held.pop(task_id)

    def _forget_daemon_state(self) -> None:
        """The daemon lost track of this worker: what it held is no longer expected anywhere.

        Tasks still running are killed with their processors: the daemon has already
        retried or failed them, and a processor busy with a result nobody wants would keep
        the rejoined worker from running anything else.
        """
        self.welcomed = False
        self.resume.forget()
        self.queue.clear()
        for task_id in list(self.held):
            if not any(task_id in p.outstanding for p in self.processors.values()):
                del self.held[task_id]
        # Results of tasks still running are not wanted (by attempt: the daemon may hand this
        # worker the same task again, as a new attempt, while the old one is being killed).
        self.cancelled.update((task_id, task.attempt) for task_id, task in self.held.items())
        for p in list(self.processors.values()):
            if p.outstanding and p.eof_at is None:
                p.kill_for(Status.CANCELLED, "the daemon no longer expects this task")
        self.fetches.clear()
        self.incoming.clear()  # a partial object's buffer goes with the rest (its streams end short)
        self.results.clear()
        self.raw_out.clear()
        self.lanes.close(self.poller)  # their clients submit what they had there again, to the daemon

    def _cancel(self, task_ids: list[int], force: bool) -> None:
        for task_id in task_ids:
            task = self.held.get(task_id)
            if task is None:
                continue
            holder = next(
                (p for p in self.processors.values() if p.attempts.get(task_id) == task.attempt and task_id in p.outstanding),
                None,
            )
            if holder is None:  # still in our queue, or parked: drop it
                self._unhold(task_id)
                self.results.append(m.TaskResult(task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))
            elif force and holder.outstanding[0] == task_id:
                holder.kill_for(Status.FORCE_CANCELLED, "cancelled with force=True while running")
            else:
                self.cancelled.add((task_id, task.attempt))  # it will run; say cancelled

    # ------------------------------------------------------------------ processors

    def _spawn(self) -> None:
        try:
            self.zygote.request()
        except OSError:
            # The zygote died and its end has not been read yet (a processor's end can come
            # first in the same turn): the same as reading it.
            self._zygote_died()
            return
        self.starting += 1

    def _zygote_died(self) -> None:
        if not self.stopping:
            log.error("worker %s: the zygote died; the worker cannot replace processors and stops", self.name)
        self.exit_code = 3
        self.stopping = True

    def _on_zygote(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.zygote.control, 4096, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            self._zygote_died()
            return
        message = msgpack.unpackb(data)
        if message[0] == SPAWNED:
            self.starting -= 1
            conn = Connection(fds[0])
            p = Processor(message[1], conn, fds[1], fds[2])
            os.set_blocking(fds[1], False)
            os.set_blocking(fds[2], False)
            self.processors[conn.fileno()] = p
            self.stderr_of[fds[1]] = p
            self.by_pid[p.pid] = p
            self.poller.register(conn.fileno())
            self.poller.register(fds[1])
        elif message[0] == EXITED:
            exited = self.by_pid.get(message[1])
            if exited is not None:
                exited.wait_status = message[2]
                if exited.eof_at is not None:
                    self._bury(exited)

    def _on_processor(self, p: Processor) -> None:
        # Everything available in one read (FrameReader): results that arrived together
        # cost one system call.
        try:
            p.reader.fill()
            for raw in p.reader.frames():
                self._on_processor_message(p, msgpack.unpackb(raw))
        except (EOFError, OSError):
            self.next_housekeeping = 0.0
            p.eof_at = time.monotonic()
            self.poller.unregister(p.fd)
            if p.wait_status is not None:
                self._bury(p)

    def _take_back(self, p: Processor, returned: list[int]) -> None:
        """Tasks a processor handed back unstarted: to the front of our queue, in order."""
        given = p.take_back(returned)
        for back in reversed(returned):
            task = self.held.get(back)
            if task is not None and task.attempt == given[back]:
                self.queue.appendleft(task)

    def _on_processor_message(self, p: Processor, message: list[Any]) -> None:
        if message[0] == proc.RECALLED:
            p.recalling = False
            self._take_back(p, message[1])
            return
        if message[0] == proc.SECEDE:
            _, task_id, returned = message
            self._take_back(p, returned)  # queued behind the seceding task
            p.seceded = True
            p.deadline = None  # a task waiting on sub-tasks is timed by its sub-tasks
            self.outbox.append(m.Seceded([task_id]))
            self.next_housekeeping = 0.0  # it needs a processor to stand in for it
            return
        if message[0] == proc.INIT_FAILED:
            reason = "the executor's initializer failed in a worker process"
            self.broken = reason
            log.error("worker %s: %s", self.name, reason)
            self.outbox.append(m.ClusterBroken(reason, message[1]))
            return
        _, task_id, attempt, status, payload, started, finished, peak, result_objects, delivered, output = message
        if type(payload) is int:  # a large result, in the memfd that came beside DONE (handoff.py)
            payload = handoff.attach(p.reader.take_fd(), payload)
        p.seceded = False
        p.recalling = False  # its head changed; an answer still on its way hands back what it lists
        expected = p.outstanding.popleft()
        assert expected == task_id, f"processor {p.pid} answered task {task_id:#x}, expected {expected:#x}"
        if p.outstanding:
            p.head_since = time.monotonic()  # the next one starts now
        elif not self.queue:
            self.straggler_watch = True  # idle: is another holding tasks behind a long one?
        p.attempts.pop(task_id, None)
        p.deadline = None
        peak = max(peak, p.peak)
        p.peak = 0
        task = self.held.get(task_id)
        if task is None or task.attempt != attempt:
            task = None  # an attempt the daemon no longer expects (a newer one may be held)
        else:
            del self.held[task_id]
            if self.fetch_objects:
                self.fetches.forget(task_id)  # its fetched objects, unless another task reads them
        if (task_id, attempt) in self.cancelled:
            self.cancelled.discard((task_id, attempt))
            status, payload = Status.CANCELLED, b""
        if task is not None or result_objects:
            # A stale result goes too when it has store objects: the daemon drops the result
            # and deletes the objects, which nobody else would.
            facts = m.make(m.TaskFacts, (self.name, started, finished, peak))
            self.results.append(m.make(m.TaskResult, (task_id, attempt, status, payload, facts, result_objects, delivered, output)))
            if task is not None and task_id not in self.lanes.tasks:  # a lane task's: lanes.py records it
                self.runlog.ended(started, finished, status, peak)
        duration = finished - started
        self.mean_task = duration if self.mean_task is None else self.mean_task + 0.2 * (duration - self.mean_task)
        if task is not None:
            fn_mean = self.fn_means.get(task.fn_id)
            if fn_mean is not None:
                self.fn_means[task.fn_id] = fn_mean + 0.2 * (duration - fn_mean)
            elif len(self.fn_means) < FN_MEANS_MAX:
                self.fn_means[task.fn_id] = duration
        self.died_in_a_row = 0

    def _on_stderr(self, p: Processor) -> None:
        """Forward what a processor wrote to stderr, and keep its tail (Processor.read_stderr)."""
        if p.err_fd >= 0 and p.read_stderr():
            self.poller.unregister(p.err_fd)
            del self.stderr_of[p.err_fd]
            p.close_stderr()

    def _sample_memory(self, now: float) -> None:
        if now < self.next_sample:
            return
        self.next_sample = now + MEMORY_SAMPLE_SECONDS
        total = 0
        busiest: Processor | None = None
        for p in self.processors.values():
            if p.eof_at is not None:
                continue
            p.memory = private_memory(p.pid)
            total += p.memory
            if p.outstanding and p.memory > p.peak:
                p.peak = p.memory
            if busiest is None or p.memory > busiest.memory:
                busiest = p
        self.memory_total = total
        if self.memory_limit is not None and busiest is not None and total > self.memory_limit:
            busiest.kill_for(
                Status.PROCESSOR_DIED,
                f"killed by scaler-executor: the worker's processors held {size_text(total)} of private memory, "
                f"over its memory limit of {size_text(self.memory_limit)}; this processor held {size_text(busiest.memory)}",
            )

    def _bury(self, p: Processor) -> None:
        """A processor is gone (socket closed and exit status known, or the grace passed)."""
        if self.processors.get(p.fd) is p:
            del self.processors[p.fd]
        if self.by_pid.get(p.pid) is p:
            del self.by_pid[p.pid]
        p.close_fds()
        if p.err_fd >= 0:
            os.set_blocking(p.err_fd, True)  # it is dead: read what it wrote up to EOF
            self._on_stderr(p)
        how = p.how_it_ended(self.oom, self.memory_limit)
        # A capturing task's output up to its death, read from its processor's files.
        output = capture.read_files(self.capture_dir, p.pid, self.config.capture_output_limit) if self.capture_dir else b""
        if self.store is not None:
            # Processors never detach: give back now what it held in the store (large NumPy
            # arrays it had made, unsealed writes), rather than at the next process's attach.
            try:
                self.store.reap()
            except Exception as exc:  # noqa: BLE001  (a failed reap must not keep the processor unburied)
                log.warning("worker %s: reaping the object store after processor %d: %s", self.name, p.pid, exc)
        if p.outstanding:
            running = p.outstanding.popleft()
            attempt = p.attempts.pop(running, None)
            task = self.held.get(running)
            cancelled = (running, attempt) in self.cancelled
            self.cancelled.discard((running, attempt))
            if task is not None and task.attempt == attempt:
                self._unhold(running)
                if p.kill is not None:
                    status, text = p.kill[0], f"{p.kill[1]} (processor pid {p.pid} {how})"
                elif cancelled:
                    status, text = Status.CANCELLED, ""
                else:
                    status, text = Status.PROCESSOR_DIED, f"processor pid {p.pid} {how} while running the task"
                if not task.flags & m.TaskFlags.CAPTURE:
                    output = b""
                self.results.append(
                    m.TaskResult(running, task.attempt, status, text.encode(), m.NO_FACTS, m.NO_OBJECTS, False, output)
                )
            # Tasks queued behind it never started: they go back to the front of our queue.
            for task_id in reversed(p.outstanding):
                task = self.held.get(task_id)
                if task is not None and task.attempt == p.attempts.get(task_id):
                    self.queue.appendleft(task)
            self.died_in_a_row += 1
        elif p.retired or (self.max_tasks and p.sent >= self.max_tasks):
            pass  # it was asked to go, or served its max_tasks_per_child
        elif p.wait_status is not None:
            log.warning("worker %s: idle processor pid %d %s", self.name, p.pid, how)
            self.died_in_a_row += 1
        delay = RESPAWN_BACKOFF[min(self.died_in_a_row, len(RESPAWN_BACKOFF) - 1)]
        self.respawn_at = time.monotonic() + delay
        self._reconcile(time.monotonic())

    def _reconcile(self, now: float) -> None:
        """Keep ``capacity`` processors taking tasks, plus one for each seceded task."""
        if self.stopping or self.broken is not None or (self.draining and not self.queue):
            return  # (a draining worker's queue holds only lane tasks, which run)
        taking = [p for p in self.processors.values() if p.eof_at is None and p.kill is None and not p.retired]
        desired = self.capacity + sum(1 for p in taking if p.seceded)
        missing = desired - len(taking) - self.starting
        if missing > 0 and now >= self.respawn_at:
            for _ in range(missing):
                self._spawn()
        elif missing < 0:
            for p in taking:
                if missing >= 0:
                    break
                if not p.outstanding and not p.seceded:
                    p.retire()
                    missing += 1

    def _to_processor(self, p: Processor, data: bytes) -> None:
        pending = self._pending_writes
        if pending is not None:  # inside _assign: one write per processor at its end
            pending.setdefault(p, []).append(data)
            return
        p.send(data)

    def _to_processor_with_fds(self, p: Processor, data: bytes, fds: list[int]) -> None:
        """``data`` with memfds beside it (worker/handoff.py), after what waits for ``p``."""
        pending = self._pending_writes
        if pending is not None and p in pending:
            p.send_frames(pending.pop(p))
        p.send_with_fds(data, fds)

    def _assign(self, now: float) -> None:
        if not self.queue or self.broken is not None:
            return
        if self.draining:
            self._hand_back()  # what never started goes back to the daemon; lane tasks stay
            if not self.queue:
                return
        # Tasks queued behind a running one only pay off for short tasks, and only once we
        # know they are short: before that, two long tasks would run in series.
        fn_means, worker_mean = self.fn_means, self.mean_task
        short = task_depth(fn_means.get(self.queue[0].fn_id), worker_mean) > 1
        live = [
            p
            for p in self.processors.values()
            if p.eof_at is None
            and p.kill is None
            and not p.seceded
            and not p.retired
            and not p.recalling
            and (not short or takes_more(len(p.outstanding), now - p.head_since))
        ]
        self._pending_writes = {}
        try:
            for level in range(1, MAX_DEPTH + 1 if short else 2):
                for p in live:
                    while len(p.outstanding) < level and self.queue:
                        if self.max_tasks is not None and p.sent >= self.max_tasks:
                            break
                        task = self.queue[0]
                        if self.held.get(task.task_id) is not task:
                            self.queue.popleft()
                            continue  # cancelled while queued, or superseded by a newer attempt
                        if level > 1 and level > task_depth(fn_means.get(task.fn_id), worker_mean):
                            return  # every live processor holds as many as this task's kind may
                        self.queue.popleft()
                        self._run_on(p, task, now)
                    if not self.queue:
                        return
        finally:
            pending, self._pending_writes = self._pending_writes, None
            for p, frames in pending.items():
                p.send_frames(frames)

    def _run_on(self, p: Processor, task: m.TaskDispatch, now: float) -> None:
        fn_payload = None
        if task.fn_id and task.fn_id not in p.functions:
            fn_payload = self.functions.get(task.fn_id)
            if fn_payload is None:
                fn_payload = self.lanes.functions.get(task.fn_id)  # a lane task's
            p.functions.add(task.fn_id)
        p.outstanding.append(task.task_id)
        p.attempts[task.task_id] = task.attempt
        p.sent += 1
        if len(p.outstanding) == 1:
            p.head_since = now
        if len(p.outstanding) == 1 and task.task_timeout is not None:
            p.deadline = now + task.task_timeout
        blobs, fds, streams = handoff.blobs_for_run(self.fetches.for_run(task.task_id)) if self.fetch_objects else (None, [], [])
        (self._to_processor_with_fds if fds else self._to_processor)(
            p,
            msgpack.packb(
                [
                    proc.RUN,
                    task.task_id,
                    task.attempt,
                    task.fn_id,
                    fn_payload,
                    task.flags,
                    task.payload,
                    task.deps,
                    task.objects,
                    self.store_name,
                    self.threshold,
                    blobs,
                    [task.reply_to, self.name, self.lanes.path_for(task.reply_to, self.poller, task.authkey_file)]
                    if task.reply_to
                    else None,
                    task.authkey_file,
                    [self._capture_dir(), self.config.capture_output_limit] if task.flags & m.TaskFlags.CAPTURE else None,
                ],
                use_bin_type=True,
            ),
            *([fds] if fds else []),
        )
        for fd in streams:
            os.close(fd)  # the processor's end of an object's stream: sent, or it died

    # ------------------------------------------------------------------ timers

    def _recall(self, now: float) -> None:
        """Processors idle, nothing queued here, and another processor holds tasks queued
        behind one that has run RECALL_AFTER: ask it for them back (they were dealt as
        short work; now they would wait for the long one while a processor idles)."""
        self.straggler_watch = False
        if self.queue:
            return
        idle, holders = False, []
        for p in self.processors.values():
            if p.eof_at is not None or p.kill is not None or p.retired or p.seceded or p.recalling:
                continue
            if not p.outstanding:
                idle = idle or self.max_tasks is None or p.sent < self.max_tasks
            elif len(p.outstanding) > 1:
                holders.append(p)
        if not idle:
            return
        for p in holders:
            if not recall_due(now - p.head_since):
                self.straggler_watch = True  # look again soon
            elif p.recall_fd >= 0:
                try:
                    os.write(p.recall_fd, b"r")
                    p.recalling = True
                except OSError:
                    pass  # it died: its socket's EOF will be noticed

    def _housekeeping(self, now: float) -> None:
        self._sample_memory(now)
        self._recall(now)
        for p in list(self.processors.values()):
            if p.eof_at is not None and p.wait_status is None and now - p.eof_at > EXIT_STATUS_GRACE:
                self._bury(p)
            elif p.outstanding and p.kill is None:
                if p.deadline is None:
                    task = self.held.get(p.outstanding[0])
                    if task is not None and task.task_timeout is not None:
                        p.deadline = now + task.task_timeout
                elif now >= p.deadline:
                    task = self.held.get(p.outstanding[0])
                    limit = task.task_timeout if task is not None else 0
                    p.kill_for(Status.TIMEOUT, f"task ran longer than its task_timeout of {limit} s")
        self._reconcile(now)
        if not self.zygote_warm:
            if self.held:
                self.last_busy = now
            elif now - self.last_busy >= ZYGOTE_WARM_IDLE:
                self.zygote_warm = True
                self.zygote.warm()
        self._check_daemon(now)

    def _check_daemon(self, now: float) -> None:
        """The reconnection policy's worker side (protocol/rejoin.py)."""
        silence = now - self.last_recv
        if self.lifeline_fd is not None:
            if silence > self.daemon_silence_limit:
                log.error("worker %s: no message from the daemon for %.1f s; stopping", self.name, silence)
                self.exit_code = 4
                self.stopping = True
        elif self.welcomed:
            if silence > self.daemon_silence_limit:
                self._rejoin(f"no message from the daemon at {self.address} for {silence:.1f} s")
        elif self.resume.resuming:
            if silence > self.daemon_silence_limit:
                self.welcomed = True  # (for _rejoin: the loss is logged once)
                self._rejoin(f"the daemon at {self.address} did not resume this worker within {silence:.1f} s")
            elif now >= self.next_hello:  # our Resume reached a daemon that died again, say
                self.next_hello = now + self.rejoin.next_delay()
                self.resume.resuming = False
                resume = self.resume.start()
                if resume is not None:
                    self._send_now([resume])
        elif silence > self.config.worker_daemon_loss_timeout:
            log.error(
                "worker %s: no daemon answered at %s for %.1f s (worker_daemon_loss_timeout); stopping",
                self.name, self.address, silence,
            )
            self.exit_code = 4
            self.stopping = True
        elif now >= self.next_hello:
            log.debug("worker %s: Hello again to %s (attempt %d)", self.name, self.address, self.rejoin.attempts)
            self._hello()

    def _rejoin(self, why: str) -> None:
        """The link to the daemon is lost (logged once here): discard, and join again empty."""
        if self.draining:  # nothing it runs is expected any more, and it was leaving anyway
            log.warning("worker %s: %s while draining; stopping", self.name, why)
            self.stopping = True
            return
        log.warning(
            "worker %s: %s; discarding its %d tasks and joining again (stopping after %.0f s "
            "without a daemon: worker_daemon_loss_timeout)",
            self.name, why, len(self.held), self.config.worker_daemon_loss_timeout,
        )
        self._forget_daemon_state()
        self.rejoin.reset()
        self._hello()

    def _flush(self, now: float) -> None:
        batch = self.outbox
        if self.results and self.lanes.tasks:
            self.results, free = self.lanes.route(self.results)
            if not self.results:
                self.results_since = 0.0
            if free:
                self._forget_functions(free)
        report = self.lanes.report(now, force=bool(batch))  # (a tally of plain ends may wait)
        if report is not None:
            batch.append(report)
        due = self.lanes.due(now)
        if due:
            batch.append(m.LaneStarted(due))
        if self.results:
            if not self.results_since:
                self.results_since = now
            # Saturated (more tasks waiting here than processors): results may wait up to
            # RESULT_LINGER to travel together, since no processor idles meanwhile and the
            # daemon answers a batch with a batch.  One result per transmission had cost
            # the daemon and this agent most of their time per no-op task.  Otherwise (a
            # lone task, a draining queue) they go at once: latency first.
            if (
                batch
                or len(self.queue) < self.capacity
                or len(self.results) >= RESULT_BATCH
                or now - self.results_since >= RESULT_LINGER
            ):
                results = self._offload(self.results) if self.fetch_objects and self.daemon_store else self.results
                batch.append(m.TaskResults(results))
                self.results = []
                self.results_since = 0.0
        if self.sock.connections != self.connections_seen:
            if self.connections_seen and self.welcomed:
                # The transport connected again: the daemon there may be a restarted one that
                # does not know us. Beat now (its answer makes us join again, rejoin.py's
                # case c) rather than at the next idle heartbeat, up to a quarter of its
                # liveness limit away (1.25 s by default).
                self.last_heartbeat = self.last_send = 0.0
            self.connections_seen = self.sock.connections
        quiet = self.heartbeat_interval
        if self.idle_reported and not self.held and self.last_busy < self.last_heartbeat:
            # Idle since a heartbeat that said so: nothing new to tell but that we live, which
            # the daemon needs only a few times within its liveness limit (protocol/rejoin.py).
            quiet = self.idle_heartbeat
        if now - self.last_heartbeat >= self.heartbeat_interval and (batch or now - self.last_send >= quiet):
            # Also beside results: a busy worker's memory and CPU reach the daemon too.
            self.last_heartbeat = now
            self.idle_reported = not self.held
            batch.append(self._heartbeat(now))
            if (runs := self.runlog.take()) is not None:
                batch.append(runs)  # the daemon's history: in bulk, never per task
                self.runs_sent = now
        elif self.runlog.pending and not self.held and now - self.runs_sent >= RUNS_IDLE_SECONDS:
            batch.append(self.runlog.take())  # idle: a burst's last runs go now
            self.runs_sent = now
        if batch and (report := self.lanes.report(now)) is not None:
            batch.append(report)  # a waiting tally goes with whatever goes
        if batch and self.welcomed:
            if self.raw_out and not self._send_raw():
                return  # a result's chunks go before it: the batch waits in the outbox
            self.outbox = []
            self._send_now(batch)

    def _heartbeat(self, now: float) -> m.Heartbeat:
        running = sum(1 for p in self.processors.values() if p.outstanding)
        seen: dict[int, float] = {}
        busy = 0.0
        for p in self.processors.values():
            if p.eof_at is None and (used := cpu_seconds(p.pid)) is not None:
                seen[p.pid] = used
                if p.pid in self.cpu_seen:
                    busy += max(0.0, used - self.cpu_seen[p.pid])
        cpu = busy / (now - self.cpu_at) if self.cpu_seen and now > self.cpu_at else 0.0
        self.cpu_seen, self.cpu_at = seen, now
        store = ("", 0, 0, 0)
        if self.store is not None:
            try:  # lock-free and O(1): a heartbeat never waits on the store's lock
                capacity, used, _data, objects = self.store.usage()
                store = (self.store_name, used, capacity, objects)
            except Exception as exc:  # noqa: BLE001 - the figures are for watching only
                log.debug("worker %s: reading the object store's use: %s", self.name, exc)
        return m.Heartbeat(len(self.queue), running, self.memory_total, self.memory_limit or 0, round(cpu, 3), *store)

    # ------------------------------------------------------------------ stop

    def _drain(self, now: float) -> None:
        """SIGTERM with ``drain_seconds``: the job ends soon (Slurm's walltime drain signal).

        At once: tell the daemon (``WorkerDraining``, which dispatches nothing more here)
        and hand back every task no processor started: our queue, tasks parked for their
        objects, and those queued inside processors, recalled (RECALLED lists exactly the
        ones the processor had not started; a processor between two tasks may start the
        next, so the recall is repeated while it holds more than one).  Tasks that come
        back unstarted later (recalled, behind a processor that died, a dispatch that
        crossed our message) go back the same way.  The started ones run to their end and
        their results go as usual; the loop stops (Goodbye, _shutdown) when none is held or
        at the deadline, ``drain_seconds`` less DRAIN_MARGIN after the signal.

        Lane tasks (lanes.py) are not the daemon's to run elsewhere: those held here, queued
        or running, run to their end; the lanes are no longer read, and are closed once no
        lane task is held (their clients then submit through the daemon, and a task a
        client had sent down one that was never read is submitted again as any lane task
        of a closed lane is: lane tasks have default options).
        """
        if not self.draining:
            if not self.welcomed:
                self.stopping = True  # nothing held that the daemon expects: stop at once
                return
            self.draining = True
            self.drain_deadline = now + max(0.0, self.drain_seconds - DRAIN_MARGIN)
            for pollable in self.lanes.by_pollable:
                self.poller.unregister(pollable)
            back = self._hand_back(announce=False)
            self.outbox.append(m.WorkerDraining(back))  # even if empty: no task for it any more
            log.info(
                "worker %s: draining (SIGTERM): %d tasks handed back, finishing %d within %.0f s",
                self.name, len(back), len(self.held), self.drain_seconds,
            )
        else:
            self._hand_back()
        lane_tasks = self.lanes.tasks
        for p in self.processors.values():
            if (
                len(p.outstanding) > 1
                and not p.recalling
                and p.eof_at is None
                and p.kill is None
                and p.recall_fd >= 0
                and any(task_id not in lane_tasks for task_id in list(p.outstanding)[1:])
            ):
                try:
                    os.write(p.recall_fd, b"r")
                    p.recalling = True
                except OSError:
                    pass  # it died: its socket's EOF will be noticed
        if self.lanes.by_pollable and not lane_tasks:
            self.lanes.close()  # already unregistered from the poller
        if not self.held:
            log.info("worker %s: drained: every task it started has ended", self.name)
            self.stopping = True
        elif now >= self.drain_deadline:
            log.warning(
                "worker %s: drain time (%.0f s) is up with %d tasks still running; stopping",
                self.name, self.drain_seconds, len(self.held),
            )
            self.stopping = True

    def _hand_back(self, announce: bool = True) -> list[m.TaskAttempt]:
        """While draining: the tasks in our queue or parked for their objects never started,
        out of ``held`` and back to the daemon (a ``WorkerDraining`` in the outbox when
        ``announce``); lane tasks stay queued."""
        lane_tasks = self.lanes.tasks
        back: list[m.TaskAttempt] = []
        keep: deque[m.TaskDispatch] = deque()
        for task in self.queue:
            if self.held.get(task.task_id) is not task:
                continue  # cancelled while queued, superseded, or listed already
            if task.task_id in lane_tasks:
                keep.append(task)
                continue
            self._unhold(task.task_id)
            back.append(m.TaskAttempt(task.task_id, task.attempt))
        self.queue = keep
        for task_id in self.fetches.parked():
            back.append(m.TaskAttempt(task_id, self._unhold(task_id).attempt))
        if back and announce:
            self.outbox.append(m.WorkerDraining(back))
        return back

    def _capture_dir(self) -> str:
        if not self.capture_dir:
            self.capture_dir = tempfile.mkdtemp(prefix="scaler-capture-")
        return self.capture_dir

    def _goodbye(self) -> list[object]:
        """What this worker says last: results not sent yet, then its Goodbye listing the
        tasks it hands back that never started (never given to a processor; the loop has
        ended, so none will be).  Anything else it holds may have started: the daemon
        counts it as interrupted (at-most-once tasks fail rather than run again)."""
        batch = self.outbox
        self.outbox = []
        if self.results and self.lanes.tasks:
            self.results, _free = self.lanes.route(self.results)  # lane tasks' go to their clients
        report = self.lanes.report(time.monotonic())
        if report is not None:
            batch.append(report)
        if self.results:
            results = self._offload(self.results) if self.fetch_objects and self.daemon_store else self.results
            self.results = []
            if self._send_raw():  # a result's chunks go before it
                batch.append(m.TaskResults(results))
        given = {(task_id, p.attempts.get(task_id)) for p in self.processors.values() for task_id in p.outstanding}
        lane_tasks = self.lanes.tasks  # not the daemon's to run again: their clients resubmit them
        unstarted = [
            m.TaskAttempt(task_id, task.attempt)
            for task_id, task in self.held.items()
            if (task_id, task.attempt) not in given and task_id not in lane_tasks
        ]
        if (runs := self.runlog.take()) is not None:
            batch.append(runs)  # what it ran since its last heartbeat stays in the daemon's history
        batch.append(m.Goodbye("worker stopping", unstarted))
        return batch

    def _shutdown(self) -> None:
        try:
            if self.welcomed:
                self._send_now(self._goodbye())
        except channel.SendError:
            pass
        self.lanes.close()
        for p in list(self.processors.values()):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.close_fds()
            if p.err_fd >= 0:
                os.close(p.err_fd)
        self.zygote.close()  # the zygote reaps its processors, then exits
        try:
            os.waitpid(self.zygote.pid, 0)
        except ChildProcessError:
            pass
        if self.capture_dir:
            import shutil

            shutil.rmtree(self.capture_dir, ignore_errors=True)
        self.sock.close()
        if self.store is not None:
            self.store.close()
        if self.orphaned and self.store_name:
            # Our daemon is stopping or was killed: if it could not remove its host's region
            # (SIGKILL), the last of its local processes does. Harmless when already gone.
            try:
                from scaler_executor.objstore import ObjectStore

                ObjectStore.unlink_name(self.store_name, tempfile.gettempdir())
            except Exception as exc:  # noqa: BLE001  (best effort while stopping: the rest of the shutdown must run)
                log.debug("worker %s: removing the object store %s: %s", self.name, self.store_name, exc)
        os.close(self._signal_r)
        os.close(self._signal_w)


def _error(text: str) -> bytes:
    """A task error raised in the agent, in the wire form of a task's exception."""
    return proc.dump_exception(RuntimeError(text))
