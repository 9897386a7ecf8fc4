"""The executors ``compare.py`` puts side by side: one adapter per contestant.

An adapter says how to make an executor with N worker processes, submit one
call, map over an iterable with a chunk size, and shut down (waiting).  It
imports its package only in :meth:`Contestant.load`, so that ``cold_start`` can
time the first import in a fresh interpreter, and so that a contestant whose
package is missing is skipped with a note instead of failing the run.

To add a contestant: subclass :class:`Contestant`, fill in ``name``,
``modules`` and ``pip``, override what differs from the
``concurrent.futures.Executor`` defaults, and decorate it with
:func:`contestant`.  Optional peers are listed in ``bench/requirements-peers.txt``;
they are never dependencies of the project.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
from collections.abc import Callable, Iterable, Iterator
from typing import Any

REFERENCE = "scaler"  # the contestant every ratio is taken against

CONTESTANTS: dict[str, Contestant] = {}


def contestant(cls: type[Contestant]) -> type[Contestant]:
    CONTESTANTS[cls.name] = cls()
    return cls


class Contestant:
    name = ""  # short name used on the command line and in tables
    label = ""  # what the table's reader should understand
    modules: tuple[str, ...] = ()  # imported by load(); find_spec'd by missing()
    pip = ""  # how to install it, for the skip note

    def missing(self) -> str | None:
        """Why this contestant cannot run here, or None (checked without importing it)."""
        absent = [m for m in self.modules if importlib.util.find_spec(m.split(".")[0]) is None]
        if absent:
            return f"{', '.join(absent)} not installed (pip install {self.pip}, see bench/requirements-peers.txt)"
        return None

    def load(self) -> None:
        """Import what a user imports to use the contestant (timed by cold_start: imports only).

        Resolves the names a user's ``from X import Y`` would, since a package may
        import its modules lazily on first attribute access (scaler_executor does).
        """
        self.mods = {m: importlib.import_module(m) for m in self.modules}
        self.entry = {name: getattr(self.mods[m], name) for m, name in self.entry_points}

    entry_points: tuple[tuple[str, str], ...] = ()  # (module, attribute) pairs load() resolves

    def versions(self) -> dict[str, str]:
        return {}

    def create(self, workers: int) -> Any:
        raise NotImplementedError

    def submit(self, ex: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """A future with ``result()``."""
        return ex.submit(fn, *args)

    def map(
        self, ex: Any, fn: Callable[..., Any], iterable: Iterable[Any], chunksize: int
    ) -> Iterator[Any]:
        return ex.map(fn, iterable, chunksize=chunksize)  # type: ignore[no-any-return]

    def shutdown(self, ex: Any) -> None:
        ex.shutdown(wait=True)

    # Optional capabilities, used by the object and graph workloads.  ``None`` means the
    # contestant has no such mechanism: the workload reports "n/a" for that metric.
    put_via: str | None = None  # how put() places a value once for many tasks
    graph_via: str | None = None  # how graph_get() runs a Dask-style graph

    def put(self, ex: Any, value: Any) -> Any:
        """Place ``value`` once with the system's own mechanism; a handle tasks receive as the value."""
        raise NotImplementedError(f"{self.name} has no put/scatter mechanism")

    def graph_get(self, ex: Any, dsk: dict[Any, Any], key: Any) -> Any:
        """Compute ``key`` of the Dask-format graph ``dsk``."""
        raise NotImplementedError(f"{self.name} does not run task graphs")

    def gather(self, ex: Any, futures: list[Any]) -> list[Any]:
        """Every future's result, in order (a contestant with a bulk call uses it)."""
        return [f.result() for f in futures]

    def abandon(self, ex: Any, futures: list[Any]) -> None:
        """Give up on ``futures`` before shutdown: cancel those that have not started."""
        for f in futures:
            f.cancel()

    def known_tasks(self, ex: Any) -> int | None:
        """Unfinished tasks the scheduler has received, where submit() only queues a message.

        None: submit() hands the task over before returning (concurrent.futures' pools
        keep pending work in the caller's process), so there is nothing to wait for.
        """
        return None

    def _ensure_loaded(self) -> None:
        if not hasattr(self, "mods"):
            self.load()


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        # e.g. pyzmq in a peers environment: the embedded cluster talks over Unix
        # sockets and imports zmq only for tcp:// addresses, so it runs without it.
        return "not installed"
    except Exception:  # noqa: BLE001  (a version is informative, never essential)
        return "?"


