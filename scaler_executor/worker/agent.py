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

``WorkerAgent`` is one object built of layers, a module each; a layer calls only the layers
below it::

    agent.py             WorkerAgent: the loop (run), signals, draining, stopping
    agent_timers.py      recalls, housekeeping, the daemon's silence, the flush, heartbeats
    agent_daemon.py      the handshake, the daemon's messages, ours to it
    agent_processors.py  processors: spawned, fed, heard, sampled, buried
    agent_objects.py     objects: the host's store, fetches, what is held for tasks
    agent_base.py        the tunables and the state every layer shares
"""

from __future__ import annotations

import logging
import math
import os
import signal
import tempfile
import time
from typing import Any

from scaler_executor.protocol import channel
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming
from scaler_executor.worker import handoff
from scaler_executor.worker.agent_base import DRAIN_MARGIN, HOUSEKEEPING_SECONDS, RESULT_LINGER
from scaler_executor.worker.agent_timers import Timers

log = logging.getLogger("scaler_executor.worker")


class WorkerAgent(Timers):
    """A worker: its connection to the daemon and its processors (the module's docstring).

    Built as ``AgentBase(config, address, processors=..., ...)`` says."""

    def _join_layers(self) -> None:
        """What the layers above the base provide, bound as the base's ``__init__`` ends: the
        handlers of what the daemon sends, the fetched objects' callback; then the
        processors are asked for."""
        # fetched objects that come in parts (protocol/chunks.py), written into memfds that
        # the processors map (worker/handoff.py)
        self.incoming = Incoming(
            allocate=handoff.allocate, write=handoff.write, finish=handoff.seal, started=self._object_started, abort=handoff.Unsealed.abort
        )
        self._daemon_handlers = {
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
