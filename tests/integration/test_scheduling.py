"""Scheduling and fault tolerance, end to end: resources and tags, priorities, retries and
how each death is told, per-task timeouts, force cancel and ``task_info``.

Issue "Scheduling, fault tolerance and autoscaling".  Each test names the behaviour it pins:

=====================================  ================================================
feature                                what the user must see
=====================================  ================================================
resources, quantities                  gpu=2 worker runs at most two gpu=1 tasks at once
head of line                           a task that cannot be placed yet delays no other
unsatisfiable, embedded cluster        TaskError at once, naming the resource
unsatisfiable, external daemon         waits; fails after --unsatisfiable-timeout, or
                                       runs when a matching worker joins (no timeout)
priority                               higher first among queued tasks, FIFO within one
max_retries (config, per task)         WorkerLost listing one line per attempt
deaths                                 exit code, SIGKILL, SIGSEGV, missed heartbeats,
                                       memory limit (limit + size), stderr tail
MemoryError raised by the task         comes back as MemoryError
task_timeout                           TaskTimeout (a TaskError, not a TimeoutError); the
                                       worker serves the next task
cancel(force=True)                     TaskCancelled (a CancelledError), cancelled() False
task_info                              worker, times, attempts, peak memory
=====================================  ================================================

Tasks report through files and return values; the test polls with a deadline
(``wait_until``) and never sleeps to wait for a state.  Tests that kill, stop or need a
special configuration get their own cluster (``fresh_executor``).

The machine these run on may be shared with other suites (load average > 5 on 2 cores),
so clusters use a tolerant liveness (``TOLERANT``) unless missed heartbeats are the point.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from scaler_testing import child_env, daemon_of, fast_config, wait_until, workers_of

import scaler_executor
from scaler_executor import ScalerExecutor, TaskCancelled, TaskError, TaskTimeout, WorkerLost

REPO = str(Path(scaler_executor.__file__).resolve().parent.parent)

# Fast heartbeats (0.1 s) but 5 s of silence before a peer is declared dead, and 30 s before a
# client gives up on its daemon: a loaded machine must not turn into spurious losses.
TOLERANT = fast_config(heartbeat_liveness=50, daemon_loss_timeout=30.0)


# =========================================================================== task functions
# Module level: workers import them by reference.


def span(duration: float, tag: Any = None) -> tuple[Any, float, float]:
    """Sleep ``duration``; return (tag, start, end) wall-clock times as seen by the task."""
    start = time.time()
    time.sleep(duration)
    return tag, start, time.time()


def hold(release: str, started: str | None = None, tag: Any = None) -> tuple[Any, float, float]:
    """Run until the file ``release`` exists; announce the start through the file ``started``."""
    start = time.time()
    if started:
        Path(started).write_text(str(os.getpid()))
    while not os.path.exists(release):
        time.sleep(0.01)
    return tag, start, time.time()


def die(how: str) -> None:
    if how == "exit":
        os._exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segv":
        ctypes.string_at(0)
    if how == "stderr":
        sys.stderr.write("some context\nboom-marker: the task's last words\n")
        sys.stderr.flush()
        os._exit(1)
    raise ValueError(how)


def die_once(marker: str, value: int) -> int:
    """Kill the processor on the first attempt only (``marker`` remembers it); then return."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(5)
    return value


def allocate(megabytes: int, seconds: float) -> int:
    block = bytearray(megabytes * 2**20)  # zero-filled: every page is touched
    time.sleep(seconds)
    return len(block)


def raise_memory_error() -> None:
    raise MemoryError("the task's own MemoryError")


def square(x: int) -> int:
    return x * x


def pids() -> tuple[int, int]:
    """(processor pid, its parent: the worker's zygote)."""
    return os.getpid(), os.getppid()


# =========================================================================== helpers


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = most = 0
    for _, delta in events:
        open_now += delta
        most = max(most, open_now)
    return most








