"""A joblib backend: ``joblib.Parallel`` on scaler-executor.

Importing this module registers the backend ``"scaler"`` (class :class:`ScalerBackend`)::

    import joblib
    import scaler_executor.joblib  # noqa: F401  (registers "scaler")

    with joblib.parallel_config("scaler", n_jobs=-1):
        results = joblib.Parallel()(joblib.delayed(f)(i) for i in range(100))

Works with joblib 1.4 and later (``apply_async`` before joblib 1.5, ``submit`` after).

Which cluster
-------------

``parallel_config("scaler", ...)`` takes these backend keywords:

* ``executor=ex``: run on that executor (a :class:`~scaler_executor.ScalerExecutor`, or any
  ``concurrent.futures.Executor``).  The backend never shuts it down.
* ``address="tcp://host:port"``: join that running ``scaler-daemon``.  One client per
  address per process, created on first use and reused by every later call.
* neither: **one embedded local cluster per process**, started on the first ``Parallel``
  call that needs it and reused by every later one (scikit-learn calls ``Parallel`` many
  times: the cluster's start-up is paid once).  It starts with as many processors as this
  process may use (``os.sched_getaffinity``), or ``n_jobs`` if that is larger.  If a later
  call asks for more ``n_jobs`` than it has, it is **resized**: a larger cluster replaces it
  for new work, and the old one is shut down once the calls still using it have finished
  (its outstanding tasks complete first).  It is never shrunk: a smaller ``n_jobs`` limits
  how many of *that call's* batches run at once instead.  :func:`shutdown` stops it (it is
  also registered with :mod:`atexit`); the next call starts a new one.
* ``max_retries``, ``priority``, ``task_timeout``: scheduling options for every task of the
  call, as ``ex.options(...)`` (``max_retries=0``: at-most-once; a batch whose process died
  on every attempt fails the call with :class:`~scaler_executor.WorkerLost`).
* ``wait_for_workers_timeout`` (seconds, default 10): with ``address=``, how long
  ``n_jobs=-1`` waits for the cluster to have a processor before raising ``TimeoutError``.

``n_jobs``
----------

* ``n_jobs=-1`` is the cluster's capacity: for the embedded cluster, its processors (at
  least the CPUs this process may use); for a running cluster, what the daemon reports
  (``ex.statistics()["processors"]``, asked at each call).  ``-2`` is one fewer, as in joblib.
  It is also the default: choosing this backend without ``n_jobs`` means the whole cluster.
* ``n_jobs=k`` runs at most ``k`` of the call's batches at a time (its other batches wait
  in this process, not in the cluster's queue), even on a larger shared cluster.
* ``n_jobs=1`` runs sequentially in the calling process, as with every joblib backend.

Failures
--------

A task's exception is re-raised by ``Parallel`` with its original type (its remote traceback
is its ``__cause__``).  When one batch fails, joblib calls :meth:`ScalerBackend.abort_everything`:
the call's batches that have not started are cancelled — *that call's only*: other
``Parallel`` calls and other users of the same executor are untouched, and the backend stays
usable.  Batches already running finish and their results are dropped (the executor has no
public way to kill a running task).  A process killed under a task is retried by the cluster
(``max_retries``, default 3) and then fails the future with ``WorkerLost``, which ``Parallel``
raises: it never hangs.  If the cluster is gone (``DaemonLost``, a ``BrokenExecutor``), the
call fails and the next call starts a fresh embedded cluster (or a fresh client).

Nested ``Parallel`` (inside a task)
-----------------------------------

Batches carry a copy of the backend (``get_nested_backend``; the backend is picklable and
drops its executor on the way).  A ``Parallel`` call made *inside a task* — by that copy, or
because the task's own code says ``parallel_config("scaler")`` — does **not** start an
embedded cluster of its own: it runs sequentially in the task's process (joblib's rule for
nested calls, with ``nesting_level`` one deeper).  Why:

* every task starting its own embedded cluster would fork a daemon and a set of processors
  per task, and a task of those would start another: a runaway recursion of clusters, each
  process oversubscribing the same CPUs;
* the outer call already keeps every processor busy, so the nested work gains nothing from
  more processes on the same machine;
* running them on the *same* cluster makes each waiting outer task secede, and the worker
  forks a processor per waiting task: with every processor busy with outer tasks, that
  doubles the processes on the same CPUs (the oversubscription joblib avoids).

With ``address=`` the nested calls run on that cluster.  A task running on that very
cluster reaches it through ``scaler_executor.get_executor()``, which *secedes* the task (the
worker starts another processor while it waits and hands back the tasks queued behind it),
so nested waits cannot deadlock; a task on another cluster joins ``address`` with a client.
The address must be spelled as the workers know it (``SCALER_DAEMON_ADDRESS`` in the task)
for the first case to apply.  :func:`_executor_for_nested_call` is the hook where an opt-in
mode can send nested calls without an address to the task's own cluster too.

Data
----

Each batch's functions and arguments are pickled (cloudpickle) and sent through the
cluster; joblib's memmapping options (``max_nbytes``, ``mmap_mode``, ``temp_folder``) do not
apply and are ignored.  Large arrays passed to many tasks are sent with each batch.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, Future
from functools import partial
from typing import Any

import joblib  # type: ignore[import-untyped]
from joblib._parallel_backends import (  # type: ignore[import-untyped]
    FallbackToBackend,
    SequentialBackend,
)
from joblib.parallel import AutoBatchingMixin, ParallelBackendBase  # type: ignore[import-untyped]

__all__ = ["ScalerBackend", "shutdown"]

BACKEND_NAME = "scaler"
_OPTION_NAMES = ("max_retries", "priority", "task_timeout")


# =========================================================================== clusters


class _Cluster:
    """One executor the module owns (the embedded cluster, or a client of an address)."""

    __slots__ = ("broken", "closed", "executor", "retired", "size", "users")

    def __init__(self, executor: Executor, size: int) -> None:
        self.executor = executor
        self.size = size  # processors (embedded); 0 for a client of an address
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


def _acquire_embedded(n_jobs: int) -> _Cluster:
    """The process-wide embedded cluster with at least ``n_jobs`` processors, leased."""
    global _embedded
    from scaler_executor.client.executor import ScalerExecutor

    with _lock:
        current = _embedded
        if current is None or current.broken or current.size < n_jobs:
            size = max(
                n_jobs,
                _default_size(),
                current.size if current is not None and not current.broken else 0,
            )
            replacement = _Cluster(ScalerExecutor(max_workers=size), size)
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


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_after_fork)


# =========================================================================== inside a task


def _in_task() -> bool:
    """True in a scaler-executor processor process (running a task, or its initializer)."""
    from scaler_executor import _compat

    return _compat.PROCESSOR is not None


def _executor_for_nested_call() -> Executor | None:
    """The hook for ``Parallel`` calls made inside a task with no ``address``/``executor``.

    None means: run them sequentially in the task's process (see the module docstring for
    why).  ``scaler_executor.get_executor()`` (the task's own cluster; it secedes the task,
    so waiting never deadlocks) is what an opt-in "nested calls use the cluster" mode would
    return here; the backend then runs the nested call on it like an ``executor=`` call.
    """
    return None


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


# =========================================================================== one Parallel call


class _BatchFuture(Future):  # type: ignore[type-arg]
    """What the backend hands joblib per batch: a Future with ``AsyncResult.get`` for joblib 1.4."""

    def get(self, timeout: float | None = None) -> Any:
        return self.result(timeout)


class _Call:
    """The batches of one ``Parallel`` call: at most ``limit`` submitted at once; abortable."""

    def __init__(self, backend: ScalerBackend, call_id: Any, limit: int) -> None:
        self.backend = backend
        self.call_id = call_id
        self.limit = max(1, limit)
        self.lock = threading.Lock()
        self.running = 0
        self.waiting: deque[tuple[_BatchFuture, Callable[[], Any]]] = deque()
        self.submitted: set[Future[Any]] = set()
        self.aborted = False

    def add(self, outer: _BatchFuture, batch: Callable[[], Any]) -> None:
        with self.lock:
            if self.aborted:
                launch = False
            elif self.running < self.limit:
                self.running += 1
                launch = True
            else:
                self.waiting.append((outer, batch))
                return
        if launch:
            self._launch(outer, batch)
        else:
            outer.cancel()

    def _launch(self, outer: _BatchFuture, batch: Callable[[], Any]) -> None:
        cluster = self.backend._cluster
        try:
            submitter = self.backend._submitter()
            inner = submitter.submit(batch)
        except BaseException as exc:  # noqa: BLE001  # broken/shut down executor: fail the batch, not hang
            if isinstance(exc, BrokenExecutor) and cluster is not None:
                _mark_broken(cluster)
            inner = Future()
            inner.set_exception(exc)
        with self.lock:
            self.submitted.add(inner)
        inner.add_done_callback(partial(self._done, outer, cluster))

    def _done(self, outer: _BatchFuture, cluster: _Cluster | None, inner: Future[Any]) -> None:
        with self.lock:
            self.submitted.discard(inner)
            self.running -= 1
            following = None
            if self.waiting and not self.aborted:
                following = self.waiting.popleft()
                self.running += 1
        if following is not None:
            self._launch(*following)
        if inner.cancelled():
            outer.cancel()
            return
        exc = inner.exception()
        if exc is None:
            outer.set_result(inner.result())
        else:
            if isinstance(exc, BrokenExecutor) and cluster is not None:
                _mark_broken(cluster)
            outer.set_exception(exc)

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            waiting = list(self.waiting)
            self.waiting.clear()
            submitted = list(self.submitted)
        for outer, _ in waiting:
            outer.cancel()
        for inner in submitted:
            inner.cancel()  # a queued task is dropped; a running one finishes, its result unused


# =========================================================================== the backend


class ScalerBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    """joblib's ``"scaler"`` backend; see the module docstring for the keywords and rules."""

    supports_retrieve_callback = True
    supports_timeout = True
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = -1

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        *,
        address: str | None = None,
        executor: Executor | None = None,
        max_retries: int | None = None,
        priority: int | None = None,
        task_timeout: float | None = None,
        wait_for_workers_timeout: float = 10.0,
    ) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        if address is not None and executor is not None:
            raise ValueError("give the scaler backend either address= or executor=, not both")
        if executor is not None and not hasattr(executor, "submit"):
            raise TypeError(
                f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}"
            )
        self.address = address
        self.executor = executor
        self.options = {
            name: value
            for name, value in (
                ("max_retries", max_retries),
                ("priority", priority),
                ("task_timeout", task_timeout),
            )
            if value is not None
        }
        self.wait_for_workers_timeout = wait_for_workers_timeout
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._leases: list[_Cluster] = []  # one per configure() not yet matched by terminate()
        self._cluster: _Cluster | None = None  # the newest lease: where new batches go
        self._view: tuple[Any, Any] | None = None  # (executor, its options view)
        self._calls: weakref.WeakKeyDictionary[Any, _Call] = weakref.WeakKeyDictionary()
        self._limits: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.parallel = None

    # ------------------------------------------------------------------ pickling

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors, locks and calls stay here; a copy (e.g. in a task) gets the settings only.
        return (
            _rebuild_backend,
            (type(self), self.nesting_level, self.inner_max_num_threads, self._settings()),
        )

    def _settings(self) -> dict[str, Any]:
        return {
            "address": self.address,
            **self.options,
            "wait_for_workers_timeout": self.wait_for_workers_timeout,
        }

    def __repr__(self) -> str:
        where = (
            f"executor={self.executor!r}"
            if self.executor is not None
            else f"address={self.address!r}"
            if self.address
            else "embedded"
        )
        return f"{type(self).__name__}({where}, nesting_level={self.nesting_level}, options={self.options})"

    # ------------------------------------------------------------------ where tasks go

    def _sequential_here(self) -> bool:
        """Inside a task with nothing to join: run sequentially (see the module docstring)."""
        return (
            self.executor is None
            and self.address is None
            and _in_task()
            and _executor_for_nested_call() is None
        )

    def _target_executor(self) -> Executor | None:
        """An executor the backend does not own (and never shuts down), or None."""
        if self.executor is not None:
            return self.executor
        if _in_task():
            return (
                _executor_for_nested_call()
                if self.address is None
                else _own_cluster_executor(self.address)
            )
        return None

    def _capacity(self) -> int:
        target = self._target_executor()
        if target is not None:
            return _capacity_of(target)
        if self.address is not None:
            cluster = _acquire_client(self.address)
            try:
                return _capacity_of(cluster.executor, self.wait_for_workers_timeout)
            finally:
                _release(cluster)
        with _lock:
            current = _embedded
            return max(
                current.size if current is not None and not current.broken else 0, _default_size()
            )

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if self._sequential_here():
            return 1
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:
            return max(self._capacity() + 1 + n_jobs, 1)
        return n_jobs

    def configure(
        self,
        n_jobs: int = 1,
        parallel: Any = None,
        prefer: Any = None,
        require: Any = None,
        **backend_kwargs: Any,
    ) -> int:
        """Called by joblib at the start of each ``Parallel`` call (or ``with Parallel(...)``)."""
        self.parallel = parallel
        if self._sequential_here():
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        if self._target_executor() is None:
            cluster = (
                _acquire_client(self.address)
                if self.address is not None
                else _acquire_embedded(n_jobs)
            )
            with self._lock:
                self._leases.append(cluster)
                self._cluster = cluster
        with self._lock:
            self._limits[parallel if parallel is not None else self] = n_jobs
        return n_jobs

    def _submitter(self) -> Any:
        executor = self._target_executor()
        if executor is None:
            with self._lock:
                cluster = self._cluster
            if cluster is None:
                raise RuntimeError(
                    "the scaler backend is not configured: use it through joblib.Parallel"
                )
            executor = cluster.executor
        if not self.options:
            return executor
        with self._lock:
            view = self._view
            if view is None or view[0] is not executor:
                if not hasattr(executor, "options"):
                    raise TypeError(
                        f"{', '.join(self.options)} need a ScalerExecutor, not {type(executor).__name__}"
                    )
                view = self._view = (executor, executor.options(**self.options))
            return view[1]

    def terminate(self) -> None:
        """End of a call (or of ``with Parallel(...)``): release its lease on the cluster."""
        with self._lock:
            cluster = self._leases.pop(0) if self._leases else None
            self._cluster = self._leases[-1] if self._leases else None
        if cluster is not None:
            _release(cluster)
        self.reset_batch_stats()

    # ------------------------------------------------------------------ batches

    def _call_for(self, callback: Any) -> _Call:
        parallel = getattr(callback, "parallel", None)
        if parallel is None:
            parallel = self.parallel
        key = parallel if parallel is not None else self
        call_id = getattr(callback, "parallel_call_id", None)
        with self._lock:
            call = self._calls.get(key)
            if call is None or call.call_id != call_id:
                limit = self._limits.get(key) or max(self.effective_n_jobs(-1), 1)
                call = self._calls[key] = _Call(self, call_id, limit)
            return call

    def submit(
        self, func: Callable[[], Any], callback: Callable[[Any], Any] | None = None
    ) -> _BatchFuture:
        """Run one batch (joblib >= 1.5); ``callback(future)`` runs when it is done."""
        future = _BatchFuture()
        if callback is not None:
            future.add_done_callback(callback)
        self._call_for(callback).add(future, func)
        return future

    def apply_async(
        self, func: Callable[[], Any], callback: Callable[[Any], Any] | None = None
    ) -> _BatchFuture:
        """Run one batch: the entry point of joblib < 1.5 (deprecated there since)."""
        return self.submit(func, callback)

    def retrieve_result_callback(self, out: Future[Any]) -> Any:
        return out.result()

    def retrieve_result(self, out: Future[Any], timeout: float | None = None) -> Any:
        """Used instead when ``supports_retrieve_callback`` is False (joblib >= 1.5)."""
        return out.result(timeout if self.supports_timeout else None)

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the outstanding batches of the aborting ``Parallel`` call only.

        joblib marks the failing call (``_aborting``) before calling this; other calls
        sharing this backend instance, and other users of the executor, keep running.  The
        backend stays usable whatever ``ensure_ready`` says (the cluster is shared).
        """
        with self._lock:
            calls = [
                call for key, call in self._calls.items() if getattr(key, "_aborting", key is self)
            ]
            if not calls and self.parallel is not None and self.parallel in self._calls:
                calls = [self._calls[self.parallel]]
        for call in calls:
            call.abort()

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int | None]:
        """What ``Parallel`` calls inside this call's tasks use: a copy of the settings, one level deeper.

        The executor is not passed on; there, without an ``address``, the copy runs
        sequentially (see the module docstring).
        """
        nested = type(self)(
            nesting_level=(self.nesting_level or 0) + 1,
            inner_max_num_threads=self.inner_max_num_threads,
            **self._settings(),
        )
        return nested, None


def _rebuild_backend(
    cls: type[ScalerBackend], nesting_level: int | None, inner: int | None, settings: dict[str, Any]
) -> ScalerBackend:
    return cls(nesting_level=nesting_level, inner_max_num_threads=inner, **settings)


joblib.register_parallel_backend(BACKEND_NAME, ScalerBackend)
