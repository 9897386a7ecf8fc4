"""``ScalerExecutor``: the ``concurrent.futures.Executor`` users touch.

A thin facade over the :class:`~scaler_executor.client.agent.ClientAgent`
(which owns the connection) and, without an address, an
:class:`~scaler_executor.client.cluster.EmbeddedCluster`.  The facade holds the
agent; nothing holds the facade, so dropping the last reference to the
executor shuts it down as ``shutdown(wait=False)`` would.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from scaler_executor import _compat
from scaler_executor._compat import DAEMON_ADDRESS_ENV
from scaler_executor.client.cluster import EmbeddedCluster
from scaler_executor.config import ClusterConfig, check_address
from scaler_executor.exceptions import BrokenScalerExecutor

# The client's machinery (the agent, pickling, completion, the wire's records) is imported
# where it is first used, not here: ``import scaler_executor`` stays cheap.  An embedded
# executor's constructor has it imported and built on a thread of its own (client/start.py)
# while its daemon starts; one joining a running daemon imports it at once.
if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.completion import TaskInfo
    from scaler_executor.client.pickling import ObjectRef
    from scaler_executor.client.start import AgentStart
    from scaler_executor.protocol.messages import TaskOptions
    from scaler_executor.scheduler.stats import Statistics

T = TypeVar("T")


def _initializer_blob(initializer: Callable[..., object], initargs: tuple[Any, ...]) -> bytes:
    """The embedded cluster's initializer, unpickled and run with this process's authkey
    (manager proxies in ``initargs``: protocol/initializer.py)."""
    import multiprocessing

    from scaler_executor.client import serialization as ser
    from scaler_executor.protocol.initializer import run_initializer

    key = bytes(multiprocessing.current_process().authkey)
    return ser.dumps((run_initializer, (key, ser.dumps((initializer, initargs)))))


V = TypeVar("V")


class _AfterStart(Generic[V]):
    """A field of ``ScalerExecutor`` known once its client has started (client/start.py).

    A non-data descriptor: its first reading waits for the start (raising
    ``BrokenScalerExecutor`` if it failed) and stores the agent and the flags on the
    instance, whose own fields then shadow it: no cost on the paths that read them.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, executor: None, owner: type | None = None) -> _AfterStart[V]: ...
    @overload
    def __get__(self, executor: ScalerExecutor, owner: type | None = None) -> V: ...
    def __get__(
        self, executor: ScalerExecutor | None, owner: type | None = None
    ) -> V | _AfterStart[V]:
        if executor is None:  # read on the class (inspect, documentation tools)
            return self
        start = executor.__dict__.get("_start")
        if start is None:  # a constructor that raised before it had an agent
            raise AttributeError(f"this ScalerExecutor has no {self.name}: its constructor failed")
        executor._use(start.agent())
        value: V = executor.__dict__[self.name]
        return value


