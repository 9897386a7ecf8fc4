"""One daemon, many simulated workers and clients: what the daemon costs as the cluster grows.

A script, not a test (its figures are measured, never asserted)::

    PYTHONPATH=. python bench/scale.py --workers 10,100,1000 --processors 4 --clients 1,10
    PYTHONPATH=. python bench/scale.py --transport tcp --workers 100 --clients 10       # CURVE on
    PYTHONPATH=. python bench/scale.py --transport tcp --insecure --workers 100
    PYTHONPATH=. python bench/scale.py --workers 100 --clients 10 --journal-fsync turn   # journaled

A real daemon (``python -m scaler_executor.cli.daemon --address ... --workers 0``) is started
per size, pinned to core 0 with ``taskset``; this process, pinned to core 1, runs every
simulated peer in one event loop over the project's own codec (protocol/codec.py) and
channels (protocol/channel.py: a ``StreamDealer`` per peer on ipc; on tcp one ZeroMQ
DEALER per peer, all in one context, with the CURVE keys of a ``scaler-keys`` credential,
because a ``DealerChannel`` per peer would start a ZeroMQ context and I/O thread each).

* A simulated **worker** says ``Hello`` as a worker with P processors and answers each
  dispatched task with ``TaskResults`` after a duration drawn from ``--duration`` (``0``,
  ``fixed:S``, ``uniform:A:B``, ``exp:MEAN``).  It deals tasks to its P processors as the
  agent does (bench/scale_worker.py: top-ups of up to 8 sub-millisecond tasks, each after a
  wake-up drawn from ``--wake``, then in series); ``--client-wake`` delays a client's next
  submit after results, and ``--shared-core`` serves every wake-up in turn on one simulated
  core.  Without them every peer answers at once, in lockstep, offering the daemon fewer,
  fuller turns than real workers (docs/scaling.rst).  On the wire it does what
  a real worker (worker/agent.py) does: each result carries ``TaskFacts`` with the task's
  run time (the daemon sizes its prefetch windows from them), a ``Heartbeat`` goes every
  ``heartbeat_interval`` (from ``Welcome``) beside results or alone after silence (after
  the longer idle silence of protocol/rejoin.py's ``idle_heartbeat`` once idle), and while
  saturated (more tasks waiting than processors) results wait up to ``RESULT_LINGER`` or
  ``RESULT_BATCH`` to travel together.  A task with dependencies gets their results as
  ``DepValue`` s from the daemon; graph mode (``--graph``, bench/scale_graph.py) checks them.
  ``Sim(faithful=False)`` keeps the first, simpler worker (bench/scale_validate.py's A/B).
* A simulated **client** says ``Hello`` as a client and keeps up to ``--window`` no-op tasks
  outstanding (``TaskFlags.INLINE_FN``; the payload is the submit time, which the daemon
  never unpickles), counting the results.

Phases, per size: clients connect (RSS₀); workers connect (RSS₁: memory per worker);
**idle** for ``--idle`` seconds (the daemon's CPU over that time per worker heartbeat, and
as a share of its core); **watched** for ``--watch`` seconds, if given: idle still, one client
asking for statistics every ``--stats-every`` seconds (the daemon's CPU per snapshot beyond
the idle phase's rate, the snapshot's size); **load**: ``--tasks`` tasks through the windows (daemon CPU per
task, tasks/s, submit→dispatch at the worker, the daemon's turn histogram from its
statistics); **pending**: the workers leave (``Goodbye``), ``--pending`` more tasks are
submitted and acknowledged (RSS growth per queued task), then as many fresh workers join
and drain them.  Heartbeats are counted as the simulated peers send them; the daemon's
own heartbeats to quiet peers (one per client an interval, one per worker an
``idle_heartbeat``) are part of the CPU measured.

The daemon's CPU is read from ``/proc/PID/task/*/schedstat`` (ns); ``others_on_core_pct``
is how busy its core was with other processes meanwhile (``/proc/stat``: ``taskset`` keeps
the daemon on its core, not the machine's other work off it), which inflates turn times
(wall clock, preemption included) and latencies but not CPU per task.  If this process was on
its CPU for more than ``HARNESS_BOUND`` of a phase's wall time, the harness, not the
daemon, limited that phase, and the row says so.

Limits: RLIMIT_NOFILE is raised to its hard limit (ipc: two descriptors per simulated
peer here, one in the daemon; tcp: ZeroMQ's ``MAX_SOCKETS`` of the shared context is set
once, before its first socket, to the most peers the size makes plus 64, at least 1,024:
libzmq ignores a later change); RLIMIT_NOFILE is printed, MAX_SOCKETS is in each tcp row.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle  # type: ignore[import-untyped]

from bench.scale_daemon import DaemonProcess, _pctl, _phase, cpu_busy, daemon_cpu, pin, raise_nofile  # noqa: F401
from bench.scale_worker import Processors
from bench.scale_zmq import SharedZmqDealer
from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.rejoin import idle_heartbeat, is_unknown_peer
from scaler_executor.scheduler import turns
from scaler_executor.worker.agent_base import RESULT_BATCH, RESULT_LINGER

HARNESS_BOUND = 0.85  # share of a phase's wall time on a CPU above which the harness limited it
_STAMP = struct.Struct("<d")
_VALUE = struct.Struct("<q")  # a graph node's value (bench/scale_graph.py)


def duration_sampler(text: str, option: str = "--duration") -> Callable[[], float]:
    """``0``, ``fixed:S``, ``uniform:A:B`` or ``exp:MEAN`` (seconds) as a sampler."""
    kind, _, rest = text.partition(":")
    try:
        if kind == "0" and not rest:
            return lambda: 0.0
        if kind == "fixed":
            s = float(rest)
            return lambda: s
        if kind == "uniform":
            a, b = (float(x) for x in rest.split(":"))
            return lambda: random.uniform(a, b)
        if kind == "exp":
            mean = float(rest)
            return lambda: random.expovariate(1 / mean) if mean > 0 else 0.0
    except ValueError:
        pass
    raise SystemExit(f"scale.py: bad {option} {text!r}; use 0, fixed:S, uniform:A:B or exp:MEAN (seconds)")


# --------------------------------------------------------------------------- transports


# --------------------------------------------------------------------------- peers


@dataclass(eq=False)
class Peer:
    index: int
    role: str
    chan: Any
    capacity: int = 0
    peer_id: int = 0
    welcomed: bool = False
    refused: str = ""
    last_sent: float = 0.0
    out: list[Any] = field(default_factory=list)
    frames: list[list[Any]] = field(default_factory=list)  # encoded already; go before ``out``
    hello: Any = None
    # worker
    running: int = 0
    held: deque[tuple[int, int, bytes]] = field(default_factory=deque)  # dispatched, not yet dealt
    procs: Processors = field(default_factory=lambda: Processors(0))
    last_heartbeat: float = 0.0
    last_busy: float = 0.0  # when tasks last came
    idle_reported: bool = False  # its last heartbeat said it held nothing
    finished: list[Any] = field(default_factory=list)  # results not sent yet (faithful: RESULT_LINGER)
    finished_since: float = 0.0
    # client
    next_n: int = 1
    outstanding: int = 0
    quota: int = 0  # tasks this client may still submit
    results: int = 0
    acked: int = 0
    react_at: float = 0.0  # when it tops up after results came (0: at once; Sim's client_wake)


class Sim:
    """Every simulated peer, in one event loop."""

    def __init__(self, address: str, *, hwm: int = 100_000, credentials: dict[str, Any] | None = None,
                 duration: Callable[[], float] = lambda: 0.0, window: int = 100, max_peers: int = 1024,
                 payload: bytes | None = None, faithful: bool = True, wake: Callable[[], float] = lambda: 0.0,
                 client_wake: Callable[[], float] | None = None) -> None:
        self.address = address
        # faithful: simulated workers send what real ones send (task facts with each result, a
        # heartbeat every interval even beside results); False: the harness's first workers
        # (no facts, heartbeats only after silence), kept for bench/scale_validate.py's A/B.
        self.faithful = faithful
        # faithful: how long a simulated processor takes to wake for a top-up of tasks
        # (bench/scale_worker.py), drawn per top-up; not part of the run time facts report.
        self.wake = wake
        # A client's delay before it submits more after results came (a process the OS must
        # schedule); None: at once, on the harness's next turn.
        self.client_wake = client_wake
        # Every peer's wake-up (a processor's per top-up, a client's) is CPU time on one
        # simulated core, served in turn (bench/scale_worker.py); False: each its own.
        self.shared_core = False
        self._core_free = 0.0
        # What each simulated task carries: None, its submit time (the simulated workers read it
        # for submit→dispatch); or a fixed payload, e.g. a pickled no-op a real worker can run.
        self.payload = payload
        # tcp: libzmq reads MAX_SOCKETS once, when the context makes its first socket, so
        # it is sized here, for every peer this Sim will ever make, not as peers are added.
        self.max_sockets = max(1024, max_peers + 64)
        self.hwm = hwm
        self.credentials = credentials or {}
        self.duration = duration
        self.window = window
        self.poller = channel.Poller()
        self.by_pollable: dict[Any, Peer] = {}
        self.peers: list[Peer] = []
        self.workers: list[Peer] = []
        self.clients: list[Peer] = []
        self.context: Any = None
        self.heartbeat_interval = 0.5
        self.idle_heartbeat = 0.5  # a worker idle since its last heartbeat: from Welcome
        self.timers: list[tuple[float, int, Peer, int, int, int, bytes, float, float]] = []  # task completions
        self._lingering = 0.0  # when the first held-back results are due (0: none)
        self._seq = 0
        self._made = 0
        self.dispatched: dict[int, int] = {}  # task id -> dispatches seen by workers
        self.result_ids: dict[int, int] = {}  # task id -> results seen by its client
        self.wrong_client = 0  # results that reached a client which did not submit them
        self.submit_to_dispatch: list[float] = []
        self.heartbeats_sent = 0
        self.rejoins = 0  # peers the daemon called unknown, which joined again
        self.daemon_heartbeats = 0
        self.stats: dict[str, Any] | None = None
        self.stats_bytes = 0  # the last Stats transmission's size, its frames summed
        # Graphs (bench/scale_graph.py): what each task depends on, and the values the
        # requested ones must come back with.  A simulated worker computes a task's value as
        # its payload's plus its dependencies' (each an 8-byte integer), from the DepValues
        # the daemon sends with it, as a real worker hands them to the task's function.
        self.stamped = payload is None  # payloads are submit times (not with graphs)
        self.deps_of: dict[int, list[int]] = {}
        self.expected: dict[int, int] = {}
        self.dep_errors = 0  # dispatched without the dependencies (or the values) the client declared
        self.values_wrong = 0  # requested results that came back with another value

    # ------------------------------------------------------------------ set-up

    def _channel(self, role: str) -> Any:
        if self.address.startswith("ipc://"):
            return channel.connect(self.address, hwm=self.hwm, linger=0)
        if self.context is None:
            import zmq

            self.context = zmq.Context(1)
            self.context.set(zmq.MAX_SOCKETS, self.max_sockets)
        if len(self.peers) + 1 > self.max_sockets - 64:
            raise RuntimeError(f"more peers than the {self.max_sockets} sockets this Sim's context was sized for")
        return SharedZmqDealer(self.context, self.address, self.hwm, self.credentials.get(role))

    def add(self, role: str, capacity: int = 0) -> Peer:
        self._made += 1
        peer = Peer(self._made, role, self._channel(role), capacity=capacity, procs=Processors(capacity))
        self.peers.append(peer)
        (self.workers if role == m.Role.WORKER else self.clients).append(peer)
        self.poller.register(peer.chan.pollable)
        self.by_pollable[peer.chan.pollable] = peer
        peer.hello = m.Hello(
            role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
            f"sim-{role}-{peer.index}", os.getpid(), socket.gethostname(), capacity, {}, [],
        )
        peer.out.append(peer.hello)
        return peer

    # ------------------------------------------------------------------ the loop

    def run_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"scale.py: {what} did not happen within {timeout:.0f} s")
            refused = [p.refused for p in self.peers if p.refused]
            if refused:
                raise RuntimeError(f"scale.py: the daemon refused a simulated peer: {refused[0]}")
            self.turn(now)

    def turn(self, now: float) -> None:
        self._flush(now)
        wait = 50.0
        if self.timers:
            wait = min(wait, max(0.0, (self.timers[0][0] - now) * 1000))
        if self._lingering:
            wait = min(wait, max(0.0, (self._lingering - now) * 1000))
        if self.client_wake is not None:
            for client in self.clients:
                if client.react_at:
                    wait = min(wait, max(0.0, (client.react_at - now) * 1000))
        if wait < 1.0:
            wait = 0.0  # epoll rounds a timeout up to whole ms: spin rather than oversleep a timer
        for peer in self.peers:
            if peer.chan.buffered:
                wait = 0
                break
        if self.address.startswith("ipc://"):
            wait = min(peer.chan.poll_timeout(wait) for peer in self.peers) if self.peers else wait
        ready = self.poller.poll(wait)
        now = time.monotonic()
        for target in ready:
            self._drain(self.by_pollable[target], now)
        for peer in self.peers:
            if peer.chan.buffered:
                self._drain(peer, now)
        timers = self.timers
        while timers and timers[0][0] <= now:
            _, _, worker, index, task_id, attempt, payload, started, seconds = heapq.heappop(timers)
            self._finish(worker, index, task_id, attempt, payload, started, seconds)
            if worker.held:
                self._start(worker, now)
        interval = self.heartbeat_interval
        for peer in self.peers:
            if not peer.welcomed:
                continue
            if peer.role == m.Role.WORKER and self.faithful:
                # As the real agent (worker/agent.py): a heartbeat every interval, beside its
                # results when it has some (its load and memory reach the daemon while busy too),
                # alone when it has been silent that long, or idle_heartbeat once its last
                # heartbeat said it was idle and no task came since (protocol/rejoin.py).
                quiet = interval
                if peer.idle_reported and not peer.held and not peer.running and peer.last_busy < peer.last_heartbeat:
                    quiet = self.idle_heartbeat
                if now - peer.last_heartbeat >= interval and (peer.out or now - peer.last_sent >= quiet):
                    peer.last_heartbeat = now
                    peer.idle_reported = not peer.held and not peer.running
                    peer.out.append(m.Heartbeat(len(peer.held), peer.running, 0, 0, 0.0))
                    self.heartbeats_sent += 1
            elif not peer.out and now - peer.last_sent >= interval:
                peer.out.append(m.Heartbeat(len(peer.held), peer.running))
                self.heartbeats_sent += 1
        for client in self.clients:
            if client.react_at <= now:
                client.react_at = 0.0
                self._top_up(client)
        if self.faithful:
            self._send_results(now)
        self._flush(now)

    def _drain(self, peer: Peer, now: float) -> None:
        chan = peer.chan
        while chan.readable():
            try:
                frames = chan.recv()
            except channel.Again:
                return
            messages, _ = codec.decode(frames)
            for message in messages:
                if type(message) is m.Stats:
                    self.stats_bytes = sum(len(frame) for frame in frames)
                self._on(peer, message, now)

    def _on(self, peer: Peer, message: Any, now: float) -> None:
        kind = type(message)
        if kind is m.DispatchTasks:
            peer.last_busy = now
            stamped = self.stamped
            for task in message.tasks:
                self.dispatched[task.task_id] = self.dispatched.get(task.task_id, 0) + 1
                if stamped:
                    self.submit_to_dispatch.append(now - _STAMP.unpack(task.payload)[0])
                payload = task.payload if not task.deps and task.task_id not in self.deps_of else self._evaluate(task)
                peer.held.append((task.task_id, task.attempt, payload))
            self._start(peer, now)
        elif kind is m.TaskResults:
            expected = self.expected
            for result in message.results:
                if result.task_id >> m.TASK_ID_BITS != peer.peer_id:
                    self.wrong_client += 1
                if expected and result.task_id in expected and _VALUE.unpack(result.payload)[0] != expected[result.task_id]:
                    self.values_wrong += 1
                self.result_ids[result.task_id] = self.result_ids.get(result.task_id, 0) + 1
                peer.results += 1
                peer.outstanding -= 1
            if self.client_wake is not None and not peer.react_at:
                peer.react_at = self._woken(now, self.client_wake)
        elif kind is m.SubmitAck:
            peer.acked += message.count
        elif kind is m.Heartbeat:
            self.daemon_heartbeats += 1
        elif kind is m.Welcome:
            peer.peer_id = message.peer_id
            peer.welcomed = True
            self.heartbeat_interval = message.heartbeat_interval
            self.idle_heartbeat = idle_heartbeat(message.heartbeat_interval, message.heartbeat_liveness)
        elif kind is m.Stats:
            self.stats = dict(message.snapshot)
        elif kind is m.Refused:
            if is_unknown_peer(message.reason):
                # The daemon does not know this connection (ZeroMQ reconnected it under a new
                # routing id): join again, as a real worker or client does (protocol/rejoin.py).
                self.rejoins += 1
                peer.welcomed = False
                peer.out.insert(0, peer.hello)
            else:
                peer.refused = message.reason
        elif kind is m.Goodbye:
            peer.refused = f"the daemon said goodbye: {message.reason}"
        # TasksRunning and the rest: nothing for a no-op peer to do

    def _evaluate(self, task: m.TaskDispatch) -> bytes:
        """A graph task's result: its own value plus its dependencies' (checked against the
        dependencies its client declared)."""
        declared = self.deps_of.get(task.task_id)
        if declared is None or sorted(d.task_id for d in task.deps) != declared:
            self.dep_errors += 1
        value = _VALUE.unpack(task.payload)[0]
        for dep in task.deps:
            if len(dep.payload) != _VALUE.size:
                self.dep_errors += 1
                continue
            value += _VALUE.unpack(dep.payload)[0]
        return _VALUE.pack(value)

    def _start(self, worker: Peer, now: float) -> None:
        if self.faithful:
            self._deal(worker, now)
            return
        while worker.held and worker.running < worker.capacity:
            task_id, attempt, payload = worker.held.popleft()
            worker.running += 1
            seconds = self.duration()
            if seconds <= 0:
                self._finish(worker, -1, task_id, attempt, payload, time.time(), seconds)
            else:
                self._seq += 1
                heapq.heappush(self.timers, (now + seconds, self._seq, worker, -1, task_id, attempt, payload,
                                             time.time(), seconds))

    def _deal(self, worker: Peer, now: float) -> None:
        """As a real agent deals to its processors (bench/scale_worker.py): tasks in top-ups,
        each after a drawn wake-up, then in series; what ends by ``now`` finishes at once."""
        procs = worker.procs
        wall = time.time() - now
        while worker.held:
            dealt = procs.deal(worker.held, now, self.duration, lambda: self._woken(now, self.wake))
            if not dealt:
                return
            worker.running = procs.running()
            instant = False
            for index, start, end, seconds, (task_id, attempt, payload) in dealt:
                if end <= now:
                    instant = True
                    self._finish(worker, index, task_id, attempt, payload, wall + start, seconds)
                else:
                    self._seq += 1
                    heapq.heappush(self.timers, (end, self._seq, worker, index, task_id, attempt, payload,
                                                 wall + start, seconds))
            if not instant:
                return

    def _woken(self, now: float, wake: Callable[[], float]) -> float:
        if not self.shared_core:
            return now + wake()
        self._core_free = max(now, self._core_free) + wake()
        return self._core_free

    def _finish(self, worker: Peer, index: int, task_id: int, attempt: int, payload: bytes, started: float,
                seconds: float) -> None:
        if not self.faithful:
            worker.running -= 1
            result = m.TaskResult(task_id, attempt, m.Status.OK, payload, m.NO_FACTS, m.NO_OBJECTS)
            out = worker.out
            if out and type(out[-1]) is m.TaskResults:
                out[-1].results.append(result)
            else:
                out.append(m.TaskResults([result]))
            return
        # Facts as a real processor reports them: the task's own run time (the daemon times
        # tasks from them, which sizes its prefetch windows, and records each run).
        now = time.monotonic()
        worker.procs.done(index, now)
        worker.procs.timed(max(seconds, 1e-6))
        worker.running = worker.procs.running()
        facts = m.TaskFacts(worker.hello.name, started, started + max(seconds, 1e-6), 0)
        if not worker.finished:
            worker.finished_since = now
        worker.finished.append(m.TaskResult(task_id, attempt, m.Status.OK, payload, facts, m.NO_OBJECTS))

    def _send_results(self, now: float) -> None:
        """Finished tasks' results go as a real agent sends them (worker/agent.py): at once
        unless the worker is saturated (more tasks waiting than processors), then together,
        after at most RESULT_LINGER or once there are RESULT_BATCH of them, or beside any
        other message it sends."""
        self._lingering = 0.0
        for worker in self.workers:
            results = worker.finished
            if not results:
                continue
            if (worker.out or len(worker.held) < worker.capacity or len(results) >= RESULT_BATCH
                    or now - worker.finished_since >= RESULT_LINGER):
                worker.out.append(m.TaskResults(results))
                worker.finished = []
            else:
                due = worker.finished_since + RESULT_LINGER
                self._lingering = due if not self._lingering else min(self._lingering, due)

    def drop_workers(self) -> None:
        """Every worker says Goodbye and closes (none holds a task: call between phases)."""
        for worker in self.workers:
            assert not worker.held and not worker.running, "drop_workers with tasks at a worker"
            left = [m.TaskResults(worker.finished)] if worker.finished else []
            worker.chan.send(codec.encode([*worker.out, *left, m.Goodbye("harness: next phase")]))
            self.poller.unregister(worker.chan.pollable)
            del self.by_pollable[worker.chan.pollable]
            worker.chan.close(linger=1.0)
        gone = set(map(id, self.workers))
        self.peers = [p for p in self.peers if id(p) not in gone]
        self.workers = []

    def _top_up(self, client: Peer) -> None:
        room = min(self.window - client.outstanding, client.quota)
        if room <= 0 or not client.welcomed:
            return
        stamp = _STAMP.pack(time.monotonic()) if self.payload is None else self.payload
        base = client.peer_id << m.TASK_ID_BITS
        n = client.next_n
        specs = [m.TaskSpec(base | (n + i), 0, 0, m.TaskFlags.INLINE_FN, stamp, [], [], 0) for i in range(room)]
        client.next_n = n + room
        client.outstanding += room
        client.quota -= room
        client.out.append(m.SubmitTasks(specs))

    def _flush(self, now: float) -> None:
        for peer in self.peers:
            while peer.frames:
                try:
                    peer.chan.send(peer.frames[0])
                except channel.Again:
                    break
                peer.frames.pop(0)
                peer.last_sent = now
            if peer.frames:
                continue  # ``out`` goes after them
            if peer.out:
                try:
                    peer.chan.send(codec.encode(peer.out))
                except channel.Again:
                    continue  # the daemon is behind: keep the batch, try next turn
                peer.out = []
                peer.last_sent = now

    # ------------------------------------------------------------------ queries

    def request_stats(self, timeout: float = 60.0) -> dict[str, Any]:
        self.stats = None
        self.clients[0].out.append(m.StatsRequest())
        self.run_until(lambda: self.stats is not None, timeout, "a Stats answer")
        assert self.stats is not None
        return self.stats

    def close(self) -> None:
        for peer in self.peers:
            if peer.welcomed:
                try:
                    peer.chan.send(codec.encode([m.Goodbye("harness done")]))
                except channel.SendError:
                    pass
        for peer in self.peers:
            peer.chan.close(linger=0)
        self.poller.close()
        if self.context is not None:
            self.context.term()


# --------------------------------------------------------------------------- one size


@dataclass
class Size:
    workers: int
    processors: int
    clients: int
    tasks: int = 100_000
    window: int = 100
    idle: float = 5.0
    pending: int = 20_000
    duration: str = "0"
    transport: str = "ipc"
    insecure: bool = False
    timeout: float = 600.0
    daemon_tree: str = ""  # run the daemon from this checkout (A/B of two versions); "" this one
    wake: str = "0"  # a simulated processor's wake-up per top-up of tasks (a --duration spelling)
    client_wake: str = ""  # a simulated client's delay before it submits more ("": none)
    shared_core: bool = False  # the wake-ups are CPU time on one simulated core, in turn (Sim.shared_core)
    watch: float = 0.0  # seconds of the watched phase (0: skip): idle, one client asking for statistics
    stats_every: float = 1.0  # ... every this many seconds, as a dashboard or `scaler-top` would
    journal_fsync: str = ""  # run the daemon with a journal synced this way ("": no journal)
    journal_dir: str = "/var/tmp"  # ... made in a fresh directory here (a disk: fsync on tmpfs is free)


def _watched(sim: Sim, daemon: DaemonProcess, size: Size, idle: dict[str, float]) -> dict[str, Any]:
    """Statistics at scale: the idle cluster while one client asks for a snapshot every
    ``size.stats_every`` seconds (a client's ``StatsRequest`` gets a fresh one, built on
    demand: docs/monitoring.rst). The daemon's CPU beyond the idle phase's rate, per snapshot
    (``us_per_snapshot``: building, encoding and sending it), and the snapshot's size."""
    asked = 0

    def body() -> None:
        nonlocal asked
        end = time.monotonic() + size.watch
        while time.monotonic() < end:
            due = time.monotonic() + size.stats_every
            sim.request_stats()
            asked += 1
            sim.run_until(lambda: time.monotonic() >= min(due, end), size.stats_every + 60, "the watched phase")

    watched = _phase(sim, daemon, body)
    beyond = watched["daemon_cpu"] - idle["daemon_cpu"] / idle["wall"] * watched["wall"]
    return {
        "stats_every_s": size.stats_every, "snapshots": asked,
        "us_per_snapshot": 1e6 * beyond / max(1, asked),
        "watched_core_pct": 100 * watched["daemon_cpu"] / watched["wall"],
        "snapshot_kb": sim.stats_bytes / 1024,
        "watched_others_on_core_pct": 100 * watched["others"],
    }


