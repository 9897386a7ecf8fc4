"""The graph controller, a layer of the core (core.py): tasks tied to their dependencies,
dependents freed or failed with them, constraints no worker can meet, and cancels.
"""

from __future__ import annotations

import logging

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.scheduler.core_bookkeeping import Bookkeeping
from scaler_executor.scheduler.core_events import CANCEL_ANSWER, CANCEL_FORCE, _packb
from scaler_executor.scheduler.state import (
    AT_WORKER_STATES,
    QUEUED_STATES,
    ConstraintKey,
    TaskRecord,
    TaskState,
    describe_key,
)

log = logging.getLogger("scaler_executor.daemon")


class GraphController(Bookkeeping):
    """Dependencies, cancels and unsatisfiable constraints."""

    def _link(self, task: TaskRecord) -> bool:
        """Tie a new task to its dependencies; True if it is ready to queue now.

        A dependency this daemon no longer knows (it finished and was forgotten before the
        dependent arrived) is answered with DEP_GONE: the client then has its result and
        sends the dependent again with the value inlined.
        """
        task.set_state(TaskState.WAITING)
        linked: list[TaskRecord] = []
        for dep_id in task.deps:
            dep = self.tasks.get(dep_id)
            if dep is None or dep.client != task.client:
                for done in linked:
                    del done.dependents[task.task_id]  # type: ignore[union-attr]
                    done.holds -= 1
                    self._maybe_release(done)
                task.deps = []
                task.transition("dep-gone")
                self._forget(task)
                self._result_to(task.client, m.TaskResult(task.task_id, 0, Status.DEP_GONE, _packb([dep_id]), m.NO_FACTS, m.NO_OBJECTS))
                return False
            if dep.dependents is None:
                dep.dependents = {}
            dep.dependents[task.task_id] = None
            dep.holds += 1
            linked.append(dep)
            if dep.state is not TaskState.FINISHED:
                task.waiting += 1
        if task.waiting:
            return False
        task.set_state(TaskState.PENDING)
        return True

    def _dependents_ready(self, task: TaskRecord) -> None:
        for dep_id in task.dependents or ():
            dependent = self.tasks.get(dep_id)
            if dependent is not None and dependent.state is TaskState.WAITING:
                dependent.waiting -= 1
                if not dependent.waiting:
                    dependent.transition("deps-ready")
                    if dependent.queue_key is None:
                        self.ready.push(dependent)
                    else:
                        self._queue(dependent)

    def _fail_dependents(self, task: TaskRecord, status: int, payload: bytes) -> None:
        """A task ended without a result: its waiting dependents (transitively) end too, unrun.

        A cancelled task cancels them; any other failure fails them with DEP_FAILED carrying
        the original failure, so the client raises the original exception.
        """
        if not task.dependents:
            return
        if status == Status.CANCELLED:
            answer_status, answer = Status.CANCELLED, b""
        else:
            answer_status, answer = Status.DEP_FAILED, _packb([task.task_id, status, payload])
        stack = list(task.dependents)
        while stack:
            dependent = self.tasks.get(stack.pop())
            if dependent is None or dependent.state is not TaskState.WAITING:
                continue
            dependent.transition("dep-failed")
            self._forget(dependent)
            self.counters["cancelled" if answer_status == Status.CANCELLED else "failed"] += 1
            if not dependent.flags & TaskFlags.NO_RESULT:
                self._result_to(dependent.client, m.TaskResult(dependent.task_id, 0, answer_status, answer, m.NO_FACTS, m.NO_OBJECTS))
            stack.extend(dependent.dependents or ())

    def _satisfiable(self, key: ConstraintKey) -> bool:
        if self.template is not None and self.template.fits_ever(key):
            return True
        if self.managers.can_fit(key):
            return True
        return self.placement.satisfiable(key)

    def _unsatisfiable_text(self, key: ConstraintKey) -> str:
        have = "; ".join(
            f"{w.name}: {describe_key((tuple(sorted(w.resources.items())), tuple(sorted(w.tags)))) or 'nothing'}"
            for w in self.workers.values()
        )
        return (
            f"no worker can provide {describe_key(key)} (workers have: {have or 'no workers connected'}); "
            "start workers with --resources/--tags that match, or change the task's options"
        )

    def _reject_spec(self, peer: bytes, spec: m.TaskSpec, reason: str) -> None:
        log.warning("rejected task %#x from %r: %s", spec.task_id, peer, reason)
        self.counters["failed"] += 1
        self.recorder.ended(self._now, 0, 1)
        self.history.ended(self._now, 0, 1)
        self.recorder.event(self._now, "rejected", reason, task_id=spec.task_id, where=self.clients[peer].name if peer in self.clients else "")
        self._result_to(peer, m.TaskResult(spec.task_id, 0, Status.REJECTED, reason.encode(), m.NO_FACTS, m.NO_OBJECTS))

    def _on_cancel(self, peer: bytes, message: m.CancelTasks) -> None:
        """``force``: kill wherever it is.  Without it (``Future.cancel()``): drop only a task
        no worker holds, and say which were dropped, so ``cancel()`` returns True only for a
        task that never runs; one at a worker (maybe still in its prefetch queue) runs on.
        Another client's task is left alone and the attempt refused (counted, logged)."""
        for task_id in message.task_ids:
            other = self.tasks.get(task_id)
            if other is not None and other.client != peer:
                self._refuse(peer, "cancel-tasks", f"task id {task_id:#x} is not this client's")
        if message.force:
            for task_id in message.task_ids:
                task = self.tasks.get(task_id)
                if task is not None and task.client == peer:
                    if task.state is TaskState.UNCLAIMED:
                        self.hold_cancel(task_id, CANCEL_FORCE)
                    else:
                        self._cancel(task, True)
            return
        cancelled: list[int] = []
        refused: list[int] = []
        for task_id in message.task_ids:
            task = self.tasks.get(task_id)
            if task is not None and task.client == peer and (
                task.state in QUEUED_STATES or task.state is TaskState.WAITING
            ):
                self._cancel(task, False)
                cancelled.append(task_id)
            elif task is not None and task.client == peer and task.state is TaskState.UNCLAIMED:
                self.hold_cancel(task_id, CANCEL_ANSWER)  # answered once it is claimed or not
            else:
                refused.append(task_id)
        self._send(peer, m.TasksCancelled(cancelled, refused))

    def hold_cancel(self, task_id: int, how: int) -> None:
        """A cancel of an UNCLAIMED task (state.py): whether it can still be kept from
        running is known only once a worker claims it or the recovery ends; applied then
        (``_apply_held_cancel``).  ``how``: CANCEL_ANSWER and/or CANCEL_FORCE."""
        self.cancels_held[task_id] = self.cancels_held.get(task_id, 0) | how

    def _cancel(self, task: TaskRecord, force: bool) -> None:
        """Drop a task no worker holds; ask its worker to drop one it holds.  An UNCLAIMED
        one is dropped (its client left or no longer wants it: if a worker still holds it,
        that worker's report has it cancelled there as a task nobody awaits)."""
        if task.state in QUEUED_STATES or task.state is TaskState.WAITING or task.state is TaskState.UNCLAIMED:
            if task.state in QUEUED_STATES:
                self._unqueue(task)
            elif task.state is TaskState.UNCLAIMED:
                del self.unclaimed[task.task_id]
                self.cancels_held.pop(task.task_id, None)
            task.transition("cancel")
            self._forget(task)
            self.counters["cancelled"] += 1
            self._fail_dependents(task, Status.CANCELLED, b"")
        elif task.state in AT_WORKER_STATES:
            task.transition("cancel")
            assert task.worker is not None
            self._send(task.worker, m.CancelTasks([task.task_id], force))