class ScalerExecutor(Executor):
    """Run calls on a scaler-executor cluster, with ``ProcessPoolExecutor``'s contract.

    Args:
        max_workers: processes that run tasks in the embedded cluster (default: the
            CPUs this process may use).  Must be None with ``address``: a running
            cluster's capacity belongs to the cluster.
        mp_context: must be None (workers are started by the cluster, not by
            multiprocessing); accepted positionally for ProcessPoolExecutor compatibility.
        initializer, initargs: called in every process that runs tasks before its
            first task, replacements included.  If it raises, pending futures fail with
            :class:`~scaler_executor.exceptions.InitializerFailed` and the executor is broken.
        max_tasks_per_child: replace a processor after it ran this many tasks.
        address: ``tcp://host:port`` (or ``ipc://path``) of a running ``scaler-daemon``
            to join instead of starting an embedded cluster.  The constructor waits for
            the daemon's answer to the handshake, up to ``connect_timeout`` (config).
        min_workers: autoscaling for the embedded cluster: it keeps at least this many
            processes (0 frees them all when idle) and starts up to ``max_workers`` as tasks
            queue, all at once; processes idle for ``scale_down_idle`` seconds (config) are
            stopped, never one running a task.  None (default): a fixed pool.
        config: a :class:`~scaler_executor.config.ClusterConfig`; default: loaded from
            ``SCALER_*`` environment variables and ``$SCALER_CONFIG``.
        credentials: with a ``tcp://`` address, the client credential file made by
            ``scaler-keys issue DIR NAME --role client`` (overrides the config's
            ``credentials`` / ``SCALER_CREDENTIALS``). tcp:// needs one unless the config
            says ``insecure = true`` (which warns).
        dashboard: ``"HOST:PORT"`` (say ``"127.0.0.1:8787"``; port 0 picks one) to serve the
            embedded cluster's web dashboard and Prometheus ``/metrics`` there; the daemon
            prints the URL with its access token on stderr (docs/monitoring.rst). Not with
            ``address``.
        journal: a directory for the embedded daemon's write-ahead journal
            (docs/durability.rst): when that daemon dies (SIGKILL, the OOM killer), this
            client restarts it on the journal, its workers wait for it, and pending futures
            complete as if nothing happened (a thread in ``result()`` sees a delay).  Not
            with ``address`` (a running daemon has its own ``--journal``).

    The embedded cluster's constructor returns once its daemon is started and the client's
    own start is under way on a thread (client/start.py); the first call waits for both.
    Should the client fail to start, that call raises ``BrokenScalerExecutor`` with the
    failure as its cause (the cluster is stopped then).

    Raises:
        ValueError / TypeError: for invalid arguments, naming the fix.
        ConfigError: a ``ValueError`` for an address that is not ``tcp://HOST:PORT`` or
            ``ipc://PATH`` (``localhost:8786`` lacks its scheme), a config file that cannot
            be read, or a bad ``SCALER_*`` value; tcp:// without a credential (or
            ``insecure``), or an unusable credential; the message names the fix.
        DaemonLost: with ``address``, no daemon answered there within ``connect_timeout``
            (the message names the likely cause), or the daemon refused this client.
    """

    # An embedded executor's two wait for its client's start at their first reading.
    _agent: _AfterStart[ClientAgent] = _AfterStart()
    _flags: _AfterStart[int] = _AfterStart()
    _start: AgentStart
    _finalizer: weakref.finalize[..., Any]

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: Any = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        max_tasks_per_child: int | None = None,
        address: str | None = None,
        min_workers: int | None = None,
        config: ClusterConfig | None = None,
        credentials: str | None = None,
        dashboard: str | None = None,
        journal: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_pool_arguments(mp_context, initializer, max_tasks_per_child)
        _check_dashboard(dashboard, address)
        config = _config_for(config, journal, address)
        self._cluster: EmbeddedCluster | None = None
        if address is not None:
            check_address(address)
            _check_remote_arguments(max_workers, initializer, max_tasks_per_child, min_workers)
            config, security = _remote_security(config, address, credentials)
            self._max_workers = 0
            self._config, self._address = config, address
            self._join(config, address, security)
            return
        if credentials is not None:
            raise ValueError(
                "credentials is for joining a tcp:// cluster (address=...); the embedded "
                "cluster is private to this user and needs none"
            )
        max_workers = _check_embedded_counts(max_workers, min_workers)
        init_blob = _initializer_blob(initializer, tuple(initargs)) if initializer else None
        self._cluster = cluster = EmbeddedCluster(
            config,
            processors=max_workers,
            minimum=min_workers,
            initializer=init_blob,
            max_tasks_per_child=max_tasks_per_child,
            dashboard=dashboard,
        )
        self._max_workers = max_workers
        self._config, self._address = cluster.config, cluster.address
        # The client's machinery is imported and built on a thread of its own while the
        # daemon starts; ``_agent`` and ``_flags`` wait for it at first use (_AfterStart).
        from scaler_executor.client.start import AgentStart

        self._start = start = AgentStart(cluster.config, cluster.address, cluster)
        try:
            self._finalizer = weakref.finalize(self, start.shutdown, False)
            self._finalizer.atexit = False  # interpreter exit is handled by the agent module
        finally:
            start.go()  # the build begins once this constructor is done (client/start.py)

    def _join(self, config: ClusterConfig, address: str, security: Any) -> None:
        """Connect to a running daemon and wait for its Welcome (raises ``DaemonLost``)."""
        from scaler_executor.client import connect
        from scaler_executor.client.agent import ClientAgent

        agent = ClientAgent(config, address, None, security)
        self._use(agent)
        connect.wait_for_welcome(agent, address, config.connect_timeout)
        self._finalizer = weakref.finalize(self, ClientAgent.shutdown, agent, False)
        self._finalizer.atexit = False  # interpreter exit is handled by the agent module

    def _use(self, agent: ClientAgent) -> None:
        """Keep ``agent`` and the plain calls' flags as instance fields: from now on they
        shadow the class's ``_AfterStart`` descriptors, and reading them costs nothing more."""
        self.__dict__["_flags"] = _plain_flags(agent.config)
        self.__dict__["_agent"] = agent

    # ------------------------------------------------------------------ Executor contract

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)``; every keyword goes to ``fn``."""
        return self._agent.submit(fn, args, kwargs, 0, self._flags)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """``Executor.map`` with ``ProcessPoolExecutor``'s ``chunksize`` and Python 3.14's ``buffersize``."""
        agent = self._agent  # first: a started client's modules are imported before mapping's
        from scaler_executor.client.mapping import run_map

        return run_map(agent, 0, fn, iterables, timeout, chunksize, buffersize, self._flags)

    def get(self, dsk: Any, keys: Any, **options: Any) -> Any:
        """Compute ``keys`` of a Dask-style graph ``dsk`` in the cluster.

        Usable as a Dask scheduler: ``dask.compute(x, scheduler=ex.get)``.  ``options`` are
        those of :meth:`options` (priority, max_retries, …) for every task of the graph.
        Results come in the nested shape of ``keys`` (a list of keys gives a tuple).

        Raises:
            KeyError: a requested key is not in the graph.
            ValueError: the graph has a cycle (the message names a key on it).
            Exception: the first failing task's own exception, for a key that depends on it.
        """
        agent = self._agent  # first: a started client's modules are imported before graph's
        from scaler_executor.client.graph import run_graph

        view = self.options(**options) if options else None
        return run_graph(agent, dsk, keys, view._id() if view is not None else 0)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Standard semantics; idempotent.  Stops the embedded cluster once outstanding work is done."""
        try:
            agent = self._agent
        except BrokenScalerExecutor:
            return  # the client never started, and its cluster was stopped then
        agent.shutdown(wait, cancel_futures=cancel_futures)

    # ------------------------------------------------------------------ extras

    def options(
        self,
        *,
        resources: dict[str, float] | None = None,
        tags: Iterable[str] | None = None,
        priority: int = 0,
        task_timeout: float | None = None,
        max_retries: int | None = None,
        writable: bool = False,
        capture_output: bool | None = None,
    ) -> _OptionsView:
        """A view on this executor whose ``submit``/``map`` carry scheduling options.

        ``ex.options(priority=5).submit(f, x, timeout=3)`` passes ``timeout=3`` to ``f``.
        ``writable=True`` gives tasks private writable copies of arguments that travel through
        the object store (by default they are read-only zero-copy views).
        ``capture_output=True`` collects each task's stdout, stderr (at the file-descriptor
        level: C code and subprocesses included) and log records, bounded by
        ``capture_output_limit`` bytes per stream (head and tail), and attaches them to its
        future: ``scaler_executor.task_info(f).stdout``, ``.stderr``, ``.logs``; a failed
        task's exception carries the tail as a note.  None: the config's ``capture_output``.
        It applies to ``submit`` and ``map`` (not to ``get``'s graph tasks); see
        :mod:`scaler_executor.worker.capture` for what is and is not captured.

        Raises:
            TypeError: a value of the wrong type (a bool is not a number).
            ValueError: a value out of range, naming the option and its range: ``priority``
                and ``max_retries`` are 64-bit integers (``max_retries`` >= 0), resource
                quantities finite numbers >= 0, ``task_timeout`` seconds > 0 (see
                :mod:`scaler_executor.client.options`).
        """
        if not isinstance(writable, bool):
            raise TypeError(f"writable must be True or False, got {writable!r}")
        if capture_output is not None and not isinstance(capture_output, bool):
            raise TypeError(
                f"capture_output must be True, False or None (the config's default), got {capture_output!r:.60}"
            )
        from scaler_executor.client.options import make_options

        options = make_options(resources, tags, priority, task_timeout, max_retries)
        return _OptionsView(self, options, writable, capture_output)

    def put(self, value: Any) -> ObjectRef:
        """Place ``value`` in the cluster's object store once; returns a ref to pass as an argument.

        Large buffers (contiguous NumPy arrays, anything pickle protocol 5 hands out of band)
        reach tasks as read-only zero-copy views of shared memory; other large values arrive
        as their own type after one copy.  The value stays stored while the ref lives.

        Raises:
            ObjectStoreFull: the store has no room for it (at once, nothing half-written).
        """
        return self._agent.put(value)

    def get_object(self, ref: ObjectRef) -> Any:
        """The value behind ``ref`` (same as ``ref.result()``)."""
        from scaler_executor.client.pickling import ObjectRef

        if not isinstance(ref, ObjectRef):
            raise TypeError(f"get_object takes an ObjectRef from put(), got {type(ref).__name__}")
        return ref.result()

    def cancel(self, future: Future[Any], *, force: bool = False) -> bool:
        """Cancel a future of this executor; with ``force=True`` also a running one.

        Without ``force`` this is ``future.cancel()``.  With ``force``, a task already running
        has its processor killed (the worker starts a replacement) and the future fails with
        :class:`~scaler_executor.exceptions.TaskCancelled`, a ``CancelledError``:
        ``result()`` raises it, but ``cancelled()`` stays False, because the standard
        ``Future`` has no running-to-cancelled transition.  Returns whether a cancellation
        was made or requested.
        """
        return self._agent.cancels.force(future, force)

    def statistics(self, timeout: float | None = 10.0) -> Statistics:
        """A snapshot of the daemon: a :class:`~scaler_executor.Statistics` (frozen).

        It is also a read-only mapping over the daemon's counters, so
        ``ex.statistics()["finished"]`` reads as before; its attributes add tasks by state,
        the workers (load, queue, processors, last heard from, lane tasks, memory), the
        clients, tasks ended and their run times over the last 10 and 60 s, recent
        failures with their cause, and the host's object store (docs/monitoring.rst).
        Raises ``TimeoutError`` if the daemon does not answer within ``timeout``.

        A sequential caller's result can reach it straight from the processor (see
        docs/architecture.rst, life of a task).  The snapshot counts every such result that
        came down a worker's lane before this call (the daemon waits for those workers'
        reports, at most 1 s); one of a task the daemon dispatched is counted once its
        worker's report arrives, which may be just after ``result()`` returned.
        """
        return self._agent.request_stats().result(timeout)

    def report(self, path: str | os.PathLike[str], timeout: float | None = 30.0) -> str:
        """Write the run's report to ``path``: one self-contained HTML file, viewable offline
        after the cluster is gone.  Returns the path written.

        It holds, from the daemon's state when it is asked (docs/monitoring.rst, "Report"):

        * a summary: uptime, the task counters, tasks by state, the workers (memory, CPU);
        * a task stream: a row per worker, a bar per task run coloured by status, for the
          daemon's most recent 20,000 runs (older ones are dropped; the count says so);
        * throughput (tasks ended and failed per second) and the workers' total memory and
          count over the whole run, in buckets of 10 s (merged pairwise as the run passes 24 h);
        * the recent failures with the tail of their tracebacks, and other recent events;
        * the host's object store figures;
        * the configuration: the daemon's, and this client's (with its address).

        The page has inline CSS and SVG, no script and no external resource; every task,
        worker name and traceback in it is escaped.  Raises ``TimeoutError`` if the daemon
        does not answer within ``timeout``.  ``scaler-daemon --report FILE`` writes the same
        page (without a client's configuration) when the daemon stops.
        """
        from scaler_executor.scheduler.report import render_report, write_report

        history = self._agent.request_history()
        stats = self.statistics(timeout)
        client = {
            "address": self._address,
            "max_workers": self._max_workers or None,
            **self._config.to_dict(),
        }
        text = render_report(
            stats,
            history.result(timeout),
            client_config=client,
            source=f"ScalerExecutor.report (pid {os.getpid()})",
        )
        write_report(path, text)
        return os.fspath(path)

    @property
    def address(self) -> str:
        return self._address

    def __repr__(self) -> str:
        where = f"embedded, max_workers={self._max_workers}" if self._cluster else self._address
        try:
            agent = self._agent
        except BrokenScalerExecutor:
            return f"<ScalerExecutor broken ({where}): its client did not start>"
        state = "broken" if agent.broken else "shutdown" if agent.shutdown_requested else "running"
        return f"<ScalerExecutor {state} ({where}) outstanding={agent.outstanding}>"


