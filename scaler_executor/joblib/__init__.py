"""A joblib backend: ``joblib.Parallel`` on scaler-executor.

Importing this module registers the backend ``"scaler"`` (class :class:`ScalerBackend`)::

    import joblib
    import scaler_executor.joblib  # noqa: F401  (registers "scaler")

    with joblib.parallel_config("scaler", n_jobs=-1):
        results = joblib.Parallel()(joblib.delayed(f)(i) for i in range(100))

Works with joblib 1.4 and later (``apply_async`` before joblib 1.5, ``submit`` after); the
suite runs its joblib tests under 1.4.x, 1.5.x and the installed release.

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
  call asks for more ``n_jobs`` than it has, or for another ``initializer``/``initargs`` or
  ``inner_max_num_threads``, it is **replaced**: a new cluster takes new work, and the old
  one is shut down once the calls still using it have finished (its outstanding tasks
  complete first) — as loky restarts its reusable executor when these change.  It is never
  shrunk: a smaller ``n_jobs`` limits how many of *that call's* batches run at once.
  :func:`shutdown` stops it (also registered with :mod:`atexit`); the next call starts anew.
* ``initializer=f, initargs=(...)`` (joblib 1.5's process-backend parameters, also taken
  under joblib 1.4): ``f(*initargs)`` runs once in every processor of the embedded cluster
  before its first task, replacements included, as with loky.  If it raises, the call fails
  with :class:`~scaler_executor.InitializerFailed` and the next call starts a new cluster.
  With ``executor=`` or ``address=`` the processors are not the backend's to start: it
  raises ``ValueError`` (give the initializer to ``ScalerExecutor(initializer=...)`` or to
  ``scaler-worker --initializer``).
* ``max_retries``, ``priority``, ``task_timeout``: scheduling options for every task of the
  call, as ``ex.options(...)`` (``max_retries=0``: at-most-once; a batch whose process died
  on every attempt fails the call with :class:`~scaler_executor.WorkerLost`).
* ``wait_for_workers_timeout`` (seconds, default 10): with ``address=``, how long
  ``n_jobs=-1`` waits for the cluster to have a processor before raising ``TimeoutError``.
* ``nested="joblib"`` (default) or ``"cluster"``: what ``Parallel`` calls inside tasks use
  (see below).

``n_jobs``
----------

* ``n_jobs=-1`` is the cluster's capacity: for the embedded cluster, its processors (at
  least the CPUs this process may use); for a running cluster, what the daemon reports
  (``ex.statistics()["processors"]``, asked at each call).  ``-2`` is one fewer, as in joblib.
  It is also the default: choosing this backend without ``n_jobs`` means the whole cluster.
* ``n_jobs=k`` runs at most ``k`` of the call's batches at a time (its other batches wait
  in this process, not in the cluster's queue), even on a larger shared cluster.
* ``n_jobs=1`` runs sequentially in the calling process, as with every joblib backend.

What joblib passes to process backends
--------------------------------------

* ``inner_max_num_threads`` (``parallel_config``): as loky, the embedded cluster's
  processors get ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``BLIS_NUM_THREADS``, ``VECLIB_MAXIMUM_THREADS``, ``NUMBA_NUM_THREADS`` and
  ``NUMEXPR_NUM_THREADS`` set to it (and ``ENABLE_IPC=1`` for TBB unless set), before the
  initializer and the first task.  Without it each variable is this process's value if set,
  else ``cpu_count() // processors`` (at least 1): loky's rule, with the cluster's processors
  for ``n_jobs`` since one cluster serves calls of every ``n_jobs``.  With ``executor=`` or
  ``address=`` an explicit value raises ``ValueError`` (set the variables in the workers'
  environment) and nothing is set.
* ``max_nbytes`` and ``mmap_mode`` (loky's automatic memory mapping): NumPy arrays among a
  task's arguments (at any depth of lists, tuples and dicts) larger than ``max_nbytes``
  (default ``"1M"``) arrive as with loky's ``mmap_mode``: ``"r"`` (the default) read-only,
  ``"c"`` writable and private to the task; arrays up to ``max_nbytes``, and every array with
  ``max_nbytes=None``, arrive as writable copies.  Large arrays still travel through the
  shared-memory object store once, not through files.  ``"r+"`` and ``"w+"`` (writes shared
  through the file) cannot be kept: the call raises ``ValueError``.
* ``temp_folder``: not used — nothing is memory-mapped from files (the store lives in
  shared memory), so no folder is created, as with joblib's thread-based backend.
* ``prefer``/``require``: joblib applies them before the backend is chosen (this backend
  declares no shared memory, so ``require="sharedmem"`` runs in threads, as for loky).
* ``verbose``: joblib's own progress messages work as with every backend; the value
  joblib hands the backend (``verbose - 50``) drives loky's memory-mapping debug output,
  which has nothing to report here.
* ``context`` (the multiprocessing start method): processors are forked by the cluster's
  worker, not by :mod:`multiprocessing`; it does not apply.
* Any other keyword (e.g. loky's ``idle_worker_timeout`` through ``Parallel(...)``) raises
  ``TypeError``, as an unknown keyword does with loky and multiprocessing.

Failures
--------

A task's exception is re-raised by ``Parallel`` with its original type (its remote traceback
is its ``__cause__``); the backend passes it on unchanged.  When one batch fails, joblib calls
:meth:`ScalerBackend.abort_everything`: the call's batches that have not started are
cancelled — *that call's only*: other ``Parallel`` calls and other users of the same
executor are untouched, and the backend stays usable.  Batches already running finish and
their results are dropped (the executor has no public way to kill a running task).  A
process killed under a task is retried by the cluster (``max_retries``, default 3) and then
fails the future with ``WorkerLost``, which ``Parallel`` raises: it never hangs.  If the
cluster is gone (``DaemonLost``, a ``BrokenExecutor``), the call fails and the next call
starts a fresh embedded cluster (or a fresh client).

Nested ``Parallel`` (inside a task)
-----------------------------------

``nested="joblib"`` (the default) follows joblib's rules, as loky does for the same program:

* A ``Parallel`` call inside a task with no configuration of its own uses joblib's
  ``ThreadingBackend`` at nesting level 1 (``n_jobs`` defaults to 1 there, so
  ``Parallel()`` runs sequentially and ``Parallel(n_jobs=2)`` in two threads of the task's
  process; ``effective_n_jobs(-1)`` is the CPU count), and ``SequentialBackend`` deeper.
* A task that says ``parallel_config("scaler")`` itself gets what ``parallel_config("loky")``
  gets under loky: a pool of its own — an embedded cluster started by the task's process on
  first use and kept for that process's life (as loky's nested executor), at the nesting
  level of the task's backend.  Like loky, it refuses to start one from a thread of a nested
  call inside a task (``n_jobs`` becomes 1 with a warning); outside tasks, threads share the
  process's embedded cluster at any level.  Clusters nested deeper than loky's ``MAX_DEPTH``
  (``LOKY_MAX_DEPTH``, default 10) are refused with ``RuntimeError``, as loky refuses pools.
* Under ``parallel_config("scaler", n_jobs=1)`` the call runs sequentially in the calling
  process at level 0, and a ``Parallel`` call inside it uses the scaler backend again.

``nested="cluster"`` is the explicit choice to send nested calls back to the cluster: the
tasks' ``Parallel`` calls get a copy of the backend one level deeper, whose tasks go to the
cluster the task runs on through ``scaler_executor.get_executor()``.  That *secedes* the
waiting task (the worker starts another processor and hands back the tasks queued behind
it), so nested waits cannot deadlock — but each waiting task keeps its process, so a full
cluster of waiting outer tasks doubles the processes on the same CPUs, which joblib's rule
avoids.  ``n_jobs=-1`` there is the cluster's capacity.  With ``address=`` the copies join
that address (seceding when it is the task's own cluster, spelled as the workers know it:
``SCALER_DAEMON_ADDRESS`` in the task).
"""

