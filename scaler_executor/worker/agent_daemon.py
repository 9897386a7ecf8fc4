"""The worker agent's daemon side, a layer of the agent (agent.py): the handshake and
rejoining, what the daemon sends (one handler per message type), and what goes to it.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.rejoin import idle_heartbeat, is_not_resumable, is_unknown_peer
from scaler_executor.worker import processor as proc
from scaler_executor.worker.agent_processors import ProcessorSide
from scaler_executor.worker.lanes import Lane

log = logging.getLogger("scaler_executor.worker")


class DaemonSide(ProcessorSide):
    """The connection to the daemon: the handshake, its messages in, ours out."""

    def _hello(self) -> None:
        self.last_hello = time.monotonic()
        self.next_hello = self.last_hello + self.rejoin.next_delay()
        hello = m.Hello(
            m.Role.WORKER,
            m.PROTOCOL_VERSION,
            python_version(),
            cloudpickle.__version__,
            __version__,
            self.name,
            os.getpid(),
            socket.gethostname(),
            self.capacity,
            self.resources,
            self.tags,
        )
        self._send_now([hello])

    def _send_now(self, batch: list[object]) -> None:
        # At most SEND_BATCH_MESSAGES a transmission (the daemon refuses a batch over
        # codec.MAX_BATCH_MESSAGES): an outbox that grew while the daemon did not read can
        # hold more.
        step = codec.SEND_BATCH_MESSAGES
        for start in range(0, len(batch), step):
            try:
                self.sock.send(codec.encode(batch[start : start + step] if len(batch) > step else batch))
            except channel.Again:
                # The daemon is not keeping up (or not there): keep the rest for the next turn.
                self.outbox[:0] = batch[start:]
                return
            self.last_send = time.monotonic()
            if self.resume.journal:
                self.resume.sent(batch[start : start + step])

    def _on_daemon(self) -> None:
        sock, handlers = self.sock, self._daemon_handlers
        while sock.readable():
            try:
                frames = sock.recv()
            except channel.Again:
                return
            self.last_recv = time.monotonic()
            try:
                messages, buffers = codec.decode(frames)
            except codec.DecodeError as exc:
                log.warning("worker %s: dropped a bad transmission from the daemon: %s", self.name, exc)
                continue
            self._frames_of_last_message = buffers
            for message in messages:
                handler = handlers.get(type(message))
                if handler is None:
                    self._on_unexpected(message)
                else:
                    handler(message)
            # By the batch's last message, not the loop variable: an empty batch (which the
            # codec accepts) left that unbound, and the UnboundLocalError stopped the worker.
            if messages and type(messages[-1]) is not m.DispatchTasks:
                self.next_housekeeping = 0.0

    def _on_lane(self, lane: Lane) -> None:
        now = time.monotonic()
        for item in self.lanes.receive(lane, self.held, now):
            if type(item) is m.TaskDispatch:
                self.last_busy = now
                self.queue.append(item)
            elif type(item) is m.CancelTasks:
                self._cancel(item.task_ids, item.force)
            else:
                self._forget_functions(item.fn_ids)

    def _forget_functions(self, fn_ids: list[int]) -> None:
        """Processors that have any of these callables drop them, unless the daemon's table
        still has them (a lane released one the daemon also sent)."""
        ids = [fn_id for fn_id in fn_ids if fn_id not in self.functions]
        for fn_id in ids:
            self.fn_means.pop(fn_id, None)
        if ids:
            forget = msgpack.packb([proc.FORGET, ids])
            for p in self.processors.values():
                if p.eof_at is None and not p.functions.isdisjoint(ids):
                    p.functions.difference_update(ids)
                    self._to_processor(p, forget)

    # One handler per message type the daemon sends a worker (_on_daemon looks them up in
    # self._daemon_handlers, filled in WorkerAgent.__init__); any other type is dropped
    # (_on_unexpected).

    def _on_dispatch(self, message: m.DispatchTasks) -> None:
        self.last_busy = self.last_recv
        for blob in message.functions:
            self.functions[blob.fn_id] = blob.payload
        if not self.fetch_objects:
            for task in message.tasks:
                self.held[task.task_id] = task
                self.queue.append(task)
            return
        request: list[bytes] = []
        for task in message.tasks:
            self.held[task.task_id] = task
            # (a draining worker hands it back: nothing to fetch)
            need = self.fetches.hold(task.task_id, () if self.draining else self._object_ids_of(task))
            request += need.request
            if need.ready:
                self.queue.append(task)  # (else parked until its objects arrive)
        if request:
            self.outbox.append(m.ObjectRequest(request))

    def _on_cancel_tasks(self, message: m.CancelTasks) -> None:
        self._cancel(message.task_ids, message.force)

    def _on_release_functions(self, message: m.ReleaseFunctions) -> None:
        ids = message.fn_ids
        for fn_id in ids:
            self.functions.pop(fn_id, None)
        self._forget_functions(ids)  # a lane task still queued gets it again from lanes.functions

    def _on_welcome(self, message: m.Welcome) -> None:
        self.daemon_store = message.object_store
        resumed = self.resume.welcomed(message)
        if self.welcomed and not resumed:
            # The answer to a repeated Hello: the daemon treated it as joining again and took
            # back what it had given us under the first Welcome.
            log.info("worker %s: welcomed again (a repeated Hello); discarding what it held", self.name)
            self._forget_daemon_state()
        self.welcomed = True
        self.runlog.resize(message.runs)
        self.rejoin.reset()
        self._reach_store(message.object_store)
        # Send at least as often as the daemon expects; judge its silence by its own pace.
        self.heartbeat_interval = min(self.config.heartbeat_interval, message.heartbeat_interval)
        self.idle_heartbeat = max(self.heartbeat_interval, idle_heartbeat(message.heartbeat_interval, message.heartbeat_liveness))
        self.daemon_silence_limit = max(
            self.config.heartbeat_interval * self.config.heartbeat_liveness,
            message.heartbeat_interval * message.heartbeat_liveness,
            self.config.daemon_loss_timeout,  # a daemon holding 10^6 tasks may pause to collect garbage
            self.resume.silence_limit(message.heartbeat_interval, message.heartbeat_liveness),
        )
        if resumed:
            self.orphaned = False  # its region is the restarted daemon's now: not ours to remove
            log.warning("worker %s resumed with the daemon at %s after its restart", self.name, self.address)
            # Not lane tasks (lanes.py): never the daemon's (a restarted one has no record of
            # them, and would cancel them as strays); they run on for their clients.
            lane_tasks = self.lanes.tasks
            holding = [m.TaskAttempt(t, task.attempt) for t, task in self.held.items() if t not in lane_tasks]
            # Finished and not sent yet: in the outbox (made while we waited) or still collecting.
            waiting = [r for message in self.outbox if type(message) is m.TaskResults for r in message.results]
            self._send_now(self.resume.report(holding, waiting + self.results))
            return
        log.info("worker %s joined the daemon at %s as worker %d", self.name, self.address, message.peer_id)

    def _on_refused(self, message: m.Refused) -> None:
        reason = message.reason
        if is_unknown_peer(reason):
            if is_not_resumable(reason):
                if self.welcomed or self.resume.resuming:
                    self.resume.forget()
                    self.welcomed = True  # (for _rejoin: the loss is logged once)
                    self._rejoin(f"the daemon at {self.address} cannot resume this worker ({reason})")
            elif self.resume.resuming:
                pass  # the refusals of what we sent before our Resume
            elif self.welcomed and (resume := self.resume.start()) is not None:
                log.warning("worker %s: the daemon at %s restarted; resuming on its journal", self.name, self.address)
                self.welcomed = False  # what we have to say waits for its Welcome
                self.next_hello = time.monotonic() + self.rejoin.next_delay()
                self._send_now([resume])
            elif self.welcomed:  # once per loss: the refusals of what we sent before our Hello follow
                self._rejoin(f"the daemon at {self.address} does not know this worker (restarted without a journal?)")
        else:
            log.error("worker %s: the daemon refused it: %s", self.name, reason)
            self.exit_code = 2
            self.stopping = True

    def _on_goodbye(self, message: m.Goodbye) -> None:
        log.info("worker %s: the daemon is stopping (%s)", self.name, message.reason)
        if self.lifeline_fd is not None or self.draining:
            self.stopping = True
        else:
            self._forget_daemon_state()

    def _on_object_stored(self, message: m.ObjectStored) -> None:
        if message.error:  # the result it held is lost: its client hears that reading it
            log.warning("worker %s: the daemon could not store a result: %s", self.name, message.error)

    def _offload(self, results: list[m.TaskResult]) -> list[m.TaskResult]:
        """Large results of processors that cannot map the store, streamed to the daemon's
        store in chunks (``ObjectChunk``, zero-copy frames) and sent as store headers, so
        that no message carries them whole: msgpack copies a 100 MB field into the body,
        and the daemon and the client would each decode and copy it again."""
        out = []
        for result in results:
            payload = result.payload
            if result.objects or result.status != Status.OK or len(payload) < max(self.threshold, m.OBJECT_CHUNK_BYTES):
                out.append(result)
                continue
            from scaler_executor.objstore.payload import stream_in_store_header

            object_id, view, step = os.urandom(16), memoryview(payload), m.OBJECT_CHUNK_BYTES
            for offset in range(0, len(view), step):
                # Naming the task: the daemon forwards each chunk to its client as it comes.
                chunk = m.ObjectChunk(object_id, offset, len(view), result.task_id, result.attempt)
                self.raw_out.append(codec.encode([chunk], [view[offset : offset + step]]))
            out.append(result._replace(payload=stream_in_store_header(), objects=[object_id]))
        return out

    def _send_raw(self) -> bool:
        """Send the chunks waiting in ``raw_out``; False if the daemon's queue is full."""
        while self.raw_out:
            try:
                self.sock.send(self.raw_out[0])
            except channel.Again:
                return False
            self.raw_out.popleft()
            self.last_send = time.monotonic()
        return True

    def _on_heartbeat(self, message: m.Heartbeat) -> None:
        pass  # only a sign of life: _on_daemon noted the time the transmission came

    def _on_unexpected(self, message: object) -> None:
        """A message the codec decodes but a worker has no use for (one meant for a client or
        the daemon): logged and dropped, a sign of life only, never a reason to stop."""
        log.warning("worker %s: dropped a %s from the daemon: not a message for a worker", self.name, type(message).__name__)

    def _rejoin(self, why: str) -> None:
        """The link to the daemon is lost (logged once here): discard, and join again empty."""
        if self.draining:  # nothing it runs is expected any more, and it was leaving anyway
            log.warning("worker %s: %s while draining; stopping", self.name, why)
            self.stopping = True
            return
        log.warning(
            "worker %s: %s; discarding its %d tasks and joining again (stopping after %.0f s "
            "without a daemon: worker_daemon_loss_timeout)",
            self.name, why, len(self.held), self.config.worker_daemon_loss_timeout,
        )
        self._forget_daemon_state()
        self.rejoin.reset()
        self._hello()