_nested_lock = threading.Lock()
_nested: ScalerExecutor | None = None


def get_executor() -> ScalerExecutor:
    """An executor for the cluster this task runs on, for sub-tasks (inside a task only).

    Calling it *secedes* the calling task: its processor stops counting against the
    worker's capacity and the worker starts another processor, so that a task waiting on
    its sub-tasks never deadlocks the cluster (as Dask's ``secede``).  The task keeps
    running; when it finishes, the worker returns to its normal size.  The executor is
    shared by the tasks of this process; do not shut it down.

    Raises:
        RuntimeError: outside a task running on a scaler-executor worker.
    """
    global _nested
    processor = _compat.PROCESSOR
    address = os.environ.get(DAEMON_ADDRESS_ENV)
    if processor is None or not address:
        raise RuntimeError(
            "get_executor() works inside a task running on a scaler-executor worker; "
            "outside one, create a ScalerExecutor"
        )
    processor.secede()
    with _nested_lock:
        if _nested is None:
            _nested = ScalerExecutor(address=address, config=ClusterConfig())
        return _nested


def task_info(future: Future[Any]) -> TaskInfo | None:
    """Facts about a finished task: worker, submit/start/end times, attempts, peak memory.

    None while the task has not finished, or for a future that did not run on a worker
    (cancelled, failed before it left the client, or rejected by the daemon).
    """
    from scaler_executor.client.completion import task_info_of

    return task_info_of(future)