class External:
    """A standalone ``scaler-daemon`` and ``scaler-worker``s, started by hand; always cleaned up."""

    FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "50")

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxs-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{self.sock_path}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()

    def _start(self, module: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", module, *args, *self.FLAGS], env=child_env())
        self.procs.append(proc)
        return proc

    def daemon(self, *args: str) -> subprocess.Popen[bytes]:
        proc = self._start("scaler_executor.cli.daemon", "--address", self.address, *args)
        assert wait_until(
            lambda: os.path.exists(self.sock_path) or proc.poll() is not None, timeout=30
        )
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
        return proc

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self._start("scaler_executor.cli.worker", self.address, *args)

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, config=TOLERANT)

    def close(self) -> None:
        for proc in self.procs:
            try:
                self.seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for proc in reversed(self.procs):  # workers first: they say goodbye to a live daemon
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.seen:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def external() -> Iterator[External]:
    ext = External()
    try:
        yield ext
    finally:
        ext.close()


@pytest.fixture
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="sxsched-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_executor() -> Iterator[ScalerExecutor]:
    """One worker with 4 processors that declares gpu=2 and the tag linux."""
    ex = ScalerExecutor(
        max_workers=4, config=TOLERANT.replace(worker_resources="gpu=2", worker_tags="linux")
    )
    warm_up(ex, 4)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


def warm_up(ex: ScalerExecutor, processors: int) -> None:
    """Return once ``processors`` distinct processors have run a task (all are up).

    Before that, timing tests would measure processor start-up, not scheduling.
    """
    seen: set[int] = set()

    def all_up() -> bool:
        seen.update(pid for _, (pid, _) in ex.map(span_pid, [0.05] * (2 * processors)))
        return len(seen) >= processors

    assert wait_until(all_up, timeout=60), f"only processors {sorted(seen)} ran tasks"


def span_pid(duration: float) -> tuple[float, tuple[int, int]]:
    time.sleep(duration)
    return duration, pids()


def error_of(future: concurrent.futures.Future[Any], timeout: float = 60) -> BaseException:
    exc = future.exception(timeout=timeout)
    assert exc is not None, f"expected a failure, got {future.result()!r}"
    return exc


# =========================================================================== resources and tags


@pytest.mark.timeout(90)
def test_resource_quantity_bounds_concurrency(gpu_executor: ScalerExecutor) -> None:
    ex = gpu_executor
    gpu = ex.options(resources={"gpu": 1})
    results = [f.result(60) for f in [gpu.submit(span, 0.4, i) for i in range(8)]]
    overlap = max_overlap([(s, e) for _, s, e in results])
    # Never more than the two gpus at once, and the two are used (not one task at a time).
    assert overlap == 2, results
    # Plain tasks are bound by processors only: four run at once on the same worker.
    plain = [f.result(60) for f in [ex.submit(span, 0.6, i) for i in range(4)]]
    assert max_overlap([(s, e) for _, s, e in plain]) >= 3, plain


@pytest.mark.timeout(60)
def test_fractional_quantities_and_the_whole_quantity(gpu_executor: ScalerExecutor) -> None:
    ex = gpu_executor
    # gpu=0.75 twice fits in gpu=2, three times does not: two at once, though four processors.
    part = ex.options(resources={"gpu": 0.75}, tags={"linux"})
    results = [f.result(60) for f in [part.submit(span, 0.4, i) for i in range(5)]]
    assert max_overlap([(s, e) for _, s, e in results]) == 2, results
    # The whole quantity in one task: it runs, alone.
    both = ex.options(resources={"gpu": 2}).submit(span, 0.05, "both")
    assert both.result(60)[0] == "both"


@pytest.mark.timeout(60)
def test_tags_route_tasks_to_workers_that_have_them(gpu_executor: ScalerExecutor) -> None:
    assert gpu_executor.options(tags={"linux"}).submit(square, 9).result(60) == 81
    assert (
        gpu_executor.options(tags=["linux"], resources={"gpu": 1}).submit(square, 3).result(60) == 9
    )


