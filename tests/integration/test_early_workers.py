"""The embedded cluster's first workers, started by the daemon before its own imports.

``ScalerExecutor()`` writes the worker command into its private directory and the daemon
starts it first thing (``--early-workers``, cli/daemon.py). These check that such a worker
is what the manager's own workers are — the daemon's child, with its lifeline held by the
daemon alone, its exit reported with the real cause, replaced when it dies — that a bad
``--early-workers`` file is a usage error naming the problem, and the process handle
(``manager/process.py``) the daemon keeps its workers with.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from scaler_testing import child_env, daemon_of, wait_until, workers_of

from scaler_executor import ScalerExecutor, WorkerLost
from scaler_executor.manager.process import WorkerProcess


def hold_while(flag: str) -> int:
    """Occupy a processor while ``flag`` exists; publishes its pid first."""
    import time

    with open(flag + ".pid", "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 120
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def _pipe_inode(pid: int, fd: int) -> str:
    target = os.readlink(f"/proc/{pid}/fd/{fd}")
    assert target.startswith("pipe:"), f"fd {fd} of {pid} is {target}, not a pipe"
    return target


def _writers_of(pipe: str, pids: list[int]) -> list[int]:
    """Which of ``pids`` hold ``pipe`` open for writing."""
    out = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != pipe:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                out.append(pid)
    return out


@pytest.fixture
def executor(fresh_executor: Callable[..., ScalerExecutor]) -> Iterator[ScalerExecutor]:
    yield fresh_executor(max_workers=1)


@pytest.mark.timeout(60)
def test_the_first_worker_is_the_daemons_child_and_only_the_daemon_holds_its_lifeline(
    executor: ScalerExecutor,
) -> None:
    assert executor.submit(abs, -3).result(timeout=30) == 3
    daemon = daemon_of(executor)
    (worker,) = workers_of(daemon)
    assert worker.ppid() == daemon.pid
    assert "--lifeline" in worker.cmdline()
    lifeline = _pipe_inode(worker.pid, 0)
    everyone = [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]
    assert _writers_of(lifeline, everyone) == [daemon.pid]
    # The daemon's own lifeline: written by this process only.
    assert _writers_of(_pipe_inode(daemon.pid, 0), everyone) == [os.getpid()]


@pytest.mark.timeout(120)
def test_an_early_worker_killed_is_reported_with_its_signal_and_replaced(
    executor: ScalerExecutor, tmp_path: Path
) -> None:
    flag = str(tmp_path / "hold")
    open(flag, "w").close()
    future = executor.options(max_retries=0).submit(hold_while, flag)
    assert wait_until(lambda: os.path.exists(flag + ".pid"), timeout=30)
    daemon = daemon_of(executor)
    (worker,) = workers_of(daemon)
    worker.send_signal(signal.SIGKILL)
    with pytest.raises(WorkerLost) as info:
        future.result(timeout=60)
    assert "SIGKILL" in str(info.value), str(info.value)
    os.unlink(flag)
    assert executor.submit(abs, -4).result(timeout=60) == 4  # on the replacement
    (replacement,) = workers_of(daemon)
    assert replacement.pid != worker.pid and replacement.ppid() == daemon.pid


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff not json", "is not JSON"),
        (b"[]", 'must hold {"command": [...], "count": N}'),
        (json.dumps({"command": [], "count": 1}).encode(), "command must be a non-empty list of strings"),
        (json.dumps({"command": ["python"], "count": -1}).encode(), "count must be an integer from 0 to 1024"),
        (json.dumps({"command": ["python"], "count": True}).encode(), "count must be an integer from 0 to 1024"),
    ],
)
@pytest.mark.timeout(60)
def test_a_bad_early_workers_file_is_a_usage_error_naming_the_problem(
    tmp_path: Path, content: bytes, message: str
) -> None:
    spec = tmp_path / "workers.json"
    spec.write_bytes(content)
    proc = subprocess.run(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", f"ipc://{tmp_path}/d.sock",
         "--workers", "1", "--early-workers", str(spec)],
        env=child_env(), capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "--early-workers" in last and message in last, proc.stderr
    assert not (tmp_path / "d.sock").exists()


@pytest.mark.timeout(60)
def test_early_workers_without_local_workers_is_a_usage_error(tmp_path: Path) -> None:
    spec = tmp_path / "workers.json"
    spec.write_text(json.dumps({"command": [sys.executable, "-c", "pass"], "count": 0}))
    proc = subprocess.run(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", f"ipc://{tmp_path}/d.sock",
         "--early-workers", str(spec)],
        env=child_env(), capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--early-workers needs local workers (--workers N)" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- WorkerProcess


@pytest.mark.timeout(60)
def test_worker_process_lifeline_is_its_stdin_and_its_exit_code_is_known() -> None:
    child = WorkerProcess([sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.exit(3)"])
    try:
        assert stat.S_ISFIFO(os.stat(f"/proc/{child.pid}/fd/0").st_mode)
        assert child.poll() is None
        # It blocks reading its lifeline: it cannot have exited in any time at all.
        with pytest.raises(TimeoutError, match=f"worker pid {child.pid} still running after 0.001 s"):
            child.wait(0.001)
        assert child.stdin is not None
        child.stdin.close()  # the lifeline closes: it reads EOF and exits
        assert child.wait(30) == 3
        assert child.poll() == 3 and child.returncode == 3
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()


@pytest.mark.timeout(60)
def test_worker_process_killed_has_the_signal_as_negative_returncode() -> None:
    child = WorkerProcess([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"])
    child.kill()
    assert child.wait(30) == -signal.SIGKILL
    child.send_signal(signal.SIGTERM)  # once reaped, a no-op: never a signal to a reused pid
    assert child.stdin is not None
    child.stdin.close()


CHECK_FDS = """
import os, sys
mine = {os.readlink("/proc/self/fd/" + fd) for fd in os.listdir("/proc/self/fd") if os.path.exists("/proc/self/fd/" + fd)}
sys.exit(10 if sys.argv[1] in mine else 0)
"""


@pytest.mark.timeout(60)
def test_worker_process_holds_no_other_descriptor_of_its_parent() -> None:
    r, w = os.pipe()  # close-on-exec, as Python makes every descriptor: the worker must not hold it
    try:
        child = WorkerProcess([sys.executable, "-c", CHECK_FDS, os.readlink(f"/proc/self/fd/{w}")])
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(30) == 0, "the worker inherited a descriptor of its parent"
    finally:
        os.close(r)
        os.close(w)
