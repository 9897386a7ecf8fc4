"""What a real worker agent (``python -m scaler_executor.cli.worker``) does with daemon
transmissions it has no use for: an empty batch (the codec accepts one) and messages of a
type meant for someone else.  Neither may stop it; it keeps running tasks.  And what it does
with the parts of an object a task reads (it reads them as they come), how long it keeps
a fetched object, and its runs, run times and heartbeats.

The daemon here is the test: it binds the ipc socket (``channel.bind``, the daemon's own
transport), answers the worker's Hello, and speaks the wire protocol through ``codec``.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import psutil
import pytest
from scaler_testing import child_env

from scaler_executor.objstore import payload
from scaler_executor.protocol import channel, codec, refs, rejoin
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0  # seconds for a worker on a loaded 2-core machine to answer


class FakeDaemon:
    """The daemon's side of one worker's connection, driven by the test."""

    def __init__(self, directory: str) -> None:
        self.address = f"ipc://{directory}/d.sock"
        self.router = channel.bind(self.address, hwm=1000)
        self.peer: bytes | None = None
        self.worker: subprocess.Popen[bytes] | None = None  # its exit ends a wait at once
        self.log: Path | None = None  # its stderr, quoted when it exits

    def next_batch(self, timeout: float = WAIT) -> list[Any]:
        """The next transmission from the worker, decoded (its identity remembered)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker is not None and self.worker.poll() is not None:
                said = self.log.read_text(errors="replace")[-3000:] if self.log is not None else ""
                raise AssertionError(f"the worker exited with code {self.worker.returncode}:\n{said}")
            self.router.poll_timeout(10)
            if self.router.readable():
                identity, *frames = self.router.recv()
                self.peer = identity
                messages, _buffers = codec.decode(frames)
                return messages
            time.sleep(0.002)
        raise AssertionError(f"the worker sent nothing for {timeout} s")

    def wait_for(self, kind: type, timeout: float = WAIT) -> Any:
        """The first message of ``kind`` the worker sends (heartbeats and others skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.next_batch(max(0.0, deadline - time.monotonic())):
                if type(message) is kind:
                    return message

    def send(self, batch: list[Any], buffers: list[bytes] | None = None) -> None:
        assert self.peer is not None, "the worker has not said Hello yet"
        self.router.send([self.peer, *codec.encode(batch, buffers or ())])

    def close(self) -> None:
        self.router.close()


@pytest.fixture
def directory() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="fakedaemon-", dir="/tmp")  # short: sun_path is 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """Stop the worker and every process under it (its zygote and processors)."""
    try:
        family = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)  # an orderly stop: it reaps its zygote and processors
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    worker.wait(timeout=10)
    psutil.wait_procs(family, timeout=10)


@contextlib.contextmanager
def _worker_of(directory: str) -> Iterator[tuple[FakeDaemon, subprocess.Popen[bytes], Path]]:
    """A real worker agent (one processor) connected to a FakeDaemon in ``directory``, and
    its stderr's file; on the way out, whatever happened, the worker and everything under
    it stopped and the daemon's socket closed."""
    daemon = FakeDaemon(directory)
    log_path = Path(directory) / "worker.log"
    try:
        with open(log_path, "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "scaler_executor.cli.worker", daemon.address, "--processors", "1", "--lifeline"],
                stdin=subprocess.PIPE,  # --lifeline: it stops when this closes, whatever happens to the test
                stderr=log,
                env=child_env(),
            )
        daemon.worker, daemon.log = worker, log_path
        try:
            yield daemon, worker, log_path
        finally:
            _stop(worker)
            assert worker.stdin is not None
            worker.stdin.close()
    finally:
        daemon.close()


def _add_task(task_id: int, a: int, b: int) -> m.TaskDispatch:
    payload = cloudpickle.dumps((operator.add, (a, b), {}))
    return m.TaskDispatch(task_id, 1, 0, TaskFlags.INLINE_FN, payload, [], None, [])