@pytest.mark.timeout(90)
def test_task_that_cannot_be_placed_yet_does_not_delay_others(
    gpu_executor: ScalerExecutor, workdir: str
) -> None:
    ex = gpu_executor
    release = os.path.join(workdir, "release")
    gpu = ex.options(resources={"gpu": 1})
    holders = [
        gpu.submit(hold, release, os.path.join(workdir, f"started-{i}"), i) for i in range(2)
    ]
    try:
        assert wait_until(
            lambda: all(os.path.exists(os.path.join(workdir, f"started-{i}")) for i in range(2)),
            timeout=30,
        ), "the two gpu=1 tasks did not start"
        # Both gpus are busy: this one must wait for them, at the head of its own queue...
        big = ex.options(resources={"gpu": 2}).submit(span, 0.0, "big")
        # ...while plain tasks submitted after it run on the free processors.
        plain = [ex.submit(span, 0.05, i) for i in range(6)]
        _, not_done = concurrent.futures.wait(plain, timeout=30)
        assert not not_done, "plain tasks waited behind a task that cannot be placed yet"
        assert not big.done(), "the gpu=2 task ran while both gpus were held"
    finally:
        Path(release).touch()
    _, big_start, _ = big.result(60)
    assert big_start >= max(end for _, _, end in (f.result() for f in plain))
    assert big_start >= min(end for _, _, end in (f.result(60) for f in holders))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"resources": {"tpu": 1}}, "tpu"),
        ({"resources": {"gpu": 3}}, "gpu=3"),  # more than any worker has in all
        ({"tags": {"windows"}}, "windows"),
    ],
)
def test_unsatisfiable_task_fails_at_once_on_the_embedded_cluster(
    gpu_executor: ScalerExecutor, options: dict[str, Any], named: str
) -> None:
    started = time.monotonic()
    exc = error_of(gpu_executor.options(**options).submit(square, 2), timeout=30)
    elapsed = time.monotonic() - started
    assert isinstance(exc, TaskError), repr(exc)
    assert named in str(exc), str(exc)
    assert elapsed < 10, f"took {elapsed:.1f} s to fail"
    # The executor stays usable.
    assert gpu_executor.submit(square, 4).result(30) == 16


@pytest.mark.timeout(120)
def test_unsatisfiable_task_fails_after_the_daemons_timeout(external: External) -> None:
    external.daemon("--unsatisfiable-timeout", "1")
    external.worker("--processors", "2", "--resources", "cpu=4", "--tags", "a,b")
    with external.client() as ex:
        # Until the worker joins, nothing is satisfiable: wait for it.
        assert wait_until(lambda: ex.statistics()["workers"] == 1, timeout=60)
        assert ex.options(resources={"cpu": 2}, tags={"a"}).submit(square, 5).result(60) == 25
        started = time.monotonic()
        exc = error_of(ex.options(resources={"gpu": 1}).submit(square, 2), timeout=60)
        elapsed = time.monotonic() - started
        assert isinstance(exc, TaskError), repr(exc)
        assert "gpu" in str(exc) and "unsatisfiable_timeout" in str(exc), str(exc)
        assert 0.9 <= elapsed < 20, f"failed after {elapsed:.2f} s with unsatisfiable_timeout=1"
        assert ex.submit(square, 6).result(60) == 36


@pytest.mark.timeout(120)
def test_unsatisfiable_task_waits_for_a_matching_worker(external: External) -> None:
    external.daemon()
    external.worker("--processors", "1")
    with external.client() as ex:
        assert ex.submit(square, 5).result(60) == 25
        waiting = ex.options(resources={"gpu": 1}, tags={"cuda"}).submit(pids)
        assert wait_until(lambda: ex.statistics().get("tasks_pending", 0) == 1, timeout=30)
        # Other work is not held up meanwhile, and the constrained task is still waiting.
        assert ex.submit(square, 7).result(60) == 49
        assert not waiting.done()
        external.worker("--processors", "1", "--resources", "gpu=1", "--tags", "cuda,linux")
        _, zygote = waiting.result(60)
        gpu_agent = psutil.Process(zygote).parent()
        assert "gpu=1" in gpu_agent.cmdline(), gpu_agent.cmdline()


# =========================================================================== priorities


