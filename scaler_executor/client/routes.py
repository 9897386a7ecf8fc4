"""The ways a task and its result travel besides the daemon's socket.

Three routes carry a client's tasks and results (``docs/architecture.rst``, "a result's
way back"): the daemon's socket, a worker's *lane* and the *reply inbox*.

* ``DaemonRoute``: the connection to the daemon: its socket, a transmission held back
  while the daemon's queue is full (order is kept), and the liveness clock.

* ``LaneRoute``: a worker on this host offers a lane (``worker/lanes.py``); a task
  submitted alone goes down it to the worker, and its result comes back on it (or as
  a reply datagram).  The daemon never holds such a task.
* ``ReplyInbox``: the Unix datagram socket where local processors send a sequential
  caller's result (``protocol/reply.py``), read by the agent thread — or by the caller
  itself while it waits in ``result()`` (``pick_up``), which saves the thread wake-up
  between a result and its waiting caller.

All three offer the agent loop one interface, ``Route``: ``pollable`` (what the loop
polls; None while closed), ``buffered`` (read earlier, not yet handled) and
``serve(sink)``, which reads what is waiting and hands it to the ``RouteSink`` (the
agent): daemon messages, results, lane tasks to send again, objects to pin.  The loop
(``ClientAgent._serve``) only polls and calls ``serve`` on each ready route, the way
``scheduler/loop.py`` only polls and dispatches.

Lock order (outermost first; take none of them in code a finalizer can reach):
``ClientAgent._io`` (10) → ``ClientAgent.lock`` (20) → ``ReplyInbox.pickup_lock`` (25;
a datagram read by a picking-up caller may name a lane, which it then connects) →
``LaneRoute.lock`` (30) → ``ReplyInbox.fd_lock`` (50) → ``ClientAgent._wake_lock`` (90).  The ranks are checked while the tests run (``scaler_executor/_locks.py``).
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from scaler_executor._locks import ranked_lock
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.state import TASK_MASK, TaskItem, TaskRecord
from scaler_executor.protocol import channel, codec, reply
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent

log = logging.getLogger("scaler_executor.client")

RECV_BURST = 1024
TURN_SECONDS = 0.02  # most a turn spends receiving, so heartbeats and submissions still go out under floods
# A sequential caller polls its reply socket without sleeping for up to this long before it
# blocks (ReplyInbox.pick_up): a blocked caller leaves its vCPU idle, and waking an idle
# vCPU of a VM costs ~0.2-1 ms, most of the slowest 1 % of round trips.  Spinning only
# while the last pick-up came within the window bounds the waste to one window per change
# to longer tasks; it yields the CPU on every empty poll, so the processes it waits on run.
PICKUP_SPIN_SECONDS = 0.002
SPIN_WORTHWHILE = len(os.sched_getaffinity(0)) > 1  # on one CPU the work waited on needs it


class RouteSink(Protocol):
    """What a route hands over, on the agent thread (``ClientAgent`` implements it)."""

    def on_message(self, message: Any, buffers: list[Any]) -> None:
        """One message of the daemon (``inbound.py`` has a handler per type)."""

    def on_results(self, results: list[m.TaskResult]) -> None:
        """Results to complete (``completion.py``)."""

    def send_again(self, records: list[TaskRecord], closed: bool) -> None:
        """Lane tasks that did not run to the end: to the daemon; ``closed``: the lane
        closed (the core's ``LaneLost``)."""

    def pin(self, object_ids: list[bytes]) -> None:
        """Objects made for us that the daemon does not know of: held until read."""


class Route(Protocol):
    """One way results come back, as the agent loop sees it."""

    @property
    def pollable(self) -> Any:
        """What the loop polls for this route; None while it is closed."""

    @property
    def buffered(self) -> bool:
        """Read earlier and not yet handled: serve it even if the poll did not report it."""

    def serve(self, sink: RouteSink) -> None:
        """Read what is waiting (bounded per turn) and hand it to ``sink``."""


class DaemonRoute:
    """The client's connection to the daemon (used by the agent role's thread only, and by
    a user thread sending its own submit while it holds the connection's lock)."""

    def __init__(self, address: str, hwm: int, heartbeat_interval: float, security: Any = None) -> None:
        # The embedded daemon binds moments after we connect: the channel retries.
        self.sock = channel.connect(address, hwm=hwm, linger=0.1, security=security)
        self.pending: list[Any] | None = None  # frames held back by a full queue
        self.welcomed = False
        self.heartbeat_interval = heartbeat_interval  # lowered to the daemon's at Welcome
        self.started = self.last_recv = self.last_send = time.monotonic()

    @property
    def pollable(self) -> Any:
        return self.sock.pollable

    @property
    def buffered(self) -> bool:
        return bool(self.sock.buffered)

    def poll_timeout(self, milliseconds: float) -> float:
        return float(self.sock.poll_timeout(milliseconds))

    def send(self, batch: list[Any]) -> None:
        frames = codec.encode(batch)
        try:
            self.sock.send(frames)
            self.last_send = time.monotonic()
        except channel.Again:
            self.pending = frames  # the daemon's queue is full: hold it, keep order

    def retry(self) -> None:
        """Send the held-back transmission if the queue has room now."""
        assert self.pending is not None
        try:
            self.sock.send(self.pending)
        except channel.Again:
            return
        self.pending = None
        self.last_send = time.monotonic()

    def heartbeat_due(self, now: float) -> bool:
        return now - self.last_send >= self.heartbeat_interval

    def receive(self, seconds: float) -> Iterator[tuple[list[Any], list[Any]]]:
        """Decoded transmissions waiting in the socket, for up to ``seconds`` (so heartbeats
        and submissions still go out under a flood); a bad one is logged and dropped."""
        sock = self.sock
        deadline = time.monotonic() + seconds
        for _ in range(RECV_BURST):
            if time.monotonic() > deadline or not sock.readable():
                return  # the rest waits for the next turn
            try:
                frames = sock.recv()
            except channel.Again:
                return
            self.last_recv = time.monotonic()
            try:
                yield codec.decode(frames)
            except codec.DecodeError as exc:
                log.warning("client: dropped a bad transmission from the daemon: %s", exc)

    def serve(self, sink: RouteSink) -> None:
        for messages, buffers in self.receive(TURN_SECONDS):
            for message in messages:
                sink.on_message(message, buffers)

    def close(self, goodbye: bool) -> None:
        if goodbye:
            try:
                self.sock.send(codec.encode([m.Goodbye("client shutting down")]))
            except channel.SendError:
                pass
        self.sock.close()


class LaneRoute:
    """The client's end of one worker's lane (at most one open at a time)."""

    def __init__(self, agent: ClientAgent, enabled: bool, hwm: int) -> None:
        self.agent = agent
        self.enabled = enabled
        self.hwm = hwm
        self.lock = ranked_lock("LaneRoute.lock", 30)  # serializes sends (user threads) and reads (agent thread)
        self.dealer: Any = None  # a channel.StreamDealer, once a result named a lane
        self.refused: set[str] = set()  # lanes that could not be connected
        self.fns: set[int] = set()  # callables sent down the current lane
        self.tasks: dict[int, TaskRecord] = {}  # what is on the lane now, by task number
        self.poller: channel.Poller | None = None  # the agent loop's, once a lane was connected
        # Worker name -> lane tasks' results received from it (any status), for the
        # statistics barrier (scheduler/stats_barrier.py); the current lane's worker.
        self.ends: dict[str, int] = {}
        self.worker = ""

    @property
    def open(self) -> bool:
        return self.dealer is not None

    @property
    def pollable(self) -> Any:
        dealer = self.dealer
        return None if dealer is None else dealer.pollable

    @property
    def buffered(self) -> bool:
        dealer = self.dealer
        return dealer is not None and bool(dealer.buffered)

    def serve(self, sink: RouteSink) -> None:
        assert self.poller is not None  # set when the lane was connected
        results, again, lost = self.receive(self.poller)
        if again or lost:
            sink.send_again(again, lost)
        pins = [oid for r in results for oid in r.objects]
        if pins:
            sink.pin(pins)  # made by the processor for us, unknown to the daemon
        if results:
            sink.on_results(results)

    def submit(self, record: TaskRecord, item: TaskItem) -> bool:
        """Send a task down the lane (the core's ``SendDownLane``); False: it goes to the
        daemon instead (``LaneRefused``).  The caller marks the future RUNNING: the worker
        has it, a cancel could no longer keep it from running."""
        core = self.agent.core
        with self.lock:
            dealer = self.dealer
            if dealer is None or dealer.conn is None:
                return False
            base = core.base
            messages: list[Any] = []
            if item.fn_id and item.fn_id not in self.fns:
                assert record.blob is not None  # the core routes a task whose callable is gone to the daemon
                messages.append(m.RegisterFunction(base | item.fn_id, record.blob))
            spec = m.make(m.TaskSpec, (base | item.n, base | item.fn_id if item.fn_id else 0, 0, item.flags, item.payload, [], [], 0))
            messages.append(m.SubmitTasks([spec]))
            self.tasks[item.n] = record  # first: its result may be read before send returns
            try:
                dealer.send(codec.encode(messages))
            except channel.SendError:
                del self.tasks[item.n]
                return False
            if dealer.conn is None:
                del self.tasks[item.n]
                return False  # the write failed: the worker is gone, nothing of it arrived whole
            if item.fn_id:
                self.fns.add(item.fn_id)
        return True

    def connect(self, path: str, reply_to: str, poller: channel.Poller, closing: bool) -> None:
        """Connect to the lane a result named, unless one is open (or this one failed)."""
        with self.lock:
            if self.dealer is not None or path in self.refused or closing:
                return
            if not self.enabled or not path.startswith(os.path.dirname(reply_to) + os.sep):
                self.refused.add(path)  # off, or not beside our reply socket: not a lane of ours
                return
            try:
                dealer = channel.StreamDealer(path, hwm=self.hwm, linger=0)
            except OSError as exc:
                dealer = None
                log.info("client: cannot connect to the lane %s (%s)", path, exc)
            if dealer is None or dealer.conn is None:
                if dealer is not None:
                    dealer.close(linger=0)
                self.refused.add(path)
                return
            self.fns.clear()
            poller.register(dealer.pollable)
            self.poller = poller
            self.dealer = dealer

    def receive(self, poller: channel.Poller) -> tuple[list[m.TaskResult], list[TaskRecord], bool]:
        """(Agent thread) What came back: results, and the tasks to send again through the
        daemon (their processor died, or the lane closed with them on it)."""
        results: list[m.TaskResult] = []
        with self.lock:
            dealer = self.dealer
            if dealer is None:
                return [], [], False
            while dealer.conn is not None and dealer.readable():
                try:
                    frames = dealer.recv()
                except channel.Again:
                    break
                try:
                    messages, _ = codec.decode(frames)
                except codec.DecodeError as exc:
                    log.error("client: dropped a bad transmission from the lane %s: %s", dealer.path, exc)
                    continue
                for message in messages:
                    if type(message) is m.TaskResults:
                        results.extend(message.results)
            lost = dealer.conn is None
            if lost:
                self._close(poller)
            again = []
            for result in results:
                record = self.tasks.pop(result.task_id & TASK_MASK, None)
                if record is not None:
                    self._ended(result.facts.worker)
                    if result.status == Status.PROCESSOR_DIED:
                        again.append(record)
            if lost:
                again.extend(self.tasks.values())
                self.tasks.clear()
                # Its worker stopped or closed its lanes: what it reports now (if anything)
                # no longer holds back statistics, and a worker of the same name later on
                # (another process) starts its count afresh.
                self.ends.pop(self.worker, None)
        return [r for r in results if r.status != Status.PROCESSOR_DIED], again, lost

    def delivered(self, result: m.TaskResult) -> None:
        """A result came another way (a reply datagram, the daemon): a lane task's ends."""
        if self.tasks and self.tasks.pop(result.task_id & TASK_MASK, None) is not None:
            with self.lock:
                self._ended(result.facts.worker)

    def _ended(self, worker: str) -> None:
        """(Under ``lock``) A lane task's result came from ``worker``."""
        self.ends[worker] = self.ends.get(worker, 0) + 1
        self.worker = worker

    def counts(self) -> dict[str, int]:
        """What a StatsRequest names: the lane results received, by worker."""
        if not self.ends:
            return {}
        with self.lock:
            return dict(self.ends)

    def release(self, fn_id: int) -> None:
        """(Agent thread) The worker may drop a callable it had down the lane: after the
        tasks sent before, which it keeps it for."""
        with self.lock:
            dealer = self.dealer
            if dealer is None or fn_id not in self.fns:
                return
            self.fns.discard(fn_id)
            try:
                dealer.send(codec.encode([m.ReleaseFunctions([self.agent.core.base | fn_id])]))
            except channel.SendError:
                pass  # the lane is closing: its worker forgets everything of it

    def kill(self, n: int) -> bool:
        """Kill a running lane task (``force``); False if the lane closed (the task goes to
        the daemon, which can be told)."""
        with self.lock:
            dealer = self.dealer
            if dealer is None or dealer.conn is None or n not in self.tasks:
                return False
            try:
                dealer.send(codec.encode([m.CancelTasks([self.agent.core.base | n], True)]))
            except channel.SendError:
                return False
            return dealer.conn is not None

    def holds(self, n: int) -> bool:
        return n in self.tasks

    def close(self, poller: channel.Poller) -> None:
        with self.lock:
            self._close(poller)

    def _close(self, poller: channel.Poller) -> None:
        dealer, self.dealer = self.dealer, None
        if dealer is not None:
            self.fns.clear()
            try:
                poller.unregister(dealer.pollable)
            except (KeyError, ValueError, OSError):
                pass
            dealer.close(linger=0)


class ReplyInbox:
    """The socket where local processors send sequential callers' results (reply.py)."""

    def __init__(self, sock: socket.socket, path: str, poller: channel.Poller,
                 on_lane: Callable[[str], None]) -> None:
        self.sock = sock
        self.path = path
        self.poller = poller
        self.on_lane = on_lane  # a datagram named the lane of the worker that sent it
        self.fd = sock.fileno()
        # A caller waiting in result() reads the socket itself (pick_up): one at a time
        # (pickup_lock), woken by pickup_fd when its future is completed another way;
        # fd_lock keeps a write off a closed descriptor.
        self.pickup_lock = ranked_lock("ReplyInbox.pickup_lock", 25)
        self.fd_lock = ranked_lock("ReplyInbox.fd_lock", 50)
        self.pickup_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.picking: TaskFuture[Any] | None = None
        self.spin = SPIN_WORTHWHILE  # the last pick-up came within PICKUP_SPIN_SECONDS
        self.tearing = False
        poller.register(self.fd)

    @property
    def pollable(self) -> int:
        return self.fd

    buffered = False  # a datagram socket: the poll sees everything waiting

    def serve(self, sink: RouteSink) -> None:
        results = self.read()
        if results:
            sink.on_results(results)

    @classmethod
    def bind(cls, directory: str, poller: channel.Poller, on_lane: Callable[[str], None]) -> ReplyInbox | None:
        """In the embedded cluster's own directory (mode 0700): only this user's processes
        can write to it, and it goes with the directory.  None: results take the daemon."""
        path = os.path.join(directory, reply.SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            channel.owner_only_bind(sock, path)  # the directory is private; the socket is too
        except OSError as exc:
            sock.close()
            log.warning("client: no reply socket at %s (%s); results take the daemon's path", path, exc)
            return None
        return cls(sock, path, poller, on_lane)

    def read(self, wanted: int | None = None) -> list[m.TaskResult]:
        """Datagrams until none is left, or until one has the result of task ``wanted``
        (a caller picking up its own: one more ``recv`` would only fail, ~20 us of its
        round trip for the system call and the exception; the agent reads any rest)."""
        results: list[m.TaskResult] = []
        sock = self.sock
        for _ in range(RECV_BURST):
            try:
                datagram = sock.recv(reply.DATAGRAM_LIMIT)
            except BlockingIOError:
                break
            try:
                result, lane = reply.decode(datagram)
            except codec.DecodeError as exc:  # only a bug sends one: the daemon has no copy to send
                log.error("client: dropped a bad result datagram (%d bytes): %s", len(datagram), exc)
                continue
            results.append(result)
            if lane:
                try:
                    self.on_lane(lane)
                except Exception:  # the results read so far must still be completed
                    log.exception("client: could not connect to the lane %s", lane)
            if wanted is not None and result.task_id & TASK_MASK == wanted:
                break
        return results

    def pick_up(self, future: TaskFuture[Any], timeout: float | None, n: int) -> list[m.TaskResult]:
        """``future.result()`` of a sequential caller's task (number ``n``): read this socket
        on the waiting thread until its result (or others) came; [] if the future was
        completed another way (the daemon's path, a cancel, a broken executor: each wakes
        it through ``pickup_fd``), the timeout passed, another thread is picking up, or
        the inbox is closing.  It polls without sleeping for the first
        ``PICKUP_SPIN_SECONDS`` while results have been coming that fast."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.pickup_lock.acquire(blocking=False):
            return []
        try:
            if self.tearing:
                return []
            return self._await(future, deadline, n)
        finally:
            self.pickup_lock.release()

    def _await(self, future: TaskFuture[Any], deadline: float | None, n: int) -> list[m.TaskResult]:
        waiter = _PickupWaiter(self)
        if not future.add_waiter(waiter):
            return []  # done already
        fd = self.fd
        started = time.monotonic()
        self.poller.unregister(fd)  # the agent thread stops watching it (epoll is thread-safe)
        self.picking = future  # only now: the socket is this thread's (tests wait for this)
        try:
            try:
                os.eventfd_read(self.pickup_fd)  # a wake-up meant for an earlier pick-up
            except BlockingIOError:
                pass
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            poll.register(self.pickup_fd, select.POLLIN)
            spin_until = started + PICKUP_SPIN_SECONDS if self.spin else started
            if deadline is not None:
                spin_until = min(spin_until, deadline)
            while not future.done() and not self.tearing:
                now = time.monotonic()
                if now < spin_until:
                    ready = poll.poll(0)
                    if not ready:
                        os.sched_yield()  # the daemon, worker or processor may be waiting for this CPU
                        continue
                elif deadline is None:
                    ready = poll.poll()
                else:
                    left = deadline - now
                    if left <= 0:
                        return []
                    ready = poll.poll(math.ceil(left * 1000))
                if any(ready_fd == fd for ready_fd, _ in ready):
                    results = self.read(n)
                    if results:
                        return results
            return []
        finally:
            # However the wait ended (a result either way, a timeout, a cancel): spin next
            # time only if this one was short enough for spinning to have paid.
            self.spin = SPIN_WORTHWHILE and time.monotonic() - started <= PICKUP_SPIN_SECONDS
            self.picking = None
            future.remove_waiter(waiter)
            if not self.tearing:
                self.poller.register(fd)  # level-triggered: anything that came meanwhile wakes the agent

    def wake_picker(self) -> None:
        with self.fd_lock:
            if self.pickup_fd >= 0:
                os.eventfd_write(self.pickup_fd, 1)

    def close(self) -> None:
        self.tearing = True
        self.wake_picker()
        with self.pickup_lock:  # a caller picking up leaves once woken
            self.sock.close()  # its file goes with the cluster's directory
        with self.fd_lock:
            os.close(self.pickup_fd)
            self.pickup_fd = -1


class _PickupWaiter:
    """A ``concurrent.futures`` waiter that wakes a thread in ``ReplyInbox.pick_up``."""

    __slots__ = ("inbox",)

    def __init__(self, inbox: ReplyInbox) -> None:
        self.inbox = inbox

    def add_result(self, future: Any) -> None:
        self.inbox.wake_picker()

    add_exception = add_cancelled = add_result
