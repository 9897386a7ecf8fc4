"""The crash matrix: every way a call can fail, and the exact error the user sees.

Modelled on loky's ``tests/test_reusable_executor.py`` (CONVENTIONS §24). Rows:

=============================  ==========================================  ======================
where it breaks                how                                         what the user sees
=============================  ==========================================  ======================
client, pickling the call      socket / lock in args or kwargs, closure    original TypeError + a
                               over a lock                                 note naming the culprit
worker, unpickling arguments   ``__reduce__`` whose loader raises          that error + note
worker, running                the task raises                             its own type, cause =
                                                                           RemoteTraceback
worker, pickling the result    returns a lock                              TypeError naming it
worker, pickling the exception exception holds a lock                      its own type, rebuilt
                                                                           from its args
                               ... and cannot be rebuilt from its args     RemoteError
client, unpickling exception   ``__init__`` needs args not in ``args``     RemoteError
processor dies                 ``os._exit(3)``, SIGKILL, SIGSEGV           WorkerLost (retries 0)
                                                                           or the value (retried)
worker agent dies              SIGKILL                                     every task reruns
daemon dies                    SIGKILL                                     DaemonLost, promptly
client dies                    SIGKILL                                     cluster exits, dir gone
Ctrl-C in the client           SIGINT to its process group                 KeyboardInterrupt in the
                                                                           user's code only
standalone CLI processes       SIGTERM                                     exit 0, nothing left
bad bytes on the socket        garbage, wrong version, wrong Python, ...   Refused; daemon serves
=============================  ==========================================  ======================

Tests that kill something get their own cluster (``fresh_executor``); the rest share
the module's ``executor``.  Nothing here sleeps to wait for a state: tasks report
through files, and the test polls them with a deadline (``wait_until``).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import psutil
import pytest
from scaler_testing import FAST, child_env, daemon_of, fast_config, socket_dir, wait_until, workers_of

import scaler_executor
from scaler_executor import DaemonLost, RemoteError, ScalerExecutor, TaskError, WorkerLost
from scaler_executor.exceptions import RemoteTraceback
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m

REPO = str(Path(scaler_executor.__file__).resolve().parent.parent)


# =========================================================================== task functions
# Module level, so that workers import them by reference.


def identity(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


def square(x: int) -> int:
    return x * x


def return_lock() -> Any:
    return threading.Lock()


def raise_value_error(x: int) -> None:
    raise ValueError(f"bad value {x}")


class LockedError(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_locked_error() -> None:
    raise LockedError("holds a lock")


class LockedKeywordError(Exception):
    """Holds a lock, and its ``__init__`` takes a keyword its ``args`` do not carry."""

    def __init__(self, *, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_locked_keyword_error() -> None:
    raise LockedKeywordError(message="holds a lock")


class NeedsTwoArgs(Exception):
    """Pickles fine, but unpickling calls ``NeedsTwoArgs(*self.args)`` with one argument."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


def raise_needs_two_args() -> None:
    raise NeedsTwoArgs("left", "right")


def _raise_on_load(message: str) -> None:
    raise ValueError(message)


