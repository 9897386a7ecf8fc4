"""Dispatch, a layer of the core (core.py): ready tasks to workers' free slots through the
allocation policy (policies.py) and the placement indexes (placement.py), constrained
queues served fairly beside the plain one, and a restarted daemon's unclaimed tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.scheduler.core_events import CANCEL_ANSWER, CANCEL_FORCE, _dep_value
from scaler_executor.scheduler.core_graphs import GraphController
from scaler_executor.scheduler.policies import LeastLoaded, WorkerSlot, prefetch_window
from scaler_executor.scheduler.state import ConstraintKey, TaskRecord, WorkerRecord, describe_key

log = logging.getLogger("scaler_executor.daemon")


class Dispatcher(GraphController):
    """Ready tasks to workers."""

    def _dispatch(self) -> None:
        if not self.workers:
            return
        out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]] = {}
        self.placement.refresh()
        if not self.constrained:
            if self.ready.live:
                self._dispatch_ready(out)
        else:
            # Fairness across queues: the unconstrained queue and the per-constraint ones
            # share workers, and whichever is served first takes the free slots.  Serving
            # them in the order in which their next clients were last served keeps the
            # rotation between clients whole: one client's backlog of tagged tasks cannot
            # starve another client's plain ones, nor the other way round.  Within a queue
            # the rotation is ReadyQueue's; priority breaks ties (one client's own order).
            # Only the constrained queues some worker may serve now are visited (placement.py:
            # a stuck key waits, at no cost per turn, until a worker that fits it has room).
            served = self._served
            order: list[tuple[int, int, ConstraintKey | None]] = []
            if self.ready.live:
                order.append((served.get(self.ready.next_client() or b"", -1), -self.ready.head_priority(), None))
            placement = self.placement
            for key in list(placement.active):
                queue = self.constrained[key]
                if not queue.live:
                    del self.constrained[key]
                    placement.served(key)
                    continue
                order.append((served.get(queue.next_client() or b"", -1), -queue.head_priority(), key))
            order.sort(key=lambda entry: entry[:2])
            for _, _, which in order:
                if which is None:
                    self._dispatch_ready(out)
                else:
                    self._dispatch_constrained(which, out)
        for peer, (blobs, batch) in out.items():
            self._send(peer, m.DispatchTasks(blobs, batch))

    def _dispatch_ready(self, out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]]) -> None:
        """Tasks any worker can run: the policy's share of each worker's free slots."""
        # Only the workers that may have room (placement.py): those found full, broken or
        # draining leave the open set until they grow; the policy sees the rest, in join order.
        max_prefetch, placement = self.config.max_prefetch, self.placement
        if type(self.policy) is LeastLoaded:
            # Its first choices without a pass over every open worker: the idle ones, in join
            # order, each filled to its processors (policies.py; placement.py, "Idle workers");
            # the pass below is for the rest.  One at a time, only while tasks remain: a thin
            # queue takes one worker off the heap per processors' worth of tasks, not one per
            # task, and puts none back.
            ready = self.ready
            while ready.live:
                worker = placement.next_idle()
                if worker is None:
                    break
                given = 0
                for _ in range(worker.capacity):
                    task = ready.pop()
                    if task is None:
                        break
                    self._assign(worker, task, out)
                    given += 1
                if not given:
                    placement.put_back(worker)
                    break
            if not ready.live:
                return
        workers, slots = [], []
        for w in placement.open_workers(self.workers):
            slot = WorkerSlot(w.capacity, len(w.inflight) - len(w.seceded), w.mean_task_seconds)
            if w.broken is not None or w.draining or prefetch_window(slot, max_prefetch) <= slot.inflight:
                placement.closed(w.peer)
                continue
            workers.append(w)
            slots.append(slot)
        counts = self.policy.allocate(self.ready.live, slots)  # one per slot, same order
        for worker, count in zip(workers, counts, strict=False):
            for _ in range(count):
                task = self.ready.pop()
                if task is None:
                    return
                self._assign(worker, task, out)

    def _dispatch_constrained(
        self, key: ConstraintKey, out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]]
    ) -> None:
        """Tasks that need resources or tags (one constraint's queue): each to a worker that
        has them free now.

        A task that fits nowhere yet stays in its own queue and delays no other task.
        Quantities are honoured: a worker's resources held by its in-flight tasks are in use.
        """
        max_prefetch = self.config.max_prefetch
        queue = self.constrained[key]
        placement = self.placement
        candidates = placement.candidates(key)
        if candidates is None:  # not stuck: every worker that could ever run it
            workers: Iterable[WorkerRecord] = placement.workers_for(key)
        else:  # stuck: only those that may have room since (every other one still has none)
            present = self.workers
            workers = [w for peer in candidates if (w := present.get(peer)) is not None]
        for worker in workers:
            if worker.broken is not None or worker.draining:
                continue
            window = prefetch_window(WorkerSlot(worker.capacity, 0, worker.mean_task_seconds), max_prefetch)
            while queue.live and len(worker.inflight) - len(worker.seceded) < window and worker.fits_now(key):
                task = queue.pop()
                if task is None:
                    break
                self._assign(worker, task, out)
            if not queue.live:
                break
        if queue.live:
            placement.stick(key)  # no worker can take one more of these now
        else:
            del self.constrained[key]
            placement.served(key)

    def _assign(
        self,
        worker: WorkerRecord,
        task: TaskRecord,
        out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]],
    ) -> None:
        entry = out.get(worker.peer)
        if entry is None:
            entry = out[worker.peer] = ([], [])
        task.transition("dispatch")
        task.worker = worker.peer
        worker.inflight[task.task_id] = None
        self._dispatches += 1
        self._served[task.client] = self._dispatches
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                used[name] = used.get(name, 0.0) + quantity
        fn_id = task.fn_id
        if fn_id and fn_id not in worker.functions:
            worker.functions.add(fn_id)
            entry[0].append(m.FunctionBlob(fn_id, self.functions[fn_id]))
        deps = [_dep_value(self.tasks[d]) for d in task.deps] if task.deps else []
        reply_to = authkey_file = ""
        client = self.clients.get(task.client)
        if client is not None and client.host == worker.host:
            # Only the file's path, only to a worker on the client's host: elsewhere the path
            # is useless, and only the client's user can read the file (client/authkey.py).
            authkey_file = client.authkey_file
            if task.flags & TaskFlags.REPLY_DIRECT:
                reply_to = client.reply_to
        entry[1].append(
            m.make(m.TaskDispatch, (
                task.task_id, task.attempt, fn_id, task.flags, task.payload, task.objects or [],
                task.options.task_timeout, deps, reply_to, authkey_file,
            ))
        )  # fmt: skip
        if task.flags & TaskFlags.REPLY_DIRECT:
            self._direct_running[task.task_id] = (task.client, self._now)
            return
        if task.flags & TaskFlags.NO_RESULT:
            return  # a graph's intermediate: its client keeps no future to mark running
        running = self._running.get(task.client)
        if running is None:
            running = self._running[task.client] = []
        running.append(task.task_id)

    def _claim(self, worker: WorkerRecord, task: TaskRecord) -> None:
        """An UNCLAIMED task is at this worker (its report lists it, or its result): DISPATCHED
        there under the attempt it has, as if dispatched (nothing is sent: the worker has it).
        Then ``_apply_held_cancel``."""
        del self.unclaimed[task.task_id]
        task.transition("claimed")
        task.worker = worker.peer
        worker.inflight[task.task_id] = None
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                used[name] = used.get(name, 0.0) + quantity

    def _release_unclaimed(self, task: TaskRecord) -> None:
        """The recovery ended and no worker claimed this UNCLAIMED task: queued under a new
        attempt (a late answer from an earlier hand-out cannot settle it), at no charge
        against its retries.  Then ``_apply_held_cancel``."""
        del self.unclaimed[task.task_id]
        task.attempt += 1
        task.transition("unclaimed")
        task.queued_at = self._now
        self._queue(task)

    def _apply_held_cancel(self, task: TaskRecord, claimed: bool) -> None:
        """The cancel held while the task was UNCLAIMED (hold_cancel), now that it was
        claimed by a worker (as for a task at a worker: refused, and with force killed there)
        or released to its queue (as for a queued task: dropped, its client told by
        ``TasksCancelled``, or by a CANCELLED result for a forced cancel, which gets no
        answer of its own)."""
        how = self.cancels_held.pop(task.task_id, 0)
        if not how:
            return
        client = task.client if task.client in self.clients else None
        if claimed:
            if how & CANCEL_FORCE:
                self._cancel(task, True)
            if how & CANCEL_ANSWER and client is not None:
                self._send(client, m.TasksCancelled([], [task.task_id]))
            return
        self._cancel(task, False)
        if client is None:
            return
        if how & CANCEL_ANSWER:
            self._send(client, m.TasksCancelled([task.task_id], []))
        if how & CANCEL_FORCE and not task.flags & TaskFlags.NO_RESULT:
            self._result_to(client, m.TaskResult(task.task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))

    def _unassign(self, worker: WorkerRecord, task: TaskRecord) -> None:
        del worker.inflight[task.task_id]
        worker.seceded.discard(task.task_id)
        self.placement.grew(worker.peer)
        if not worker.inflight:
            worker.idle_since = self._now
        task.worker = None
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                left = used[name] - quantity
                if left <= 1e-9:
                    del used[name]
                else:
                    used[name] = left

    def _expire_unsatisfiable(self, now: float) -> None:
        timeout = self.config.unsatisfiable_timeout
        for key, queue in list(self.constrained.items()):
            if not queue.live:
                if key not in self.placement.active:  # a stuck key's tasks all went (cancelled): drop it
                    del self.constrained[key]
                    self.placement.served(key)
                continue
            if self._satisfiable(key):
                continue
            if key not in self._warned:
                self._warned.add(key)
                log.warning("tasks wait for %s, which no connected worker has", describe_key(key))
            if timeout is None:
                continue
            for task in queue.entries():
                if now - task.queued_at >= timeout:
                    self._unqueue(task)
                    task.transition("reject")
                    self._forget(task)
                    self.counters["failed"] += 1
                    reason = (self._unsatisfiable_text(key) + f" within unsatisfiable_timeout={timeout:g} s").encode()
                    self.recorder.ended(now, 0, 1)
                    self.history.ended(now, 0, 1)
                    self.recorder.event(now, "rejected", reason.decode(), task_id=task.task_id)
                    self._fail_dependents(task, Status.REJECTED, reason)
                    if not task.flags & TaskFlags.NO_RESULT:
                        self._result_to(task.client, m.TaskResult(task.task_id, 0, Status.REJECTED, reason, m.NO_FACTS, m.NO_OBJECTS))