def test_an_empty_batch_and_a_message_for_someone_else_do_not_stop_the_worker(directory: str) -> None:
    with _worker_of(directory) as (daemon, worker, log_path):
        hello = daemon.wait_for(m.Hello)
        assert hello.role == m.Role.WORKER and hello.pid == worker.pid
        daemon.send([m.Welcome(1, 0.1, 50, "")])
        # A worker heartbeats only once welcomed: the Welcome has been handled, so the empty
        # batch is the first transmission the worker reads in its next turn (an agent that
        # read its loop variable after the loop failed on exactly that).
        daemon.wait_for(m.Heartbeat)
        daemon.send([])  # the codec accepts an empty batch
        daemon.send([m.SubmitAck(3)])  # a client's message
        daemon.send([m.Heartbeat(0, 0), m.Stats({"tasks": 1}), m.TasksRunning([7])])
        daemon.send([])
        daemon.send([m.DispatchTasks([], [_add_task(1, 2, 3)])])

        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.attempt, r.status) for r in results.results] == [(1, 1, Status.OK)]
        assert pickle.loads(results.results[0].payload) == 5
        assert worker.poll() is None

        daemon.send([m.DispatchTasks([], [_add_task(2, 40, 2)]), m.SubmitAck(1)])  # one in a batch with tasks
        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(2, Status.OK)]
        assert pickle.loads(results.results[0].payload) == 42
        assert worker.poll() is None

        daemon.send([m.Goodbye("test over")])  # with --lifeline a daemon's Goodbye stops the worker
        daemon.worker = None
        assert worker.wait(timeout=WAIT) == 0
    text = log_path.read_text(errors="replace")
    for kind in ("SubmitAck", "Stats", "TasksRunning"):
        assert f"dropped a {kind} from the daemon" in text, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("runs", [100, 0])
def test_the_worker_reports_its_runs_and_run_times_in_bulk_as_its_welcome_says(directory: str, runs: int) -> None:
    """protocol/runlog.py: the runs of the tasks it ran (none when the daemon keeps none) and
    their run times, in TaskRuns beside its results, never in them."""
    from scaler_executor.protocol.runlog import unpack

    with _worker_of(directory) as (daemon, _worker, _log):
        daemon.wait_for(m.Hello)
        daemon.send([m.Welcome(1, 0.1, 50, "", runs=runs)])
        daemon.wait_for(m.Heartbeat)
        daemon.send([m.DispatchTasks([], [_add_task(1, 2, 3), _add_task(2, 40, 2)])])
        reports: list[m.TaskRuns] = []
        facts: dict[int, m.TaskFacts] = {}
        deadline = time.monotonic() + WAIT
        while sum(r.timed for r in reports) < 2 and time.monotonic() < deadline:
            for message in daemon.next_batch():
                if type(message) is m.TaskRuns:
                    reports.append(message)
                elif type(message) is m.TaskResults:
                    facts.update((r.task_id, r.facts) for r in message.results)
        assert sum(r.timed for r in reports) == 2 and sorted(facts) == [1, 2]
        got = [run for r in reports for run in zip(*unpack(r.runs, r.kept), strict=True)]
        want = sorted((f.started, f.finished, Status.OK) for f in facts.values())
        assert sorted(got) == (want if runs else [])
        assert sum(r.seen for r in reports) == (2 if runs else 0)
        assert sum(r.seconds for r in reports) == pytest.approx(sum(f.finished - f.started for f in facts.values()))
        assert sum(sum(r.durations) for r in reports) == 2


def test_an_idle_worker_heartbeats_four_times_a_liveness_limit_and_a_busy_one_every_interval(directory: str) -> None:
    """protocol/rejoin.py's idle_heartbeat: once a heartbeat said it held nothing and no task
    came since, the worker beats a quarter of the daemon's liveness limit (here 0.05 s times 80:
    every 1 s), not every interval (0.05 s); while it holds a task, and in the heartbeat that
    follows, every interval. Counts, not timings: load can only make them smaller."""

    def heartbeats(daemon: FakeDaemon, seconds: float) -> list[m.Heartbeat]:
        """The worker's heartbeats over ``seconds``, while we beat to it every 0.05 s."""
        beats: list[m.Heartbeat] = []
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            daemon.send([m.Heartbeat(0, 0)])
            try:
                batch = daemon.next_batch(min(left, 0.05))
            except AssertionError:  # nothing within 0.05 s (the worker's exit is raised above)
                continue
            beats.extend(message for message in batch if type(message) is m.Heartbeat)
        return beats

    with _worker_of(directory) as (daemon, _worker, log_path):
        daemon.wait_for(m.Hello)
        daemon.send([m.Welcome(1, 0.05, 80, "")])
        daemon.wait_for(m.Heartbeat)
        idle = heartbeats(daemon, 4.0)
        assert 1 <= len(idle) <= 6, f"{len(idle)} heartbeats in 4 s idle: want about 4, one a second (80 at the interval)"
        assert all((beat.queued, beat.running) == (0, 0) for beat in idle)
        sleeper = cloudpickle.dumps((time.sleep, (3.0,), {}))
        daemon.send([m.DispatchTasks([], [m.TaskDispatch(1, 1, 0, TaskFlags.INLINE_FN, sleeper, [], None, [])])])
        busy = heartbeats(daemon, 2.5)
        assert len([beat for beat in busy if beat.running]) >= 5, f"busy: {busy}"
        batch: list[Any] = []
        while not any(type(message) is m.TaskResults for message in batch):
            batch = daemon.next_batch()
        results = next(message for message in batch if type(message) is m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(1, Status.OK)]
        # The daemon hears that it is idle again at the interval's pace, beside the result or
        # just after it, not a second later.
        after = [message for message in batch if type(message) is m.Heartbeat] + heartbeats(daemon, 0.6)
        assert any((beat.queued, beat.running) == (0, 0) for beat in after), after
    assert "Traceback" not in log_path.read_text(errors="replace")