class FailsToUnpickle:
    """Pickles to a call that raises when it is loaded (in the worker)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_raise_on_load, ("refusing to be unpickled",))


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def crash(how: str, workdir: str, value: int = 0, once: bool = False) -> int:
    """Crash the processor ``how`` (exit / sigkill / segfault); with ``once``, only on the first attempt.

    Every attempt appends its pid to ``workdir/attempts``; ``sigkill`` publishes the pid in
    ``workdir/pid`` and waits for the test to kill it.
    """
    with open(os.path.join(workdir, "attempts"), "a") as f:
        f.write(f"{os.getpid()}\n")
    marker = os.path.join(workdir, "crashed-once")
    if once:
        if os.path.exists(marker):
            return value
        open(marker, "w").close()
    if how == "exit":
        os._exit(3)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "sigkill":
        _write_atomically(os.path.join(workdir, "pid"), str(os.getpid()))
        time.sleep(120)
    raise AssertionError(f"crash({how!r}) did not crash")


def run_while_flag(i: int, workdir: str) -> int:
    """Log this attempt (pid), then hold the processor while ``workdir/hold`` exists."""
    with open(os.path.join(workdir, f"task-{i}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 120
    while os.path.exists(os.path.join(workdir, "hold")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return i * i


# =========================================================================== helpers


def attempts_of(workdir: str, name: str = "attempts") -> list[int]:
    try:
        with open(os.path.join(workdir, name)) as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


def is_gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting for a parent that never reaps counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def all_gone(pids: list[int]) -> bool:
    return all(is_gone(pid) for pid in pids)


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass








def assert_no_files_for(worker: psutil.Process) -> None:
    """A local worker gets its settings as flags: nothing on disk can outlive a killed daemon."""
    cmd = worker.cmdline()
    assert "--config" not in cmd and "--initializer" not in cmd or "--workdir" in " ".join(cmd), cmd


def descendants(p: psutil.Process) -> list[int]:
    try:
        return [c.pid for c in p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []




@pytest.fixture
def workdir() -> Iterator[str]:
    """A short private directory for files the tasks and the test exchange."""
    path = tempfile.mkdtemp(prefix="sxtest-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# =========================================================================== pickling in the client


@pytest.mark.timeout(60)
def test_unpicklable_kwarg_fails_the_future_with_a_note(executor: ScalerExecutor) -> None:
    with socket.socket() as conn:
        future = executor.submit(identity, 1, conn=conn)
    exc = future.exception(timeout=10)
    assert type(exc) is TypeError, repr(exc)
    assert "socket" in str(exc)
    assert exc.__notes__ == ["while pickling kwargs['conn'] (socket.socket) for identity"]
    assert executor.submit(square, 6).result(timeout=30) == 36


@pytest.mark.timeout(60)
def test_unpicklable_positional_arg_names_its_index(executor: ScalerExecutor) -> None:
    future = executor.submit(identity, 1, threading.Lock())
    exc = future.exception(timeout=10)
    assert type(exc) is TypeError, repr(exc)
    assert exc.__notes__ == ["while pickling args[1] (_thread.lock) for identity"]
    # The same mistake through map: the iterator raises it at that position.
    results = executor.map(identity, [1, threading.Lock(), 3])
    assert next(results) == ((1,), {})
    with pytest.raises(TypeError) as info:
        next(results)
    assert info.value.__notes__ == ["while pickling args[0] (_thread.lock) for identity"]
    assert executor.submit(square, 7).result(timeout=30) == 49


def _closure_over_a_lock() -> Callable[[], int]:
    lock = threading.Lock()

    def uses_lock() -> int:
        with lock:
            return 1

    return uses_lock


@pytest.mark.timeout(60)
def test_unpicklable_function_fails_the_future_with_a_note(executor: ScalerExecutor) -> None:
    future = executor.submit(_closure_over_a_lock())
    exc = future.exception(timeout=10)
    assert type(exc) is TypeError, repr(exc)
    (note,) = exc.__notes__
    assert note.startswith("while pickling the function "), note
    assert "uses_lock" in note
    assert executor.submit(square, 8).result(timeout=30) == 64


# =========================================================================== unpickling in the worker


@pytest.mark.timeout(60)
def test_argument_that_fails_to_unpickle_in_the_worker(executor: ScalerExecutor) -> None:
    future = executor.submit(identity, FailsToUnpickle())
    exc = future.exception(timeout=30)
    assert type(exc) is ValueError, repr(exc)
    assert str(exc) == "refusing to be unpickled"
    assert any(
        "unpickling" in note and "arguments" in note and "worker" in note for note in exc.__notes__
    ), exc.__notes__
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "_raise_on_load" in str(exc.__cause__)
    assert executor.submit(square, 9).result(timeout=30) == 81


# =========================================================================== results and exceptions


@pytest.mark.timeout(60)
def test_unpicklable_return_value_names_its_type(executor: ScalerExecutor) -> None:
    future = executor.submit(return_lock)
    exc = future.exception(timeout=30)
    assert type(exc) is TypeError, repr(exc)
    text = " ".join(exc.__notes__)
    assert "_thread.lock" in text and "return_lock" in text and "return value" in text, (
        exc.__notes__
    )
    assert executor.submit(square, 10).result(timeout=30) == 100


@pytest.mark.timeout(60)
def test_task_exception_keeps_its_type_with_the_remote_traceback(executor: ScalerExecutor) -> None:
    future = executor.submit(raise_value_error, 3)
    exc = future.exception(timeout=30)
    assert type(exc) is ValueError, repr(exc)
    assert str(exc) == "bad value 3"
    cause = exc.__cause__
    assert isinstance(cause, RemoteTraceback), repr(cause)
    assert "raise_value_error" in str(cause)
    assert "ValueError: bad value 3" in str(cause)
    with pytest.raises(ValueError, match="bad value 3"):
        future.result()


@pytest.mark.timeout(60)
def test_unpicklable_exception_keeps_its_type_when_its_args_rebuild_it(executor: ScalerExecutor) -> None:
    exc = executor.submit(raise_locked_error).exception(timeout=30)
    assert type(exc) is LockedError and exc.args == ("holds a lock",), repr(exc)
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "could not be pickled" in exc.__cause__.tb


def test_unpicklable_exception_becomes_remote_error(executor: ScalerExecutor) -> None:
    future = executor.submit(raise_locked_keyword_error)
    exc = future.exception(timeout=30)
    assert isinstance(exc, RemoteError), repr(exc)
    assert isinstance(exc, TaskError)
    assert exc.type_name.endswith("LockedKeywordError"), exc.type_name
    assert exc.message == "holds a lock"
    assert "raise_locked_keyword_error" in exc.traceback_text
    assert "LockedKeywordError: holds a lock" in exc.traceback_text
    assert str(exc) == f"{exc.type_name}: holds a lock"
    assert executor.submit(square, 11).result(timeout=30) == 121


@pytest.mark.timeout(60)
def test_exception_that_fails_to_unpickle_in_the_client_becomes_remote_error(
    executor: ScalerExecutor,
) -> None:
    future = executor.submit(raise_needs_two_args)
    exc = future.exception(timeout=30)
    assert isinstance(exc, RemoteError), repr(exc)
    assert exc.type_name.endswith("NeedsTwoArgs"), exc.type_name
    assert exc.message == "left/right"
    assert "raise_needs_two_args" in exc.traceback_text
    assert any("could not be unpickled" in note for note in getattr(exc, "__notes__", [])), (
        exc.__dict__
    )
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert executor.submit(square, 12).result(timeout=30) == 144


# =========================================================================== processors that die

CRASHES = [
    pytest.param("exit", "exit code 3", id="os._exit(3)"),
    pytest.param("sigkill", "SIGKILL", id="SIGKILL"),
    pytest.param("segfault", "SIGSEGV", id="segfault"),
]


def _kill_when_published(workdir: str) -> int:
    """Wait for the task to publish its pid, then SIGKILL it (the processor running it)."""
    path = os.path.join(workdir, "pid")
    assert wait_until(lambda: os.path.exists(path), timeout=30), "the task never started"
    with open(path) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how, cause", CRASHES)
def test_processor_crash_without_retries_fails_with_worker_lost(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str, how: str, cause: str
) -> None:
    ex = fresh_executor(max_workers=2)
    future = ex.options(max_retries=0).submit(crash, how, workdir)
    if how == "sigkill":
        _kill_when_published(workdir)
    exc = future.exception(timeout=60)
    assert isinstance(exc, WorkerLost), repr(exc)
    assert isinstance(exc, TaskError)
    text = str(exc)
    assert exc.task_id, "WorkerLost must carry the task id"
    assert f"task {exc.task_id:#x}" in text, text
    assert cause in text, text
    assert len(exc.attempts) == 1, exc.attempts
    assert cause in exc.attempts[0] and "worker" in exc.attempts[0], exc.attempts
    assert len(attempts_of(workdir)) == 1
    # A fresh processor replaced the dead one: the executor keeps serving.
    assert list(ex.map(square, range(6))) == [x * x for x in range(6)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how, cause", CRASHES)
def test_processor_crash_on_first_attempt_is_retried(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str, how: str, cause: str
) -> None:
    ex = fresh_executor(max_workers=2)
    future = ex.submit(crash, how, workdir, value=42, once=True)
    if how == "sigkill":
        _kill_when_published(workdir)
    assert future.result(timeout=60) == 42
    tries = attempts_of(workdir)
    assert len(tries) == 2 and tries[0] != tries[1], tries  # a second attempt, in another process
    assert ex.statistics()["retried"] == 1


@pytest.mark.timeout(120)
def test_poison_task_fails_after_every_attempt_and_the_executor_keeps_serving(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    ex = fresh_executor(max_workers=2)
    max_retries = 2
    future = ex.options(max_retries=max_retries).submit(crash, "exit", workdir)
    exc = future.exception(timeout=90)
    assert isinstance(exc, WorkerLost), repr(exc)
    assert len(attempts_of(workdir)) == max_retries + 1
    assert len(exc.attempts) == max_retries + 1, exc.attempts
    text = str(exc)
    for n in range(1, max_retries + 2):
        assert f"attempt {n}:" in text, text
    assert all("exit code 3" in line for line in exc.attempts), exc.attempts
    assert f"max_retries={max_retries}" in text, text
    assert list(ex.map(square, range(10))) == [x * x for x in range(10)]
    stats = ex.statistics()
    assert stats["retried"] == max_retries
    assert stats["failed"] == 1


# =========================================================================== the worker agent dies


@pytest.mark.timeout(120)
def test_worker_agent_killed_every_task_reruns(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    ex = fresh_executor(max_workers=2)
    open(os.path.join(workdir, "hold"), "w").close()
    n = 8
    futures = [ex.submit(run_while_flag, i, workdir) for i in range(n)]

    def started() -> list[int]:
        return [i for i in range(n) if attempts_of(workdir, f"task-{i}")]

    assert wait_until(lambda: len(started()) == 2, timeout=30), started()
    daemon = daemon_of(ex)
    (worker,) = workers_of(daemon)
    old_processors = [attempts_of(workdir, f"task-{i}")[0] for i in started()]
    worker.kill()
    # The processors follow their agent (they watch its socket), even mid-task.
    assert wait_until(lambda: all_gone(old_processors), timeout=10), old_processors
    os.unlink(os.path.join(workdir, "hold"))
    _, not_done = concurrent.futures.wait(futures, timeout=60)
    assert not not_done, f"{len(not_done)} futures never completed"
    assert [f.result() for f in futures] == [i * i for i in range(n)]
    # The tasks that were running on the dead worker ran again, on the replacement.
    for i in range(n):
        pids = attempts_of(workdir, f"task-{i}")
        assert 1 <= len(pids) <= 2, (i, pids)
        assert not set(pids[-1:]) & set(old_processors), (i, pids)
    replacement = workers_of(daemon)
    assert len(replacement) == 1 and replacement[0].pid != worker.pid
    stats = ex.statistics()
    assert stats["workers_lost"] == 1, stats
    assert stats["workers"] == 1, stats


# =========================================================================== the daemon dies


@pytest.mark.timeout(120)
def test_daemon_killed_pending_futures_fail_with_daemon_lost(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    config = fast_config(daemon_loss_timeout=3.0)
    ex = fresh_executor(max_workers=2, config=config)
    open(os.path.join(workdir, "hold"), "w").close()
    futures = [ex.submit(run_while_flag, i, workdir) for i in range(6)]
    assert wait_until(
        lambda: sum(bool(attempts_of(workdir, f"task-{i}")) for i in range(6)) == 2, timeout=30
    )
    daemon = daemon_of(ex)
    cluster = descendants(daemon)  # worker, zygote, processors
    assert len(cluster) >= 4, cluster
    (worker,) = workers_of(daemon)
    assert_no_files_for(worker)
    try:
        killed_at = time.monotonic()
        daemon.kill()
        _, not_done = concurrent.futures.wait(futures, timeout=config.daemon_loss_timeout + 3.0)
        elapsed = time.monotonic() - killed_at
        assert not not_done, (
            f"{len(not_done)} futures still pending {elapsed:.1f} s after the daemon died"
        )
        for f in futures:
            exc = f.exception()
            assert isinstance(exc, DaemonLost), repr(exc)
            assert isinstance(exc, concurrent.futures.BrokenExecutor)
            assert "daemon" in str(exc) and "SIGKILL" in str(exc), str(exc)
        with pytest.raises(concurrent.futures.BrokenExecutor):
            ex.submit(square, 2)
        # The worker sees its lifeline close; its processors follow it.
        assert wait_until(lambda: all_gone(cluster), timeout=10), [
            p for p in cluster if not is_gone(p)
        ]
        shutdown_started = time.monotonic()
        ex.shutdown(wait=True)
        assert time.monotonic() - shutdown_started < 10
        ex.shutdown(wait=True)  # idempotent
        assert not os.path.exists(socket_dir(ex)), "shutdown left the socket directory behind"
    finally:
        kill_leftovers(cluster)


# =========================================================================== client scripts (own process)

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import psutil
    from scaler_executor import ClusterConfig, ScalerExecutor

    # As in a terminal: Ctrl-C raises KeyboardInterrupt. (A test run started in the
    # background by a shell hands its children SIGINT ignored, and Python then installs no
    # handler at start-up.)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def hold(workdir, name):
        tmp = os.path.join(workdir, f"tmp-{name}")
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, os.path.join(workdir, name))  # the test reads it as soon as it exists
        while not os.path.exists(os.path.join(workdir, "go")):
            time.sleep(0.01)
        return os.getpid()

    def square(x):
        return x * x

    def cluster_pids():
        return sorted(p.pid for p in psutil.Process().children(recursive=True))

    mode, workdir = sys.argv[1], sys.argv[2]
    config = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=10, daemon_loss_timeout=3.0)
    with ScalerExecutor(max_workers=2, config=config) as ex:
        # Four tasks for two processors: both run one (whichever processor starts first).
        futures = [ex.submit(hold, workdir, f"started-{i}") for i in range(4)]
        while len([n for n in os.listdir(workdir) if n.startswith("started-")]) < 2:
            time.sleep(0.01)
        (daemon,) = psutil.Process().children()
        (worker,) = daemon.children()
        info = {
            "daemon": daemon.pid,
            "cluster": cluster_pids(),
            "address": ex.address,
            "worker_cmdline": worker.cmdline(),
        }
        # READY is printed inside the try: the test sends Ctrl-C as soon as it reads the
        # line, and on a loaded machine that could land before a try entered after it.
        try:
            print("READY " + json.dumps(info), flush=True)
            if mode == "killed":
                time.sleep(120)
                sys.exit(1)
            futures[0].result()  # blocks until Ctrl-C
            print("NOT INTERRUPTED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        open(os.path.join(workdir, "go"), "w").close()
        held = [f.result(timeout=30) for f in futures]
        after = {
            "held": held,
            "square": ex.submit(square, 7).result(timeout=30),
            "map": list(ex.map(square, range(5))),
            "cluster": cluster_pids(),
        }
        print("AFTER " + json.dumps(after), flush=True)
    """
)


