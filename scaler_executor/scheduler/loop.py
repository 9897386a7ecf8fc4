"""The daemon's thin loop around the pure core.

::

    poll(daemon channel, signal pipe, lifeline)  ── timeout: next tick, or 5 ms while a backlog waits
      → recv the transmissions ready, decode within daemon_limits (codec.Limits), until they
        carry the turn's budget of tasks and results (turns.TurnBudget: about TURN_TARGET_NS
        of work, learnt from the turns before), RECV_BURST of them or TURN_SECONDS;
        bad ones: count (dropped_messages), log (rate-limited), drop
        (tcp:// with --security: ZAP requests answered on this poller; each transmission's key
        (User-Id) checked before it is decoded, each message against the key's role; the
        allow-list re-read when its file changes: security/server.py)
      → Tick every heartbeat_interval / 4; Wake when the core asked (deferred notices);
        local worker exits from the manager
      → core.handle(*events) → [Send(peer, messages)]
      → SendObjects / CreditObjects / EndObjectSends: answers to ObjectRequests, large objects
        in 4 MiB parts cut from the store's views, a window of parts per peer (object_stream.py)
      → StoreChunk: a put's or a large result's chunk written into the store; a result's also
        sent on to its client as a ResultPart, the same frame (result_stream.py)
      → encode one transmission per peer; an unroutable peer is an error (ROUTER_MANDATORY)
        (→ PeerUnreachable next turn) and a full one EAGAIN (→ that peer's backlog, kept in order)
      → the turn's duration (receive to last send) into core.turns (scheduler/turns.py), and
        with what it read into the budget

Everything the daemon decides is in ``core.py``; this file only moves bytes,
reads clocks and starts or stops processes.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler import core
from scaler_executor.scheduler.backlog import Backlogs
from scaler_executor.scheduler.capacity import CapacityAdapter
from scaler_executor.scheduler.core import (
    AbortPuts,
    DeleteObjects,
    LocalWorkers,
    PeerUnreachable,
    Received,
    Scheduler,
    Send,
    SendObjects,
    StartWorkers,
    StopWorkers,
    StoreChunk,
    Tick,
    Wake,
    WorkerExited,
)
from scaler_executor.scheduler.durable_records import JournalWrite, SweepStore
from scaler_executor.scheduler.managers import AdmitKeys, WithdrawKeys
from scaler_executor.scheduler.object_stream import CreditObjects, EndObjectSends, Finish, Outbound
from scaler_executor.scheduler.result_stream import AbortPartial, ForwardStored
from scaler_executor.scheduler.turns import TurnBudget

log = logging.getLogger("scaler_executor.daemon")

RECV_BURST = 4096  # transmissions read per turn before the core runs: bounds latency under load
# A loaded turn reads what the core handles in about this long (turns.TurnBudget), so that
# turns stay short (docs/scaling.rst, "a turn bounded by its work") whatever the load.
TURN_TARGET_NS = 2_500_000
TURN_SECONDS = 0.05  # and at most this long receiving, so heartbeats and dispatch keep flowing
MAX_BACKLOG = 100_000  # transmissions held for one slow peer before it is declared unreachable
BACKLOG_RETRY_MS = 5
# Most bytes a peer that has not joined may send in one transmission (its Hello and what
# travels with it): larger ones are dropped undecoded, so a flood before the handshake
# costs the daemon no memory (one 40 MB batch of 8 M heartbeats once grew it by 2 GB).
MAX_HANDSHAKE_BYTES = 64 * 1024


def journal_version() -> str:
    """What a journal must have been written by: this package's version and the durable
    core's record layout (scheduler/durable.py); any other is refused at start."""
    from scaler_executor._version import __version__

    return f"{__version__}/records-1"


def _remove_dead_socket(path: str) -> None:
    """A daemon restarted on its journal takes over its address: the socket file a killed
    daemon left is removed if nothing accepts connections on it (a live daemon's is kept, and
    binding then fails with the usual message)."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        log.info("daemon: removed %s, the socket file of a daemon that is gone", path)
    except OSError:
        pass
    finally:
        probe.close()


def _journal_error(exc: BaseException) -> bool:
    from scaler_executor.scheduler.journal import JournalError

    return isinstance(exc, JournalError)


def daemon_limits(config: ClusterConfig, address: str) -> codec.Limits:
    """What one transmission from a peer may decode to (codec.Limits): over a cap, it is
    dropped like any malformed one.  Arrays may hold as many items as a client may have
    pending tasks (a graph, a cancel of all of them); strings and payloads are bounded by
    the frame, max_message_size on tcp:// (they cost their bytes, no more), and on ipc://
    (local peers, no frame cap) only by msgpack's format."""
    frame = config.max_message_size if address.startswith("tcp://") else 2**32 - 1
    return codec.Limits(
        messages=codec.MAX_BATCH_MESSAGES,
        array=max(codec.MAX_ARRAY_LEN, config.max_pending_tasks),
        map=codec.MAX_MAP_LEN,
        string=min(frame, 2**32 - 1),
        binary=min(frame, 2**32 - 1),
    )