def run_size(size: Size, workdir: str, prefix: list[str] | None = None) -> dict[str, Any]:
    """Start a daemon, offer it ``size``, measure; returns a row of figures (see the module doc).

    Also reports the harness's own checks: ``dispatched_more_than_once``, ``never_dispatched``,
    ``results_missing``, ``results_duplicated``, ``results_to_wrong_client`` (all 0 when right)."""
    prefix = [] if prefix is None else prefix
    credentials: dict[str, Any] = {}
    extra: list[str] = []
    if size.transport == "ipc":
        address = f"ipc://{workdir}/daemon.sock"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        address = f"tcp://127.0.0.1:{port}"
        if size.insecure:
            extra.append("--insecure")
        else:
            from scaler_executor.security.keys import SecurityDir, load_credential

            keys = os.path.join(workdir, "keys")
            directory = SecurityDir.init(keys)
            for role in (m.Role.WORKER, m.Role.CLIENT):
                path = os.path.join(workdir, f"{role}.cred")
                directory.issue(f"sim-{role}", role, path)
                credentials[role] = load_credential(path)
            extra += ["--security", keys]
    journal = ""
    if size.journal_fsync:
        journal = os.path.join(tempfile.mkdtemp(prefix="scale-journal-", dir=size.journal_dir), "journal")
        extra += ["--journal", journal, "--journal-fsync", size.journal_fsync]
    daemon = DaemonProcess(address, extra, prefix, os.path.join(workdir, "daemon.log"), size.daemon_tree)
    peers = size.clients + 2 * size.workers + 1  # the pending phase adds the workers again; a monitor
    sim = Sim(address, credentials=credentials, duration=duration_sampler(size.duration), window=size.window, max_peers=peers,
              wake=duration_sampler(size.wake), client_wake=duration_sampler(size.client_wake) if size.client_wake else None)
    sim.shared_core = size.shared_core
    row: dict[str, Any] = {
        "transport": size.transport + ("" if size.transport == "ipc" else (" insecure" if size.insecure else " curve")),
        "workers": size.workers, "processors": size.processors, "clients": size.clients,
        "zmq_max_sockets": sim.max_sockets if size.transport == "tcp" else None,
        "journal_fsync": size.journal_fsync or None,
    }
    try:
        for _ in range(size.clients):
            sim.add(m.Role.CLIENT)
        sim.run_until(lambda: all(c.welcomed for c in sim.clients), 60, "the clients' Welcome")
        rss0 = daemon.rss()
        for _ in range(size.workers):
            sim.add(m.Role.WORKER, size.processors)
        sim.run_until(lambda: all(w.welcomed for w in sim.workers), size.timeout, "the workers' Welcome")
        row["heartbeat_interval"] = sim.heartbeat_interval
        # Idle: nothing but heartbeats, both ways.
        hb0 = sim.heartbeats_sent
        end = time.monotonic() + size.idle
        idle = _phase(sim, daemon, lambda: sim.run_until(lambda: time.monotonic() >= end, size.idle + 60, "idle"))
        rss1 = daemon.rss()
        beats = sim.heartbeats_sent - hb0
        row["idle_core_pct"] = 100 * idle["daemon_cpu"] / idle["wall"]
        row["us_per_heartbeat"] = 1e6 * idle["daemon_cpu"] / max(1, beats)
        row["idle_others_on_core_pct"] = 100 * idle["others"]
        row["idle_harness_bound"] = idle["harness_cpu"] / idle["wall"] > HARNESS_BOUND
        row["kb_per_worker"] = (rss1 - rss0) / 1024 / max(1, size.workers)
        if size.watch:
            row.update(_watched(sim, daemon, size, idle))
        # Load: no-op tasks through the clients' windows.
        stats0 = sim.request_stats()
        per_client, extra_tasks = divmod(size.tasks, size.clients)
        for i, client in enumerate(sim.clients):
            client.quota = per_client + (1 if i < extra_tasks else 0)
        sim.submit_to_dispatch = []
        load = _phase(sim, daemon, lambda: sim.run_until(
            lambda: all(c.quota == 0 and c.outstanding == 0 for c in sim.clients), size.timeout, "the load phase"))
        stats1 = sim.request_stats()
        row["tasks_per_s"] = size.tasks / load["wall"]
        row["us_per_task"] = 1e6 * load["daemon_cpu"] / size.tasks
        row["daemon_core_pct"] = 100 * load["daemon_cpu"] / load["wall"]
        row["others_on_core_pct"] = 100 * load["others"]
        row["harness_bound"] = load["harness_cpu"] / load["wall"] > HARNESS_BOUND
        row["submit_dispatch_p50_ms"] = 1e3 * _pctl(sim.submit_to_dispatch, 0.5)
        row["submit_dispatch_p99_ms"] = 1e3 * _pctl(sim.submit_to_dispatch, 0.99)
        bins0, bins1 = turns.parse_bins(str(stats0["turn_bins"])), turns.parse_bins(str(stats1["turn_bins"]))
        diff = {k: n - bins0.get(k, 0) for k, n in bins1.items() if n - bins0.get(k, 0) > 0}
        # A bin's upper bound, so no more than the longest turn seen (over the daemon's life).
        row["turn_max_us"] = int(stats1["turn_max_us"])
        row["turn_p50_us"] = min(turns.percentile(diff, 0.5), row["turn_max_us"])
        row["turn_p99_us"] = min(turns.percentile(diff, 0.99), row["turn_max_us"])
        # Pending: the workers leave (Goodbye), so what the clients submit now waits in the
        # daemon; then as many fresh workers join and drain it.
        if size.pending:
            sim.drop_workers()
            sim.run_until(lambda: int(sim.request_stats()["workers"]) == 0, 60, "the workers' departure")
            acked0 = sum(c.acked for c in sim.clients)
            before = daemon.rss()
            sim.window = size.window + size.pending
            for i, client in enumerate(sim.clients):
                client.quota = size.pending // size.clients + (1 if i < size.pending % size.clients else 0)
            sim.run_until(lambda: sum(c.acked for c in sim.clients) - acked0 >= size.pending, size.timeout,
                          "the pending tasks' acks")
            stats = sim.request_stats()
            queued = int(stats.get("tasks_pending", 0))
            row["pending_queued"] = queued
            row["bytes_per_pending_task"] = (daemon.rss() - before) / max(1, queued)
            for _ in range(size.workers):
                sim.add(m.Role.WORKER, size.processors)
            sim.run_until(lambda: all(c.outstanding == 0 for c in sim.clients), size.timeout, "the pending tasks' drain")
        total = size.tasks + size.pending
        row["dispatched_more_than_once"] = sum(1 for n in sim.dispatched.values() if n > 1)
        row["never_dispatched"] = total - len(sim.dispatched)
        row["results_missing"] = total - len(sim.result_ids)
        row["results_duplicated"] = sum(1 for n in sim.result_ids.values() if n > 1)
        row["results_to_wrong_client"] = sim.wrong_client
        row["rejoins"] = sim.rejoins
        row["daemon_finished"] = int(sim.request_stats().get("finished", -1))
    finally:
        sim.close()
        daemon.stop()
        if journal:  # the journal and the store region it keeps for a restart
            subprocess.run([sys.executable, "-m", "scaler_executor.cli.daemon", "--journal", journal, "--discard"],
                           cwd=size.daemon_tree or None, capture_output=True, check=False)
            shutil.rmtree(os.path.dirname(journal), ignore_errors=True)
    return row


