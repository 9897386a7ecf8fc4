"""Prometheus ``/metrics``: a statistics snapshot in the text exposition format (0.0.4).

A pure function of one ``Statistics``: nothing here keeps state between scrapes, so a
departed worker's series are gone from the next scrape (Prometheus marks them stale) and a
scrape costs the daemon one snapshot, no more.  Every family has one ``# HELP``/``# TYPE``
pair and its own name: a counter ends in ``_total``, a unit is in the name (``_bytes``,
``_seconds``), and no family's name is another's plus a suffix Prometheus reserves
(``_total``, ``_count``, ``_sum``, ``_bucket``, ``_created``).  The table of families is in
docs/monitoring.rst; keep both in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scaler_executor.scheduler.stats import Statistics, WorkerStatistics

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (family, counter key in Statistics.counters, help): the daemon's monotonic counters.
COUNTERS = (
    ("scaler_tasks_submitted_total", "submitted", "Tasks submitted to the daemon."),
    ("scaler_tasks_retried_total", "retried", "Task attempts retried after a worker or processor was lost."),
    ("scaler_workers_lost_total", "workers_lost", "Workers declared lost (silent or dead)."),
    ("scaler_clients_lost_total", "clients_lost", "Clients lost without a goodbye."),
    ("scaler_messages_dropped_total", "dropped_messages", "Transmissions dropped undecoded or refused."),
)
OUTCOMES = (("finished", "finished"), ("failed", "failed"), ("cancelled", "cancelled"))
STORE = (
    ("scaler_object_store_bytes", "data_bytes", "Bytes of objects held in the daemon host's object store."),
    ("scaler_object_store_capacity_bytes", "capacity", "The object store's memory limit in bytes."),
    ("scaler_object_store_objects", "objects", "Objects held in the daemon host's object store."),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _family(out: list[str], name: str, kind: str, text: str, samples: Iterable[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {text}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        out.append(f"{name}{labels} {_number(value)}")


def _label(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def render(stats: Statistics) -> str:
    """The exposition text of ``stats`` (ends with a newline, as the format requires)."""
    c = stats.counters
    out: list[str] = []
    _family(
        out, "scaler_tasks", "gauge", "Tasks the daemon holds, by state.",
        ((_label(state=state), n) for state, n in sorted(stats.tasks_by_state.items())),
    )  # fmt: skip
    _family(
        out, "scaler_tasks_completed_total", "counter", "Tasks that ended, by outcome.",
        ((_label(outcome=outcome), int(c.get(key, 0))) for outcome, key in OUTCOMES),
    )  # fmt: skip
    for name, key, text in COUNTERS:
        _family(out, name, "counter", text, [("", int(c.get(key, 0)))])
    _family(out, "scaler_workers", "gauge", "Workers connected.", [("", len(stats.workers))])
    _family(out, "scaler_processors", "gauge", "Processors of the connected workers.", [("", int(c.get("processors", 0)))])
    _family(out, "scaler_clients", "gauge", "Clients connected.", [("", len(stats.clients))])
    _family(out, "scaler_uptime_seconds", "gauge", "Seconds since the daemon's first tick.", [("", float(stats.uptime))])
    if stats.windows:
        w = stats.windows[0]
        _family(
            out, "scaler_task_throughput", "gauge",
            f"Tasks ended per second over the last {w.seconds:g} seconds.", [("", float(w.throughput))],
        )  # fmt: skip
    durations = stats.durations
    out.append("# HELP scaler_task_duration_seconds Run time of the tasks that ran, as their workers timed it.")
    out.append("# TYPE scaler_task_duration_seconds histogram")
    for bound, n in durations.cumulative():
        le = "+Inf" if bound == float("inf") else repr(bound)
        out.append(f'scaler_task_duration_seconds_bucket{{le="{le}"}} {n}')
    out.append(f"scaler_task_duration_seconds_sum {_number(float(durations.total_seconds))}")
    out.append(f"scaler_task_duration_seconds_count {durations.count}")
    for name, key, text in STORE:
        if key in stats.store:
            _family(out, name, "gauge", text, [("", int(stats.store[key]))])
    workers = sorted(stats.workers, key=lambda w: w.name)
    per_worker: tuple[tuple[str, str, str, Callable[[WorkerStatistics], float | None]], ...] = (
        ("scaler_worker_tasks", "gauge", "Tasks at the worker (queued or running).", lambda w: w.tasks),
        ("scaler_worker_processors", "gauge", "Processors of the worker.", lambda w: w.processors),
        ("scaler_worker_last_heard_seconds", "gauge", "Seconds since the worker's last message.", lambda w: w.last_heard),
        (
            "scaler_worker_task_peak_memory_bytes", "gauge",
            "Peak private memory of the worker's last task, in bytes (absent until reported).", lambda w: w.peak_memory,
        ),
        (
            "scaler_worker_memory_bytes", "gauge",
            "Private memory of the worker's processors now, in bytes (absent until reported).", lambda w: w.memory,
        ),
        (
            "scaler_worker_memory_limit_bytes", "gauge",
            "The worker's memory limit for its processors, in bytes (absent: none).", lambda w: w.memory_limit,
        ),
        (
            "scaler_worker_cpu_cores", "gauge",
            "Cores the worker's processors kept busy between its last two heartbeats.", lambda w: w.cpu,
        ),
    )  # fmt: skip
    for name, kind, text, value in per_worker:
        samples = [(_label(worker=w.name, host=w.host), v) for w in workers if (v := value(w)) is not None]
        _family(out, name, kind, text, samples)
    _stores(out, stats, workers)
    _managers(out, stats)
    return "\n".join(out) + "\n"


SHARED = " Workers on one host share one store, so each of them reports the same store: sum scaler_store_* for a total, never these."


def _stores(out: list[str], stats: Statistics, workers: list[WorkerStatistics]) -> None:
    """Each worker's host store (labelled with the store), then each store once (``stores``)."""
    per_worker: tuple[tuple[str, str, Callable[[WorkerStatistics], int | None]], ...] = (
        ("scaler_worker_store_bytes", "Bytes allocated in the object store the worker maps (absent: it maps none).", lambda w: w.store_bytes),
        ("scaler_worker_store_capacity_bytes", "Capacity of the object store the worker maps, in bytes.", lambda w: w.store_capacity),
        ("scaler_worker_store_objects", "Objects in the object store the worker maps.", lambda w: w.store_objects),
    )  # fmt: skip
    for name, text, value in per_worker:
        samples = [
            (_label(worker=w.name, host=w.host, store=w.store), v) for w in workers if w.store and (v := value(w)) is not None
        ]
        _family(out, name, "gauge", text + SHARED, samples)
    stores = stats.stores
    per_store = (
        ("scaler_store_bytes", "Bytes allocated in each object store, counted once however many workers map it.", "bytes"),
        ("scaler_store_capacity_bytes", "Capacity of each object store in bytes, counted once.", "capacity"),
        ("scaler_store_objects", "Objects in each object store, counted once.", "objects"),
        ("scaler_store_workers", "Workers that map each object store.", ""),
    )
    for name, text, field in per_store:
        samples = [(_label(store=u.name), getattr(u, field) if field else len(u.workers)) for u in stores]
        _family(out, name, "gauge", text, samples)


