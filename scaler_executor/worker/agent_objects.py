"""The worker agent's objects, a layer of the agent (agent.py): the host's store reached,
objects fetched over the network for the tasks that wait for them, held tasks released.
"""

from __future__ import annotations

import logging
import os
import tempfile

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import StreamError
from scaler_executor.protocol.messages import Status
from scaler_executor.worker import handoff
from scaler_executor.worker.agent_base import PICKLE_5, AgentBase, _error

log = logging.getLogger("scaler_executor.worker")


class ObjectSide(AgentBase):
    """Objects tasks need, fetched or mapped, and what the agent holds for them."""

    def _reach_store(self, name: str) -> None:
        """Map the daemon host's store if this host has it; otherwise fetch over the network."""
        if not name or self.fetch_objects:
            self.fetch_objects = self.fetch_objects or bool(name)
            return
        try:
            from scaler_executor.objstore import ObjectStore

            store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
        except Exception as exc:  # noqa: BLE001  (whatever keeps us from mapping it, the network path works)
            log.info("worker %s cannot map the object store %s (%s): fetching objects over the network", self.name, name, exc)
            self.fetch_objects = True
            return
        if self.store is not None:
            self.store.close()
        self.store = store  # kept: it reaps what dead processors held (_bury)
        self.store_name = name

    def _object_ids_of(self, task: m.TaskDispatch) -> list[bytes]:
        ids = list(task.objects)
        for dep in task.deps:
            ids.extend(dep.objects)
        return ids

    def _on_object_part(self, message: m.ObjectPart) -> None:
        frames = self._frames_of_last_message
        self.incoming.part(message, frames[0] if frames else b"")
        self.outbox.append(m.ObjectPartsTaken(1))  # the daemon's window moves on

    def _object_started(self, object_id: bytes, memfd: handoff.Unsealed) -> None:
        """The first part of a fetched object is written: if it is a pickle stream (the
        objects ``pickle.load`` reads, not out-of-band buffers, which processors map whole),
        the tasks that wait for nothing else run now and read it as it comes (handoff.stream)."""
        if os.pread(memfd.fd, 2, 0) != PICKLE_5:
            return
        for task_id in self.fetches.started(object_id, memfd):
            self.queue.append(self.held[task_id])

    def _on_object_data(self, message: m.ObjectData) -> None:
        buffers = iter(self._frames_of_last_message)
        for object_id, found in zip(message.object_ids, message.found, strict=False):
            blob, why = None, "is no longer in the object store"
            if found:
                try:
                    # bytes, a view of a large frame (wire.recv) or of what came in parts: no copy
                    blob = self.incoming.take(object_id, next(buffers, b""))
                except StreamError as exc:
                    why = f"did not arrive whole ({exc})"
            arrival = self.fetches.arrived(object_id, blob)
            if blob is None and arrival.stream is not None:
                arrival.stream.abort(why)  # tasks reading it as it came fail on it (handoff.Streamed)
            text = f"object {object_id.hex()} of its arguments {why}"
            for task_id in arrival.failed:
                # Gone from the store (its owner released it), or cut short: it cannot run here.
                task = self.held.pop(task_id)
                self.results.append(m.TaskResult(task_id, task.attempt, Status.ERROR, _error(text), m.NO_FACTS, m.NO_OBJECTS))
            if arrival.readers:
                # Those queued to read it as it came, not yet at a processor, fail as parked
                # ones do (the others fail on their stream).
                readers = set(arrival.readers)
                for task in self.queue:
                    if task.task_id in readers and self.held.get(task.task_id) is task:
                        self._unhold(task.task_id)  # the queue passes over it
                        self.results.append(m.TaskResult(task.task_id, task.attempt, Status.ERROR, _error(text), m.NO_FACTS, m.NO_OBJECTS))
            for task_id in arrival.ready:
                self.queue.append(self.held[task_id])

    def _unhold(self, task_id: int) -> m.TaskDispatch:
        """A task this worker will not run or report again: out of ``held``, and its fetched
        objects dropped unless another held task reads them."""
        self.fetches.forget(task_id)
        return self.held.pop(task_id)

    def _forget_daemon_state(self) -> None:
        """The daemon lost track of this worker: what it held is no longer expected anywhere.

        Tasks still running are killed with their processors: the daemon has already
        retried or failed them, and a processor busy with a result nobody wants would keep
        the rejoined worker from running anything else.
        """
        self.welcomed = False
        self.resume.forget()
        self.queue.clear()
        for task_id in list(self.held):
            if not any(task_id in p.outstanding for p in self.processors.values()):
                del self.held[task_id]
        # Results of tasks still running are not wanted (by attempt: the daemon may hand this
        # worker the same task again, as a new attempt, while the old one is being killed).
        self.cancelled.update((task_id, task.attempt) for task_id, task in self.held.items())
        for p in list(self.processors.values()):
            if p.outstanding and p.eof_at is None:
                p.kill_for(Status.CANCELLED, "the daemon no longer expects this task")
        self.fetches.clear()
        self.incoming.clear()  # a partial object's buffer goes with the rest (its streams end short)
        self.results.clear()
        self.raw_out.clear()
        self.lanes.close(self.poller)  # their clients submit what they had there again, to the daemon

    def _cancel(self, task_ids: list[int], force: bool) -> None:
        for task_id in task_ids:
            task = self.held.get(task_id)
            if task is None:
                continue
            holder = next(
                (p for p in self.processors.values() if p.attempts.get(task_id) == task.attempt and task_id in p.outstanding),
                None,
            )
            if holder is None:  # still in our queue, or parked: drop it
                self._unhold(task_id)
                self.results.append(m.TaskResult(task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))
            elif force and holder.outstanding[0] == task_id:
                holder.kill_for(Status.FORCE_CANCELLED, "cancelled with force=True while running")
            else:
                self.cancelled.add((task_id, task.attempt))  # it will run; say cancelled