class RateLimitedLog:
    """At most one line per ``key`` every ``interval`` seconds, counting what it held back."""

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self.logger = logger
        self.interval = interval
        self.last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def warning(self, key: str, text: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last.get(key, -1e9) < self.interval:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return
        held = self.suppressed.pop(key, 0)
        self.last[key] = now
        if held:
            text, args = f"{text} (%d similar lines suppressed)", (*args, held)
        self.logger.warning(text, *args)


class Daemon:
    def __init__(
        self,
        config: ClusterConfig,
        address: str,
        *,
        lifeline_fd: int | None = None,
        manager: CapacityAdapter | None = None,
        security: Any = None,
        report: str | None = None,
    ) -> None:
        """``security``: a ServerSecurity (security/server.py) for a tcp:// address, or None.
        ``report``: a file the run's report (scheduler/report.py) is written to when it stops."""
        self.config = config
        self.address = address
        from scaler_executor.scheduler.objects import HostStore

        self.journal: Any = None
        live: dict[bytes, bytes] = {}
        if config.journal:
            from scaler_executor.scheduler.journal import open_journal

            # First: a journal that cannot be used (locked, corrupt, another version) stops
            # the daemon before it binds or makes a store region.
            self.journal, live = open_journal(
                config.journal, package_version=journal_version(), policy=config.journal_fsync,
                interval=config.journal_fsync_interval, log=log,
            )
        adopt = live.get(b"s", b"").decode()  # the store region of the previous run (durable.py)
        self.objects = HostStore(config, adopt=adopt, journaled=self.journal is not None)
        if self.journal is not None and self.objects.name and config.journal:
            from scaler_executor.scheduler.journal_discard import note_region

            try:
                note_region(config.journal, self.objects.name)  # for --discard, whatever becomes of the journal
            except OSError as exc:  # a full disk, say: the journal's own record still names it
                log.warning("daemon: could not note the store region in %s: %s", config.journal, exc)
        if self.journal is not None:
            from scaler_executor.scheduler.durable import DurableScheduler

            self.core: Scheduler = DurableScheduler(config, self.objects.name)
            if live:
                from scaler_executor.scheduler.journal import JournalRecordInvalid

                try:
                    self.core.restore(live, time.monotonic())
                except JournalRecordInvalid as exc:  # reported as any unusable journal (cli/daemon.py)
                    self.objects.close()
                    self.journal.close()
                    raise JournalRecordInvalid(exc.key, exc.reason, config.journal or "") from None
        else:
            self.core = Scheduler(config, self.objects.name)
        self.core.store_stats = self.objects.figures
        self.lifeline_fd = lifeline_fd
        self.manager = manager
        self.host = socket.gethostname()
        self.stopping = False
        self.exit_code = 0
        # A turn the journal could not write (a full disk): its entries and commands, with
        # every later turn's, held until a write succeeds (_journaled).
        self.held: tuple[list[Any], list[Any]] | None = None
        self.security = security
        self.report = report
        if security is not None:
            security.use_counters(self.core.counters)
        if self.journal is not None and address.startswith("ipc://"):
            _remove_dead_socket(address[len("ipc://") :])
        try:
            self.sock = channel.bind(
                address, hwm=config.send_hwm, security=security, max_message_size=config.max_message_size
            )
        except BaseException:  # the address is taken, say: the store region must not outlive us
            self.objects.close()
            if self.journal is not None:
                self.journal.close()
            raise
        self.backlog = Backlogs(MAX_BACKLOG, config.max_backlog_bytes)  # sends to peers that do not read
        self.unreachable: list[PeerUnreachable] = []
        self.bad_input = RateLimitedLog(log)
        self.limits = daemon_limits(config, address)
        # Chunks of puts received this turn, by (peer, object id, offset): the core decides
        # whether to store each (StoreChunk); what it did not take is dropped after the turn.
        self.chunks: dict[tuple[bytes, bytes, int], Any] = {}
        self.budget = TurnBudget(TURN_TARGET_NS)  # how much a loaded turn reads (turns.py)
        self.units_read = 0  # what this turn's receive read, in the budget's units
        # Answers to ObjectRequests still to send, in parts with a window per peer.
        self.outbound = Outbound()
        self._signal_r, self._signal_w = os.pipe()
        os.set_blocking(self._signal_r, False)
        os.set_blocking(self._signal_w, False)

    def restored_local_pids(self) -> list[int]:
        """The pids of this host's workers the journal named (a restarted daemon's local
        manager keeps those still running instead of starting others: manager/adopted.py)."""
        return [w.pid for w in self.core.workers.values() if w.host == self.host and w.pid > 0]

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._signal_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        poller = channel.Poller()
        poller.register(self.sock.pollable)
        poller.register(self._signal_r)
        secured = [] if self.security is None else self.security.pollables()  # ZAP, handshake monitor
        for target in secured:
            poller.register(target)
        if self.lifeline_fd is not None:
            poller.register(self.lifeline_fd)
        if self.manager is not None:
            self.manager.start()
        tick_every = max(0.01, min(self.config.heartbeat_interval / 4, 0.25))
        next_tick = time.monotonic()
        try:
            while not self.stopping:
                now = time.monotonic()
                wakeup = self.core.wakeup_at()
                deadline = next_tick if wakeup is None else min(next_tick, wakeup)
                # Rounded up to whole milliseconds: a 0 would spin.
                timeout = math.ceil(max(0.0, deadline - now) * 1000)
                if self.backlog or self.held is not None:
                    timeout = min(timeout, BACKLOG_RETRY_MS)
                ready = poller.poll(self.sock.poll_timeout(timeout))
                turn_started = time.perf_counter_ns()
                self.units_read = 0
                now = time.monotonic()
                events: list[core.Event] = []
                if self.sock.pollable in ready or self.sock.buffered:
                    self._receive(events, now)
                if secured:
                    self.security.on_ready(ready)
                    self._secure_turn(events, now)
                if self._signal_r in ready:
                    self._drain_signal_pipe()
                if (
                    self.lifeline_fd is not None
                    and self.lifeline_fd in ready
                    and not os.read(self.lifeline_fd, 4096)  # EOF: the client's end closed
                ):
                    log.info("daemon: the client that started it is gone; stopping")
                    self.stopping = True
                if now >= next_tick:
                    next_tick = now + tick_every
                    events.append(Tick(now))
                    if self.manager is not None:
                        for pid, how in self.manager.poll():
                            events.append(WorkerExited(pid, self.host, how, now))
                        events.append(LocalWorkers(self.manager.pids(), self.host, now))
                if self.unreachable:
                    events.extend(self.unreachable)
                    self.unreachable = []
                if not events and wakeup is not None and now >= wakeup:
                    events.append(Wake(now))
                if not events and self.held is not None:
                    events.append(Wake(now))  # try the held journal write again
                if events:
                    try:
                        commands = self.core.handle(*events)
                    except Exception:  # a bug in the core must not take the cluster down
                        log.exception("daemon: the core failed to handle %d events", len(events))
                        continue
                    try:
                        self._execute(commands, now)
                    except Exception as exc:
                        if not _journal_error(exc):
                            raise
                        # Nothing of this turn was sent: the journal holds all that peers heard.
                        log.error(
                            "daemon: cannot write its journal: %s; stopping (peers wait for a restart "
                            "on the journal once the cause is fixed)", exc,
                        )
                        self.exit_code = 3
                        break
                    took = time.perf_counter_ns() - turn_started
                    self.core.turns.record(took)
                    self.budget.observe(self.units_read, took)
                self.chunks.clear()  # those the core refused (a peer not allowed to put)
                if self.backlog:
                    self._retry_backlog(now)
        finally:
            # Every way out of the loop but SIGKILL: a signal, the lifeline closing (the end of
            # an embedded cluster), an error.  Before _shutdown: the store's figures need it open.
            if self.report is not None:
                self._write_report(self.report)
            self._shutdown()
        return self.exit_code

    def _write_report(self, path: str) -> None:
        try:
            from scaler_executor.scheduler.history import history_message
            from scaler_executor.scheduler.report import render_report, write_report
            from scaler_executor.scheduler.stats import Statistics, stats_message

            stats = Statistics.from_message(stats_message(self.core))
            text = render_report(stats, history_message(self.core), source=f"scaler-daemon at {self.address} (pid {os.getpid()}), on stopping")
            write_report(path, text)
            log.info("daemon: the run's report is in %s", path)
        except Exception:  # a report that cannot be written must not keep the daemon from stopping
            log.exception("daemon: could not write the report to %s", path)

    def _drain_signal_pipe(self) -> None:
        try:
            os.read(self._signal_r, 512)
        except BlockingIOError:
            pass

    def _secure_turn(self, events: list[core.Event], now: float) -> None:
        """Revocations (the allow-list re-read when its file changed) and the gate's refusals."""
        security = self.security
        if security.refresh(now):
            security.forget(self.core.knows)
        if security.lost:
            events.extend(PeerUnreachable(peer, now) for peer in security.lost)
            security.lost = []
        if security.replies:
            replies, security.replies = security.replies, []
            for peer, refusal in replies:
                self._send(peer, codec.encode([refusal]), now)

    def _receive(self, events: list[core.Event], now: float) -> None:
        sock = self.sock
        security = self.security
        deadline = now + TURN_SECONDS
        budget = self.budget.units()
        for _ in range(RECV_BURST):
            if self.units_read >= budget or time.monotonic() > deadline:
                return
            if not sock.readable():
                return
            try:
                if security is None:
                    frames = sock.recv()
                else:
                    # No frame of a peer whose key is not (or no longer) allowed is decoded.
                    frames, user, frame = sock.recv_authenticated()
                    allowed = security.admit(frames[0], user, frame)
                    if allowed is None:
                        continue
            except channel.Again:
                return
            peer = frames[0]
            if not self.core.knows(peer) and sum(len(f) for f in frames[1:]) > MAX_HANDSHAKE_BYTES:
                self.core.counters["dropped_messages"] += 1
                self.bad_input.warning(
                    "handshake", "daemon: dropped a transmission of more than %d bytes from a peer that has not joined",
                    MAX_HANDSHAKE_BYTES,
                )
                continue
            try:
                messages, buffers = codec.decode(frames[1:], self.limits)
                if security is not None:
                    messages = security.within_role(peer, allowed, messages, frame)
            except codec.VersionMismatch as exc:
                self.bad_input.warning("version", "daemon: refused a transmission from %r: %s", peer, exc)
                self._execute([Send(peer, [m.Refused(str(exc))])], now)
                continue
            except codec.DecodeError as exc:
                self.core.counters["dropped_messages"] += 1
                self.bad_input.warning("decode", "daemon: dropped a bad transmission from %r: %s", peer, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a bug reading one peer's input must not stop the daemon for all
                self.core.counters["dropped_messages"] += 1
                self.bad_input.warning(
                    "decode-bug", "daemon: dropped a transmission from %r that failed to decode (%s: %s)",
                    peer, type(exc).__name__, str(exc)[:200],
                )  # fmt: skip
                continue
            if buffers:  # a put's chunks (ObjectChunk): held for the core's StoreChunk, this turn
                chunks = [c for c in messages if type(c) is m.ObjectChunk]
                for chunk, buffer in zip(chunks, buffers, strict=False):
                    self.chunks[(peer, chunk.object_id, chunk.offset)] = buffer
            if messages:
                for message in messages:  # the budget's units: a task submitted, a result, a message
                    kind = type(message)
                    if kind is m.SubmitTasks:
                        self.units_read += len(message.tasks)
                    elif kind is m.TaskResults:
                        self.units_read += len(message.results)
                    else:
                        self.units_read += 1
                events.append(Received(peer, messages, now))

    def _store_chunk(self, command: StoreChunk, now: float) -> None:
        peer, object_id, offset, total = command.peer, command.object_id, command.offset, command.total
        data = self.chunks.pop((peer, object_id, offset), None)
        if command.forward:
            # The same frame on to the task's client first (libzmq's I/O thread writes it
            # while this thread copies it into the store; it holds the frame until written).
            # Sent whatever the store says: the core counted it in the client's window, and
            # the client checks the parts itself (a missing frame fails its stream).
            self._forward_part(command.forward, command.task_id, object_id, offset, total, data, now)
        if data is None:
            error: str | None = f"chunk at offset {offset} came without its bytes"
        else:
            error = self.objects.write_chunk(peer, object_id, offset, total, data)
            self.core.counters["object_bytes_received"] += memoryview(data).nbytes
        if error is None:
            return
        if not error:
            self.core.counters["objects_received"] += 1
        self._send(peer, codec.encode([m.ObjectStored(object_id, error)]), now)

    def _forward_part(self, client: bytes, task_id: int, object_id: bytes, offset: int, total: int, data: Any, now: float) -> None:
        frame = data if data is not None else b""  # none: the client drops the stream (and credits it)
        counters = self.core.counters
        counters["result_parts_forwarded"] += 1
        counters["result_bytes_forwarded"] += memoryview(frame).nbytes
        self._send(client, codec.encode([m.ResultPart(task_id, object_id, offset, total)], [frame]), now)

    def _execute(self, commands: Sequence[Any], now: float) -> None:  # core.Command, JournalWrite, SendNow
        # Chunks first: a result sent this turn may refer to the object they complete (a
        # worker on another host streams a large result before the result itself).
        if self.journal is not None:
            written = self._journaled(commands, now)
            if written is None:
                return
            commands = written
        for command in commands:  # in order: a part from the store comes after the chunk that wrote it
            if type(command) is StoreChunk:
                self._store_chunk(command, now)
            elif type(command) is ForwardStored:
                self.core.counters["result_parts_from_store"] += 1
                data = self.objects.read_range(command.object_id, command.offset, command.length)
                self._forward_part(command.client, command.task_id, command.object_id, command.offset, command.total, data, now)
        for command in commands:
            match command:
                case Send(peer, messages):
                    self._send(peer, codec.encode(messages), now)
                case StartWorkers(count):
                    if self.manager is not None:
                        self.manager.start_more(count)
                case StopWorkers(pids):
                    if self.manager is not None:
                        self.manager.stop_some(pids)
                case DeleteObjects(object_ids):
                    self.objects.delete(object_ids)
                case SendObjects(peer, object_ids):
                    found, buffers = self.objects.read(object_ids)  # views: each holds a reader reference
                    views = iter(buffers)
                    sizes = [next(views).nbytes if ok else None for ok in found]
                    if not self.outbound.request(peer, list(object_ids), sizes, buffers):
                        log.warning(
                            "daemon: dropping peer %r: it asked for objects beyond %d not yet sent to it",
                            peer, self.outbound.max_objects,
                        )  # fmt: skip
                        self.unreachable.append(PeerUnreachable(peer, now))
                case CreditObjects(peer, count):
                    self.outbound.taken(peer, count)
                case EndObjectSends(peer):
                    if self.outbound.drop(peer):
                        self.core.counters["object_sends_dropped"] += 1
                case StoreChunk() | ForwardStored():
                    pass  # written and sent above, before any other send
                case AbortPartial(peer, object_ids):
                    for object_id in object_ids:
                        self.objects.abort_partial(peer, object_id)
                case AbortPuts(peer):
                    aborted = self.objects.abort_peer(peer)
                    if aborted:
                        log.info("daemon: aborted %d object(s) %r was still putting when it was lost", aborted, peer)
                case SweepStore():
                    swept = self.objects.sweep(self.core.object_holds)
                    if swept:
                        log.info("daemon: deleted %d objects of the previous run that nobody holds", swept)
                case AdmitKeys(manager, keys):
                    # A manager's workers' keys (scheduler/managers.py); none on an insecure daemon.
                    if self.security is not None:
                        from scaler_executor.security.keys import KeyEntry, now_text

                        for name, public in keys:
                            self.security.ephemeral[public] = KeyEntry(name, "worker", public, f"ephemeral {now_text()}, manager {manager}")
                case WithdrawKeys(public_keys):
                    if self.security is not None:
                        for public in public_keys:
                            self.security.ephemeral.pop(public, None)
                        # A worker that already left is forgotten, not "expelled" as if revoked;
                        # one still connected with the key is expelled at the next refresh.
                        self.security.forget(self.core.knows)
                case _:
                    raise TypeError(f"daemon loop cannot execute unknown command {command!r}")
        if self.outbound.peers:
            self._send_objects(now)

    def _send_objects(self, now: float) -> None:
        """The parts and answers the window allows (object_stream.py decides; here bytes move:
        a part is a slice of the store's view, sent without a copy)."""
        counters = self.core.counters
        for step in self.outbound.due():
            if isinstance(step, Finish):
                counters["objects_sent"] += sum(step.found)
                counters["object_bytes_sent"] += step.inline_bytes
                self._send(step.peer, codec.encode([m.ObjectData(step.object_ids, step.found)], step.frames), now)
            else:
                counters["object_bytes_sent"] += step.length
                part = step.view[step.offset : step.offset + step.length]
                self._send(step.peer, codec.encode([m.ObjectPart(step.object_id, step.offset, step.total)], [part]), now)

    def _journaled(self, commands: Sequence[Any], now: float) -> Sequence[Any] | None:
        """Write the turn's journal entries before anything of it is sent (scheduler/durable.py):
        a daemon killed at any point never said what its journal does not hold.  A full disk
        (JournalFull) holds the turn, and every later one, until a write succeeds (retried
        every turn); meanwhile the core refuses new submissions (sent at once: SendNow)."""
        from scaler_executor.scheduler.durable_records import SendNow
        from scaler_executor.scheduler.journal import JournalFull

        now_sends = [c for c in commands if type(c) is SendNow]
        for command in now_sends:
            self._send(command.peer, codec.encode(command.messages), now)
        entries = commands[0].entries if commands and type(commands[0]) is JournalWrite else []
        rest = [c for c in commands if type(c) is not JournalWrite and type(c) is not SendNow]
        if self.held is not None:
            self.held[0].extend(entries)
            self.held[1].extend(rest)
            entries, rest = self.held
        if not entries:
            self.held = None
            return rest
        try:
            self.journal.append(entries)
        except JournalFull as exc:
            if self.held is None:
                self.held = (list(entries), list(rest))
            self.core.set_journal_full(str(exc))  # type: ignore[attr-defined]  # a DurableScheduler
            return None
        if self.held is not None:
            self.held = None
            self.core.set_journal_full(None)  # type: ignore[attr-defined]
        return rest

    def _send(self, peer: bytes, frames: list[Any], now: float) -> None:
        if peer in self.backlog:
            self._hold(peer, frames, now)
            return
        try:
            self.sock.send([peer, *frames])
        except channel.Again:
            if self.core.is_monitor(peer):
                # A monitor that does not read is dropped, never waited for: it may ask
                # again (its library joins again), and no backlog grows for a watcher.
                log.info("daemon: monitor %r is not reading its snapshots; dropping it", peer)
                self.unreachable.append(PeerUnreachable(peer, now))
                return
            self._hold(peer, frames, now)
        except channel.Unreachable:
            self.unreachable.append(PeerUnreachable(peer, now))

    def _hold(self, peer: bytes, frames: list[Any], now: float) -> None:
        for dropped, why in self.backlog.hold(peer, frames):
            log.warning("daemon: dropping peer %r: %s", dropped, why)
            self.unreachable.append(PeerUnreachable(dropped, now))

    def _retry_backlog(self, now: float) -> None:
        backlog = self.backlog
        for peer in backlog.peers():
            while (frames := backlog.front(peer)) is not None:
                try:
                    self.sock.send([peer, *frames])
                except channel.Again:
                    break
                except channel.Unreachable:
                    self.unreachable.append(PeerUnreachable(peer, now))
                    backlog.clear(peer)
                    break
                backlog.sent(peer)

    # ------------------------------------------------------------------ stop

    def _shutdown(self) -> None:
        pause = self.journal is not None and bool(self.core.tasks)
        if not pause:
            # Without a journal, or with nothing in it to resume (an embedded cluster whose
            # client shut down, say), a stop is the end: its workers go now, not after the grace.
            if self.journal is not None:
                self.journal.close()
                if self.objects.name and self.config.journal:
                    from scaler_executor.scheduler.journal_discard import forget_region

                    forget_region(self.config.journal)  # the region goes below
            goodbye = codec.encode([m.Goodbye("daemon stopping")])
            for peer in [*self.core.clients, *self.core.workers]:
                conn = self.core.connection(peer)
                if conn is None:  # a journaled peer not back since a restart
                    continue
                try:
                    self.sock.send([conn, *goodbye])
                except channel.SendError:
                    pass
        else:
            # With a journal a stop is a pause: peers wait for a restart (up to its grace
            # period, docs/durability.rst) and resume; nothing of theirs is forgotten.
            self.journal.close()
        if self.manager is not None:
            self.manager.stop()
        if self.security is not None:
            self.security.close()  # its ZAP socket first: the channel's close ends their context
        self.sock.close(linger=0)
        self.outbound.peers.clear()  # their views, before the store closes
        self.objects.close(keep=pause)  # a pause keeps the region and its objects for the restart
        if self.address.startswith("ipc://"):
            try:
                os.unlink(self.address[len("ipc://") :])
            except FileNotFoundError:
                pass
        os.close(self._signal_r)
        os.close(self._signal_w)
