"""The worker agent's processors, a layer of the agent (agent.py): spawned by the zygote,
given tasks (dealing.py decides how many), their messages and stderr, their memory, and
their deaths, with what they held handed back.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.worker import capture, handoff
from scaler_executor.worker import processor as proc
from scaler_executor.worker.agent_base import FN_MEANS_MAX, MEMORY_SAMPLE_SECONDS, RESPAWN_BACKOFF
from scaler_executor.worker.agent_objects import ObjectSide
from scaler_executor.worker.dealing import MAX_DEPTH, takes_more, task_depth
from scaler_executor.worker.memory import private_memory
from scaler_executor.worker.processes import Processor, size_text
from scaler_executor.worker.zygote import EXITED, SPAWNED

log = logging.getLogger("scaler_executor.worker")


class ProcessorSide(ObjectSide):
    """Processors: started, fed, heard, sampled, buried."""

    def _spawn(self) -> None:
        try:
            self.zygote.request()
        except OSError:
            # The zygote died and its end has not been read yet (a processor's end can come
            # first in the same turn): the same as reading it.
            self._zygote_died()
            return
        self.starting += 1

    def _zygote_died(self) -> None:
        if not self.stopping:
            log.error("worker %s: the zygote died; the worker cannot replace processors and stops", self.name)
        self.exit_code = 3
        self.stopping = True

    def _on_zygote(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.zygote.control, 4096, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            self._zygote_died()
            return
        message = msgpack.unpackb(data)
        if message[0] == SPAWNED:
            self.starting -= 1
            conn = Connection(fds[0])
            p = Processor(message[1], conn, fds[1], fds[2])
            os.set_blocking(fds[1], False)
            os.set_blocking(fds[2], False)
            self.processors[conn.fileno()] = p
            self.stderr_of[fds[1]] = p
            self.by_pid[p.pid] = p
            self.poller.register(conn.fileno())
            self.poller.register(fds[1])
        elif message[0] == EXITED:
            exited = self.by_pid.get(message[1])
            if exited is not None:
                exited.wait_status = message[2]
                if exited.eof_at is not None:
                    self._bury(exited)

    def _on_processor(self, p: Processor) -> None:
        # Everything available in one read (FrameReader): results that arrived together
        # cost one system call.
        try:
            p.reader.fill()
            for raw in p.reader.frames():
                self._on_processor_message(p, msgpack.unpackb(raw))
        except (EOFError, OSError):
            self.next_housekeeping = 0.0
            p.eof_at = time.monotonic()
            self.poller.unregister(p.fd)
            if p.wait_status is not None:
                self._bury(p)

    def _take_back(self, p: Processor, returned: list[int]) -> None:
        """Tasks a processor handed back unstarted: to the front of our queue, in order."""
        given = p.take_back(returned)
        for back in reversed(returned):
            task = self.held.get(back)
            if task is not None and task.attempt == given[back]:
                self.queue.appendleft(task)

    def _on_processor_message(self, p: Processor, message: list[Any]) -> None:
        if message[0] == proc.RECALLED:
            p.recalling = False
            self._take_back(p, message[1])
            return
        if message[0] == proc.SECEDE:
            _, task_id, returned = message
            self._take_back(p, returned)  # queued behind the seceding task
            p.seceded = True
            p.deadline = None  # a task waiting on sub-tasks is timed by its sub-tasks
            self.outbox.append(m.Seceded([task_id]))
            self.next_housekeeping = 0.0  # it needs a processor to stand in for it
            return
        if message[0] == proc.INIT_FAILED:
            reason = "the executor's initializer failed in a worker process"
            self.broken = reason
            log.error("worker %s: %s", self.name, reason)
            self.outbox.append(m.ClusterBroken(reason, message[1]))
            return
        _, task_id, attempt, status, payload, started, finished, peak, result_objects, delivered, output = message
        if type(payload) is int:  # a large result, in the memfd that came beside DONE (handoff.py)
            payload = handoff.attach(p.reader.take_fd(), payload)
        p.seceded = False
        p.recalling = False  # its head changed; an answer still on its way hands back what it lists
        expected = p.outstanding.popleft()
        assert expected == task_id, f"processor {p.pid} answered task {task_id:#x}, expected {expected:#x}"
        if p.outstanding:
            p.head_since = time.monotonic()  # the next one starts now
        elif not self.queue:
            self.straggler_watch = True  # idle: is another holding tasks behind a long one?
        p.attempts.pop(task_id, None)
        p.deadline = None
        peak = max(peak, p.peak)
        p.peak = 0
        task = self.held.get(task_id)
        if task is None or task.attempt != attempt:
            task = None  # an attempt the daemon no longer expects (a newer one may be held)
        else:
            del self.held[task_id]
            if self.fetch_objects:
                self.fetches.forget(task_id)  # its fetched objects, unless another task reads them
        if (task_id, attempt) in self.cancelled:
            self.cancelled.discard((task_id, attempt))
            status, payload = Status.CANCELLED, b""
        if task is not None or result_objects:
            # A stale result goes too when it has store objects: the daemon drops the result
            # and deletes the objects, which nobody else would.
            facts = m.make(m.TaskFacts, (self.name, started, finished, peak))
            self.results.append(m.make(m.TaskResult, (task_id, attempt, status, payload, facts, result_objects, delivered, output)))
            if task is not None and task_id not in self.lanes.tasks:  # a lane task's: lanes.py records it
                self.runlog.ended(started, finished, status, peak)
        duration = finished - started
        self.mean_task = duration if self.mean_task is None else self.mean_task + 0.2 * (duration - self.mean_task)
        if task is not None:
            fn_mean = self.fn_means.get(task.fn_id)
            if fn_mean is not None:
                self.fn_means[task.fn_id] = fn_mean + 0.2 * (duration - fn_mean)
            elif len(self.fn_means) < FN_MEANS_MAX:
                self.fn_means[task.fn_id] = duration
        self.died_in_a_row = 0

    def _on_stderr(self, p: Processor) -> None:
        """Forward what a processor wrote to stderr, and keep its tail (Processor.read_stderr)."""
        if p.err_fd >= 0 and p.read_stderr():
            self.poller.unregister(p.err_fd)
            del self.stderr_of[p.err_fd]
            p.close_stderr()

    def _sample_memory(self, now: float) -> None:
        if now < self.next_sample:
            return
        self.next_sample = now + MEMORY_SAMPLE_SECONDS
        total = 0
        busiest: Processor | None = None
        for p in self.processors.values():
            if p.eof_at is not None:
                continue
            p.memory = private_memory(p.pid)
            total += p.memory
            if p.outstanding and p.memory > p.peak:
                p.peak = p.memory
            if busiest is None or p.memory > busiest.memory:
                busiest = p
        self.memory_total = total
        if self.memory_limit is not None and busiest is not None and total > self.memory_limit:
            busiest.kill_for(
                Status.PROCESSOR_DIED,
                f"killed by scaler-executor: the worker's processors held {size_text(total)} of private memory, "
                f"over its memory limit of {size_text(self.memory_limit)}; this processor held {size_text(busiest.memory)}",
            )

    def _bury(self, p: Processor) -> None:
        """A processor is gone (socket closed and exit status known, or the grace passed)."""
        if self.processors.get(p.fd) is p:
            del self.processors[p.fd]
        if self.by_pid.get(p.pid) is p:
            del self.by_pid[p.pid]
        p.close_fds()
        if p.err_fd >= 0:
            os.set_blocking(p.err_fd, True)  # it is dead: read what it wrote up to EOF
            self._on_stderr(p)
        how = p.how_it_ended(self.oom, self.memory_limit)
        # A capturing task's output up to its death, read from its processor's files.
        output = capture.read_files(self.capture_dir, p.pid, self.config.capture_output_limit) if self.capture_dir else b""
        if self.store is not None:
            # Processors never detach: give back now what it held in the store (large NumPy
            # arrays it had made, unsealed writes), rather than at the next process's attach.
            try:
                self.store.reap()
            except Exception as exc:  # noqa: BLE001  (a failed reap must not keep the processor unburied)
                log.warning("worker %s: reaping the object store after processor %d: %s", self.name, p.pid, exc)
        if p.outstanding:
            running = p.outstanding.popleft()
            attempt = p.attempts.pop(running, None)
            task = self.held.get(running)
            cancelled = (running, attempt) in self.cancelled
            self.cancelled.discard((running, attempt))
            if task is not None and task.attempt == attempt:
                self._unhold(running)
                if p.kill is not None:
                    status, text = p.kill[0], f"{p.kill[1]} (processor pid {p.pid} {how})"
                elif cancelled:
                    status, text = Status.CANCELLED, ""
                else:
                    status, text = Status.PROCESSOR_DIED, f"processor pid {p.pid} {how} while running the task"
                if not task.flags & m.TaskFlags.CAPTURE:
                    output = b""
                self.results.append(
                    m.TaskResult(running, task.attempt, status, text.encode(), m.NO_FACTS, m.NO_OBJECTS, False, output)
                )
            # Tasks queued behind it never started: they go back to the front of our queue.
            for task_id in reversed(p.outstanding):
                task = self.held.get(task_id)
                if task is not None and task.attempt == p.attempts.get(task_id):
                    self.queue.appendleft(task)
            self.died_in_a_row += 1
        elif p.retired or (self.max_tasks and p.sent >= self.max_tasks):
            pass  # it was asked to go, or served its max_tasks_per_child
        elif p.wait_status is not None:
            log.warning("worker %s: idle processor pid %d %s", self.name, p.pid, how)
            self.died_in_a_row += 1
        delay = RESPAWN_BACKOFF[min(self.died_in_a_row, len(RESPAWN_BACKOFF) - 1)]
        self.respawn_at = time.monotonic() + delay
        self._reconcile(time.monotonic())

    def _reconcile(self, now: float) -> None:
        """Keep ``capacity`` processors taking tasks, plus one for each seceded task."""
        if self.stopping or self.broken is not None or (self.draining and not self.queue):
            return  # (a draining worker's queue holds only lane tasks, which run)
        taking = [p for p in self.processors.values() if p.eof_at is None and p.kill is None and not p.retired]
        desired = self.capacity + sum(1 for p in taking if p.seceded)
        missing = desired - len(taking) - self.starting
        if missing > 0 and now >= self.respawn_at:
            for _ in range(missing):
                self._spawn()
        elif missing < 0:
            for p in taking:
                if missing >= 0:
                    break
                if not p.outstanding and not p.seceded:
                    p.retire()
                    missing += 1

    def _to_processor(self, p: Processor, data: bytes) -> None:
        pending = self._pending_writes
        if pending is not None:  # inside _assign: one write per processor at its end
            pending.setdefault(p, []).append(data)
            return
        p.send(data)

    def _to_processor_with_fds(self, p: Processor, data: bytes, fds: list[int]) -> None:
        """``data`` with memfds beside it (worker/handoff.py), after what waits for ``p``."""
        pending = self._pending_writes
        if pending is not None and p in pending:
            p.send_frames(pending.pop(p))
        p.send_with_fds(data, fds)

    def _assign(self, now: float) -> None:
        if not self.queue or self.broken is not None:
            return
        if self.draining:
            self._hand_back()  # what never started goes back to the daemon; lane tasks stay
            if not self.queue:
                return
        # Tasks queued behind a running one only pay off for short tasks, and only once we
        # know they are short: before that, two long tasks would run in series.
        fn_means, worker_mean = self.fn_means, self.mean_task
        short = task_depth(fn_means.get(self.queue[0].fn_id), worker_mean) > 1
        live = [
            p
            for p in self.processors.values()
            if p.eof_at is None
            and p.kill is None
            and not p.seceded
            and not p.retired
            and not p.recalling
            and (not short or takes_more(len(p.outstanding), now - p.head_since))
        ]
        self._pending_writes = {}
        try:
            for level in range(1, MAX_DEPTH + 1 if short else 2):
                for p in live:
                    while len(p.outstanding) < level and self.queue:
                        if self.max_tasks is not None and p.sent >= self.max_tasks:
                            break
                        task = self.queue[0]
                        if self.held.get(task.task_id) is not task:
                            self.queue.popleft()
                            continue  # cancelled while queued, or superseded by a newer attempt
                        if level > 1 and level > task_depth(fn_means.get(task.fn_id), worker_mean):
                            return  # every live processor holds as many as this task's kind may
                        self.queue.popleft()
                        self._run_on(p, task, now)
                    if not self.queue:
                        return
        finally:
            pending, self._pending_writes = self._pending_writes, None
            for p, frames in pending.items():
                p.send_frames(frames)

    def _run_on(self, p: Processor, task: m.TaskDispatch, now: float) -> None:
        fn_payload = None
        if task.fn_id and task.fn_id not in p.functions:
            fn_payload = self.functions.get(task.fn_id)
            if fn_payload is None:
                fn_payload = self.lanes.functions.get(task.fn_id)  # a lane task's
            p.functions.add(task.fn_id)
        p.outstanding.append(task.task_id)
        p.attempts[task.task_id] = task.attempt
        p.sent += 1
        if len(p.outstanding) == 1:
            p.head_since = now
        if len(p.outstanding) == 1 and task.task_timeout is not None:
            p.deadline = now + task.task_timeout
        blobs, fds, streams = handoff.blobs_for_run(self.fetches.for_run(task.task_id)) if self.fetch_objects else (None, [], [])
        (self._to_processor_with_fds if fds else self._to_processor)(
            p,
            msgpack.packb(
                [
                    proc.RUN,
                    task.task_id,
                    task.attempt,
                    task.fn_id,
                    fn_payload,
                    task.flags,
                    task.payload,
                    task.deps,
                    task.objects,
                    self.store_name,
                    self.threshold,
                    blobs,
                    [task.reply_to, self.name, self.lanes.path_for(task.reply_to, self.poller, task.authkey_file)]
                    if task.reply_to
                    else None,
                    task.authkey_file,
                    [self._capture_dir(), self.config.capture_output_limit] if task.flags & m.TaskFlags.CAPTURE else None,
                ],
                use_bin_type=True,
            ),
            *([fds] if fds else []),
        )
        for fd in streams:
            os.close(fd)  # the processor's end of an object's stream: sent, or it died

    def _hand_back(self, announce: bool = True) -> list[m.TaskAttempt]:
        """While draining: the tasks in our queue or parked for their objects never started,
        out of ``held`` and back to the daemon (a ``WorkerDraining`` in the outbox when
        ``announce``); lane tasks stay queued."""
        lane_tasks = self.lanes.tasks
        back: list[m.TaskAttempt] = []
        keep: deque[m.TaskDispatch] = deque()
        for task in self.queue:
            if self.held.get(task.task_id) is not task:
                continue  # cancelled while queued, superseded, or listed already
            if task.task_id in lane_tasks:
                keep.append(task)
                continue
            self._unhold(task.task_id)
            back.append(m.TaskAttempt(task.task_id, task.attempt))
        self.queue = keep
        for task_id in self.fetches.parked():
            back.append(m.TaskAttempt(task_id, self._unhold(task_id).attempt))
        if back and announce:
            self.outbox.append(m.WorkerDraining(back))
        return back