@pytest.mark.timeout(90)
def test_higher_priority_runs_first_among_queued_tasks(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    ex = fresh_executor(max_workers=1, config=TOLERANT)
    release = os.path.join(workdir, "release")
    started = os.path.join(workdir, "started")
    blocker = ex.submit(hold, release, started, "blocker")
    try:
        assert wait_until(lambda: os.path.exists(started), timeout=30)
        low = [ex.options(priority=0).submit(span, 0.0, ("low", i)) for i in range(5)]

        # The worker holds a task or so ahead of its processor (prefetch): those are no
        # longer queued.  Wait until the daemon knows all six, then count what it handed out.
        def all_six_known() -> bool:
            stats = ex.statistics()
            return bool(stats.get("tasks_pending", 0) + stats.get("tasks_dispatched", 0) == 6)

        assert wait_until(all_six_known, timeout=30)
        prefetched = ex.statistics()["tasks_dispatched"] - 1  # the blocker is one of them
        assert 0 <= prefetched <= 2, prefetched
        high = [ex.options(priority=5).submit(span, 0.0, ("high", i)) for i in range(5)]
        assert wait_until(
            lambda: ex.statistics().get("tasks_pending", 0) == 10 - prefetched, timeout=30
        )
    finally:
        Path(release).touch()
    blocker.result(60)
    results = [f.result(60) for f in low + high]
    order = [tuple(tag) for tag, start, _ in sorted(results, key=lambda r: r[1])]
    # Tasks already handed to the worker run first (the lowest-numbered lows, FIFO); of the
    # rest, every high one runs before any low one, each priority in submission order.
    expected = [("low", i) for i in range(prefetched)]
    expected += [("high", i) for i in range(5)] + [("low", i) for i in range(prefetched, 5)]
    assert order == expected, (order, prefetched)


# =========================================================================== retries and how deaths are told


@pytest.fixture(scope="module")
def crash_executor() -> Iterator[ScalerExecutor]:
    """Two processors, max_retries=2 by configuration."""
    ex = ScalerExecutor(max_workers=2, config=TOLERANT.replace(max_retries=2))
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(90)
def test_max_retries_default_comes_from_the_config(crash_executor: ScalerExecutor) -> None:
    exc = error_of(crash_executor.submit(die, "exit"))
    assert type(exc) is WorkerLost, repr(exc)
    assert len(exc.attempts) == 3, exc.attempts  # the first run and max_retries=2 retries
    assert "max_retries=2" in str(exc)
    for n, line in enumerate(exc.attempts, 1):
        assert line.startswith(f"attempt {n}:"), line
        assert "exit code 3" in line, line
        assert line in str(exc)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("retries", [0, 1])
def test_max_retries_per_task(crash_executor: ScalerExecutor, retries: int) -> None:
    exc = error_of(crash_executor.options(max_retries=retries).submit(die, "exit"))
    assert type(exc) is WorkerLost, repr(exc)
    assert len(exc.attempts) == retries + 1, exc.attempts


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("how", "told"),
    [
        ("exit", r"exit code 3"),
        ("sigkill", r"killed by signal SIGKILL"),
        ("segv", r"killed by signal SIGSEGV"),
        ("stderr", r"exit code 1; its last stderr lines:.*boom-marker: the task's last words"),
    ],
)
def test_worker_lost_tells_how_each_attempt_died(
    crash_executor: ScalerExecutor, how: str, told: str
) -> None:
    exc = error_of(crash_executor.options(max_retries=1).submit(die, how))
    assert type(exc) is WorkerLost, repr(exc)
    assert len(exc.attempts) == 2
    for line in exc.attempts:
        assert re.search(told, line, re.DOTALL), line
        assert "processor pid" in line, line
    # The poison task is gone; the cluster keeps serving.
    assert list(crash_executor.map(square, range(20))) == [x * x for x in range(20)]


@pytest.mark.timeout(60)
def test_memory_error_raised_by_the_task_is_its_own_exception(
    crash_executor: ScalerExecutor,
) -> None:
    exc = error_of(crash_executor.submit(raise_memory_error))
    assert type(exc) is MemoryError, repr(exc)
    assert str(exc) == "the task's own MemoryError"


