"""The clusters the joblib backend owns, and where a task's nested calls go.

One embedded local cluster per process (replaced when a call needs more processors or
another processor setup, shut down once its last call has left), one client per
``address=``, both leased to calls by ``ScalerBackend.configure`` and released by its
``terminate``; :func:`shutdown` stops them (also at exit).  The rules are in the
package's docstring (``scaler_executor.joblib``)."""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
from joblib.parallel import ParallelBackendBase  # type: ignore[import-untyped]

# How many embedded clusters deep this process is (a task starting a pool of its own starts
# one more); past loky's limit (LOKY_MAX_DEPTH, default 10) a new one is refused, as loky does.
_DEPTH_ENV = "JOBLIB_SCALER_CLUSTER_DEPTH"


# =========================================================================== clusters


class _Cluster:
    """One executor the module owns (the embedded cluster, or a client of an address)."""

    __slots__ = ("broken", "closed", "executor", "retired", "setup", "size", "users")

    def __init__(self, executor: Executor, size: int, setup: bytes = b"") -> None:
        self.executor = executor
        self.size = size  # processors (embedded); 0 for a client of an address
        self.setup = setup  # the processors' initializer and thread limits, pickled
        self.users = 0  # Parallel calls between configure() and terminate()
        self.retired = False  # replaced; shut down when the last user leaves
        self.broken = False  # failed with a BrokenExecutor: never handed out again
        self.closed = False


_lock = threading.RLock()
_embedded: _Cluster | None = None
_retired: list[_Cluster] = []
_clients: dict[str, _Cluster] = {}


def _default_size() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _Setup:
    """How the backend's own processors start: thread limits, then the user's initializer."""

    __slots__ = ("initargs", "initializer", "inner_max_num_threads")

    def __init__(
        self,
        initializer: Callable[..., object] | None,
        initargs: tuple[Any, ...],
        inner_max_num_threads: int | None,
    ) -> None:
        self.initializer = initializer
        self.initargs = initargs
        self.inner_max_num_threads = inner_max_num_threads

    def key(self) -> bytes:
        """Equal for the same initializer, initargs and thread limit (what picks the cluster)."""
        key: bytes = cloudpickle.dumps(
            (self.initializer, self.initargs, self.inner_max_num_threads), protocol=5
        )
        return key


def _start_processor(
    environment: dict[str, str],
    initializer: Callable[..., object] | None,
    initargs: tuple[Any, ...],
) -> None:
    """The embedded cluster's initializer: loky's worker environment, then the user's."""
    os.environ.update(environment)
    if initializer is not None:
        initializer(*initargs)


def _check_depth(depth: int) -> None:
    from joblib.externals.loky import process_executor  # type: ignore[import-untyped]

    limit = int(process_executor.MAX_DEPTH)
    if 0 < limit < depth:
        raise RuntimeError(
            f"could not start an embedded scaler cluster at nesting depth {depth}, beyond "
            f"MAX_DEPTH={limit} (loky's limit on nested pools); if this is intended, raise it "
            "with the LOKY_MAX_DEPTH environment variable"
        )


def _acquire_embedded(n_jobs: int, setup: _Setup, backend: ParallelBackendBase) -> _Cluster:
    """The process-wide embedded cluster with at least ``n_jobs`` processors and ``setup``, leased."""
    global _embedded
    from scaler_executor.client.executor import ScalerExecutor

    key = setup.key()
    depth = int(os.environ.get(_DEPTH_ENV, "0")) + 1
    with _lock:
        current = _embedded
        usable = current is not None and not current.broken
        if current is None or not usable or current.size < n_jobs or current.setup != key:
            size = max(
                n_jobs,
                _default_size(),
                current.size if current is not None and usable and current.setup == key else 0,
            )
            # joblib's own rule for loky's workers (ParallelBackendBase._prepare_worker_env:
            # inner_max_num_threads, else the variable's value here, else cpu_count() //
            # n_jobs), given the processors as n_jobs: one cluster serves calls of every n_jobs.
            environment = dict(backend._prepare_worker_env(n_jobs=size))
            environment[_DEPTH_ENV] = str(depth)
            _check_depth(depth)
            executor = ScalerExecutor(
                max_workers=size,
                initializer=_start_processor,
                initargs=(environment, setup.initializer, setup.initargs),
            )
            replacement = _Cluster(executor, size, key)
            if current is not None:
                _retire(current)
            _embedded = current = replacement
        current.users += 1
        return current