class _OptionsView:
    """``submit``/``map`` with scheduling options, on the same connection as its executor."""

    def __init__(
        self,
        executor: ScalerExecutor,
        options: TaskOptions,
        writable: bool = False,
        capture_output: bool | None = None,
    ) -> None:
        from scaler_executor.protocol.messages import TaskFlags

        self._executor = executor
        self._options = options
        self._options_id: int | None = None
        self._writable = writable
        self._capture_output = capture_output  # as asked; None: the config's default
        if capture_output is None:
            capturing = bool(executor._flags & TaskFlags.CAPTURE)
        else:
            capturing = capture_output
        self._flags = (TaskFlags.WRITABLE if writable else 0) | (
            TaskFlags.CAPTURE if capturing else 0
        )

    def _id(self) -> int:
        if self._options_id is None:
            self._options_id = self._executor._agent.options_id(self._options)
        return self._options_id

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._executor._agent.submit(fn, args, kwargs, self._id(), self._flags)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        from scaler_executor.client.mapping import run_map

        return run_map(
            self._executor._agent,
            self._id(),
            fn,
            iterables,
            timeout,
            chunksize,
            buffersize,
            self._flags,
        )

    def get(self, dsk: Any, keys: Any) -> Any:
        """:meth:`ScalerExecutor.get` with this view's options."""
        from scaler_executor.client.graph import run_graph

        if self._capture_output:  # asked for here (a config default leaves graph tasks uncaptured)
            raise ValueError(
                "capture_output applies to submit and map, not to get()'s graph tasks: "
                "call get() on a view with capture_output=False"
            )
        return run_graph(self._executor._agent, dsk, keys, self._id())

    def options(self, **changes: Any) -> _OptionsView:
        from scaler_executor.client.options import OPTION_NAMES as _OPTION_NAMES

        merged: dict[str, Any] = dict(zip(_OPTION_NAMES, self._options, strict=True))
        unknown = set(changes) - set(_OPTION_NAMES) - {"writable", "capture_output"}
        if unknown:
            raise TypeError(
                f"unknown option(s) {sorted(unknown)}; valid: {[*_OPTION_NAMES, 'writable', 'capture_output']}"
            )
        writable = changes.pop("writable", self._writable)
        capture_output = changes.pop("capture_output", self._capture_output)
        merged.update(changes)
        return self._executor.options(**merged, writable=writable, capture_output=capture_output)

    def __repr__(self) -> str:
        return f"<options {self._options} on {self._executor!r}>"


