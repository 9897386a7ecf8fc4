"""``scaler-top`` in a real pseudo-terminal (tmux): it shows the workers and task counts of
a real secured daemon, changes as tasks run, sorts by a column on its key, and quits cleanly
on ``q`` and on Ctrl-C.  The screen is read with ``capture-pane``; every wait is bounded."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from scaler_testing import child_env, wait_until
from test_security import WAIT, Cluster

from scaler_executor.cli.top import render
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.stats import Statistics

pytestmark = [pytest.mark.timeout(120), pytest.mark.requires_system(commands=("tmux",))]


def square(x: int) -> int:
    return x * x


class Tmux:
    """A tmux server of this test's own (-S, in a directory removed at the end), so nobody
    else's sessions are touched and no socket file is left behind."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="scaler-top-")  # short: a socket path has ~100 bytes
        self.socket = os.path.join(self.dir, "tmux.sock")
        self.session = "top"
        self.status = os.path.join(self.dir, "status")

    def run(self, *args: str) -> str:
        tmux = shutil.which("tmux")
        assert tmux is not None
        done = subprocess.run([tmux, "-S", self.socket, *args], capture_output=True, text=True, timeout=WAIT)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, command: list[str], env: dict[str, str]) -> None:
        # The program runs under a shell that writes its exit status to a file and then keeps
        # the pane open, so the last screen can still be read.  tmux's own record of a dead
        # pane is not used: tmux 3.3a at times leaves a pane's exited process unreaped, its
        # status blank for good, and with remain-on-exit at times drops the last output.
        script = f"{shlex.join(command)}; echo $? > {shlex.quote(self.status)}; exec sleep 600"
        env_args = [a for k, v in env.items() if k in ("PYTHONPATH", "PATH", "HOME") for a in ("-e", f"{k}={v}")]
        self.run("new-session", "-d", "-s", self.session, "-x", "80", "-y", "40", *env_args, "sh", "-c", script)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-J", "-t", self.session)  # -J: wrapped lines joined

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def exited(self) -> tuple[bool, str]:
        """(whether the program ended, its exit status as the shell reports it: 128+N for
        signal N)."""
        try:
            with open(self.status) as f:
                text = f.read()
        except FileNotFoundError:
            return False, ""
        if not text.endswith("\n"):
            return False, ""  # the shell is still writing it
        return True, text.strip()

    def close(self) -> None:
        tmux = shutil.which("tmux")
        if tmux is not None and os.path.exists(self.socket):
            subprocess.run([tmux, "-S", self.socket, "kill-server"], capture_output=True, timeout=WAIT)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux()
    try:
        yield t
    finally:
        t.close()


def _top(cluster: Cluster, tmux: Tmux, credential: str) -> None:
    tmux.start([sys.executable, "-m", "scaler_executor.cli.top", cluster.address, "--credentials", credential], child_env())
    assert wait_until(lambda: "scaler-top" in tmux.screen() and "NAME" in tmux.screen(), timeout=WAIT), tmux.screen()


@pytest.mark.parametrize("quit_with", ["q", "C-c"])
def test_top_shows_workers_and_tasks_sorts_and_quits(cluster: Cluster, tmux: Tmux, quit_with: str) -> None:
    mon = cluster.credential("mon", "monitor")
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon("--workers", "2")
    _top(cluster, tmux, mon)
    assert wait_until(lambda: "workers 2" in tmux.screen(), timeout=WAIT), tmux.screen()
    with cluster.client(alice) as ex:
        assert list(ex.map(square, range(7))) == [x * x for x in range(7)]
        assert wait_until(lambda: "total: submitted 7 finished 7" in tmux.screen(), timeout=WAIT), tmux.screen()
    screen = tmux.screen()
    assert "NAME^" in screen and "t=TASKS" in screen and "q: quit" in screen
    # Both local workers map the daemon's store: a STORE column each, one store line.
    assert "STORE" in screen and "o=STORE" in screen
    assert wait_until(lambda: "2 worker(s) map it" in tmux.screen(), timeout=WAIT), tmux.screen()
    tmux.keys("t")
    assert wait_until(lambda: "TASKS^" in tmux.screen(), timeout=WAIT), tmux.screen()
    tmux.keys("t")
    assert wait_until(lambda: "TASKSv" in tmux.screen(), timeout=WAIT), tmux.screen()
    tmux.keys(quit_with)
    assert wait_until(lambda: tmux.exited()[0], timeout=WAIT), tmux.screen()
    assert tmux.exited() == (True, "0")
    assert "Traceback" not in tmux.screen()