from __future__ import annotations

import sys
import threading
import warnings
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

# The clusters the backend leases to calls, and where a task's nested calls go: clusters.py.
from scaler_executor.joblib.clusters import (
    _acquire_client,
    _acquire_embedded,
    _capacity_of,
    _Cluster,
    _embedded_size,
    _in_task,
    _mark_broken,
    _own_cluster_executor,
    _release,
    _Setup,
    shutdown,
)

__all__ = ["ScalerBackend", "shutdown"]

BACKEND_NAME = "scaler"
_OPTION_NAMES = ("max_retries", "priority", "task_timeout")
NESTED_MODES = ("joblib", "cluster")
# What Parallel.configure passes to every backend (joblib 1.4-1.6), each handled in
# ScalerBackend.configure; anything else is an unknown keyword, as for loky.
_CONFIGURE_KEYWORDS = frozenset({"max_nbytes", "mmap_mode", "temp_folder", "verbose", "context"})
_MMAP_MODES = ("r", "c")  # the loky mmap_modes the store can keep ("r+"/"w+" share writes)


# =========================================================================== arrays as loky delivers them


def _arrays_like_loky(value: Any, np: Any, max_nbytes: int | None, mmap_mode: str | None) -> Any:
    """``value`` with its NumPy arrays (in lists, tuples and dicts) as loky's memmapping gives them.

    Larger than ``max_nbytes`` with ``mmap_mode="r"``: read-only (a read-only view when the
    array came writable, so a caller's array in a thread pool keeps its flags).  Otherwise
    (smaller, ``"c"``, ``None``, object arrays, which loky never maps): writable, copied when
    the store delivered a read-only view.
    """
    kind = type(value)
    if isinstance(value, np.ndarray):
        mapped = max_nbytes is not None and value.nbytes > max_nbytes and not value.dtype.hasobject
        if mapped and mmap_mode == "r":
            if not value.flags.writeable:
                return value
            view = value.view()
            view.setflags(write=False)
            return view
        return value if value.flags.writeable else value.copy()
    if kind is list:
        return [_arrays_like_loky(v, np, max_nbytes, mmap_mode) for v in value]
    if kind is tuple:
        return tuple(_arrays_like_loky(v, np, max_nbytes, mmap_mode) for v in value)
    if kind is dict:
        return {k: _arrays_like_loky(v, np, max_nbytes, mmap_mode) for k, v in value.items()}
    return value