def _acquire_client(address: str) -> _Cluster:
    from scaler_executor.client.executor import ScalerExecutor

    with _lock:
        client = _clients.get(address)
        if client is None or client.broken:
            if client is not None:
                _retire(client)
            client = _clients[address] = _Cluster(ScalerExecutor(address=address), 0)
        client.users += 1
        return client


def _retire(cluster: _Cluster) -> None:
    """Stop handing ``cluster`` out; shut it down once its last user has left.  Holds ``_lock``."""
    if cluster.retired:
        return
    cluster.retired = True
    _retired.append(cluster)
    if cluster.users == 0:
        _close(cluster, wait=False)


def _release(cluster: _Cluster) -> None:
    with _lock:
        cluster.users -= 1
        if cluster.retired and cluster.users == 0:
            _close(cluster, wait=False)


def _mark_broken(cluster: _Cluster) -> None:
    global _embedded
    with _lock:
        if cluster.broken:
            return
        cluster.broken = True
        if _embedded is cluster:
            _embedded = None
        for address, client in list(_clients.items()):
            if client is cluster:
                del _clients[address]
        _retire(cluster)


def _close(cluster: _Cluster, wait: bool) -> None:
    # wait=False: outstanding futures still complete, then the cluster stops in the background.
    if not cluster.closed or wait:
        cluster.closed = True
        cluster.executor.shutdown(wait=wait, cancel_futures=wait)


def shutdown(wait: bool = True) -> None:
    """Shut down the process-wide embedded cluster and the clients of ``address=`` clusters.

    Pending tasks are cancelled.  Executors passed with ``executor=`` are left alone, and so
    are running clusters joined by address (only this process's connection closes).  The
    next ``Parallel`` call starts a new embedded cluster.  Registered with :mod:`atexit`.
    """
    global _embedded
    with _lock:
        clusters = [c for c in (_embedded, *_clients.values(), *_retired) if c is not None]
        _embedded = None
        _clients.clear()
        _retired.clear()
    for cluster in clusters:
        cluster.retired = True
        _close(cluster, wait=wait)


def _forget_after_fork() -> None:
    """In a forked child, the parent's executors are not ours to use or to stop."""
    global _lock, _embedded, _retired, _clients
    _lock = threading.RLock()
    _embedded = None
    _retired = []
    _clients = {}


def _embedded_size() -> int:
    """The processors a call with ``n_jobs=-1`` gets from the embedded cluster (started or not)."""
    with _lock:
        current = _embedded
        return max(
            current.size if current is not None and not current.broken else 0, _default_size()
        )


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_after_fork)


# =========================================================================== inside a task


def _in_task() -> bool:
    """True in a scaler-executor processor process (running a task, or its initializer)."""
    from scaler_executor import _compat

    return _compat.PROCESSOR is not None


def _own_cluster_executor(address: str) -> Executor | None:
    """Inside a task on the cluster at ``address``: ``get_executor()``, which secedes the task.

    Joining its own cluster with a plain client could deadlock (the nested tasks may wait
    behind their parent on its processor); ``get_executor`` hands those back and frees the
    task's slot.  None when the task runs on another cluster (or the package has no
    ``get_executor``): the nested call then joins ``address`` with a client.
    """
    try:
        from scaler_executor._compat import DAEMON_ADDRESS_ENV
        from scaler_executor.client.executor import get_executor
    except ImportError:  # pragma: no cover - older package
        return None
    if os.environ.get(DAEMON_ADDRESS_ENV) != address:
        return None
    return get_executor()


def _capacity_of(executor: Any, wait_for_workers: float = 0.0) -> int:
    """The number of processors behind ``executor`` (waiting up to ``wait_for_workers`` for one)."""
    statistics = getattr(executor, "statistics", None)
    if statistics is None:
        workers = getattr(executor, "_max_workers", None)
        return int(workers) if workers else _default_size()
    deadline = time.monotonic() + wait_for_workers
    while True:
        processors = int(statistics().get("processors", 0))
        if processors > 0:
            return processors
        if time.monotonic() >= deadline:
            if wait_for_workers:
                raise TimeoutError(
                    f"the scaler cluster at {getattr(executor, 'address', '?')} has no processor after "
                    f"{wait_for_workers} s; start workers (scaler-worker ADDRESS) or raise "
                    f"parallel_config('scaler', wait_for_workers_timeout=...)"
                )
            return 1
        time.sleep(0.1)
