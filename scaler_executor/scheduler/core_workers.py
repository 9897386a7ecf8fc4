"""The worker controller, a layer of the core (core.py): results and their retries, lanes,
task runs, draining, a broken cluster, and a worker lost with what it held.
"""

from __future__ import annotations

import logging

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import DEFAULT_OPTIONS as DEFAULT
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.protocol.runlog import DURATION_BOUNDS, MAX_REPORT_RUNS, RUN_BYTES
from scaler_executor.scheduler.core_dispatch import Dispatcher
from scaler_executor.scheduler.core_events import (
    EWMA_WEIGHT,
    MAX_FIGURE,
    NONE,
    WORKER_STATUSES,
    _pack_lost,
)
from scaler_executor.scheduler.result_stream import AbortPartial
from scaler_executor.scheduler.state import TaskRecord, TaskState, WorkerRecord

log = logging.getLogger("scaler_executor.daemon")


class WorkerController(Dispatcher):
    """What workers report, and losing them."""

    def _on_task_results(self, peer: bytes, message: m.TaskResults) -> None:
        worker = self.workers[peer]
        ended = failed = 0
        counters = self.counters
        counters["result_batches"] += 1
        streams = self.result_streams
        for result in message.results:
            if streams.by_task and result.task_id in streams.by_task:  # a streamed result's end
                before = streams.forwarded
                self._streams_ended(streams.ended(peer, result.task_id, result.objects))
                counters["result_streams_forwarded"] += streams.forwarded - before
            if result.status not in WORKER_STATUSES:
                # Only the daemon says a task was rejected, lost its worker or its dependency:
                # a worker that claims so could make its client resend or misreport a task.
                self._refuse(peer, "task-result", f"status {result.status} is not a worker's to send")
                result = result._replace(
                    status=Status.PROCESSOR_DIED,
                    payload=f"the worker sent an invalid result status {result.status}".encode(),
                )
            task = self.tasks.get(result.task_id)
            if task is None or task.worker != peer or task.attempt != result.attempt:
                if result.objects:
                    self._deletions.extend(result.objects)  # an orphan result's objects
                continue  # late: an earlier attempt, or a task already settled elsewhere
            self._unassign(worker, task)
            if result.status == Status.PROCESSOR_DIED:
                self.recorder.event(self._now, "processor-died", "", task_id=task.task_id, where=worker.name, payload=result.payload, status=result.status)
                self._attempt_failed(task, f"worker {worker.name}: {result.payload.decode(errors='replace')}", result.output)
                continue
            if result.status == Status.OK and result.facts.finished > result.facts.started:
                duration = result.facts.finished - result.facts.started
                mean = worker.mean_task_seconds
                worker.mean_task_seconds = duration if mean is None else mean + EWMA_WEIGHT * (duration - mean)
            ok = result.status == Status.OK
            ended += 1
            if not ok:
                failed += 1
                self._record_failure(worker, task, result)
            if self._direct_running:
                self._direct_running.pop(task.task_id, None)  # its result tells the client it ran
            if ok and task.holds > 0 and task.state is TaskState.DISPATCHED:
                task.transition("result-kept")  # dependents need it: it stays, FINISHED
                task.result = result.payload
                if result.objects:
                    task.result_objects = result.objects
                    self._hold(result.objects)
                self._release_deps(task)  # finished, it needs its own dependencies no more
                self._dependents_ready(task)
            else:
                cancelling = task.state is TaskState.CANCELLING
                task.transition("result")
                self._forget(task)
                if not ok:
                    self._fail_dependents(task, result.status, result.payload)
                elif cancelling:  # force-cancelled, it ended before the kill: its dependents do not run
                    self._fail_dependents(task, Status.CANCELLED, b"")
            if result.delivered:
                counters["delivered_direct"] += 1  # the client has it from the processor
            elif not task.flags & TaskFlags.NO_RESULT and task.client in self.clients:
                if result.objects:
                    self._client_holds(task.client, result.objects)  # until it has read them
                self._result_to(task.client, result)
            elif result.objects and task.result_objects is None:
                self._deletions.extend(result.objects)  # nobody will read them
        # Once per batch, not per result: the tasks that ran and ended.  (Dependents failed
        # with a task count in ``failed``, not here.)  Their run times and peak memory come
        # summed up in the worker's TaskRuns (_on_task_runs), nothing per task here.
        if ended:
            counters["finished"] += ended - failed
            counters["failed"] += failed
            self.recorder.ended(self._now, ended - failed, failed)
            self.history.ended(self._now, ended - failed, failed)

    def _record_failure(self, worker: WorkerRecord, task: TaskRecord | None, result: m.TaskResult) -> None:
        """``task``: None for a lane task's (the daemon has no record of it)."""
        kind = {Status.TIMEOUT: "timeout", Status.CANCELLED: "cancelled", Status.FORCE_CANCELLED: "cancelled"}.get(result.status, "failed")
        task_id = result.task_id if task is None else task.task_id
        self.recorder.event(self._now, kind, "", task_id=task_id, where=worker.name, payload=result.payload, status=result.status)

    def _on_lane_started(self, peer: bytes, message: m.LaneStarted) -> None:
        """Lane tasks still running: recorded as this worker's, DISPATCHED, so that its load,
        the task counts and monitors include them, until LaneDone names them.  The record
        has no payload: the daemon never dispatches, retries or answers it (ON_LANE)."""
        worker = self.workers[peer]
        tasks = self.tasks
        for task_id in message.task_ids:
            client_id = task_id >> m.TASK_ID_BITS
            client = next((c for c in self.clients.values() if c.client_id == client_id), None)
            if client is None or task_id in tasks:
                continue  # its client left (the worker runs it for nobody), or a bad id
            task = TaskRecord(
                task_id, client.peer, 0, DEFAULT, TaskFlags.ON_LANE, b"", NONE, NONE, 0, self.state_counts
            )
            tasks[task_id] = task
            client.tasks.add(task_id)
            task.transition("dispatch")
            task.worker = peer
            worker.inflight[task_id] = None

    def _on_task_runs(self, peer: bytes, message: m.TaskRuns) -> None:
        """A worker's task runs since its last report: kept as they came (one blob), for the
        history; decoded only when one is asked for (scheduler/history.py)."""
        count, seen, counts = message.kept, message.seen, message.durations
        if not 0 <= count <= min(seen, MAX_REPORT_RUNS) or seen > MAX_FIGURE or len(message.runs) != count * RUN_BYTES:
            self._refuse(peer, "task-runs", f"TaskRuns of {count} runs ({seen} seen) in {len(message.runs)} bytes")
            return
        if not (
            0 <= message.timed <= MAX_FIGURE and 0.0 <= message.longest <= message.seconds <= MAX_FIGURE  # NaN fails
            and 0 <= message.peak_memory <= MAX_FIGURE
            and (counts == [] if not message.timed else len(counts) == len(DURATION_BOUNDS) + 1 and min(counts) >= 0 and sum(counts) == message.timed)
        ):  # fmt: skip
            self._refuse(peer, "task-runs", f"TaskRuns run times out of range: {message.timed} timed, {message.seconds!r} s")
            return
        self.history.reported(self.workers[peer].name, count, seen, message.runs)
        if message.timed:
            recorder = self.recorder
            recorder.ended(self._now, 0, 0, message.timed, message.seconds, message.longest)
            recorder.timed(counts, message.seconds)
            if message.peak_memory:
                recorder.peak_memory[peer] = message.peak_memory

    def _on_lane_done(self, peer: bytes, message: m.LaneDone) -> None:
        """Lane tasks that ended: counted as if submitted here (a retried one is submitted
        here again by its client, and counted then); the records of announced ones go."""
        worker = self.workers[peer]
        counts = (message.finished, message.failed, message.retried, message.delivered)
        if not all(0 <= n <= MAX_FIGURE for n in counts) or not 0.0 <= message.seconds <= MAX_FIGURE:
            self._refuse(peer, "lane-done", f"LaneDone counts out of range: {counts!r}, {message.seconds!r} s")
            return
        if message.clients:  # cumulative: the latest is the whole count (held statistics wait for it)
            if not all(0 <= e.ended <= MAX_FIGURE for e in message.clients):
                self._refuse(peer, "lane-done", f"LaneDone client counts out of range: {message.clients!r}")
                return
            worker.lane_ends = {e.client_id: e.ended for e in message.clients}
        ended = message.finished + message.failed
        counters = self.counters
        counters["submitted"] += ended
        counters["finished"] += message.finished
        counters["failed"] += message.failed
        counters["retried"] += message.retried
        counters["delivered_direct"] += message.delivered
        counters["lane"] += ended + message.retried
        if ended:
            self.recorder.ended(self._now, message.finished, message.failed, ended if message.seconds > 0 else 0, message.seconds)
            self.history.ended(self._now, message.finished, message.failed)
        for result in message.failures[: message.failed]:
            if result.status in WORKER_STATUSES and result.status != Status.OK:
                self._record_failure(worker, None, result)
        if ended and message.seconds > 0:
            duration = message.seconds / ended
            mean = worker.mean_task_seconds
            worker.mean_task_seconds = duration if mean is None else mean + EWMA_WEIGHT * (duration - mean)
            self.placement.grew(peer)  # its prefetch window may have grown
        for task_id in message.announced:
            task = self.tasks.get(task_id)
            if task is None or not task.flags & TaskFlags.ON_LANE or task.worker != peer:
                continue
            self._unassign(worker, task)
            task.transition("result")
            self._forget(task)

    def _on_seceded(self, peer: bytes, message: m.Seceded) -> None:
        worker = self.workers[peer]
        for task_id in message.task_ids:
            if task_id in worker.inflight:
                worker.seceded.add(task_id)
                self.placement.grew(peer)  # a seceded task is not counted as load

    def _on_worker_draining(self, peer: bytes, message: m.WorkerDraining) -> None:
        """The worker drains (SIGTERM with ``--drain-seconds``: its job ends soon): nothing
        more is dispatched to it; the tasks it lists as never started (under the attempt it
        holds) go back to the front of their queues at no charge, to run elsewhere; the
        rest stay its own, and their results count as usual.  Its Goodbye follows the
        usual rules.  It may say this more than once (tasks that came back to it later)."""
        worker = self.workers[peer]
        if not worker.draining:
            log.info(
                "worker %r drains: it takes no more tasks, hands back %d and finishes the rest of its %d",
                worker.name, len(message.unstarted), len(worker.inflight),
            )
        worker.draining = True
        self.managers.worker_draining(worker)
        inflight, tasks = worker.inflight, self.tasks
        for listed in message.unstarted:
            task = tasks.get(listed.task_id)
            if (
                task is None
                or listed.task_id not in inflight
                or task.attempt != listed.attempt
                or task.flags & TaskFlags.ON_LANE
            ):
                continue  # not what it holds (a stale attempt, a lane's, or no task of its)
            self._unassign(worker, task)
            self._requeue_free(task, "returned")

    def _on_cluster_broken(self, peer: bytes, message: m.ClusterBroken) -> None:
        worker = self.workers[peer]
        worker.broken = message.reason
        log.error("worker %r cannot run tasks: %s", worker.name, message.reason)
        for client in self.clients.values():
            self._send(client.peer, message)

    def _lose_worker(
        self,
        worker: WorkerRecord,
        why: str,
        *,
        clean: bool = False,
        infrastructure: bool = False,
        unstarted: list[m.TaskAttempt] | None = None,
        manager: str = "",
    ) -> None:
        """The worker is gone; each task it held goes on by what the daemon knows of it.

        * ``unstarted``: the tasks (and attempts) its Goodbye hands back as never given to a
          processor. They are queued again at no charge: they never ran.
        * Any other task may have started. It counts as interrupted when the worker left in
          an orderly way (``clean``: its Goodbye) or its manager says the infrastructure
          ended it (``infrastructure``: preemption, walltime, cancellation): queued again
          without a charge against its retries, except a task that may run at most once
          (``max_retries=0``), which fails naming the worker (and its job, where known).
        * Otherwise (a crash, missed heartbeats, unreachable) its attempt failed.
        """
        (log.info if clean else log.warning)("worker %r lost: %s; %d tasks affected", worker.name, why, len(worker.inflight))
        self._end_object_sends(worker.peer)
        self._end_puts(worker.peer)
        if worker.peer in self.result_streams.by_worker:  # lost mid-upload: no partial object is a result
            # Whole objects whose result never came: nobody will name them (the task runs
            # again and streams a new one), so they go too, unless something holds one.
            unclaimed = self.result_streams.unclaimed(worker.peer)
            streaming, ended = self.result_streams.worker_lost(worker.peer)
            self._streams_ended(ended)
            self._commands.append(AbortPartial(worker.peer, tuple(streaming)))
            self._deletions.extend(o for o in unclaimed if o not in self.object_holds)
        if not clean:
            self.counters["workers_lost"] += 1
            self.recorder.event(self._now, "worker-lost", f"{why}; {len(worker.inflight)} tasks affected", where=worker.name)
        job = self.managers.job_of(worker) if clean else ""  # a manager's "gone" names it in ``why``
        who = f"worker {worker.name}" + (f" ({job})" if job else "")
        returned = {(u.task_id, u.attempt) for u in unstarted} if unstarted else set()
        manager = manager or self.managers.manager_of(worker)  # interruptions are charged to it
        interrupted = 0
        failed: list[tuple[int, int]] = []  # its report, if it comes later, says what ended them
        self.recorder.peak_memory.pop(worker.peer, None)
        del self.workers[worker.peer]
        self.placement.remove(worker)
        self._memory_total -= worker.memory
        self.history.gauge(self._now, len(self.workers), self._memory_total)
        self.managers.worker_left(worker)
        self.last_sent.pop(worker.peer, None)
        self._out.pop(worker.peer, None)
        for task_id in list(worker.inflight):
            task = self.tasks[task_id]
            self._unassign(worker, task)
            if task.flags & TaskFlags.ON_LANE:
                task.transition("result")  # its client sees the lane close, and submits it again here
                self._forget(task)
            elif (task_id, task.attempt) in returned:
                self._requeue_free(task, "returned")
            elif (clean or infrastructure) and self._retry_free(task):
                self._requeue_free(task, "interrupted")
                interrupted += 1
            elif clean or infrastructure:
                self._attempt_failed(
                    task,
                    f"{who}: {why}",
                    at_most_once=(
                        f"task {task.task_id:#x} failed: it may have started on worker {worker.name}, which "
                        f"{'left' if clean else 'the infrastructure ended'} while it held it, and max_retries=0 "
                        "lets a task run at most once, so it was not run again"
                    ),
                )
            else:
                self._attempt_failed(task, f"{who}: {why}")
                if manager and task.failures is not None and task_id in self.tasks:
                    failed.append((task_id, len(task.failures) - 1))
        if failed:
            self.managers.failed_on(worker, failed)
        if interrupted:
            self.counters["tasks_interrupted"] += interrupted
            if manager:
                self.managers.charge(manager, interrupted)

    def _requeue_free(self, task: TaskRecord, event: str) -> None:
        """Back to the front of its queue without a charge against its retries (``returned``:
        it never started; ``interrupted``: its worker's orderly leave or the infrastructure
        cut it short).  A task being cancelled ends here instead."""
        if task.state is TaskState.CANCELLING:
            self._end_cancelling(task, event)
            return
        # A new attempt number, so that a late answer from the old hand-out (the worker may
        # still finish or cancel it) cannot settle the new one; no failure is recorded, so it
        # does not count against max_retries.
        task.attempt += 1
        task.transition(event)
        self._queue(task, front=True)

    def _end_cancelling(self, task: TaskRecord, event: str) -> None:
        """A task being cancelled (force) whose worker will never answer: it ends cancelled,
        as that answer would have said; its client is told and its dependents end too."""
        task.transition(event)
        self._forget(task)
        self.counters["cancelled"] += 1
        self._fail_dependents(task, Status.CANCELLED, b"")
        if not task.flags & TaskFlags.NO_RESULT and task.client in self.clients:
            self._result_to(task.client, m.TaskResult(task.task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))

    def _retry_free(self, task: TaskRecord) -> bool:
        max_retries = task.options.max_retries
        return (self.config.max_retries if max_retries is None else max_retries) > 0

    def _attempt_failed(self, task: TaskRecord, line: str, output: bytes = b"", at_most_once: str = "") -> None:
        """``output``: what the attempt captured before its process died (capture_output),
        given to the client with the failure when it was the last attempt allowed.
        ``at_most_once``: the failure's text instead of the usual one (a crash on every
        attempt) when this ends a task that may have started and may not run again."""
        if task.failures is None:
            task.failures = []
        task.failures.append(f"attempt {len(task.failures) + 1}: {line}")
        max_retries = task.options.max_retries
        if max_retries is None:
            max_retries = self.config.max_retries
        if task.state is TaskState.CANCELLING:
            self._end_cancelling(task, "attempt-failed")
            return
        if len(task.failures) > max_retries:
            task.transition("retries-exhausted")
            self._forget(task)
            self.counters["failed"] += 1
            text = at_most_once or (
                f"task {task.task_id:#x} failed: the process running it died on all "
                f"{len(task.failures)} attempt(s) allowed (max_retries={max_retries})"
            )
            self.recorder.ended(self._now, 0, 1)
            self.history.ended(self._now, 0, 1)
            self.recorder.event(self._now, "retries-exhausted", f"{text}; last: {line}", task_id=task.task_id)
            payload = _pack_lost(text, task.failures)
            self._fail_dependents(task, Status.WORKER_LOST, payload)
            if not task.flags & TaskFlags.NO_RESULT:
                lost = m.TaskResult(task.task_id, task.attempt, Status.WORKER_LOST, payload, m.NO_FACTS, m.NO_OBJECTS, False, output)
                self._result_to(task.client, lost)
            return
        task.attempt += 1
        task.transition("attempt-failed")
        self.counters["retried"] += 1
        self._queue(task, front=True)
