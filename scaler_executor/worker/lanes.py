"""A worker's lanes: where a client on this host submits a sequential caller's tasks
straight to the worker, without the daemon on the round trip.

The daemon puts a client's *reply socket* in the dispatch of a ``REPLY_DIRECT`` task
when the client runs on the worker's host (protocol/reply.py).  The first time the agent
sees a reply socket it binds a lane beside it, ``lane-<pid>.sock`` in the same private
(mode 0700) directory, and names it to the processor, which puts it in the result
datagram.  The client connects, and its next task submitted alone goes down the lane:

    client ──[RegisterFunction], SubmitTasks──► lane (this agent) ──RUN──► processor
    client ◄──result datagram── processor (as for any REPLY_DIRECT task)
    client ◄──TaskResults── lane    (a result the datagram cannot carry, a dead processor)
    lane ──LaneStarted──► daemon    (a task still running LANE_NOTICE after it came: the
                                     daemon records it, for loads, task counts and monitors)
    lane ──LaneDone──► daemon       (every task's end: counters, and the record goes)

The lane speaks the client protocol's messages over the ipc transport (a
``StreamRouter``); the tasks join the agent's own queue and run like any other, so
timeouts of processors, memory limits, secession and force-cancel all apply.  What the
daemon would have done for them is done by the two ends:

* a task whose processor died comes back ``PROCESSOR_DIED``; the client submits it again
  through the daemon (which retries it by the usual rules), never down a lane;
* a result with store objects comes back over the lane; the client pins the objects
  with the daemon before it reads them, so that the daemon deletes them once read;
* a lane whose client left drops its tasks' results; results with store objects go to
  the daemon instead, which deletes objects of a result it does not expect;
* a lost connection (this worker stopped, or forgot the daemon's state) is seen by the
  client, which submits every task it had on the lane again through the daemon;
* a draining worker (SIGTERM with ``drain_seconds``: agent.py ``_drain``) reads its lanes
  no more; the lane tasks it holds, queued or running, run to their end (a lane has no way
  to hand a task back uncounted, and lane tasks are plain ones with default options), and
  it closes its lanes once it holds none, so that their clients go through the daemon.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.worker.processor import dump_exception

log = logging.getLogger("scaler_executor.worker")

LANE_HWM = 1_000_000  # transmissions queued for one client (it sends one task at a time)
# A lane task still running this long after it came is announced to the daemon
# (LaneStarted), which then counts it as this worker's: the daemon's own NOTICE_DELAY for
# running notices.  Most of a sequential caller's tasks end sooner and cost it nothing.
LANE_NOTICE = 0.002
# A LaneDone that reports only tasks that ended well (counters, run seconds) waits up to
# this long for company: a sequential caller's round trip woke the daemon once per task
# for it, and on two cores that turn ran beside the next round trip (docs/performance.rst).
# Announced tasks (the daemon holds their records and counts them as this worker's load),
# failures and retries go at once; so does the tally whenever anything else is sent.
LANE_DONE_LINGER = 0.05


@dataclass
class Lane:
    """One bound lane: the clients of one reply socket."""

    path: str
    reply_to: str
    router: Any  # channel.StreamRouter
    authkey_file: str = ""  # the client's, from the dispatched task that opened the lane


LANE_FAILURES = 8  # failed lane tasks one LaneDone carries for the daemon's recent failures
MAX_FAILURE_PAYLOAD = 64 * 1024  # a larger error payload travels without its traceback


@dataclass
class LaneTally:
    """What LaneDone reports: the lane tasks that ended since the last report."""

    finished: int = 0
    failed: int = 0
    retried: int = 0
    delivered: int = 0
    seconds: float = 0.0
    announced: list[int] = field(default_factory=list)  # ended tasks a LaneStarted named
    failures: list[m.TaskResult] = field(default_factory=list)  # for its recent failures, at most LANE_FAILURES
    since: float = 0.0  # (monotonic) when its first task was counted

    def __bool__(self) -> bool:
        return bool(self.finished or self.failed or self.retried)

    def urgent(self) -> bool:
        """Whether it must go now: it names announced tasks, failures or retries."""
        return bool(self.announced or self.failed or self.retried)


@dataclass
class Lanes:
    """The agent's lanes, by reply socket; and which lane each lane task came by."""

    name: str  # the worker's, for log lines
    by_reply: dict[str, Lane | None] = field(default_factory=dict)  # None: could not bind
    by_pollable: dict[Any, Lane] = field(default_factory=dict)
    tasks: dict[int, tuple[Lane, bytes, int]] = field(default_factory=dict)  # task id -> (lane, client, fn id)
    tally: LaneTally = field(default_factory=LaneTally)
    runs: RunLog = field(default_factory=RunLog)  # the agent's: lane tasks' runs join its others'
    # Callables that came down lanes, apart from the daemon's (whose ReleaseFunctions may
    # come while a lane task still needs one), with how many lane tasks hold each; a
    # client's release of one still held waits for its last task.
    functions: dict[int, bytes] = field(default_factory=dict)
    uses: dict[int, int] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)
    started: dict[int, float] = field(default_factory=dict)  # task id -> when it came, until announced
    # client id -> its lane tasks that ended here, in all (each LaneDone carries them: the
    # statistics barrier); a few entries, one per local client that ever used a lane here.
    ends: dict[int, int] = field(default_factory=dict)
    flush_now: bool = False  # the daemon's LaneFlush: a LaneDone goes at once, even of nothing new
    eager: bool = False  # and the next tally that has something goes without waiting
    announced: set[int] = field(default_factory=set)  # running, and named to the daemon

    def path_for(self, reply_to: str, poller: channel.Poller, authkey_file: str = "") -> str:
        """The lane beside ``reply_to`` (bound on first use); "" if it cannot be bound.
        ``authkey_file``: the client's (from the daemon's dispatch), for its lane tasks."""
        lane = self.by_reply.get(reply_to, False)
        if lane is False:
            lane = self._bind(reply_to, authkey_file)
            self.by_reply[reply_to] = lane
            if lane is not None:
                self.by_pollable[lane.router.pollable] = lane
                poller.register(lane.router.pollable)
        return "" if lane is None else lane.path  # type: ignore[union-attr]  # not False: that default was replaced above

    def _bind(self, reply_to: str, authkey_file: str) -> Lane | None:
        directory = os.path.dirname(reply_to)
        path = os.path.join(directory, f"lane-{os.getpid()}.sock")
        try:
            st = os.stat(directory)
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                # Only a private directory of this user (the embedded cluster's): nobody
                # else may connect, and nothing else of anyone's is there to replace.
                log.info("worker %s: no lane beside %s: its directory is not private to this user", self.name, reply_to)
                return None
            try:
                os.unlink(path)  # a previous worker's with our pid, in a directory we own
            except FileNotFoundError:
                pass
            router = channel.StreamRouter(path, hwm=LANE_HWM)
        except OSError as exc:
            log.info("worker %s: no lane beside %s (%s): its client's tasks go through the daemon", self.name, reply_to, exc)
            return None
        return Lane(path, reply_to, router, authkey_file)

    def receive(self, lane: Lane, held: dict[int, m.TaskDispatch], now: float) -> list[Any]:
        """What arrived on ``lane``, in order: tasks (``TaskDispatch``, now in ``held``) and
        the messages the agent applies itself: ``CancelTasks`` (a client's ``force`` cancel
        of a running lane task) and ``ReleaseFunctions`` (callables no lane task holds any
        more, to forget everywhere unless the daemon's table has them too).

        A task with dependencies or store objects, or one already held, is answered at
        once with an error: the client sends only plain tasks, each once."""
        arrived: list[Any] = []
        router = lane.router
        while router.readable():
            try:
                frames = router.recv()
            except channel.Again:
                break
            client = frames[0]
            try:
                messages, _ = codec.decode(frames[1:])
            except codec.DecodeError as exc:
                log.warning("worker %s: dropped a bad transmission on lane %s: %s", self.name, lane.path, exc)
                continue
            for message in messages:
                kind = type(message)
                if kind is m.SubmitTasks:
                    for spec in message.tasks:
                        if spec.deps or spec.objects or spec.task_id in held:
                            self._send(lane, client, m.TaskResult(
                                spec.task_id, 0, Status.ERROR,
                                dump_exception(RuntimeError("a lane takes only tasks without dependencies or store objects, each once")),
                                m.NO_FACTS, m.NO_OBJECTS,
                            ))
                            continue
                        task = m.make(m.TaskDispatch, (
                            spec.task_id, 0, spec.fn_id, spec.flags, spec.payload, [], None, [], lane.reply_to, lane.authkey_file
                        ))  # fmt: skip
                        held[task.task_id] = task
                        self.tasks[task.task_id] = (lane, client, task.fn_id)
                        self.started[task.task_id] = now
                        if task.fn_id:
                            self.uses[task.fn_id] = self.uses.get(task.fn_id, 0) + 1
                        arrived.append(task)
                elif kind is m.RegisterFunction:
                    self.functions[message.fn_id] = message.payload
                    self.released.discard(message.fn_id)
                elif kind is m.CancelTasks:
                    ours = [t for t in message.task_ids if t in self.tasks]
                    arrived.append(m.CancelTasks(ours, message.force))
                elif kind is m.ReleaseFunctions:
                    free = []
                    for fn_id in message.fn_ids:
                        if self.uses.get(fn_id):
                            self.released.add(fn_id)  # its last task lets it go (route)
                        elif self.functions.pop(fn_id, None) is not None:
                            free.append(fn_id)
                    if free:
                        arrived.append(m.ReleaseFunctions(free))
                else:
                    log.warning("worker %s: lane %s does not take %s; dropped", self.name, lane.path, kind.__name__)
        return arrived

    def route(self, results: list[m.TaskResult]) -> tuple[list[m.TaskResult], list[int]]:
        """Send lane tasks' results to their clients.  Returns the results for the daemon,
        and the callables a client released that no lane task holds now."""
        for_daemon: list[m.TaskResult] = []
        free: list[int] = []
        tally = self.tally
        if not tally:
            tally.since = time.monotonic()
        for result in results:
            came_by = self.tasks.pop(result.task_id, None)
            if came_by is None:
                for_daemon.append(result)
                continue
            lane, client, fn_id = came_by
            client_id = result.task_id >> m.TASK_ID_BITS
            self.ends[client_id] = self.ends.get(client_id, 0) + 1
            if self.started.pop(result.task_id, None) is None and result.task_id in self.announced:
                self.announced.discard(result.task_id)
                tally.announced.append(result.task_id)
            if fn_id:
                left = self.uses[fn_id] - 1
                if left:
                    self.uses[fn_id] = left
                else:
                    del self.uses[fn_id]
                    if fn_id in self.released:
                        self.released.discard(fn_id)
                        self.functions.pop(fn_id, None)
                        free.append(fn_id)
            if result.status == Status.PROCESSOR_DIED:
                tally.retried += 1  # the client submits it again, through the daemon
            elif result.status == Status.OK:
                tally.finished += 1
            else:
                tally.failed += 1
                if len(tally.failures) < LANE_FAILURES:
                    payload = result.payload if len(result.payload) <= MAX_FAILURE_PAYLOAD else b""
                    tally.failures.append(result._replace(payload=payload, objects=[], delivered=False, output=b""))
            facts = result.facts
            if facts.finished > facts.started:
                tally.seconds += facts.finished - facts.started
                self.runs.ran(facts.started, facts.finished, result.status)  # for the daemon's history
            if result.delivered:
                tally.delivered += 1
                continue
            if not self._send(lane, client, result) and result.objects:
                for_daemon.append(result)  # nobody will read them: the daemon deletes them
        return for_daemon, free

    def report(self, now: float, force: bool = True) -> m.LaneDone | None:
        """The LaneDone to send now, if any: unless ``force``, a tally of tasks that only
        ended well waits until LANE_DONE_LINGER after its first (``report_due``).  After
        the daemon's LaneFlush (``flush``) one goes at once, even of nothing new, and so
        does the next tally that has something (a lane task that ended after the flush)."""
        tally = self.tally
        if not tally:
            if not self.flush_now:
                return None
            self.flush_now = False  # the cumulative counts alone; ``eager`` stays for the next end
        elif not force and now - tally.since < LANE_DONE_LINGER and not tally.urgent() and not self.eager:
            return None
        else:
            self.flush_now = self.eager = False
            self.tally = LaneTally()
        return m.LaneDone(
            tally.finished, tally.failed, tally.retried, tally.delivered, tally.seconds, tally.announced, tally.failures,
            [m.LaneEnds(client_id, ended) for client_id, ended in self.ends.items()],
        )

    def flush(self) -> None:
        """The daemon's LaneFlush: a client's statistics wait for this worker's count of its
        lane tasks (the barrier: scheduler/stats_barrier.py)."""
        self.flush_now = self.eager = True

    def report_due(self, now: float) -> float | None:
        """Seconds until a waiting tally must go (None: nothing waits)."""
        if self.flush_now:
            return 0.0
        if not self.tally:
            return None
        return 0.0 if self.eager else max(0.0, self.tally.since + LANE_DONE_LINGER - now)

    def due(self, now: float) -> list[int]:
        """Lane tasks running for LANE_NOTICE, to announce now (each once)."""
        if not self.started:
            return []
        due = [task_id for task_id, came in self.started.items() if now - came >= LANE_NOTICE]
        for task_id in due:
            del self.started[task_id]
            self.announced.add(task_id)
        return due

    def next_notice(self, now: float) -> float | None:
        """Seconds until the next announcement is due (None: none pending)."""
        if not self.started:
            return None
        return max(0.0, min(self.started.values()) + LANE_NOTICE - now)

    def _send(self, lane: Lane, client: bytes, result: m.TaskResult) -> bool:
        try:
            lane.router.send([client, *codec.encode([m.TaskResults([result])])])
        except channel.SendError:  # the client left (or stopped reading): nobody wants it
            return False
        return True

    def buffered(self) -> bool:
        """Whether a lane holds transmissions read but not handled (no poller sees them)."""
        for lane in self.by_pollable.values():  # noqa: SIM110 - once per loop turn: any() over a generator is 1.5x slower
            if lane.router.buffered:
                return True
        return False

    def buffered_lanes(self) -> list[Lane]:
        return [lane for lane in self.by_pollable.values() if lane.router.buffered]

    def close(self, poller: channel.Poller | None = None) -> None:
        """Close every lane (their clients see the connection end and resubmit)."""
        for lane in self.by_pollable.values():
            if poller is not None:
                poller.unregister(lane.router.pollable)
            lane.router.close()
            try:
                os.unlink(lane.path)
            except OSError:
                pass
        self.by_reply.clear()
        self.by_pollable.clear()
        self.tasks.clear()
        self.functions.clear()
        self.uses.clear()
        self.released.clear()
        self.started.clear()
        self.announced.clear()
