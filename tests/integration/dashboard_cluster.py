"""A real ``scaler-daemon --workers N --dashboard 127.0.0.1:0`` for the dashboard's tests:
its URL (with the token) read from the daemon's log, a client, and clean teardown."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import psutil
from scaler_testing import child_env, wait_until

from scaler_executor import ClusterConfig, ScalerExecutor

WAIT = 60.0  # bound on any single wait on a loaded machine; never a timing assertion
FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "50", "--log-level", "INFO")
CLIENT = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=20.0)


class DashboardCluster:
    def __init__(self, tmp: Path, *extra: str, workers: int = 1) -> None:
        self.address = f"ipc://{tmp}/daemon.sock"
        self.log_path = tmp / "daemon.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address,
                 "--workers", str(workers), "--dashboard", "127.0.0.1:0", *extra, *FLAGS],
                env=child_env(), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        found: list[str] = []

        def url_printed() -> bool:
            if self.proc.poll() is not None:
                return True
            found[:] = re.findall(r"dashboard at (http://\S+)", self.log())
            return bool(found)

        assert wait_until(url_printed, timeout=WAIT), self.log()
        assert self.proc.poll() is None and found, self.log()
        self.url = found[0]
        parts = urlsplit(self.url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.token = parts.query.removeprefix("token=")
        (self.dashboard,) = [
            p for p in psutil.Process(self.proc.pid).children()
            if "scaler_executor.monitor.dashboard" in " ".join(p.cmdline())
        ]  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> ScalerExecutor:
        return ScalerExecutor(address=self.address, config=CLIENT)

    def get(self, path: str, token: str | None = None, cookie: str | None = None) -> tuple[int, str]:
        """(status, body) of a GET; ``token`` as a bearer header, ``cookie`` as the dashboard's cookie."""
        request = urllib.request.Request(self.base + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if cookie is not None:
            request.add_header("Cookie", f"scaler_dashboard_token={cookie}")
        try:
            with urllib.request.urlopen(request, timeout=WAIT) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # The dashboard process is the daemon's child: gone with its lifeline (stdin's EOF).
        _, alive = psutil.wait_procs([self.dashboard], timeout=WAIT)
        for p in alive:
            p.kill()
        assert not alive, "the dashboard outlived its daemon"
        assert "Traceback" not in self.log(), self.log()
