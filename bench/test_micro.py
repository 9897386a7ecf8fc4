"""Micro-benchmarks of the per-task hot paths, so a regression shows where it starts.

    PYTHONPATH=. python -m pytest bench/test_micro.py --benchmark-only

Not part of the test suite: pyproject's ``testpaths`` is ``tests``, so a plain
``pytest`` never collects this file.  Each benchmark handles a batch of
``BATCH`` tasks (what one transmission carries under load); divide by
``BATCH`` for the per-task figure (``extra_info["per_task_us"]`` in the JSON
report has it).

* codec: ``encode``/``decode`` of a ``SubmitTasks`` batch (client → daemon) and
  of a ``TaskResults`` batch (worker → daemon → client);
* daemon core: ``Scheduler.handle`` on a submit batch (validation, records,
  queueing, dispatch to a worker, acks) and on a result batch (settling the
  tasks, routing results to the client), with a client and a worker that
  shook hands like real peers;
* client: ``serialization.dumps_args`` for the fast (builtin scalars) and the
  cloudpickle path, and the submitting thread's whole ``submit`` (an agent with no
  daemon, so that nothing else runs);
* object store: ``put``/``delete`` and ``get``/release of one object, and the
  packing of a large NumPy result, copied or sealed in place (these are per
  object, not per batch).
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.client.serialization import dumps_args
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import codec, reply
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core import Received, Scheduler, Send, refusal_for

BATCH = 100
CLIENT = b"\x00bench-client"
WORKER = b"\x00bench-worker"
FN_LOCAL_ID = 1
TASK_SECONDS = 20e-6  # the duration reported in result facts: a no-op task


def _per_task(benchmark: Any) -> None:
    benchmark.extra_info["batch"] = BATCH
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["per_task_us"] = stats.stats.median / BATCH * 1e6


def noop(*args: Any) -> None:
    return None


# --------------------------------------------------------------------------- messages


def submit_batch(base: int, first: int, n: int = BATCH) -> m.SubmitTasks:
    """What a client sends for ``n`` calls of a registered function with one int argument."""
    fn_id = base | FN_LOCAL_ID
    return m.SubmitTasks(
        [
            m.TaskSpec(
                base | (first + i), fn_id, 0, m.TaskFlags.CALL, dumps_args((i,), {}), [], [], 0
            )
            for i in range(n)
        ]
    )


def result_batch(task_ids: list[int]) -> m.TaskResults:
    """What a worker sends back for no-op tasks (``None`` pickled, facts filled in)."""
    payload = pickle.dumps(None, protocol=5)
    return m.TaskResults(
        [
            m.TaskResult(
                t,
                0,
                m.Status.OK,
                payload,
                m.TaskFacts("bench-worker", 1000.0, 1000.0 + TASK_SECONDS, 0),
                [],
            )
            for t in task_ids
        ]
    )


def hello(role: str, name: str, capacity: int) -> m.Hello:
    h = m.Hello(
        role,
        m.PROTOCOL_VERSION,
        python_version(),
        cloudpickle.__version__,
        __version__,
        name,
        os.getpid(),
        socket.gethostname(),
        capacity,
        {},
        [],
    )
    assert refusal_for(h) is None, refusal_for(h)
    return h


# --------------------------------------------------------------------------- codec


@pytest.fixture(scope="module")
def submit_message() -> m.SubmitTasks:
    return submit_batch(7 << m.TASK_ID_BITS, 1)


def test_codec_encode_submit(benchmark: Any, submit_message: m.SubmitTasks) -> None:
    frames = benchmark(codec.encode, [submit_message])
    assert frames[0] == codec.VERSION_FRAME
    _per_task(benchmark)


def test_codec_decode_submit(benchmark: Any, submit_message: m.SubmitTasks) -> None:
    frames = codec.encode([submit_message])
    messages, buffers = benchmark(codec.decode, frames)
    assert messages == [submit_message] and buffers == []
    _per_task(benchmark)


def test_codec_encode_results(benchmark: Any) -> None:
    message = result_batch([(7 << m.TASK_ID_BITS) | i for i in range(1, BATCH + 1)])
    benchmark(codec.encode, [message])
    _per_task(benchmark)


def test_codec_decode_results(benchmark: Any) -> None:
    message = result_batch([(7 << m.TASK_ID_BITS) | i for i in range(1, BATCH + 1)])
    frames = codec.encode([message])
    messages, _ = benchmark(codec.decode, frames)
    assert messages == [message]
    _per_task(benchmark)


def test_reply_datagram_encode(benchmark: Any) -> None:
    """A sequential caller's result, as its processor sends it (on the round trip)."""
    result = result_batch([(7 << m.TASK_ID_BITS) | 1]).results[0]
    datagram = benchmark(reply.encode, result)
    assert reply.decode(datagram) == (result, "")


