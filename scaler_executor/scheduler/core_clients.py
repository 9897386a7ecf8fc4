"""The client controller, a layer of the core (core.py): functions and options a client
registers, its submissions checked and queued, and a client lost with what it owned.
"""

from __future__ import annotations

import logging
from typing import Any

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import DEFAULT_OPTIONS as DEFAULT
from scaler_executor.protocol.messages import TaskFlags
from scaler_executor.scheduler.core_events import CLIENT_FLAGS, ID_MASK, NO_CLIENT, NONE
from scaler_executor.scheduler.core_workers import WorkerController
from scaler_executor.scheduler.state import ClientRecord, TaskRecord, constraint_key

log = logging.getLogger("scaler_executor.daemon")


class ClientController(WorkerController):
    """What clients register and submit, and losing them."""

    def _on_register_function(self, peer: bytes, message: m.RegisterFunction) -> None:
        """Ids belong to their owner: a client registers only ids under its own prefix
        (``client_id << TASK_ID_BITS``), and never over one already registered, so no
        client can make another's tasks run a callable of its choosing."""
        client = self.clients[peer]
        fn_id = message.fn_id
        if fn_id >> m.TASK_ID_BITS != client.client_id or not fn_id & ID_MASK:
            self._refuse(peer, "register-function", f"function id {fn_id:#x} is not this client's")
            return
        if fn_id in self.functions or fn_id in client.functions:
            self._refuse(peer, "register-function", f"function id {fn_id:#x} is registered already")
            return
        self.functions[fn_id] = message.payload
        client.functions.add(fn_id)

    def _no_journal(self, peer: bytes, message: Any) -> None:
        self._refuse(peer, type(message).__name__, "this daemon has no journal (scaler-daemon --journal)")

    def _on_release_functions(self, peer: bytes, message: m.ReleaseFunctions) -> None:
        client = self.clients[peer]
        for fn_id in message.fn_ids:
            if fn_id in client.functions:
                client.functions.discard(fn_id)
                self._release_function(fn_id)
            elif fn_id in self.functions and fn_id >> m.TASK_ID_BITS != client.client_id:
                # (One of its own it released already, tasks still referring to it: a
                # release sent twice, e.g. again after a restart, changes nothing.)
                self._refuse(peer, "release-functions", f"function id {fn_id:#x} is not this client's")

    def _on_register_options(self, peer: bytes, message: m.RegisterOptions) -> None:
        self.clients[peer].options[message.options_id] = message.options

    def _on_submit(self, peer: bytes, message: m.SubmitTasks) -> None:
        client = self.clients[peer]
        options_table = client.options
        tasks = self.tasks
        ready = self.ready
        owned = client.tasks
        refs = self.function_refs
        credited = 0  # a REPLY_DIRECT task is not in the client's submit window: no ack
        direct_unacked = not self.ACK_DIRECT  # (but under a journal: durable.py)
        for spec in message.tasks:
            if spec.flags & TaskFlags.REPLY_DIRECT and direct_unacked:
                credited += 1
            options = options_table.get(spec.options_id)
            if spec.task_id in tasks or spec.task_id >> m.TASK_ID_BITS != client.client_id:
                self._reject_spec(peer, spec, f"task id {spec.task_id:#x} is reused or not this client's")
                continue
            if spec.flags & ~CLIENT_FLAGS:
                # ON_LANE marks the daemon's own record of a lane task (never dispatched or
                # answered): a submitted one would be neither, and its dependents would hang.
                self._reject_spec(peer, spec, f"task flags {spec.flags:#x} are not a client's to set")
                continue
            if options is None:
                self._reject_spec(peer, spec, f"options record {spec.options_id} was never registered")
                continue
            if spec.fn_id and (spec.fn_id not in self.functions or spec.fn_id not in client.functions):
                self._reject_spec(peer, spec, f"function {spec.fn_id:#x} was never registered by this client or was released")
                continue
            deps = spec.deps
            if deps:
                if spec.task_id in deps:
                    self._reject_spec(peer, spec, f"task {spec.task_id:#x} depends on itself")
                    continue
                if len(deps) > 1 and len(set(deps)) < len(deps):
                    deps = list(dict.fromkeys(deps))  # each dependency once (f(x, x) of a future x)
            key = constraint_key(options.resources, options.tags) if options is not DEFAULT else None
            if key is not None and self.config.unsatisfiable_timeout == 0 and not self._satisfiable(key):
                self._reject_spec(peer, spec, self._unsatisfiable_text(key))
                continue
            task = TaskRecord(
                spec.task_id, peer, spec.fn_id, options, spec.flags, spec.payload, spec.objects or NONE,
                deps or NONE, spec.parent, self.state_counts,
            )
            tasks[spec.task_id] = task
            owned.add(spec.task_id)
            if spec.flags & TaskFlags.LANE_RETRY:  # its first attempt, on a worker's lane, did not end
                task.attempt = 1
                task.failures = ["attempt 1: on a worker's lane: the process running it died, or the worker left"]
            if spec.objects:
                self._hold(spec.objects)
            if spec.fn_id:
                refs[spec.fn_id] = refs.get(spec.fn_id, 0) + 1
            if deps and not self._link(task):
                continue  # answered (a dependency was gone) or waiting for its dependencies
            if key is None:
                ready.push(task)
            else:
                task.queue_key = key
                task.queued_at = self._now
                self._queue(task)
        n = len(message.tasks)
        self.counters["submitted"] += n
        if n > credited:
            self._acks[peer] = self._acks.get(peer, 0) + n - credited

    def _lose_client(self, client: ClientRecord, why: str, clean: bool = False) -> None:
        """A client is gone: its tasks are cancelled and what it held freed.  ``clean``: it
        said Goodbye (``clients_left``), else it was lost (``clients_lost``)."""
        log.info(
            "client %r %s (%s); cancelling its %d tasks", client.name, "left" if clean else "lost", why, len(client.tasks)
        )
        self.counters["clients_left" if clean else "clients_lost"] += 1
        if not clean:
            self.recorder.event(self._now, "client-lost", why, where=client.name)
        del self.clients[client.peer]
        self._served.pop(client.peer, None)
        self._end_puts(client.peer)
        self.stats_barrier.client_lost(client.peer)
        self._end_object_sends(client.peer)
        self.result_streams.client_lost(client.peer)
        for task_id in list(client.tasks):
            task = self.tasks.get(task_id)
            if task is not None:
                self._cancel(task, force=False)
                if task_id in self.tasks:
                    # Still at a worker (cancelling): it belongs to no client now, so a client
                    # that joins again on the same connection gets neither its result nor a say.
                    task.client = NO_CLIENT
        for fn_id in list(client.functions):
            self._release_function(fn_id)
        for object_id, count in client.objects.items():
            self._drop([object_id] * count)
        client.objects.clear()
        self.last_sent.pop(client.peer, None)
        self._out.pop(client.peer, None)
        self._results.pop(client.peer, None)
        self._running.pop(client.peer, None)
        self._acks.pop(client.peer, None)
        self.no_worker.forget_client(client.peer)