def _start_client(tmp_dir: str, mode: str, workdir: str) -> subprocess.Popen[str]:
    script = os.path.join(tmp_dir, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT_SCRIPT)
    return subprocess.Popen(
        [sys.executable, script, mode, workdir],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )


def _read_tagged(proc: subprocess.Popen[str], tag: str, timeout: float = 60.0) -> str:
    """The next stdout line of ``proc`` starting with ``tag`` (lines in between are kept in the error)."""
    assert proc.stdout is not None
    seen: list[str] = []
    result: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(tag):
                result.append(line[len(tag) :].strip())
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    assert result, (
        f"no {tag!r} line from the client within {timeout} s; got {seen!r}, exit code {proc.poll()}"
    )
    return result[0]


@pytest.mark.timeout(120)
def test_client_killed_the_cluster_exits_and_its_directory_goes(
    tmp_path: Path, workdir: str
) -> None:
    proc = _start_client(str(tmp_path), "killed", workdir)
    cluster: list[int] = []
    directory = None
    try:
        info = json.loads(_read_tagged(proc, "READY "))
        cluster = info["cluster"]
        directory = os.path.dirname(info["address"][len("ipc://") :])
        assert info["daemon"] in cluster and len(cluster) >= 4, (
            info
        )  # daemon, worker, zygote, processors
        assert os.path.isdir(directory)
        cmd = info["worker_cmdline"]
        assert "--config" not in cmd, cmd  # settings travel as flags: no file to outlive the cluster
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(10)
        gone = wait_until(lambda: all_gone(cluster), timeout=3.0)
        elapsed = time.monotonic() - killed_at
        assert gone, (
            f"still alive {elapsed:.1f} s after the client died: {[p for p in cluster if not is_gone(p)]}"
        )
        assert wait_until(lambda: not os.path.exists(directory), timeout=3.0), (
            f"the socket directory {directory} outlived the client: {os.listdir(directory)}"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(cluster)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.timeout(120)
def test_ctrl_c_interrupts_user_code_not_the_cluster(tmp_path: Path, workdir: str) -> None:
    proc = _start_client(str(tmp_path), "ctrl-c", workdir)
    cluster: list[int] = []
    try:
        info = json.loads(_read_tagged(proc, "READY "))
        cluster = info["cluster"]
        (first, *_) = sorted(n for n in os.listdir(workdir) if n.startswith("started-"))
        with open(os.path.join(workdir, first)) as f:
            running_pid = int(f.read())
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground group
        assert _read_tagged(proc, "INTERRUPTED", timeout=30) == ""
        after = json.loads(_read_tagged(proc, "AFTER "))
        # The held tasks ran to the end in the processes they started in: nobody got the SIGINT.
        assert running_pid in after["held"], (running_pid, after)
        assert after["square"] == 49
        assert after["map"] == [0, 1, 4, 9, 16]
        assert after["cluster"] == cluster, "a cluster process was interrupted and replaced"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(cluster)


# =========================================================================== standalone daemon and worker


class Standalone:
    """A ``scaler-daemon`` (and optionally ``scaler-worker``) started by hand; always cleaned up."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxd-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{self.sock_path}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()

    def start(
        self, *args: str, module: str = "scaler_executor.cli.daemon"
    ) -> subprocess.Popen[bytes]:
        flags = ["--heartbeat-interval", "0.1", "--heartbeat-liveness", "10"]
        proc = subprocess.Popen([sys.executable, "-m", module, *args, *flags], env=child_env())
        self.procs.append(proc)
        return proc

    def daemon(self, *args: str) -> subprocess.Popen[bytes]:
        proc = self.start("--address", self.address, *args)
        assert wait_until(
            lambda: os.path.exists(self.sock_path) or proc.poll() is not None, timeout=30
        )
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
        return proc

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self.start(self.address, *args, module="scaler_executor.cli.worker")

    def tree(self, proc: subprocess.Popen[bytes]) -> list[int]:
        pids = descendants(psutil.Process(proc.pid))
        self.seen.update(pids)
        return pids

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, config=FAST)

    def close(self) -> None:
        for proc in self.procs:
            try:
                self.seen.update(descendants(psutil.Process(proc.pid)))
            except psutil.NoSuchProcess:
                pass
        # Stop them as an operator would (SIGTERM: the daemon removes its socket and its
        # object-store region); SIGKILL only what does not stop in time.
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        kill_leftovers(sorted(self.seen))
        for proc in self.procs:
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def standalone() -> Iterator[Standalone]:
    s = Standalone()
    try:
        yield s
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_standalone_daemon_outlives_its_clients_and_stops_cleanly_on_sigterm(
    standalone: Standalone,
) -> None:
    daemon = standalone.daemon("--workers", "1")
    ex = standalone.client()
    try:
        assert ex.submit(square, 5).result(timeout=30) == 25
    finally:
        ex.shutdown(wait=True)
    # A client that joined a running cluster leaves it running.
    assert daemon.poll() is None
    with standalone.client() as ex2:
        assert list(ex2.map(square, range(4))) == [0, 1, 4, 9]
    assert daemon.poll() is None
    tree = standalone.tree(daemon)
    assert len(tree) >= 3, tree  # worker, zygote, processor
    (worker,) = workers_of(psutil.Process(daemon.pid))
    assert_no_files_for(worker)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(15) == 0
    assert wait_until(lambda: all_gone(tree), timeout=10), [p for p in tree if not is_gone(p)]
    assert not os.path.exists(standalone.sock_path), "the daemon left its socket behind"


@pytest.mark.timeout(120)
def test_standalone_worker_stops_cleanly_on_sigterm(standalone: Standalone) -> None:
    daemon = standalone.daemon()
    worker = standalone.worker("--processors", "2")
    with standalone.client() as ex:
        assert list(ex.map(square, range(6))) == [x * x for x in range(6)]
        tree = standalone.tree(worker)
        assert len(tree) >= 3, tree  # zygote, two processors
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(15) == 0
        assert wait_until(lambda: all_gone(tree), timeout=10), [p for p in tree if not is_gone(p)]
        assert wait_until(lambda: ex.statistics()["workers"] == 0, timeout=10)
        assert ex.statistics()["workers_lost"] == 0  # it said goodbye: not a loss
    assert daemon.poll() is None
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(15) == 0


@pytest.mark.timeout(120)
def test_a_worker_whose_zygote_dies_stops_and_takes_its_processors_with_it(
    standalone: Standalone, capfd: pytest.CaptureFixture[str]
) -> None:
    """Without its zygote a worker cannot replace processors: it says why, stops with exit
    code 3 and kills the processors the zygote left behind; the daemon carries on."""
    daemon = standalone.daemon()
    worker = standalone.worker("--processors", "2")
    with standalone.client() as ex:
        assert list(ex.map(square, range(6))) == [x * x for x in range(6)]
        agent = psutil.Process(worker.pid)
        (zygote,) = agent.children()
        tree = standalone.tree(worker)
        assert len(tree) >= 3, tree  # zygote, two processors
        # A processor dies too, so the agent wants a replacement from the dead zygote:
        # both deaths reach it in the same turn.
        agent.suspend()
        try:
            zygote.children()[0].kill()
            zygote.kill()
            assert wait_until(lambda: zygote.status() == psutil.STATUS_ZOMBIE, timeout=10)
        finally:
            agent.resume()
        assert worker.wait(15) == 3
        assert wait_until(lambda: all_gone(tree), timeout=10), [p for p in tree if not is_gone(p)]
        assert wait_until(lambda: ex.statistics()["workers"] == 0, timeout=10)
    assert "the zygote died" in capfd.readouterr().err
    assert daemon.poll() is None
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(15) == 0


# =========================================================================== bad input on the daemon's socket


def _hello(python: str) -> m.Hello:
    return m.Hello(
        m.Role.CLIENT,
        m.PROTOCOL_VERSION,
        python,
        cloudpickle.__version__,
        scaler_executor.__version__,
        "probe",
        os.getpid(),
        socket.gethostname(),
        0,
        {},
        [],
    )


WRONG_PYTHON = _hello("2.7")
BODY = msgpack.packb([[m.MESSAGE_TAGS[m.Heartbeat], [0, 0]]])
PROBES = [
    # (id, frames, the reason a Refused answer must contain, or None when no answer is required)
    ("wrong version frame", [b"SCX/9", BODY], "SCX/9"),
    ("not our protocol", [b"GET / HTTP/1.1", b"\r\n"], "not a scaler-executor transmission"),
    ("one frame", [codec.VERSION_FRAME], None),
    ("non-msgpack body", [codec.VERSION_FRAME, b"\xc1\xc1 garbage"], None),
    ("msgpack of the wrong shape", [codec.VERSION_FRAME, msgpack.packb({"a": 1})], None),
    ("message not [tag, fields]", [codec.VERSION_FRAME, msgpack.packb([[1, 2, 3]])], None),
    ("unknown tag", [codec.VERSION_FRAME, msgpack.packb([[999, []]])], None),
    (
        "fields of wrong types",
        [codec.VERSION_FRAME, msgpack.packb([[m.MESSAGE_TAGS[m.Hello], ["x"] * 11]])],
        None,
    ),
    ("Hello with a wrong Python", codec.encode([WRONG_PYTHON]), "Python 2.7"),
    (
        "SubmitTasks before Hello",
        codec.encode([m.SubmitTasks([m.TaskSpec(1, 0, 0, 2, b"x", [], [], 0)])]),
        "Hello first",
    ),
]


@pytest.mark.timeout(120)
def test_daemon_survives_garbage_and_refuses_with_reasons(standalone: Standalone) -> None:
    daemon = standalone.daemon("--workers", "1")
    path = standalone.address[len("ipc://") :]
    # Below the messages: bytes that are not the ipc transport at all (a ZeroMQ peer's
    # greeting; our greeting then an impossible frame count). Each connection is dropped.
    for raw in (b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f", channel.GREETING + b"\xff" * 4):
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(15)
            probe.connect(path)
            probe.sendall(raw)
            assert probe.recv(len(channel.GREETING)) == channel.GREETING
            assert probe.recv(100) == b"", "the daemon kept a connection that spoke garbage"
    for name, frames, reason in PROBES:
        sock = channel.connect(standalone.address, hwm=1000, linger=0)
        poller = channel.Poller()
        poller.register(sock.pollable)
        try:
            sock.send(frames)
            # A Hello with the wrong Python always gets an answer: it marks the end of the
            # answers (if any) to the probe, since one peer's messages stay in order.
            sock.send(codec.encode([WRONG_PYTHON]))
            replies = []
            deadline = time.monotonic() + 15
            while sum("Python 2.7" in r for r in replies) < (2 if reason == "Python 2.7" else 1):
                assert time.monotonic() < deadline, f"{name}: the daemon did not answer"
                poller.poll(sock.poll_timeout(100))
                while sock.readable():
                    for message in codec.decode(sock.recv())[0]:  # one batch may hold both
                        assert type(message) is m.Refused, f"{name}: {message!r}"
                        replies.append(message.reason)
            answers = replies[:-1]
            if reason is not None:
                assert len(answers) == 1 and reason in answers[0], f"{name}: {answers}"
        finally:
            poller.close()
            sock.close()
    assert daemon.poll() is None, "the daemon died of bad input"
    with standalone.client() as ex:
        assert ex.submit(square, 4).result(timeout=30) == 16
        assert ex.statistics()["dropped_messages"] >= 6


@pytest.mark.timeout(120)
def test_a_flood_before_the_handshake_costs_the_daemon_no_memory(standalone: Standalone) -> None:
    """Issue 22's probe: one 40 MB transmission of 8 M heartbeats before any Hello once grew
    a daemon from 146 MB to 2 GB and stalled it 15 s.  A peer that has not joined is heard
    only up to a bounded handshake: the daemon drops it undecoded and serves on."""
    daemon = standalone.daemon("--workers", "1")
    with standalone.client() as ex:
        assert ex.submit(square, 3).result(timeout=30) == 9
        dropped_before = ex.statistics()["dropped_messages"]
    before = psutil.Process(daemon.pid).memory_info().rss
    flood = codec.encode([m.Heartbeat(0, 0)] * 8_000_000)
    assert sum(len(f) for f in flood) > 30_000_000
    sock = channel.connect(standalone.address, hwm=1000, linger=0)
    try:
        for _ in range(3):
            sock.send(flood)
        del flood
        # A Hello with the wrong Python, sent after the floods, is answered only once the
        # daemon has read them (one peer's transmissions stay in order).
        sock.send(codec.encode([WRONG_PYTHON]))
        poller = channel.Poller()
        poller.register(sock.pollable)
        try:
            deadline = time.monotonic() + 60
            answered = False
            while not answered:
                assert time.monotonic() < deadline, "the daemon did not answer after the flood"
                poller.poll(sock.poll_timeout(100))
                while sock.readable():
                    answered |= any(type(x) is m.Refused for x in codec.decode(sock.recv())[0])
        finally:
            poller.close()
    finally:
        sock.close()
    grown = psutil.Process(daemon.pid).memory_info().rss - before
    assert grown < 64 * 1024 * 1024, f"the daemon grew by {grown / 2**20:.0f} MiB on a pre-handshake flood"
    assert daemon.poll() is None
    with standalone.client() as ex:
        assert ex.submit(square, 5).result(timeout=30) == 25
        assert ex.statistics()["dropped_messages"] >= dropped_before + 3