def test_reply_datagram_decode(benchmark: Any) -> None:
    """The same result as the caller reads it (on the round trip)."""
    result = result_batch([(7 << m.TASK_ID_BITS) | 1]).results[0]
    assert benchmark(reply.decode, reply.encode(result)) == (result, "")


# --------------------------------------------------------------------------- daemon core


class Cluster:
    """A Scheduler with one client and one 2-processor worker that said Hello, in steady state."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.scheduler = Scheduler(ClusterConfig())
        commands = self.scheduler.handle(
            Received(CLIENT, [hello(m.Role.CLIENT, "bench-client", 0)], self.tick()),
            Received(WORKER, [hello(m.Role.WORKER, "bench-worker", 2)], self.tick()),
        )
        welcome = {c.peer: c.messages[0] for c in commands}
        assert type(welcome[CLIENT]) is m.Welcome and type(welcome[WORKER]) is m.Welcome, welcome
        self.base = welcome[CLIENT].peer_id << m.TASK_ID_BITS
        self.next_task = 1
        self.handle(
            Received(
                CLIENT,
                [m.RegisterFunction(self.base | FN_LOCAL_ID, cloudpickle.dumps(noop))],
                self.tick(),
            )
        )
        # One untimed cycle so the worker has a measured task duration: from then on its
        # prefetch window (Little's law) takes a whole batch, as under a real load.
        for _ in range(3):
            self.settle(self.dispatched(self.handle(self.submit_event())))

    def tick(self) -> float:
        self.now += 0.001
        return self.now

    def handle(self, *events: Any) -> list[Send]:
        return self.scheduler.handle(*events)

    def submit_event(self) -> Received:
        message = submit_batch(self.base, self.next_task)
        self.next_task += BATCH
        return Received(CLIENT, [message], self.tick())

    def results_event(self, task_ids: list[int]) -> Received:
        return Received(WORKER, [result_batch(task_ids)], self.tick())

    @staticmethod
    def dispatched(commands: list[Send]) -> list[int]:
        return [
            t.task_id
            for c in commands
            if c.peer == WORKER
            for msg in c.messages
            if type(msg) is m.DispatchTasks
            for t in msg.tasks
        ]

    def settle(self, task_ids: list[int]) -> None:
        """Feed results for everything at the worker and anything still queued: back to idle."""
        while task_ids:
            task_ids = self.dispatched(self.handle(self.results_event(task_ids)))
        assert not self.scheduler.tasks, f"{len(self.scheduler.tasks)} tasks left"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.scheduler.validate()


def test_scheduler_submit_batch(benchmark: Any, cluster: Cluster) -> None:
    """Client's SubmitTasks → records, queue, DispatchTasks to the worker, SubmitAck."""
    pending: list[list[int]] = []

    def setup() -> tuple[tuple[Received], dict[str, Any]]:
        while pending:  # settle the previous round outside the timing
            cluster.settle(pending.pop())
        return (cluster.submit_event(),), {}

    def run(event: Received) -> list[Send]:
        commands = cluster.handle(event)
        pending.append(cluster.dispatched(commands))
        return commands

    benchmark.pedantic(run, setup=setup, rounds=2000, warmup_rounds=50)
    assert len(pending[-1]) == BATCH, (
        f"the worker was dispatched {len(pending[-1])} of {BATCH} tasks"
    )
    cluster.settle(pending.pop())
    _per_task(benchmark)


def test_scheduler_result_batch(benchmark: Any, cluster: Cluster) -> None:
    """Worker's TaskResults → tasks settled and forgotten, TaskResults to the client."""
    check: list[list[Send]] = []

    def setup() -> tuple[tuple[Received], dict[str, Any]]:
        ids = cluster.dispatched(cluster.handle(cluster.submit_event()))
        assert len(ids) == BATCH
        return (cluster.results_event(ids),), {}

    def run(event: Received) -> list[Send]:
        commands = cluster.handle(event)
        check[:] = [commands]
        return commands

    benchmark.pedantic(run, setup=setup, rounds=2000, warmup_rounds=50)
    to_client = [
        msg
        for c in check[0]
        if c.peer == CLIENT
        for msg in c.messages
        if type(msg) is m.TaskResults
    ]
    assert sum(len(msg.results) for msg in to_client) == BATCH
    assert not cluster.scheduler.tasks
    _per_task(benchmark)


# --------------------------------------------------------------------------- client serialization