# --------------------------------------------------------------------------- arguments


def _check_dashboard(dashboard: str | None, address: str | None) -> None:
    if dashboard is None:
        return
    from scaler_executor.config import parse_listen

    if not isinstance(dashboard, str):
        raise TypeError(f"dashboard must be a 'HOST:PORT' string, got {type(dashboard).__name__}")
    if address is not None:
        raise ValueError(
            "dashboard= serves the embedded cluster's dashboard; for a running daemon start it "
            "with scaler-daemon --dashboard HOST:PORT, or run scaler-dashboard ADDRESS"
        )
    parse_listen(dashboard)  # ValueError naming the fix


def _config_for(
    config: ClusterConfig | None, journal: str | os.PathLike[str] | None, address: str | None
) -> ClusterConfig:
    """The executor's config: the one given (or loaded), with the embedded cluster's journal."""
    if config is None:
        config = ClusterConfig.load()
    elif not isinstance(config, ClusterConfig):
        raise TypeError(f"config must be a ClusterConfig, got {type(config).__name__}")
    if journal is not None:
        if address is not None:
            raise ValueError(
                "journal= is the embedded cluster's journal (its daemon is restarted on it when it "
                "dies); a running daemon keeps its own: start it with scaler-daemon --journal PATH"
            )
        if not isinstance(journal, (str, os.PathLike)):
            raise TypeError(f"journal must be a directory path, got {type(journal).__name__}")
        config = config.replace(journal=os.path.abspath(os.fspath(journal)))
    return config