# --------------------------------------------------------------------------- main


LOAD_COLUMNS = [
    ("transport", "transport", "{}"), ("workers", "W", "{}"), ("processors", "P", "{}"), ("clients", "C", "{}"),
    ("tasks_per_s", "tasks/s", "{:,.0f}"), ("us_per_task", "µs CPU/task", "{:.1f}"),
    ("us_per_task_net", "net of idle", "{:.1f}"),
    ("daemon_core_pct", "daemon % core", "{:.0f}"), ("others_on_core_pct", "others % core", "{:.0f}"),
    ("submit_dispatch_p50_ms", "sub→disp p50 ms", "{:.1f}"), ("submit_dispatch_p99_ms", "p99 ms", "{:.1f}"),
    ("turn_p50_us", "turn p50 µs", "{:,}"), ("turn_p99_us", "turn p99 µs", "{:,}"), ("turn_max_us", "turn max µs", "{:,}"),
    ("harness_bound", "harness-bound", "{}"), ("repeat", "run", "{}"),
]
IDLE_COLUMNS = [
    ("transport", "transport", "{}"), ("workers", "W", "{}"), ("processors", "P", "{}"), ("clients", "C", "{}"),
    ("idle_core_pct", "idle % core", "{:.2f}"), ("us_per_heartbeat", "µs CPU/heartbeat", "{:.1f}"),
    ("idle_others_on_core_pct", "others % core", "{:.0f}"), ("kb_per_worker", "KB/worker", "{:.2f}"),
    ("bytes_per_pending_task", "B/pending task", "{:.0f}"), ("pending_queued", "pending", "{:,}"),
    ("repeat", "run", "{}"),
]