def _dumps_batch(args_list: list[tuple[Any, ...]]) -> Callable[[], None]:
    def run() -> None:
        for args in args_list:
            dumps_args(args, {})

    return run


def test_dumps_args_scalars(benchmark: Any) -> None:
    """The fast path: builtin scalars go through plain pickle."""
    benchmark(_dumps_batch([(i, float(i), "x") for i in range(BATCH)]))
    _per_task(benchmark)


def test_dumps_args_cloudpickle(benchmark: Any) -> None:
    """The general path: a list argument sends the call through cloudpickle."""
    benchmark(_dumps_batch([([i, i + 1],) for i in range(BATCH)]))
    _per_task(benchmark)


@pytest.fixture
def offline_agent(tmp_path: Any) -> Iterator[Any]:
    """A client agent whose daemon never answers: every submit stays in its outbox.

    What a benchmark then times is the submitting thread's whole share of ``submit``
    (the future, pickling, the function's id, the outbox entry, the agent's wake-up),
    with no daemon or worker competing for the two cores.
    """
    from scaler_executor.client.agent import ClientAgent

    config = ClusterConfig().replace(daemon_loss_timeout=3600.0)
    agent = ClientAgent(config, f"ipc://{tmp_path}/no-daemon", None)
    yield agent
    _forget_submits(agent)
    agent.shutdown(wait=True)


def _forget_submits(agent: Any) -> None:
    """Drop what earlier rounds queued, so that each round starts from the same state."""
    with agent.lock:
        agent.core.forget_all()


def test_client_submit(benchmark: Any, offline_agent: Any) -> None:
    """``submit(noop, i)`` as the user thread runs it (ScalerExecutor.submit calls exactly this)."""
    agent = offline_agent
    submit = agent.submit
    agent.function_id(noop)  # registered once per executor: not part of each submit

    def run() -> None:
        for i in range(BATCH):
            submit(noop, (i,), {}, 0)

    benchmark.pedantic(run, setup=lambda: _forget_submits(agent), rounds=2000, warmup_rounds=50)
    assert len(agent.core.records) == BATCH and len(agent.core.outbox) == BATCH
    _per_task(benchmark)


# --------------------------------------------------------------------------- object store
#
# One store per module, in /dev/shm, removed at the end. Sizes: the default
# object_store_threshold (64 KiB, the smallest object a value makes) and 4 MB; puts also
# at 32 MB, past the size from which several threads copy (objstore.c, os_copy).

STORE_SIZES = {"64KiB": 64 * 1024, "4MB": 4_000_000}
PUT_SIZES = {**STORE_SIZES, "32MB": 32_000_000}


@pytest.fixture(scope="module")
def store() -> Iterator[Any]:
    from scaler_executor.objstore import ObjectStore

    s = ObjectStore.create(f"sxbench-{os.getpid()}", 256 << 20)
    try:
        yield s
    finally:
        s.unlink()
        s.close()


@pytest.mark.parametrize("size", list(PUT_SIZES))
def test_store_put_delete(benchmark: Any, store: Any, size: str) -> None:
    """``ObjectStore.put`` (create, copy, seal, under the lock) and ``delete``."""
    data = os.urandom(PUT_SIZES[size])
    oid = os.urandom(16)

    def run() -> None:
        store.put(oid, data)
        store.delete(oid)

    benchmark(run)


@pytest.mark.parametrize("size", list(STORE_SIZES))
def test_store_get_release(benchmark: Any, store: Any, size: str) -> None:
    """``ObjectStore.get`` (a reference and a zero-copy view) and its release."""
    oid = os.urandom(16)
    store.put(oid, os.urandom(STORE_SIZES[size]))

    def run() -> None:
        store.get(oid).release()

    benchmark(run)
    store.delete(oid)


@pytest.mark.parametrize("where", ["private", "in_store"])
def test_pack_large_result(benchmark: Any, store: Any, where: str) -> None:
    """``payload.pack`` of a task's 4 MB NumPy result, then its deletion: an array in
    private memory is copied into a new object; one a processor built in the store
    (``arrays_in_store``) is sealed where it is."""
    np = pytest.importorskip("numpy")
    from scaler_executor.objstore import numpy_alloc, payload

    n = STORE_SIZES["4MB"] // 8
    installed = numpy_alloc.install(store, 1 << 20) if where == "in_store" else None
    try:

        def run() -> None:
            a = np.empty(n)  # the task's own work (filling it) is left out
            packed = payload.pack(a, store)
            del a
            payload.delete_objects(store, packed.created)

        benchmark(run)
    finally:
        if installed is not None:
            numpy_alloc.uninstall(installed)
