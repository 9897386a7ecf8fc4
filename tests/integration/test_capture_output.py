"""Per-task output: ``ex.options(capture_output=True)`` and the ``capture_output`` config.

A task's stdout, stderr (at the fd level: C code, ``os.write``, subprocesses) and log
records reach ``task_info(f)`` whether it succeeded, failed or its process died; a
failure's exception carries the tail; a task printing 100 MB returns a bounded head and
tail with a note, and its processor's memory stays bounded (worker/capture.py).
"""

from __future__ import annotations

import glob
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

from scaler_executor import ScalerExecutor, task_info
from scaler_executor.exceptions import WorkerLost
from scaler_testing import FAST, fast_config

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20


def _capture_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "scaler-capture-*")))


@pytest.fixture(scope="module")
def ex() -> Iterator[ScalerExecutor]:
    before = _capture_dirs()
    executor = ScalerExecutor(max_workers=1, config=FAST)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)
    assert _capture_dirs() - before == set(), "a worker left its capture directory behind"


# ----------------------------------------------------------------------------- tasks


def chatty(x: int) -> int:
    print(f"print {x}")
    print(f"to stderr {x}", file=sys.stderr)
    sys.stdout.flush()
    os.write(1, b"raw fd 1\n")  # as C code writes: below sys.stdout
    os.write(2, b"raw fd 2\n")
    subprocess.run([sys.executable, "-c", "import sys; print('child out'); print('child err', file=sys.stderr)"], check=True)
    logging.getLogger("user.code").warning("warned %d", x)
    return x * 2


def failing(x: int) -> int:
    for i in range(100):
        print(f"line {i}")
    raise ValueError(f"bad {x}")


def dies(marker: str) -> None:
    print(f"before death {marker}")
    sys.stdout.flush()
    os.write(2, b"fd 2 before death\n")
    print("never flushed")  # in sys.stdout's buffer when the process dies: lost
    os.kill(os.getpid(), signal.SIGKILL)


def floods(megabytes: int) -> int:
    chunk = ("x" * 1023 + "\n") * 1024  # 1 MiB
    sys.stdout.write("HEAD-MARK\n")
    for _ in range(megabytes):
        sys.stdout.write(chunk)
    sys.stdout.write("TAIL-MARK\n")
    return megabytes


def quiet() -> int:
    return 1


def prints(text: str) -> None:
    print(text, end="")


# ----------------------------------------------------------------------------- tests


def test_success_captures_every_stream(ex: ScalerExecutor) -> None:
    f = ex.options(capture_output=True).submit(chatty, 21)
    assert f.result(timeout=60) == 42
    info = task_info(f)
    assert info is not None and info.stdout is not None and info.stderr is not None and info.logs is not None
    for line in ("print 21", "raw fd 1", "child out"):
        assert line in info.stdout.splitlines()
    for line in ("to stderr 21", "raw fd 2", "child err"):
        assert line in info.stderr.splitlines()
    assert "print 21" not in info.stderr and "to stderr 21" not in info.stdout
    records = [r for r in info.logs if r[2] == "user.code"]
    assert [(level, message) for _, level, _, message in records] == [("WARNING", "warned 21")]
    assert info.worker and info.finished >= info.started > 0


def test_each_task_gets_only_its_own_output(ex: ScalerExecutor) -> None:
    view = ex.options(capture_output=True)
    first = view.submit(prints, "first\n")
    first.result(timeout=60)
    second = view.submit(quiet)
    second.result(timeout=60)
    info = task_info(second)
    assert info is not None and info.stdout == "" and info.stderr == ""
    assert task_info(first).stdout == "first\n"  # type: ignore[union-attr]


def test_uncaptured_task_has_none(ex: ScalerExecutor) -> None:
    f = ex.submit(quiet)
    f.result(timeout=60)
    info = task_info(f)
    assert info is not None and info.stdout is None and info.stderr is None and info.logs is None


def test_failure_keeps_output_and_notes_its_tail(ex: ScalerExecutor) -> None:
    f = ex.options(capture_output=True).submit(failing, 7)
    with pytest.raises(ValueError, match="bad 7") as caught:
        f.result(timeout=60)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "the task's stdout ended with:" in notes
    assert "line 99" in notes and "line 80" in notes and "line 79" not in notes  # the last 20 lines
    info = task_info(f)
    assert info is not None and info.stdout is not None
    assert info.stdout.splitlines() == [f"line {i}" for i in range(100)]


def test_map_captures_per_call(ex: ScalerExecutor) -> None:
    view = ex.options(capture_output=True)
    futures = [view.submit(prints, f"call {i}\n") for i in range(5)]
    for i, f in enumerate(futures):
        f.result(timeout=60)
        assert task_info(f).stdout == f"call {i}\n"  # type: ignore[union-attr]
    assert list(view.map(prints, ["a", "b"])) == [None, None]


def test_a_killed_task_keeps_what_it_wrote_to_its_fds(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(max_retries=0))
    f = ex.options(capture_output=True).submit(dies, "m1")
    with pytest.raises(WorkerLost) as caught:
        f.result(timeout=60)
    info = task_info(f)
    assert info is not None and info.stdout is not None and info.stderr is not None
    assert "before death m1" in info.stdout
    # Bytes in sys.stdout's buffer die with the process; with PYTHONUNBUFFERED (inherited
    # by the workers) there is no buffer, and the line was written at once.
    assert ("never flushed" in info.stdout) == bool(os.environ.get("PYTHONUNBUFFERED"))
    assert "fd 2 before death" in info.stderr
    assert "the process running this task died" in info.stderr
    assert info.logs == ()
    assert "before death m1" in "\n".join(getattr(caught.value, "__notes__", []))
    # The processor was replaced; the next capturing task sees only its own output.
    g = ex.options(capture_output=True).submit(prints, "after\n")
    g.result(timeout=60)
    assert task_info(g).stdout == "after\n"  # type: ignore[union-attr]