def test_top_with_a_client_key_says_why_and_exits(cluster: Cluster, tmux: Tmux) -> None:
    alice = cluster.credential("alice", "client")
    cluster.secure_daemon()
    tmux.start([sys.executable, "-m", "scaler_executor.cli.top", cluster.address, "--credentials", alice], child_env())
    assert wait_until(lambda: tmux.exited()[0], timeout=WAIT), tmux.screen()
    assert tmux.exited() == (True, "2")
    assert "has role client: it cannot join as a monitor" in tmux.screen()


def test_render_sorts_workers_by_the_chosen_column() -> None:
    def worker(name: str, tasks: int) -> m.WorkerStat:
        return m.WorkerStat(name, "h", 1, 2, tasks, 0, 0, 0, 0, -1.0, 0, 0.1, 0.0, False, "")

    stats = Statistics.from_message(
        m.Stats({"tasks": 5, "workers": 3}, 1.0, [worker("b", 1), worker("a", 3), worker("c", 2)])
    )
    names = lambda lines: [line.split()[0] for line in lines if line[:1] in "abc" and " h " in line]  # noqa: E731
    assert names(render(stats, "tcp://x:1")) == ["a", "b", "c"]
    assert names(render(stats, "tcp://x:1", sort="t")) == ["b", "c", "a"]
    assert names(render(stats, "tcp://x:1", sort="t", reverse=True)) == ["a", "c", "b"]


def test_render_shows_each_workers_store_the_stores_once_and_the_managers() -> None:
    def worker(name: str, host: str, store: str) -> m.WorkerStat:
        used = 8 << 20 if store else 0
        return m.WorkerStat(
            name, host, 1, 2, 1, 0, 0, 0, 0, 0.0123, 0, 0.1, 0.0, False, "", 3 << 20, 0, 0.5, store, used,
            (1 << 30) if store else 0, 1 if store else 0,
        )  # fmt: skip

    manager = m.ManagerStat("cpu", "slurm", False, 8, 10, 20, 30, 1, 2, 1, "Priority", "worker cpu-4 gone: exit 1\nits log", 5.0, 4, 7)
    stats = Statistics.from_message(
        m.Stats(
            {"tasks": 0, "workers": 3}, 1.0, [worker("a", "node-1", "s1"), worker("b", "node-1", "s1"), worker("c", "node-2", "")],
            store={"capacity": 1 << 30, "in_use": 8 << 20, "objects": 1}, store_name="s1", managers=[manager],
        )
    )  # fmt: skip
    lines = render(stats, "tcp://x:1")
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    header = next(line for line in lines if line.startswith("NAME"))
    store_at = header.index("STORE")
    rows = {line.split()[0]: line for line in lines if line[:2] in ("a ", "b ", "c ")}
    assert rows["a"][store_at : store_at + 5].strip() == "8.0M" and rows["c"][store_at : store_at + 5].strip() == "-"
    # One line for the shared store, not one per worker.
    assert [line for line in lines if line.startswith("store")] == [
        "store (the daemon's): 8.0M of 1.00G in use, 1 objects, 2 worker(s) map it"
    ]
    text = "\n".join(lines)
    assert "cpu slurm (gone): workers requested 10 starting 20 running 30 draining 1" in text
    assert "failed 2, ended by the infrastructure 4, tasks interrupted 7" in text
    assert "waiting: Priority" in text and "last error 5s ago: worker cpu-4 gone: exit 1" in text
    assert "o=STORE" in text
    by_store = render(stats, "tcp://x:1", sort="o")
    assert [line.split()[0] for line in by_store if line[:2] in ("a ", "b ", "c ")] == ["c", "a", "b"]
