"""A worker whose daemon never answers exits cleanly, with its processors, after
worker_daemon_loss_timeout (the reconnection policy, protocol/rejoin.py); it logs the
missing daemon once, not once per Hello."""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest
from scaler_testing import REPO, child_env, wait_until

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_without_a_daemon_exits_with_its_processors(tmp_path) -> None:
    log = tmp_path / "worker.log"
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.worker", address, "--processors", "2",
             "--insecure", "--heartbeat-interval", "0.1", "--worker-daemon-loss-timeout", "3"],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO,
        )
    try:
        agent = psutil.Process(worker.pid)
        # The zygote and its two processors exist before any daemon answers.
        assert wait_until(lambda: len(agent.children(recursive=True)) >= 3, timeout=60), log.read_text()
        below = agent.children(recursive=True)
        assert worker.wait(60) == 4, log.read_text()
        _gone, alive = psutil.wait_procs(below, timeout=30)
        assert not alive, f"processors outlived their worker: {alive}"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = log.read_text()
    assert text.count("worker_daemon_loss_timeout") == 1, text
    assert "no daemon answered at " + address in text, text