@contestant
class Scaler(Contestant):
    name = "scaler"
    label = "ScalerExecutor (embedded cluster: daemon + worker)"
    modules = ("scaler_executor",)
    entry_points = (("scaler_executor", "ScalerExecutor"),)
    pip = "-e ."

    def versions(self) -> dict[str, str]:
        self._ensure_loaded()
        return {
            "scaler-executor": self.mods["scaler_executor"].__version__,
            "cloudpickle": _version("cloudpickle"),
            "pyzmq": _version("pyzmq"),
            "msgpack": _version("msgpack"),
        }

    def create(self, workers: int) -> Any:
        self._ensure_loaded()
        return self.entry["ScalerExecutor"](max_workers=workers)

    put_via = "ex.put(value)"
    graph_via = "ex.get(dsk, key)"

    def put(self, ex: Any, value: Any) -> Any:
        return ex.put(value)

    def graph_get(self, ex: Any, dsk: dict[Any, Any], key: Any) -> Any:
        return ex.get(dsk, key)

    def known_tasks(self, ex: Any) -> int | None:
        return int(ex.statistics()["tasks"])


@contestant
class ProcessPool(Contestant):
    name = "process_pool"
    label = "concurrent.futures.ProcessPoolExecutor"
    modules = ("concurrent.futures",)
    entry_points = (("concurrent.futures", "ProcessPoolExecutor"),)  # lazily imports .process
    pip = "(standard library)"

    def load(self) -> None:
        super().load()
        import multiprocessing

        self.start_method = multiprocessing.get_start_method()

    def versions(self) -> dict[str, str]:
        self._ensure_loaded()
        return {"python": platform.python_version(), "start method": self.start_method}

    def create(self, workers: int) -> Any:
        self._ensure_loaded()
        return self.entry["ProcessPoolExecutor"](max_workers=workers)


@contestant
class Loky(Contestant):
    name = "loky"
    label = "loky.ProcessPoolExecutor"
    modules = ("loky",)
    entry_points = (("loky", "ProcessPoolExecutor"),)
    pip = "loky"

    def versions(self) -> dict[str, str]:
        self._ensure_loaded()
        return {"loky": self.mods["loky"].__version__, "cloudpickle": _version("cloudpickle")}

    def create(self, workers: int) -> Any:
        self._ensure_loaded()
        return self.entry["ProcessPoolExecutor"](max_workers=workers)