MANAGED_STATES = ("requested", "starting", "running", "draining")


def _managers(out: list[str], stats: Statistics) -> None:
    """Each worker manager the snapshot lists (``Statistics.managers``), labelled by its name."""
    managers = stats.managers
    _family(
        out, "scaler_manager_connected", "gauge", "1 while the worker manager is connected, 0 after it left (kept while its counts are).",
        ((_label(manager=s.name, kind=s.kind), int(s.connected)) for s in managers),
    )  # fmt: skip
    _family(
        out, "scaler_manager_max_workers", "gauge", "Workers the manager offers at most (its last offer).",
        ((_label(manager=s.name), s.max_workers) for s in managers),
    )  # fmt: skip
    _family(
        out, "scaler_manager_workers", "gauge", "The manager's workers by state: requested, starting (pending), running, draining.",
        ((_label(manager=s.name, state=state), getattr(s, state)) for s in managers for state in MANAGED_STATES),
    )  # fmt: skip
    _family(
        out, "scaler_manager_pending_keys", "gauge", "Worker keys admitted for the manager whose worker has not joined.",
        ((_label(manager=s.name), s.pending_keys) for s in managers),
    )  # fmt: skip
    counters = (
        ("scaler_manager_workers_failed_total", "Workers that ended without being asked to stop, not by the infrastructure.", "failed"),
        ("scaler_manager_infrastructure_ends_total", "Workers ended by the infrastructure (preemption, walltime, scancel).", "infrastructure_ends"),
        ("scaler_manager_interrupted_tasks_total", "Tasks interrupted on the manager's workers and run again at no charge.", "interrupted_tasks"),
    )  # fmt: skip
    for name, text, field in counters:
        _family(out, name, "counter", text, ((_label(manager=s.name), getattr(s, field)) for s in managers))