def test_a_worker_tells_a_daemon_that_came_back_on_its_address_at_once_not_at_its_next_idle_heartbeat(directory: str) -> None:
    """protocol/rejoin.py's case (c) for an idle worker: the daemon goes and another binds its
    address. The worker's transport connects again, and the worker beats at once (which makes
    a daemon that does not know it refuse it, so that it joins again), instead of at its next
    idle heartbeat: here a quarter of 1 s times 120, 30 s after the last one, longer than the
    wait below. Without the reconnection's beat, the new daemon hears nothing for 30 s."""
    with _worker_of(directory) as (daemon, _worker, log_path):
        daemon.wait_for(m.Hello)
        daemon.send([m.Welcome(1, 1.0, 120, "")])
        daemon.wait_for(m.Heartbeat)  # the beat that says it holds nothing: idle from here
        daemon.close()
        os.unlink(daemon.address[len("ipc://") :])  # as a restarted daemon replaces its socket
        again = FakeDaemon(directory)  # a daemon restarted on the same address
        again.worker, again.log = daemon.worker, daemon.log
        try:
            beat = again.wait_for(m.Heartbeat, timeout=WAIT)
            assert (beat.queued, beat.running) == (0, 0), beat
            # Refused as a daemon that does not know it: it says Hello again.
            again.send([m.Refused(f"{rejoin.UNKNOWN_PEER}: send Hello first")])
            again.wait_for(m.Hello)
        finally:
            again.close()
    assert "Traceback" not in log_path.read_text(errors="replace")


# ------------------------------------------------------------------ an object a task reads as it arrives


