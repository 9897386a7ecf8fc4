"""The worker agent's timers, a layer of the agent (agent.py): recalls of queued tasks from
stragglers, housekeeping, the daemon's silence, the flush of results and heartbeats.
"""

from __future__ import annotations

import logging
import os

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.worker.agent_base import (
    EXIT_STATUS_GRACE,
    RESULT_BATCH,
    RESULT_LINGER,
    RUNS_IDLE_SECONDS,
    ZYGOTE_WARM_IDLE,
)
from scaler_executor.worker.agent_daemon import DaemonSide
from scaler_executor.worker.dealing import recall_due
from scaler_executor.worker.memory import cpu_seconds

log = logging.getLogger("scaler_executor.worker")


class Timers(DaemonSide):
    """What happens by time: recalls, housekeeping, silence, the flush, heartbeats."""

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