def _run_batch(batch: Any, max_nbytes: int | None, mmap_mode: str | None) -> Any:
    """Run one of joblib's batches where the task runs, its arrays as loky would pass them."""
    np = sys.modules.get("numpy")  # no NumPy imported: no array among the arguments
    items = getattr(batch, "items", None)
    if np is not None and isinstance(items, list):
        batch.items = [
            (
                func,
                _arrays_like_loky(args, np, max_nbytes, mmap_mode),
                _arrays_like_loky(kwargs, np, max_nbytes, mmap_mode),
            )
            for func, args, kwargs in items
        ]
    return batch()


# =========================================================================== one Parallel call


class _BatchFuture(Future):  # type: ignore[type-arg]
    """What the backend hands joblib per batch: a Future with ``AsyncResult.get`` for joblib 1.4."""

    def get(self, timeout: float | None = None) -> Any:
        return self.result(timeout)


class _CallConfig:
    """What ``configure`` was told for one ``Parallel`` call."""

    __slots__ = ("max_nbytes", "mmap_mode", "n_jobs")

    def __init__(self, n_jobs: int, max_nbytes: int | None, mmap_mode: str | None) -> None:
        self.n_jobs = n_jobs
        self.max_nbytes = max_nbytes
        self.mmap_mode = mmap_mode