@pytest.mark.timeout(90)
def test_a_retry_after_a_crash_returns_the_value(
    crash_executor: ScalerExecutor, workdir: str
) -> None:
    future = crash_executor.submit(die_once, os.path.join(workdir, "marker"), 42)
    assert future.result(60) == 42
    info = scaler_executor.task_info(future)
    assert info is not None and info.attempts == 2, info


@pytest.mark.timeout(120)
def test_missed_heartbeats_are_told(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    ex = fresh_executor(
        max_workers=1,
        config=fast_config(heartbeat_interval=0.1, heartbeat_liveness=5, daemon_loss_timeout=30.0),
    )
    started = os.path.join(workdir, "started")
    future = ex.options(max_retries=0).submit(hold, os.path.join(workdir, "never"), started)
    assert wait_until(lambda: os.path.exists(started), timeout=30)
    (agent,) = workers_of(daemon_of(ex))
    agent.suspend()  # SIGSTOP: alive but silent
    try:
        exc = error_of(future, timeout=30)
    finally:
        try:
            agent.resume()
        except psutil.NoSuchProcess:
            pass
    assert type(exc) is WorkerLost, repr(exc)
    (line,) = exc.attempts
    assert "missed heartbeats" in line, line
    # The resumed agent finds itself forgotten and joins again (or leaves, and a replacement
    # joins): either way the cluster serves the next task.
    following = ex.submit(square, 12)
    served = not concurrent.futures.wait([following], timeout=20).not_done
    if not served:
        for agent in workers_of(daemon_of(ex)):  # unblock the teardown's shutdown(wait=True)
            agent.kill()
    assert served, (
        "the worker that was declared lost joined again but never ran the next task: its only "
        "processor still runs the task the daemon already failed (a result nobody wants)"
    )
    assert following.result() == 144


def record_run(path: str, seconds: float, value: int) -> int:
    """Append this run's pid to ``path``, work ``seconds``, return ``value``."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return value


@pytest.mark.timeout(120)
def test_a_task_retried_after_its_worker_was_declared_lost_completes(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    """A worker declared lost (missed heartbeats) that comes back joins again; the task it
    held is retried, possibly on that same worker while the first attempt still runs there.
    The retry must complete: the future may not stay RUNNING forever."""
    ex = fresh_executor(
        max_workers=1,
        config=fast_config(heartbeat_interval=0.1, heartbeat_liveness=5, daemon_loss_timeout=30.0),
    )
    runs = os.path.join(workdir, "runs")
    future = ex.submit(record_run, runs, 3.0, 42)
    assert wait_until(lambda: os.path.exists(runs), timeout=30)
    (agent,) = workers_of(daemon_of(ex))
    agent.suspend()
    try:
        assert wait_until(lambda: ex.statistics()["workers_lost"] >= 1, timeout=30)
    finally:
        agent.resume()
    finished = not concurrent.futures.wait([future], timeout=20).not_done
    if not finished:
        stats = ex.statistics()
        for stuck in workers_of(daemon_of(ex)):  # unblock the teardown's shutdown(wait=True)
            stuck.kill()
        pytest.fail(
            f"the retried task never completed (ran {len(Path(runs).read_text().split())} time(s); "
            f"daemon: {stats}): the rejoined worker dropped the new hand-out of a task whose "
            "first attempt it was still running"
        )
    assert future.result() == 42
    info = scaler_executor.task_info(future)
    assert info is not None and info.attempts >= 2, info


def run_logged(runs: str, release: str) -> int:
    """Append this run's pid to ``runs`` as it starts; run until the file ``release`` exists."""
    with open(runs, "a") as f:
        f.write(f"{os.getpid()}\n")
    while not os.path.exists(release):
        time.sleep(0.01)
    return os.getpid()


@pytest.mark.timeout(120)
def test_a_worker_stopped_by_sigterm_runs_no_at_most_once_task_twice(external: External, workdir: str) -> None:
    """SIGTERM (scancel, preemption, a walltime's drain) makes a worker say Goodbye. The
    max_retries=0 task it was running fails naming the worker and is never run again; the
    ordinary task it was running runs again elsewhere; an at-most-once task that had not
    started there (or was still at the daemon) runs once, elsewhere."""
    external.daemon()
    leaver = external.worker("--processors", "2", "--name", "leaver")
    runs = {name: os.path.join(workdir, name) for name in ("once", "ordinary", "queued")}
    release = os.path.join(workdir, "release")
    with external.client() as ex:
        once = ex.options(max_retries=0).submit(run_logged, runs["once"], release)
        ordinary = ex.submit(run_logged, runs["ordinary"], release)
        assert wait_until(lambda: os.path.exists(runs["once"]) and os.path.exists(runs["ordinary"]), timeout=60)
        # Both processors are busy: this one waits in the worker's queue (dispatched, RUNNING
        # to its future), never reaching a processor: the worker's Goodbye hands it back.
        queued = ex.options(max_retries=0).submit(run_logged, runs["queued"], release)
        assert wait_until(queued.running, timeout=30)
        leaver.send_signal(signal.SIGTERM)
        assert leaver.wait(30) == 0
        Path(release).write_text("")
        external.worker("--processors", "2", "--name", "stayer")
        exc = error_of(once, timeout=60)
        assert type(exc) is WorkerLost, repr(exc)
        assert "may have started on worker leaver" in str(exc) and "max_retries=0" in str(exc), str(exc)
        assert exc.attempts == ("attempt 1: worker leaver: left: worker stopping",), exc.attempts
        assert ordinary.result(60) and queued.result(60)
    counts = {name: len(Path(path).read_text().split()) for name, path in runs.items()}
    assert counts == {"once": 1, "ordinary": 2, "queued": 1}, counts


def descendants(proc: subprocess.Popen[bytes]) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.timeout(180)
def test_a_worker_draining_on_sigterm_finishes_what_it_runs_and_hands_back_the_rest(
    external: External, tmp_path: Path
) -> None:
    """Walltime without loss (issue 23): with --drain-seconds, SIGTERM (Slurm's drain signal)
    makes the worker hand back at once what it never started, which runs elsewhere, while
    the tasks it runs go on to their end and are reported: each ran exactly once (a
    max_retries=0 one too), nothing was retried or lost, and the worker exits by itself
    when it holds nothing more."""
    external.daemon()
    drainer = external.worker("--processors", "2", "--name", "drainer", "--drain-seconds", "30")
    runs = {name: str(tmp_path / name) for name in ("once", "ordinary", "queued", "queued_once", "later")}
    gate, open_gate = str(tmp_path / "gate"), str(tmp_path / "open")
    Path(open_gate).write_text("")
    with external.client() as ex:
        try:
            once = ex.options(max_retries=0).submit(run_logged, runs["once"], gate)
            ordinary = ex.submit(run_logged, runs["ordinary"], gate)
            assert wait_until(lambda: os.path.exists(runs["once"]) and os.path.exists(runs["ordinary"]), timeout=60)
            # Both processors are busy: these wait in the drainer's queue (dispatched, RUNNING).
            queued = ex.submit(run_logged, runs["queued"], open_gate)
            queued_once = ex.options(max_retries=0).submit(run_logged, runs["queued_once"], open_gate)
            assert wait_until(lambda: queued.running() and queued_once.running(), timeout=30)
            drainer_pids = descendants(drainer)
            stayer = external.worker("--processors", "2", "--name", "stayer", "--drain-seconds", "30")
            assert wait_until(lambda: ex.statistics()["workers"] == 2, timeout=60)
            drainer.send_signal(signal.SIGTERM)
            # The queued tasks run on the other worker at once, while the drainer still runs its
            # two (the gate is shut); a task submitted now goes there too.
            later = ex.submit(run_logged, runs["later"], open_gate)
            stayer_ran = {queued.result(60), queued_once.result(60), later.result(60)}
            assert stayer_ran <= descendants(stayer), (stayer_ran, descendants(stayer))
            assert drainer.poll() is None, "the drainer stopped before its running tasks ended"
            assert not once.done() and not ordinary.done()
            Path(gate).write_text("")
            assert once.result(60) in drainer_pids and ordinary.result(60) in drainer_pids
            assert drainer.wait(60) == 0
            stats = ex.statistics()
            assert stats["retried"] == 0 and stats["workers_lost"] == 0 and stats["failed"] == 0, stats
            assert scaler_executor.task_info(once).attempts == 1  # type: ignore[union-attr]
        finally:
            Path(gate).write_text("")  # a failure must not leave a task blocking the teardown
    counts = {name: len(Path(path).read_text().split()) for name, path in runs.items()}
    assert counts == dict.fromkeys(runs, 1), counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_stops_a_draining_worker_at_once(external: External, tmp_path: Path, second: int) -> None:
    """The drain is a grace, not a trap: a second SIGTERM, or a SIGINT, stops the worker at
    once (its drain of 300 s would outlast every wait here); what it ran goes back as after
    any orderly leave."""
    external.daemon()
    drainer = external.worker("--processors", "1", "--name", "drainer", "--drain-seconds", "300")
    gate, runs = str(tmp_path / "gate"), str(tmp_path / "runs")
    with external.client() as ex:
        try:
            task = ex.submit(run_logged, runs, gate)
            assert wait_until(lambda: os.path.exists(runs), timeout=60)
            external.worker("--processors", "1", "--name", "stayer")
            assert wait_until(lambda: ex.statistics()["workers"] == 2, timeout=60)
            drainer.send_signal(signal.SIGTERM)
            assert wait_until(lambda: any(w.draining for w in ex.statistics().workers), timeout=60)
            assert drainer.poll() is None
            drainer.send_signal(second)
            assert drainer.wait(60) == 0
            Path(gate).write_text("")
            assert task.result(60)
            assert ex.statistics()["failed"] == 0
        finally:
            Path(gate).write_text("")  # a failure must not leave a task blocking the teardown


@pytest.mark.timeout(180)
def test_a_draining_worker_takes_back_the_short_tasks_queued_inside_its_processor(
    external: External, tmp_path: Path
) -> None:
    """Short tasks are dealt several to a processor, queued behind the running one: on the
    drain signal the worker recalls them (the processor returns exactly those it has not
    started) and hands them back, so they run elsewhere at once instead of waiting for the
    long one; the long one finishes where it is.  Each task runs once."""
    external.daemon()
    drainer = external.worker("--processors", "1", "--name", "drainer", "--drain-seconds", "30")
    gate, open_gate = str(tmp_path / "gate"), str(tmp_path / "open")
    Path(open_gate).write_text("")
    warm = str(tmp_path / "warm")
    runs = {name: str(tmp_path / name) for name in ("head", "q0", "q1", "q2")}
    with external.client() as ex:
        try:
            # Teach the worker that this callable is short (well under 5 ms): it deals it deep.
            for _ in range(20):
                ex.submit(run_logged, warm, open_gate).result(60)
            head = ex.submit(run_logged, runs["head"], gate)
            queued = [ex.submit(run_logged, runs[f"q{i}"], open_gate) for i in range(3)]
            assert wait_until(lambda: os.path.exists(runs["head"]) and all(f.running() for f in queued), timeout=60)
            drainer_pids = descendants(drainer)
            stayer = external.worker("--processors", "1", "--name", "stayer", "--drain-seconds", "30")
            assert wait_until(lambda: ex.statistics()["workers"] == 2, timeout=60)
            drainer.send_signal(signal.SIGTERM)
            ran = {f.result(60) for f in queued}  # while the head still holds the drainer's processor
            assert ran <= descendants(stayer), (ran, descendants(stayer))
            assert not head.done() and drainer.poll() is None
            Path(gate).write_text("")
            assert head.result(60) in drainer_pids
            assert drainer.wait(60) == 0
            stats = ex.statistics()
            assert stats["retried"] == 0 and stats["workers_lost"] == 0 and stats["failed"] == 0, stats
        finally:
            Path(gate).write_text("")  # a failure must not leave a task blocking the teardown
    counts = {name: len(Path(path).read_text().split()) for name, path in runs.items()}
    assert counts == dict.fromkeys(runs, 1), counts


@pytest.mark.timeout(120)
def test_memory_limit_kill_names_limit_and_size_and_the_worker_survives(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=1, config=TOLERANT.replace(memory_limit="300M"))
    assert ex.submit(square, 2).result(60) == 4
    (agent,) = workers_of(daemon_of(ex))
    exc = error_of(ex.options(max_retries=0).submit(allocate, 600, 5.0), timeout=60)
    assert type(exc) is WorkerLost, repr(exc)
    (line,) = exc.attempts
    assert "memory limit of 300.0 MiB" in line, line
    sizes = re.findall(r"held (\d+(?:\.\d+)? MiB)", line)
    assert sizes, f"no observed size in {line!r}"
    assert "SIGKILL" in line, line
    # The worker itself survives and serves the next task (a replacement processor).
    assert ex.submit(square, 3).result(60) == 9
    assert [p.pid for p in workers_of(daemon_of(ex))] == [agent.pid]
    assert ex.statistics()["workers_lost"] == 0


# =========================================================================== per-task timeout


@pytest.mark.timeout(90)
def test_task_timeout_kills_the_task_and_the_worker_serves_the_next(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=1, config=TOLERANT)
    assert ex.submit(square, 2).result(60) == 4  # the cluster is up
    started = time.monotonic()
    future = ex.options(task_timeout=0.5).submit(time.sleep, 10)
    exc = error_of(future, timeout=30)
    failed_after = time.monotonic() - started
    assert type(exc) is TaskTimeout, repr(exc)
    assert isinstance(exc, TaskError) and not isinstance(exc, TimeoutError)
    assert "task_timeout of 0.5 s" in str(exc), str(exc)
    assert 0.5 <= failed_after < 5, f"failed after {failed_after:.2f} s"
    gap_started = time.monotonic()
    assert ex.submit(square, 3).result(30) == 9
    gap = time.monotonic() - gap_started
    print(
        f"\n[task_timeout] failed after {failed_after:.3f} s; next task served in {gap * 1000:.1f} ms"
    )
    assert gap < 5


# =========================================================================== cancel


@pytest.mark.timeout(90)
def test_force_cancel_of_a_running_task(
    fresh_executor: Callable[..., ScalerExecutor], workdir: str
) -> None:
    ex = fresh_executor(max_workers=1, config=TOLERANT)
    started = os.path.join(workdir, "started")
    running = ex.submit(hold, os.path.join(workdir, "never"), started)
    assert wait_until(lambda: os.path.exists(started), timeout=30)
    others = [ex.submit(square, i) for i in range(6)]
    assert wait_until(lambda: ex.statistics().get("tasks_pending", 0) >= 1, timeout=30)
    pending = others[-1]
    assert not pending.running()
    assert ex.cancel(pending) is True and pending.cancelled()
    assert ex.cancel(running) is False  # plain cancel of a running task, as Future.cancel()
    assert ex.cancel(running, force=True) is True
    with pytest.raises(TaskCancelled) as info:
        running.result(30)
    assert isinstance(info.value, concurrent.futures.CancelledError)
    assert not running.cancelled()  # no running-to-cancelled transition in the standard Future
    assert [f.result(30) for f in others[:-1]] == [i * i for i in range(5)]
    # The killed processor was replaced.
    assert ex.submit(square, 8).result(30) == 64


# =========================================================================== task_info


@pytest.mark.timeout(60)
def test_task_info_reports_worker_times_and_peak_memory(crash_executor: ScalerExecutor) -> None:
    before = time.time()
    future = crash_executor.submit(allocate, 200, 0.5)
    assert scaler_executor.task_info(future) is None  # not finished
    assert future.result(60) == 200 * 2**20
    info = scaler_executor.task_info(future)
    assert info is not None
    assert info.worker, info
    assert info.attempts == 1
    assert before <= info.submitted <= info.started <= info.finished <= time.time() + 1, info
    assert info.duration >= 0.5, info
    assert info.peak_memory >= 150 * 2**20, f"peak_memory {info.peak_memory} for a 200 MiB task"