WATCH_COLUMNS = [
    ("transport", "transport", "{}"), ("workers", "W", "{}"), ("processors", "P", "{}"), ("clients", "C", "{}"),
    ("stats_every_s", "every s", "{:g}"), ("snapshots", "snapshots", "{}"), ("us_per_snapshot", "µs CPU/snapshot", "{:,.0f}"),
    ("snapshot_kb", "KB/snapshot", "{:.0f}"), ("watched_core_pct", "watched % core", "{:.2f}"),
    ("idle_core_pct", "idle % core", "{:.2f}"), ("watched_others_on_core_pct", "others % core", "{:.0f}"),
    ("repeat", "run", "{}"),
]


def rst_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    cells = [[title for _, title, _ in columns]] + [[fmt.format(row[key]) if key in row else "" for key, _, fmt in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    rule = "  ".join("=" * w for w in widths)
    lines = [rule, "  ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)), rule]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells[1:]]
    return "\n".join([*lines, rule])


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="10,100,1000", help="comma-separated worker counts")
    p.add_argument("--processors", default="4", help="comma-separated processors per worker")
    p.add_argument("--clients", default="1,10", help="comma-separated client counts")
    p.add_argument("--tasks", type=int, default=100_000, help="tasks in the load phase")
    p.add_argument("--window", type=int, default=100, help="tasks each client keeps outstanding")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of the idle phase")
    p.add_argument("--pending", type=int, default=20_000, help="tasks of the pending phase (0: skip)")
    p.add_argument("--watch", type=float, default=0.0,
                   help="seconds of a watched phase after the idle one (0: skip): one client asks for statistics "
                        "every --stats-every seconds; the daemon's CPU per snapshot beyond the idle rate")
    p.add_argument("--stats-every", type=float, default=1.0, help="seconds between the watched phase's snapshots")
    p.add_argument("--duration", default="0", help="task duration: 0, fixed:S, uniform:A:B or exp:MEAN")
    p.add_argument("--wake", default="0", help="a simulated processor's wake-up per top-up of tasks, as --duration "
                   "(bench/scale_worker.py; bench/scale_validate.py's sim-paced tunes it against real workers)")
    p.add_argument("--client-wake", default="", help="a simulated client's delay before it submits more, as --duration")
    p.add_argument("--shared-core", action="store_true",
                   help="the wake-ups are CPU time on one simulated core, served in turn (peers sharing a busy core)")
    p.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    p.add_argument("--journal-fsync", default="", metavar="MODE",
                   help="run the daemon with a journal (--journal-fsync MODE: turn, interval or os); default none")
    p.add_argument("--journal-dir", default="/var/tmp", help="where --journal-fsync's journal is made (a disk, not tmpfs)")
    p.add_argument("--insecure", action="store_true", help="tcp without CURVE")
    p.add_argument("--repeat", type=int, default=1, help="runs of every size, alternated")
    p.add_argument("--json", help="append each row as a JSON line to this file")
    p.add_argument("--daemon-trees", default="",
                   help="comma-separated checkouts whose daemons to A/B, alternated within each size (default: this one)")
    p.add_argument("--graph", metavar="SHAPE:NODES,...",
                   help="graph mode (bench/scale_graph.py): e.g. tree:100000,shuffle:100000, per --workers and "
                        "--processors (no clients, load or idle phases)")
    p.add_argument("--report", nargs="+", metavar="JSONL", help="print the rows of these --json files as tables, run nothing")
    args = p.parse_args(argv)
    if args.report:
        from bench.scale_graph import GRAPH_COLUMNS

        rows = [json.loads(line) for path in args.report for line in open(path) if line.strip()]  # noqa: SIM115
        graphs = [row for row in rows if "shape" in row]
        rows = [row for row in rows if "shape" not in row]
        for row in rows:  # less what the idle phase's rate (heartbeats) would have cost meanwhile
            row["us_per_task_net"] = row["us_per_task"] - row["idle_core_pct"] / 100 * 1e6 / row["tasks_per_s"]
        if rows:
            print(rst_table(rows, LOAD_COLUMNS), "", rst_table(rows, IDLE_COLUMNS), sep="\n")
            if watched := [row for row in rows if "us_per_snapshot" in row]:
                print("", rst_table(watched, WATCH_COLUMNS), sep="\n")
        if graphs:
            print(rst_table(graphs, GRAPH_COLUMNS))
        return 0
    if args.insecure and args.transport != "tcp":
        p.error("--insecure applies to --transport tcp only; drop it or add --transport tcp")
    nofile = raise_nofile()
    prefix, pinned = pin()
    print(f"# RLIMIT_NOFILE {nofile[0]}/{nofile[1]}; daemon {'pinned: ' + ' '.join(prefix) if pinned else 'NOT pinned (fewer than 2 CPUs or no taskset)'}; "
          f"harness on CPUs {sorted(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.graph:
        from bench.scale_graph import parse, run_graph

        cells = parse(args.graph)
        for rep in range(args.repeat):
            for shape, nodes in cells if rep % 2 == 0 else cells[::-1]:
                for w in _ints(args.workers):
                    for pr in _ints(args.processors):
                        with tempfile.TemporaryDirectory(prefix="scale-") as workdir:
                            row = run_graph(shape, nodes, w, pr, workdir, prefix, duration_sampler(args.duration))
                        row["repeat"] = rep
                        row["loadavg"] = os.getloadavg()[0]
                        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
                        if args.json:
                            with open(args.json, "a") as f:
                                f.write(json.dumps(row) + "\n")
        return 0
    duration_sampler(args.wake, "--wake"), args.client_wake and duration_sampler(args.client_wake, "--client-wake")
    sizes = [Size(w, pr, c, args.tasks, args.window, args.idle, args.pending, args.duration, args.transport, args.insecure,
                  wake=args.wake, client_wake=args.client_wake, shared_core=args.shared_core, watch=args.watch,
                  stats_every=args.stats_every, journal_fsync=args.journal_fsync, journal_dir=args.journal_dir)
             for w in _ints(args.workers) for pr in _ints(args.processors) for c in _ints(args.clients)]
    trees = [os.path.abspath(t) for t in args.daemon_trees.split(",")] if args.daemon_trees else [""]
    for rep in range(args.repeat):
        for size, tree in [(s, t) for s in sizes for t in (trees if rep % 2 == 0 else trees[::-1])]:
            size.daemon_tree = tree
            with tempfile.TemporaryDirectory(prefix="scale-") as workdir:
                row = run_size(size, workdir, prefix)
            row["daemon_tree"] = tree
            row["repeat"] = rep
            row["loadavg"] = os.getloadavg()[0]
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
