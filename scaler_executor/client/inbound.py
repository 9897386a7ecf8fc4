"""The daemon's messages to a client: one handler per message type.

``DaemonMessages.table`` maps each type the daemon may send a client to its handler,
the way ``scheduler/loop.py`` dispatches; the agent loop (``agent.py``) looks a message
up there and calls it, on the agent thread, holding ``ClientAgent._io``.  A handler
runs no user code: results go to the ``Completer``'s pool threads, running notices for
a few tasks are applied here (``RUNNING_INLINE``), failures break the agent.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from scaler_executor.client import serialization as ser
from scaler_executor.client.completion import RUNNING
from scaler_executor.client.events import Acknowledged, Answered, DaemonResults, Posted, Welcomed
from scaler_executor.client.no_worker import warn_no_worker
from scaler_executor.client.remote_store import RemoteStore, RemoteStoreError
from scaler_executor.client.state import (
    FETCH_OBJECTS,
    HISTORY,
    PARTS_TAKEN,
    RESULT_PARTS_TAKEN,
    STATS,
)
from scaler_executor.exceptions import DaemonLost, InitializerFailed
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Parts, StreamError
from scaler_executor.protocol.rejoin import is_not_resumable, is_unknown_peer

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent

log = logging.getLogger("scaler_executor.client")

# Running notices for at most this many tasks are applied by the agent thread (marking a
# future running calls no callback); handing each to a pool thread woke it once per notice,
# about 80 us of CPU per task of 12 ms on the 2-core VM.  Larger ones go to the pool, so
# the agent thread is not held up by a long loop.
RUNNING_INLINE = 64



class ObjectsFetch(Future[dict[bytes, Any]]):
    """A fetch of objects through the daemon (``ObjectRequest``), settled by the ``ObjectData``
    that ends its answer: the objects by id. For a read as a stream (``stream_id``: one
    object), ``early`` is settled sooner, by the object's ``Parts`` at its first part
    (``agent._object_started``)."""

    def __init__(self, stream_id: bytes | None) -> None:
        super().__init__()
        self.stream_id = stream_id
        self.early: Future[Parts] = Future()


class DaemonMessages:
    """The handlers of one client agent for what its daemon sends."""

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.table: dict[type, Callable[[Any, list[Any]], None]] = {
            m.TaskResults: self._on_results,
            m.TasksRunning: self._on_running,
            m.SubmitAck: self._on_ack,
            m.TasksCancelled: agent.cancels.answered,
            m.Welcome: self._on_welcome,
            m.ObjectData: self._on_object_data,
            m.ObjectPart: self._on_object_part,
            m.ObjectStored: self._on_object_stored,
            m.ResultPart: self._on_result_part,
            m.ResultStreamEnded: lambda message, _buffers: agent.pushed.drop(message.object_id, message.reason),
            m.Stats: self._on_stats,
            m.History: self._on_history,
            m.ClusterBroken: self._on_cluster_broken,
            m.Refused: self._on_refused,
            m.Goodbye: self._on_goodbye,
            m.Heartbeat: self._on_heartbeat,
            m.TasksWithoutWorker: self._on_tasks_without_worker,
        }

    def _on_results(self, message: m.TaskResults, _buffers: list[Any]) -> None:
        self.agent.core.handle(DaemonResults(message.results))  # (no command: counts for a journal)
        self.agent.take_results(message.results)

    def _on_running(self, message: m.TasksRunning, _buffers: list[Any]) -> None:
        if len(message.task_ids) <= RUNNING_INLINE:
            self.agent.completion.mark_running(message.task_ids)  # runs no user code: no thread woken for it
        else:
            self.agent.completer.put(RUNNING, message.task_ids)

    def _on_ack(self, message: m.SubmitAck, _buffers: list[Any]) -> None:
        with self.agent.lock:
            self.agent.core.handle(Acknowledged(message.count))  # (no command: this turn's tick sends more)

    def _on_welcome(self, message: m.Welcome, _buffers: list[Any]) -> None:
        # The daemon judges our liveness by its settings, not ours.
        interval = min(self.agent.config.heartbeat_interval, message.heartbeat_interval)
        with self.agent.lock:
            commands = self.agent.core.handle(Welcomed(message, interval))
        if commands:  # it answers our Resume: the report goes before anything the outbox holds
            log.warning("client: resumed with the daemon at %s after its restart", self.agent.address)
            # Objects the dead daemon was sending us in parts are asked again (the report's
            # requests): what came of them goes.  Puts it was receiving cannot be resumed.
            self.agent.incoming.clear()
            self.agent.pushed.clear()
            if self.agent.remote_store is not None:
                self.agent.remote_store.fail_all(RemoteStoreError(
                    "the daemon restarted (docs/durability.rst) while this object was being put "
                    "from this host: put it again"
                ))
            self.agent.execute(commands)
            if message.object_store != getattr(self.agent.packer.store, "name", message.object_store):
                self._attach_store(message.object_store)  # (objects in the old region are gone)
        self.agent.daemon.welcomed = True
        self.agent.welcome.set()
        if self.agent.listener is not None:
            self.agent.listener.welcomed(message.heartbeat_interval)
        self.agent.daemon.heartbeat_interval = interval
        self._attach_store(message.object_store)

    def _on_object_part(self, message: m.ObjectPart, buffers: list[Any]) -> None:
        self.agent.incoming.part(message, buffers[0] if buffers else b"")
        self.agent.core.handle(Posted(PARTS_TAKEN, 1))  # the daemon's window moves on (WAKE: this turn's tick)

    def _on_result_part(self, message: m.ResultPart, buffers: list[Any]) -> None:
        self.agent.pushed.part(message, buffers[0] if buffers else b"")
        self.agent.core.handle(Posted(RESULT_PARTS_TAKEN, 1))  # the daemon's window moves on (WAKE: this turn's tick)

    def _on_object_data(self, message: m.ObjectData, buffers: list[Any]) -> None:
        data = iter(buffers)
        got: dict[bytes, Any] = {}
        failed: BaseException | None = None
        for oid, ok in zip(message.object_ids, message.found, strict=False):
            if ok:
                try:
                    # bytes, views of large frames (wire.recv) or of what came in parts: not copied here
                    got[oid] = self.agent.incoming.take(oid, next(data, b""))
                except StreamError as exc:
                    failed = exc
        self.agent.core.handle(Answered(FETCH_OBJECTS))
        if self.agent.fetch_waiters:
            waiter = self.agent.fetch_waiters.popleft()
            missing = [oid.hex() for oid, ok in zip(message.object_ids, message.found, strict=False) if not ok]
            if failed is not None:
                waiter.set_exception(failed)
            elif missing:
                waiter.set_exception(LookupError(f"objects no longer in the store: {missing}"))
            else:
                waiter.set_result(got)

    def _on_object_stored(self, message: m.ObjectStored, _buffers: list[Any]) -> None:
        if self.agent.remote_store is not None:
            self.agent.remote_store.stored(message)

    def _on_stats(self, message: m.Stats, _buffers: list[Any]) -> None:
        self.agent.core.handle(Answered(STATS))
        if self.agent.stats_waiters:
            # Imported when first asked for: no start-up cost for a client that never asks.
            from scaler_executor.scheduler.stats import Statistics

            self.agent.stats_waiters.popleft().set_result(Statistics.from_message(message))

    def _on_history(self, message: m.History, _buffers: list[Any]) -> None:
        self.agent.core.handle(Answered(HISTORY))
        if self.agent.history_waiters:
            self.agent.history_waiters.popleft().set_result(message)

    def _on_cluster_broken(self, message: m.ClusterBroken, _buffers: list[Any]) -> None:
        self.agent.break_with(_initializer_failed(message))

    def _on_refused(self, message: m.Refused, _buffers: list[Any]) -> None:
        if is_unknown_peer(message.reason) and not is_not_resumable(message.reason) and self.agent.resume.journal:
            # Policy (d): the daemon restarted on its journal; the refusals of what we sent
            # before our Resume follow it, and are ignored.
            if not self.agent.resume.resuming:
                log.warning("client: the daemon at %s restarted; resuming on its journal", self.agent.address)
                self.agent.daemon.welcomed = False  # the outbox waits for its Welcome
                self.agent.daemon.send([self.agent.resume.start(time.monotonic())])
            return
        if is_not_resumable(message.reason):
            self.agent.break_with(DaemonLost(
                f"the daemon at {self.agent.address} restarted and cannot resume this client ({message.reason}); "
                "its pending tasks are lost"
            ))
            return
        if is_unknown_peer(message.reason):  # policy (c) of protocol/rejoin.py: its tasks are gone
            self.agent.break_with(DaemonLost(
                f"the daemon at {self.agent.address} no longer knows this client: it restarted without a "
                f"journal, or dropped the client after client_timeout; its pending tasks are lost"
            ))
            return
        self.agent.break_with(DaemonLost(f"the daemon at {self.agent.address} refused this client: {message.reason}"))

    def _on_goodbye(self, message: m.Goodbye, _buffers: list[Any]) -> None:
        self.agent.break_with(DaemonLost(f"the daemon at {self.agent.address} stopped ({message.reason})"))

    def _on_heartbeat(self, message: m.Heartbeat, _buffers: list[Any]) -> None:
        pass  # any message counts: DaemonRoute.last_recv is set for each transmission

    def _on_tasks_without_worker(self, message: m.TasksWithoutWorker, _buffers: list[Any]) -> None:
        warn_no_worker(message, self.agent.address, self.agent.cluster is not None)


    def _attach_store(self, name: str) -> None:
        if name:
            try:
                from scaler_executor.objstore import ObjectStore

                self.agent.packer.store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
            except Exception as exc:  # noqa: BLE001 - another host: objects travel through the daemon
                log.info("client cannot map the object store %s (%s): objects travel over the network", name, exc)
                self.agent.remote_store = self.agent.packer.store = RemoteStore(self.agent, name)
        self.agent.packer.store_ready.set()


def _initializer_failed(message: m.ClusterBroken) -> InitializerFailed:
    error = InitializerFailed(f"{message.reason}; the executor is broken (as ProcessPoolExecutor's would be)")
    if message.payload:
        error.__cause__ = ser.rebuild_exception(message.payload)
    return error