@contestant
class Dask(Contestant):
    """dask.distributed's native Client on a LocalCluster of N single-threaded worker processes.

    The native ``Client.submit``/``Client.map`` rather than ``Client.get_executor()``:
    that is how Dask is used for speed (the executor facade adds a thread hop per
    future).  ``pure=False`` so equal calls are not deduplicated into one task.
    ``Client.map`` has no chunksize: chunks are sent as ``apply_chunk`` tasks.
    """

    name = "dask"
    label = "dask.distributed Client on LocalCluster (processes, 1 thread each)"
    modules = ("dask", "distributed")
    entry_points = (("distributed", "Client"), ("distributed", "LocalCluster"))
    pip = "'dask[distributed]'"

    def versions(self) -> dict[str, str]:
        self._ensure_loaded()
        return {
            "dask": self.mods["dask"].__version__,
            "distributed": self.mods["distributed"].__version__,
        }

    def create(self, workers: int) -> Any:
        self._ensure_loaded()
        cluster = self.entry["LocalCluster"](
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",  # loopback only
            dashboard_address=None,
            silence_logs=40,  # logging.ERROR
        )
        return self.entry["Client"](cluster)

    def submit(self, ex: Any, fn: Callable[..., Any], *args: Any) -> Any:
        return ex.submit(fn, *args, pure=False)

    def map(
        self, ex: Any, fn: Callable[..., Any], iterable: Iterable[Any], chunksize: int
    ) -> Iterator[Any]:
        from functools import partial

        from bench.workloads import apply_chunk, chunks

        items = list(iterable)
        if chunksize == 1:
            return iter(ex.gather(ex.map(fn, items, pure=False)))
        pieces = chunks(items, chunksize)
        futures = ex.map(partial(apply_chunk, fn), pieces, pure=False)
        return (x for chunk in ex.gather(futures) for x in chunk)

    def shutdown(self, ex: Any) -> None:
        cluster = ex.cluster
        ex.close()
        cluster.close()

    put_via = "client.scatter(value, broadcast=True)"
    graph_via = "client.get(dsk, key)"

    def put(self, ex: Any, value: Any) -> Any:
        return ex.scatter(value, broadcast=True)

    def graph_get(self, ex: Any, dsk: dict[Any, Any], key: Any) -> Any:
        return ex.get(dsk, key)

    def known_tasks(self, ex: Any) -> int | None:
        return int(ex.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)))

    def gather(self, ex: Any, futures: list[Any]) -> list[Any]:
        return ex.gather(futures)  # type: ignore[no-any-return]

    def abandon(self, ex: Any, futures: list[Any]) -> None:
        # Nothing: closing the client (in shutdown) drops its tasks in about a second
        # for 10,000 pending, while client.cancel() or releasing the futures makes
        # the scheduler transition them one by one, in time that grows faster than
        # their number (minutes for 50,000 on 2 cores).
        pass