def _remote_security(
    config: ClusterConfig, address: str, credentials: str | None
) -> tuple[ClusterConfig, Any]:
    """The config and the security context (ConfigError: no key on tcp://) for a running daemon."""
    if credentials is not None:
        config = config.replace(credentials=credentials)
    from scaler_executor.security import for_connecting

    return config, for_connecting(config, address, "client")


def _check_pool_arguments(mp_context: Any, initializer: Any, max_tasks_per_child: Any) -> None:
    """ProcessPoolExecutor's own arguments, checked as it checks them."""
    if mp_context is not None:
        raise ValueError(
            "mp_context is not supported: ScalerExecutor's processes are started by its cluster "
            "(forked from a pre-imported zygote), not by multiprocessing; leave it None"
        )
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    if max_tasks_per_child is not None:
        if not isinstance(max_tasks_per_child, int) or isinstance(max_tasks_per_child, bool):
            raise TypeError("max_tasks_per_child must be an integer")
        if max_tasks_per_child <= 0:
            raise ValueError("max_tasks_per_child must be >= 1")


def _check_remote_arguments(
    max_workers: Any, initializer: Any, max_tasks_per_child: Any, min_workers: Any
) -> None:
    """With ``address=``: the arguments that configure an embedded cluster must be unset."""
    if max_workers is not None:
        raise ValueError(
            "max_workers must be None when joining a running cluster (address=...): "
            "its capacity belongs to the cluster; start workers with scaler-worker instead"
        )
    if initializer is not None or max_tasks_per_child is not None:
        raise ValueError(
            "initializer and max_tasks_per_child configure the processes an embedded cluster "
            "starts; for a running cluster pass them to scaler-daemon/scaler-worker "
            "(--initializer FILE, --max-tasks-per-child N)"
        )
    if min_workers is not None:
        raise ValueError("min_workers applies to the embedded cluster; leave it None with address=")


def _plain_flags(config: ClusterConfig) -> int:
    """The flags of a plain ``submit``/``map``: the config's default (forwarding needs the output captured)."""
    from scaler_executor.protocol.messages import TaskFlags

    return TaskFlags.CAPTURE if config.capture_output or config.forward_output else 0


def _check_embedded_counts(max_workers: Any, min_workers: Any) -> int:
    """The embedded cluster's worker counts; returns max_workers (default: usable CPUs)."""
    if max_workers is None:
        max_workers = len(os.sched_getaffinity(0))
    if not isinstance(max_workers, int) or isinstance(max_workers, bool):
        raise TypeError(f"max_workers must be an integer, got {type(max_workers).__name__}")
    if max_workers <= 0:
        raise ValueError("max_workers must be greater than 0")
    if min_workers is not None:
        if not isinstance(min_workers, int) or isinstance(min_workers, bool):
            raise TypeError(
                f"min_workers must be an integer or None, got {type(min_workers).__name__}"
            )
        if not 0 <= min_workers <= max_workers:
            raise ValueError(
                f"min_workers must be between 0 and max_workers={max_workers}, got {min_workers}"
            )
    return max_workers