class _MkDir:
    """Unpickled first in the stored object: makes a directory the test watches for, so the
    test knows the task has begun reading the object (worker/handoff.py's ``stream``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, int, bool]]:
        return (os.makedirs, (self.path, 0o700, True))


class _Ref:
    """An ObjectRef argument as the client pickles it: the stored value, by its header and id."""

    def __init__(self, object_id: bytes) -> None:
        self.object_id = object_id

    def __reduce__(self) -> tuple[Any, tuple[bytes, list[bytes]]]:
        return (refs.stored, (payload.stream_in_store_header(), [self.object_id]))


def _read_task(task_id: int, object_id: bytes) -> m.TaskDispatch:
    """A task hashing the bytes in the stored object ``object_id`` (an ObjectRef argument)."""
    call = cloudpickle.dumps((lambda value: hashlib.sha256(value[1]).hexdigest(), (_Ref(object_id),), {}))
    return m.TaskDispatch(task_id, 1, 0, TaskFlags.INLINE_FN, call, [object_id], None, [])


def _first_part_read(daemon: FakeDaemon, directory: str) -> tuple[bytes, bytes, bytes]:
    """A task on an object of three parts, the first part sent; returns once the task has
    begun reading it (only the first part has come): the object's id, its pickle stream and
    the bytes in it that the task hashes."""
    began = Path(directory) / "began"
    data = os.urandom(3 * m.OBJECT_CHUNK_BYTES - 100)
    stream = pickle.dumps((_MkDir(str(began)), data), protocol=5)
    object_id = b"o" * 16
    daemon.wait_for(m.Hello)
    daemon.send([m.Welcome(1, 0.1, 50, "scaler-test-no-such-store")])  # a store it cannot map: it fetches
    daemon.wait_for(m.Heartbeat)
    daemon.send([m.DispatchTasks([], [_read_task(1, object_id)])])
    assert daemon.wait_for(m.ObjectRequest).object_ids == [object_id]
    daemon.send([m.ObjectPart(object_id, 0, len(stream))], [stream[: m.OBJECT_CHUNK_BYTES]])
    deadline = time.monotonic() + WAIT
    while not began.exists():
        assert time.monotonic() < deadline, "the task did not begin reading its object before its last part came"
        with contextlib.suppress(AssertionError):  # (the worker's exit is raised, not suppressed)
            daemon.next_batch(0.05)
    return object_id, stream, data


def test_a_task_reads_a_pickled_object_while_its_parts_arrive(directory: str) -> None:
    with _worker_of(directory) as (daemon, _worker, log_path):
        object_id, stream, data = _first_part_read(daemon, directory)
        # A second task on the same object, while it arrives: it asks for nothing more, and
        # reads it too (after the first, on the worker's one processor).
        daemon.send([m.DispatchTasks([], [_read_task(2, object_id)])])
        for offset in range(m.OBJECT_CHUNK_BYTES, len(stream), m.OBJECT_CHUNK_BYTES):
            daemon.send([m.ObjectPart(object_id, offset, len(stream))], [stream[offset : offset + m.OBJECT_CHUNK_BYTES]])
        daemon.send([m.ObjectData([object_id], [True])], [b""])
        results: dict[int, m.TaskResult] = {}
        deadline = time.monotonic() + WAIT
        while len(results) < 2 and time.monotonic() < deadline:
            for message in daemon.next_batch(max(0.0, deadline - time.monotonic())):
                assert type(message) is not m.ObjectRequest, message
                if type(message) is m.TaskResults:
                    results.update((r.task_id, r) for r in message.results)
        assert sorted((r.task_id, r.status) for r in results.values()) == [(1, Status.OK), (2, Status.OK)], results
        assert {pickle.loads(r.payload) for r in results.values()} == {hashlib.sha256(data).hexdigest()}
    assert "Traceback" not in log_path.read_text(errors="replace")


def test_a_task_reading_an_object_that_ends_short_fails_and_the_worker_serves_on(directory: str) -> None:
    with _worker_of(directory) as (daemon, worker, _log):
        object_id, _stream, _data = _first_part_read(daemon, directory)
        daemon.send([m.ObjectData([object_id], [True])], [b""])  # the answer ends after one part of three
        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(1, Status.ERROR)], results
        _pickled, kind, message, *_rest = msgpack.unpackb(results.results[0].payload)  # processor.dump_exception's form
        assert f"object {object_id.hex()} of its arguments did not arrive whole" in message, (kind, message)
        daemon.send([m.DispatchTasks([], [_add_task(2, 40, 2)])])
        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(2, Status.OK)]
        assert pickle.loads(results.results[0].payload) == 42 and worker.poll() is None


def _exit_task(task_id: int, object_id: bytes) -> m.TaskDispatch:
    """A task that reads the stored object ``object_id`` and kills its processor."""
    call = cloudpickle.dumps((lambda value: os._exit(3), (_Ref(object_id),), {}))
    return m.TaskDispatch(task_id, 1, 0, TaskFlags.INLINE_FN, call, [object_id], None, [])


def test_a_fetched_object_is_kept_only_while_a_task_the_worker_holds_reads_it(directory: str) -> None:
    """Whatever way a task leaves the worker (here its processor dies under it), the objects
    it alone read are dropped: the next task on one is fetched again, not served from a copy
    nobody would ever free."""
    stream = pickle.dumps((None, os.urandom(1000)), protocol=5)
    object_id = b"k" * 16
    with _worker_of(directory) as (daemon, worker, _log):
        daemon.wait_for(m.Hello)
        daemon.send([m.Welcome(1, 0.1, 50, "scaler-test-no-such-store")])  # a store it cannot map: it fetches
        daemon.wait_for(m.Heartbeat)
        daemon.send([m.DispatchTasks([], [_exit_task(1, object_id)])])
        assert daemon.wait_for(m.ObjectRequest).object_ids == [object_id]
        daemon.send([m.ObjectData([object_id], [True])], [stream])
        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(1, Status.PROCESSOR_DIED)], results
        daemon.send([m.DispatchTasks([], [_read_task(2, object_id)])])
        assert daemon.wait_for(m.ObjectRequest).object_ids == [object_id], "it kept the dead task's object"
        daemon.send([m.ObjectData([object_id], [True])], [stream])
        results = daemon.wait_for(m.TaskResults)
        assert [(r.task_id, r.status) for r in results.results] == [(2, Status.OK)], results
        assert pickle.loads(results.results[0].payload) == hashlib.sha256(pickle.loads(stream)[1]).hexdigest()
        assert worker.poll() is None