def hangs(marker: str) -> None:
    import time

    print(f"started {marker}", flush=True)
    time.sleep(600)


def test_a_timed_out_task_keeps_its_output(ex: ScalerExecutor) -> None:
    from scaler_executor.exceptions import TaskTimeout

    f = ex.options(capture_output=True, task_timeout=1.0).submit(hangs, "t1")
    with pytest.raises(TaskTimeout) as caught:
        f.result(timeout=60)
    info = task_info(f)
    assert info is not None and info.stdout == "started t1\n"
    assert "the process running this task died" in (info.stderr or "")
    assert "started t1" in "\n".join(getattr(caught.value, "__notes__", []))


def test_a_100_mb_print_is_bounded(ex: ScalerExecutor) -> None:
    f = ex.options(capture_output=True).submit(floods, 100)
    assert f.result(timeout=120) == 100
    info = task_info(f)
    assert info is not None and info.stdout is not None
    limit = MiB  # capture_output_limit's default
    assert len(info.stdout.encode()) <= limit + 200  # the head, the tail, and the note
    assert info.stdout.startswith("HEAD-MARK\n")
    assert info.stdout.endswith("TAIL-MARK\n")
    left_out = 100 * MiB + len("HEAD-MARK\nTAIL-MARK\n") - limit
    assert f"[scaler-executor: {left_out} bytes of output left out here; capture_output_limit is {limit} bytes]" in info.stdout
    # The processor read two slices, never the whole file (its private memory at the end
    # of the task; a read of all of it would add 100 MiB).
    assert 0 < info.peak_memory < 60 * MiB, info.peak_memory


def test_limit_is_a_config_key(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(capture_output=True, capture_output_limit=100))
    text = "".join(f"{i:03d}\n" for i in range(200))  # 800 bytes
    f = ex.submit(prints, text)  # plain submit: the config's default captures
    f.result(timeout=60)
    out = task_info(f).stdout  # type: ignore[union-attr]
    assert out is not None
    head, note, tail = out.split("\n[", 1)[0], out.split("\n[", 1)[1].split("]\n", 1)[0], out.split("]\n", 1)[1]
    assert text.startswith(head) and len(head) == 50
    assert text.endswith(tail) and len(tail) == 50
    assert note == "scaler-executor: 700 bytes of output left out here; capture_output_limit is 100 bytes"
    # The option overrides the config's default; a view that did not ask keeps it, and
    # its get() runs (graph tasks are not captured) rather than refusing.
    g = ex.options(capture_output=False).submit(prints, "x")
    g.result(timeout=60)
    assert task_info(g).stdout is None  # type: ignore[union-attr]
    h = ex.options(priority=1).submit(prints, "y")
    h.result(timeout=60)
    assert task_info(h).stdout == "y"  # type: ignore[union-attr]
    assert ex.options(priority=1).get({"a": 1}, "a") == 1


def test_logging_is_bounded(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(capture_output_limit=2000))
    f = ex.options(capture_output=True).submit(_log_many, 500)
    f.result(timeout=60)
    logs = task_info(f).logs  # type: ignore[union-attr]
    assert logs is not None
    mine = [r[3] for r in logs if r[2] == "user.many"]
    assert mine[0] == "record 0" and mine[-1] == "record 499"
    assert len(mine) < 500
    gaps = [r[3] for r in logs if r[2] == "scaler_executor.capture"]
    assert gaps == [f"{500 - len(mine)} log records left out here (capture_output_limit)"]


def _log_many(n: int) -> None:
    log = logging.getLogger("user.many")
    for i in range(n):
        log.warning("record %d", i)


def test_forward_output_prints_lines_where_they_ran(
    fresh_executor: Callable[..., ScalerExecutor], capsys: pytest.CaptureFixture[str]
) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(forward_output=True))
    f = ex.submit(chatty, 5)  # the config captures every task
    assert f.result(timeout=60) == 10
    info = task_info(f)
    assert info is not None
    out, err = capsys.readouterr()
    prefix = f"[worker {info.worker} task {info.task_id:#x}] "
    assert prefix + "print 5" in out.splitlines() and prefix + "child out" in out.splitlines()
    assert prefix + "to stderr 5" in err.splitlines() and prefix + "raw fd 2" in err.splitlines()


def test_option_is_validated(ex: ScalerExecutor) -> None:
    with pytest.raises(TypeError, match="capture_output must be True, False or None"):
        ex.options(capture_output="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capture_output must be True, False or None"):
        ex.options(priority=1).options(capture_output=1)
    with pytest.raises(ValueError, match="capture_output applies to submit and map, not to get"):
        ex.options(capture_output=True).get({"a": 1}, "a")
    chained = ex.options(capture_output=True).options(priority=2).submit(prints, "kept")
    chained.result(timeout=60)
    assert task_info(chained).stdout == "kept"  # type: ignore[union-attr]


def test_config_rejects_a_bad_limit() -> None:
    from scaler_executor.config import ClusterConfig, ConfigError

    with pytest.raises(ConfigError, match="capture_output_limit"):
        ClusterConfig(capture_output_limit=1)
