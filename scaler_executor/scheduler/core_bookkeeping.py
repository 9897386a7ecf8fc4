"""Bookkeeping, a layer of the core (core.py): the ready queues' entries, forgetting tasks
(and the dependencies and functions only they held), results on their way to clients, and
the flush that turns a turn's outbox into commands.
"""

from __future__ import annotations

import logging

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core_events import (
    MONITOR_SNAPSHOT_SECONDS,
    NOTICE_DELAY,
    Command,
    DeleteObjects,
    Send,
)
from scaler_executor.scheduler.core_objects import ObjectController
from scaler_executor.scheduler.state import ReadyQueue, TaskRecord, TaskState
from scaler_executor.scheduler.stats import stats_message

log = logging.getLogger("scaler_executor.daemon")


class Bookkeeping(ObjectController):
    """Queues, forgetting, and the turn's flush."""

    def _release_function(self, fn_id: int) -> None:
        """The client is done with a callable; it goes once no task refers to it any more."""
        if self.function_refs.get(fn_id):
            self.released_functions.add(fn_id)
            return
        self.released_functions.discard(fn_id)
        self.function_refs.pop(fn_id, None)
        if self.functions.pop(fn_id, None) is None:
            return
        forget = m.ReleaseFunctions([fn_id])
        for worker in self.workers.values():
            if fn_id in worker.functions:
                worker.functions.discard(fn_id)
                self._send(worker.peer, forget)

    def _queue(self, task: TaskRecord, *, front: bool = False) -> None:
        key = task.queue_key
        if key is None:
            self.ready.push(task, front=front)
            return
        queue = self.constrained.get(key)
        if queue is None:
            queue = self.constrained[key] = ReadyQueue()
            self.placement.queued(key)
        queue.push(task, front=front)

    def _unqueue(self, task: TaskRecord) -> None:
        """A queued task leaves its queue other than by dispatch (lazily: skipped when popped)."""
        if task.queue_key is None:
            self.ready.discard()
        else:
            self.constrained[task.queue_key].discard()

    def _forget(self, task: TaskRecord) -> None:
        if not task.deps:  # most tasks: nothing of theirs to release
            if self.tasks.pop(task.task_id, None) is not None:
                task.unrecord()
                self._forget_one(task)
            return
        # Iterative: forgetting the end of a 10,000-task chain releases the whole chain.
        stack = [task]
        while stack:
            task = stack.pop()
            if self.tasks.pop(task.task_id, None) is None:
                continue
            task.unrecord()
            self._forget_one(task)
            stack.extend(self._release_deps(task, forget=False))

    def _release_deps(self, task: TaskRecord, forget: bool = True) -> list[TaskRecord]:
        """The task needs its dependencies' results no more: drop its hold on each (once).

        Kept results nothing holds any more are released; with ``forget`` they are
        forgotten here, else returned for the caller's worklist.
        """
        released: list[TaskRecord] = []
        if task.deps_released:
            return released
        task.deps_released = True
        for dep_id in task.deps:
            dep = self.tasks.get(dep_id)
            if dep is not None:
                dep.holds -= 1
                if dep.dependents is not None:  # (a task id used again later is not its dependent)
                    dep.dependents.pop(task.task_id, None)
                if dep.holds <= 0 and dep.state is TaskState.FINISHED:
                    dep.transition("released")
                    dep.result = None
                    released.append(dep)
        if forget:
            for dep in released:
                self._forget(dep)
        return released

    def _maybe_release(self, task: TaskRecord) -> None:
        if task.holds <= 0 and task.state is TaskState.FINISHED:
            task.transition("released")
            task.result = None
            self._forget(task)

    def _forget_one(self, task: TaskRecord) -> None:
        if task.objects:
            self._drop(task.objects)
        if task.result_objects:
            self._drop(task.result_objects)
            task.result_objects = None
        if task.fn_id:
            left = self.function_refs[task.fn_id] - 1
            self.function_refs[task.fn_id] = left
            if not left and task.fn_id in self.released_functions:
                self._release_function(task.fn_id)
        client = self.clients.get(task.client)
        if client is not None:
            client.tasks.discard(task.task_id)

    def _result_to(self, peer: bytes, result: m.TaskResult) -> None:
        if peer not in self.clients:
            return  # the client is gone; nobody is waiting for this result
        results = self._results.get(peer)
        if results is None:
            self._results[peer] = [result]
        else:
            results.append(result)

    def _flush(self) -> list[Command]:
        barrier = self.stats_barrier
        if barrier.held:  # counted by now (a LaneDone came), its workers gone, or waited long enough
            expired = barrier.expired
            self._stats_wanted.extend(barrier.release(self.workers, self._now))
            self.counters["stats_barrier_expired"] += barrier.expired - expired
        if self._stats_wanted:
            fresh = None  # a client's snapshot is always fresh: its own tests read exact counts
            for peer in self._stats_wanted:
                if peer in self.clients:
                    fresh = fresh or stats_message(self)
                    self._send(peer, fresh)
                elif peer in self._monitors:
                    self._send(peer, self._snapshot_for_monitors())
            self._stats_wanted.clear()
        if self._acks or self._running:
            self._flush_notices()
        else:
            self._notices_since = None  # their client left: nothing is due (no wake-up spin)
        if self._direct_running:
            self._flush_direct_running()
        for peer, results in self._results.items():
            self._send(peer, m.TaskResults(results))
        self._results.clear()
        if self._heartbeats_due:
            self._heartbeats_due = False
            interval, now = self.config.heartbeat_interval, self._now
            beat = m.Heartbeat(self.ready.live, len(self.tasks) - self.ready.live)
            workers, clients, monitors, out, last_sent = self.workers, self.clients, self._monitors, self._out, self.last_sent
            worker_quiet = self.worker_quiet
            now_due: list[bytes] = []  # sent to this turn: next due an interval from now
            workers_due: list[bytes] = []  # and these a worker's quiet period from now
            for peer in self._quiet.due(now):
                is_worker = peer in workers
                if not is_worker and peer not in clients and peer not in monitors:
                    continue  # gone: its entry ends here
                quiet = worker_quiet if is_worker else interval
                if peer not in out:
                    last = last_sent.get(peer, 0.0)
                    if now - last < quiet:
                        self._quiet.add(peer, last + quiet)
                        continue
                    out[peer] = [beat]
                (workers_due if is_worker else now_due).append(peer)
            self._quiet.add_all(now_due, now + interval)
            self._quiet.add_all(workers_due, now + worker_quiet)
        commands: list[Command] = [Send(peer, messages) for peer, messages in self._out.items()]
        for peer in self._out:
            if peer in self.clients or peer in self.workers or peer in self._monitors:
                self.last_sent[peer] = self._now  # refused peers leave no trace
        self._out = {}
        if self._deletions:
            commands.append(DeleteObjects(tuple(self._deletions)))
            self._deletions = []
        if self._commands:
            commands.extend(self._commands)
            self._commands = []
        return commands

    def _snapshot_for_monitors(self) -> m.Stats:
        cached = self._monitor_snapshot
        if cached is None or self._now - cached[0] >= MONITOR_SNAPSHOT_SECONDS:
            cached = self._monitor_snapshot = (self._now, stats_message(self))
        return cached[1]

    def _flush_notices(self) -> None:
        """Send submit acks and running notices with a client's results, or once the oldest
        has waited NOTICE_DELAY.

        Sent at once they cost a transmission of their own per submit: about a fifth of a
        no-op round trip's CPU, in the daemon and the client, on the cores the task's own
        path needs.  Deferred, a short task's result arrives first and the notice that it
        runs is never sent (the client marks a future running on its result); a client's
        submit window (thousands) is never held up by a 2 ms delay in its acks.
        """
        now = self._now
        if self._notices_since is None:
            self._notices_since = now
        due = now >= self._notices_since + NOTICE_DELAY  # the same sum as wakeup_at: no float gap
        results, tasks = self._results, self.tasks
        for peer in [p for p in self._acks if due or p in results]:
            self._send(peer, m.SubmitAck(self._acks.pop(peer)))
        for peer in [p for p in self._running if due or p in results]:
            ids = [t for t in self._running.pop(peer) if t in tasks]  # finished ones: their result says it
            if ids and peer in self.clients:
                self._send(peer, m.TasksRunning(ids))
        if not self._acks and not self._running:
            self._notices_since = None

    def _flush_direct_running(self) -> None:
        """Running notices of REPLY_DIRECT tasks still running NOTICE_DELAY after dispatch
        (sent with the client's other notices or results if those go sooner)."""
        now, results, tasks = self._now, self._results, self.tasks
        due = [
            (task_id, peer)
            for task_id, (peer, since) in self._direct_running.items()
            if now >= since + NOTICE_DELAY or peer in results or peer in self._out
        ]
        for task_id, peer in due:
            del self._direct_running[task_id]
            if task_id in tasks and peer in self.clients:
                self._send(peer, m.TasksRunning([task_id]))

    def wakeup_at(self) -> float | None:
        """When the loop must call ``handle`` (with ``Wake``) even if nothing arrives."""
        since = self._notices_since
        if self._direct_running:  # at most a few: one per sequential caller
            first = min(dispatched for _, dispatched in self._direct_running.values())
            since = first if since is None else min(since, first)
        due = None if since is None else since + NOTICE_DELAY
        if self.stats_barrier.held:  # (rare: a client's statistics wait for lane reports)
            bound = self.stats_barrier.wakeup_at()
            due = bound if due is None or (bound is not None and bound < due) else due
        return due