class _RayFuture:
    """An ``ObjectRef`` with the ``result()``, ``done()`` and ``cancel()`` the workloads call."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def result(self) -> Any:
        import ray

        return ray.get(self.ref)

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)

    def cancel(self) -> bool:
        import ray

        ray.cancel(self.ref)
        return True


@contestant
class Ray(Contestant):
    """Ray's own API on a local Ray started by ``ray.init(num_cpus=N)``: N worker processes.

    ``ray.remote(fn)`` once per function, ``f.remote(*args)`` per call, ``ray.get`` for
    results (one call for a list). Ray's map has no chunksize: chunks are
    ``apply_chunk`` tasks, as for Dask. Dask graphs run through Ray's own Dask scheduler,
    ``ray.util.dask.ray_dask_get``.
    """

    name = "ray"
    label = "Ray (ray.init(num_cpus=N), remote functions, ray.get)"
    modules = ("ray",)
    entry_points = (("ray", "init"),)
    pip = "ray"

    def versions(self) -> dict[str, str]:
        self._ensure_loaded()
        return {"ray": self.mods["ray"].__version__}

    def create(self, workers: int) -> Any:
        import os

        self._ensure_loaded()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray = self.mods["ray"]
        ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        self.remotes: dict[Any, Any] = {}
        return ray

    def _remote(self, fn: Callable[..., Any]) -> Any:
        remote = self.remotes.get(fn)
        if remote is None:
            remote = self.remotes[fn] = self.mods["ray"].remote(fn)
        return remote

    def submit(self, ex: Any, fn: Callable[..., Any], *args: Any) -> Any:
        return _RayFuture(self._remote(fn).remote(*args))

    def map(
        self, ex: Any, fn: Callable[..., Any], iterable: Iterable[Any], chunksize: int
    ) -> Iterator[Any]:
        from bench.workloads import apply_chunk, chunks

        items = list(iterable)
        if chunksize == 1:
            remote = self._remote(fn)
            return iter(ex.get([remote.remote(x) for x in items]))
        pieces = chunks(items, chunksize)
        remote = self._remote(apply_chunk)  # ray.remote takes functions, not partials
        return (x for chunk in ex.get([remote.remote(fn, c) for c in pieces]) for x in chunk)

    def shutdown(self, ex: Any) -> None:
        ex.shutdown()

    put_via = "ray.put(value)"
    graph_via = "ray.util.dask.ray_dask_get(dsk, key)"

    def put(self, ex: Any, value: Any) -> Any:
        return ex.put(value)  # an ObjectRef passed as an argument arrives as the value

    def graph_get(self, ex: Any, dsk: dict[Any, Any], key: Any) -> Any:
        from ray.util.dask import ray_dask_get

        return ray_dask_get(dsk, key)

    def gather(self, ex: Any, futures: list[Any]) -> list[Any]:
        return ex.get([f.ref for f in futures])  # type: ignore[no-any-return]

    def abandon(self, ex: Any, futures: list[Any]) -> None:
        pass  # ray.shutdown() (in shutdown) drops pending tasks; cancelling 50,000 one by one is slow


@contestant
class OpengrisScaler(Contestant):
    """The reference system, opengris-scaler: ``SchedulerClusterCombo(n_workers=N)`` (a
    scheduler and N workers) and its ``Client``. Its map has no chunksize (chunks are
    ``apply_chunk`` tasks); its graphs take string keys, so the benchmark's tuple keys are
    renamed (inside the timing: it is part of using that interface)."""

    name = "opengris_scaler"
    label = "opengris-scaler (SchedulerClusterCombo + Client)"
    modules = ("scaler",)
    entry_points = (("scaler", "Client"), ("scaler", "SchedulerClusterCombo"))
    pip = "opengris-scaler"

    def versions(self) -> dict[str, str]:
        return {"opengris-scaler": _version("opengris-scaler")}

    def create(self, workers: int) -> Any:
        self._ensure_loaded()
        cluster = self.entry["SchedulerClusterCombo"](
            n_workers=workers, logging_level="ERROR", logging_paths=("/dev/null",)
        )
        client = self.entry["Client"](address=cluster.get_address())
        client._bench_cluster = cluster
        return client

    def map(
        self, ex: Any, fn: Callable[..., Any], iterable: Iterable[Any], chunksize: int
    ) -> Iterator[Any]:
        from functools import partial

        from bench.workloads import apply_chunk, chunks

        items = list(iterable)
        if chunksize == 1:
            return iter(ex.map(fn, items))
        pieces = chunks(items, chunksize)
        return (x for chunk in ex.map(partial(apply_chunk, fn), pieces) for x in chunk)

    def shutdown(self, ex: Any) -> None:
        cluster = ex._bench_cluster
        ex.disconnect()
        cluster.shutdown()

    put_via = "client.send_object(value)"
    graph_via = "client.get(graph, [key])"

    def put(self, ex: Any, value: Any) -> Any:
        return ex.send_object(value)

    def graph_get(self, ex: Any, dsk: dict[Any, Any], key: Any) -> Any:
        # Its graphs name every argument of a call: keys become strings, literals data nodes.
        names = {k: f"k{i}" for i, k in enumerate(dsk)}
        graph: dict[str, Any] = {}
        for k, (fn, *args) in dsk.items():
            refs = []
            for a in args:
                name = names.get(a) if isinstance(a, (str, tuple)) else None
                if name is None:
                    name = f"v{len(graph)}"
                    graph[name] = a
                refs.append(name)
            graph[names[k]] = (fn, *refs)
        return ex.get(graph, [names[key]])[names[key]]

    def abandon(self, ex: Any, futures: list[Any]) -> None:
        pass  # shutting the cluster down (in shutdown) drops them