class _Call:
    """The batches of one ``Parallel`` call: at most ``limit`` submitted at once; abortable."""

    def __init__(self, backend: ScalerBackend, call_id: Any, config: _CallConfig) -> None:
        self.backend = backend
        self.call_id = call_id
        self.limit = max(1, config.n_jobs)
        self.arrays = (config.max_nbytes, config.mmap_mode)
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
            inner = submitter.submit(_run_batch, batch, *self.arrays)
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
    supports_inner_max_num_threads = True
    uses_threads = False
    default_n_jobs = -1
    nesting_level: int | None  # set by joblib (ParallelBackendBase.__init__, parallel_config)

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        *,
        address: str | None = None,
        executor: Executor | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        max_retries: int | None = None,
        priority: int | None = None,
        task_timeout: float | None = None,
        wait_for_workers_timeout: float = 10.0,
        nested: str = "joblib",
    ) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        if address is not None and executor is not None:
            raise ValueError("give the scaler backend either address= or executor=, not both")
        if executor is not None and not hasattr(executor, "submit"):
            raise TypeError(
                f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}"
            )
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {type(initializer).__name__}")
        if not isinstance(initargs, tuple):
            raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")
        if initializer is not None and (address is not None or executor is not None):
            raise ValueError(
                "initializer= runs in the processors of the embedded cluster the scaler backend "
                "starts; with address=/executor= they are not the backend's: give it to "
                "ScalerExecutor(initializer=...) or scaler-worker --initializer instead"
            )
        if nested not in NESTED_MODES:
            raise ValueError(f"nested must be one of {NESTED_MODES}, got {nested!r}")
        self.address = address
        self.executor = executor
        self.initializer = initializer
        self.initargs = initargs
        self.nested = nested
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
        self._configs: weakref.WeakKeyDictionary[Any, _CallConfig] = weakref.WeakKeyDictionary()
        self.parallel = None

    # ------------------------------------------------------------------ pickling

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors, locks and calls stay here; a copy (e.g. in a task) gets the settings only.
        settings = self._settings()
        if self.initializer is not None:
            settings.update(initializer=self.initializer, initargs=self.initargs)
        return (
            _rebuild_backend,
            (type(self), self.nesting_level, self.inner_max_num_threads, settings),
        )

    def _settings(self) -> dict[str, Any]:
        return {
            "address": self.address,
            **self.options,
            "wait_for_workers_timeout": self.wait_for_workers_timeout,
            "nested": self.nested,
        }

    def __repr__(self) -> str:
        where = (
            f"executor={self.executor!r}"
            if self.executor is not None
            else f"address={self.address!r}"
            if self.address
            else "embedded"
        )
        return (
            f"{type(self).__name__}({where}, nesting_level={self.nesting_level}, "
            f"nested={self.nested!r}, options={self.options})"
        )

    # ------------------------------------------------------------------ where tasks go

    def _target_executor(self) -> Executor | None:
        """An executor the backend does not own (and never shuts down), or None."""
        if self.executor is not None:
            return self.executor
        if _in_task():
            if self.address is not None:
                return _own_cluster_executor(self.address)
            if self.nested == "cluster":
                from scaler_executor.client.executor import get_executor

                return get_executor()  # the task's own cluster; secedes the task
        return None

    def _below_threads_in_task(self) -> bool:
        """loky's rule: no pool of its own from a thread of a nested call (inside a task)."""
        return (
            self.executor is None
            and self.address is None
            and self.nested == "joblib"
            and bool(self.nesting_level)
            and not self.in_main_thread()
            and _in_task()
        )

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
        return _embedded_size()

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if self._below_threads_in_task():
            if n_jobs not in (1, None):  # loky: None is 1, without a warning
                warnings.warn(
                    "scaler-backed parallel loops cannot start a cluster below the threads of "
                    "a nested call inside a task (as loky's), setting n_jobs=1",
                    stacklevel=3,
                )
            return 1
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:
            return max(self._capacity() + 1 + n_jobs, 1)
        return n_jobs

    def _check_configure_keywords(self, keywords: dict[str, Any]) -> _CallConfig:
        unknown = sorted(set(keywords) - _CONFIGURE_KEYWORDS)
        if unknown:
            raise TypeError(
                f"the scaler backend does not take {', '.join(unknown)} (passed on by "
                "joblib.Parallel); see scaler_executor.joblib for the keywords it takes"
            )
        max_nbytes = keywords.get("max_nbytes", 1024**2)
        mmap_mode = keywords.get("mmap_mode", "r")
        if max_nbytes is not None and (
            not isinstance(max_nbytes, int) or isinstance(max_nbytes, bool) or max_nbytes < 0
        ):
            raise ValueError(
                f"max_nbytes must be a size such as '1M', a byte count or None, got {max_nbytes!r}"
            )
        if mmap_mode is not None and mmap_mode not in _MMAP_MODES:
            raise ValueError(
                f"mmap_mode={mmap_mode!r} shares writes between tasks through a file, which the "
                "scaler backend cannot do (large arrays travel through its shared-memory store): "
                "use mmap_mode='r' (read-only), 'c' (writable, private to the task) or None"
            )
        if self.inner_max_num_threads is not None and self._target_executor() is not None:
            raise ValueError(
                "inner_max_num_threads limits the threads of the processes the scaler backend "
                "starts (its embedded cluster); with executor= its processes are not the "
                "backend's: set OMP_NUM_THREADS (etc.) in their environment instead"
            )
        if self.inner_max_num_threads is not None and self.address is not None:
            raise ValueError(
                "inner_max_num_threads limits the threads of the processes the scaler backend "
                "starts (its embedded cluster); with address= the workers are not the "
                "backend's: set OMP_NUM_THREADS (etc.) in the workers' environment instead"
            )
        return _CallConfig(1, max_nbytes, mmap_mode)

    def configure(
        self,
        n_jobs: int = 1,
        parallel: Any = None,
        prefer: Any = None,
        require: Any = None,
        **backend_kwargs: Any,
    ) -> int:
        """Called by joblib at the start of each ``Parallel`` call (or ``with Parallel(...)``).

        ``prefer``/``require`` were applied by joblib when it chose this backend; the other
        keywords are described in the module docstring.
        """
        self.parallel = parallel
        config = self._check_configure_keywords(backend_kwargs)
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        config.n_jobs = n_jobs
        if self._target_executor() is None:
            cluster = (
                _acquire_client(self.address)
                if self.address is not None
                else _acquire_embedded(
                    n_jobs,
                    _Setup(self.initializer, self.initargs, self.inner_max_num_threads),
                    self,
                )
            )
            with self._lock:
                self._leases.append(cluster)
                self._cluster = cluster
        with self._lock:
            self._configs[parallel if parallel is not None else self] = config
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
                config = self._configs.get(key) or _CallConfig(
                    max(self.effective_n_jobs(-1), 1), 1024**2, "r"
                )
                call = self._calls[key] = _Call(self, call_id, config)
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
        """What ``Parallel`` calls inside this call's tasks use (see the module docstring).

        ``nested="joblib"``: joblib's own rule, as for loky (``ThreadingBackend`` one level
        deeper, ``SequentialBackend`` beyond).  ``nested="cluster"``: a copy of the settings
        one level deeper, without the executor, initializer or thread limit (the tasks run
        on the cluster, whose processors are already set up).
        """
        level: int = (self.nesting_level or 0) + 1
        if self.nested == "cluster":
            return type(self)(nesting_level=level, **self._settings()), None
        if self.nesting_level is None:
            # joblib sets it before any call; a backend not (yet) handed to joblib is top-level
            self.nesting_level = 0
        nested: tuple[ParallelBackendBase, int | None] = super().get_nested_backend()
        return nested


def _rebuild_backend(
    cls: type[ScalerBackend], nesting_level: int | None, inner: int | None, settings: dict[str, Any]
) -> ScalerBackend:
    return cls(nesting_level=nesting_level, inner_max_num_threads=inner, **settings)


joblib.register_parallel_backend(BACKEND_NAME, ScalerBackend)
