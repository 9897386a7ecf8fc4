"""The object controller, a layer of the core (core.py): who holds each object of the store,
puts and fetches over the network, large results streamed on to their clients, and the
statistics and history a peer asks for.
"""

from __future__ import annotations

import logging
from typing import Any

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TaskFlags
from scaler_executor.scheduler.core_base import CoreBase
from scaler_executor.scheduler.core_events import (
    MONITOR_HISTORY_SECONDS,
    AbortPuts,
    SendObjects,
    StoreChunk,
)
from scaler_executor.scheduler.history import history_message
from scaler_executor.scheduler.object_stream import EndObjectSends

log = logging.getLogger("scaler_executor.daemon")


class ObjectController(CoreBase):
    """Objects and the requests that read them."""

    def _hold(self, object_ids: list[bytes]) -> None:
        holds = self.object_holds
        for object_id in object_ids:
            holds[object_id] = holds.get(object_id, 0) + 1

    def _drop(self, object_ids: list[bytes]) -> None:
        holds = self.object_holds
        for object_id in object_ids:
            left = holds.get(object_id, 0) - 1
            if left > 0:
                holds[object_id] = left
            else:
                holds.pop(object_id, None)
                self._deletions.append(object_id)

    def _client_holds(self, peer: bytes, object_ids: list[bytes]) -> None:
        owned = self.clients[peer].objects
        for object_id in object_ids:
            owned[object_id] = owned.get(object_id, 0) + 1
        self._hold(object_ids)

    def _on_pin_objects(self, peer: bytes, message: m.PinObjects) -> None:
        self._client_holds(peer, message.object_ids)

    def _on_release_objects(self, peer: bytes, message: m.ReleaseObjects) -> None:
        owned = self.clients[peer].objects
        released = []
        for object_id in message.object_ids:
            count = owned.get(object_id, 0)
            if count > 0:
                if count == 1:
                    del owned[object_id]
                else:
                    owned[object_id] = count - 1
                released.append(object_id)
        self._drop(released)

    def _on_object_request(self, peer: bytes, message: m.ObjectRequest) -> None:
        self._fetchers.add(peer)
        self._commands.append(SendObjects(peer, tuple(message.object_ids)))

    def _end_object_sends(self, peer: bytes) -> None:
        """A peer that ever asked for objects is gone: the loop drops what it still had to send."""
        if peer in self._fetchers:
            self._fetchers.discard(peer)
            self._commands.append(EndObjectSends(peer))

    def _end_puts(self, peer: bytes) -> None:
        """A peer that streamed puts is gone: the loop aborts those it had not finished."""
        if peer in self._putters:
            self._putters.discard(peer)
            self._commands.append(AbortPuts(peer))

    def _on_object_chunk(self, peer: bytes, message: m.ObjectChunk) -> None:
        if not message.task_id:  # a put
            self._putters.add(peer)  # (its unfinished puts are aborted when it is lost)
            self._commands.append(StoreChunk(peer, message.object_id, message.offset, message.total))
            return
        if peer not in self.workers:
            self._refuse(peer, "result-chunk", "only a worker streams a task's result")
            return
        # A large result: stored, and forwarded to the task's client as it comes while the
        # task is this worker's attempt and its client wants the result.
        task = self.tasks.get(message.task_id)
        client = b""
        if (
            task is not None and task.worker == peer and task.attempt == message.attempt
            and not task.flags & TaskFlags.NO_RESULT and task.client in self.clients
        ):  # fmt: skip
            client = task.client
        forward, ended = self.result_streams.chunk(peer, message, client)
        self._streams_ended(ended)
        self._commands.append(StoreChunk(peer, message.object_id, message.offset, message.total, forward, message.task_id))
        if client and not forward:  # behind: parts it missed, from the store, if its window has room
            self._pump_results(client)

    def _on_result_parts_taken(self, peer: bytes, message: m.ResultPartsTaken) -> None:
        self.result_streams.taken(peer, message.parts)
        self._pump_results(peer)

    def _pump_results(self, client: bytes) -> None:
        """Parts of ``client``'s result streams that fell behind, from the store (ForwardStored)."""
        streams = self.result_streams
        before = streams.forwarded
        self._commands.extend(streams.pump(client))
        self.counters["result_streams_forwarded"] += streams.forwarded - before

    def _streams_ended(self, ended: list[Any]) -> None:
        """Tell each client whose result stream stopped early to drop its parts."""
        for end in ended:
            self.counters["result_streams_stopped"] += 1
            self._send(end.client, m.ResultStreamEnded(end.object_id, end.reason))

    def _on_history_request(self, peer: bytes, message: m.HistoryRequest) -> None:
        if peer not in self._monitors:
            self._send(peer, history_message(self))  # built on request: O(runs kept + buckets)
            return
        cached = self._monitor_history
        if cached is None or self._now - cached[0] >= MONITOR_HISTORY_SECONDS:
            cached = self._monitor_history = (self._now, history_message(self))
        if any(message is cached[1] for message in self._out.get(peer, ())):
            return  # one answer per monitor per turn, however many it asked for
        self._send(peer, cached[1])

    def _on_stats_request(self, peer: bytes, message: m.StatsRequest) -> None:
        if peer in self._monitors and peer in self._stats_wanted:
            return  # one answer per monitor per turn, however many it asked for
        client = self.clients.get(peer)
        if client is not None:  # its snapshot counts the lane results it had (stats_barrier.py)
            flush = self.stats_barrier.ask(peer, client.client_id, message.lanes, self.workers.values(), self._now)
            if flush is not None:
                for worker in flush:
                    self._send(worker, m.LaneFlush())
                return  # held: answered in _flush once those workers' LaneDone came
        self._stats_wanted.append(peer)  # answered in _flush, after this turn's dispatch
