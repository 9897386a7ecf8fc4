"""``scaler-daemon --dashboard HOST:PORT``: the dashboard process started beside the daemon.

The daemon writes the token on the child's stdin and keeps that pipe open as its lifeline
(the child exits on EOF: the daemon stopped, or died); the child answers with one line, the
URL to open, which the daemon prints.  The token never appears in a command line (``ps``
shows those to every user of the host).
"""

from __future__ import annotations

import logging
import secrets
import selectors
import subprocess
import sys
from typing import TYPE_CHECKING

from scaler_executor.config import ClusterConfig

if TYPE_CHECKING:
    from scaler_executor.security.keys import Credential

__all__ = ["DashboardFailed", "DashboardProcess", "start_dashboard"]

log = logging.getLogger("scaler_executor.daemon")
START_SECONDS = 30.0  # an interpreter and http.server on a loaded host; the URL line comes after


class DashboardFailed(RuntimeError):
    """The dashboard process did not start (its own message says why)."""


class DashboardProcess:
    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process = process
        self.url = url

    def stop(self) -> None:
        """Close its lifeline and reap it (killed if it does not exit in 5 s)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_dashboard(
    config: ClusterConfig, listen: str, *, metrics_without_token: bool = False, credential: Credential | None = None
) -> DashboardProcess:
    """Start the dashboard for the daemon of ``config``; ``credential``: its monitor key on a
    secured tcp:// daemon (sent on its stdin after the token).  Raises DashboardFailed."""
    assert config.address is not None
    command = [sys.executable, "-m", "scaler_executor.monitor.dashboard", config.address, "--listen", listen, "--token-stdin"]
    if credential is not None:
        command.append("--credential-stdin")
    if config.insecure and config.address.startswith("tcp://"):
        command.append("--insecure")
    if metrics_without_token:
        command.append("--metrics-without-token")
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(secrets.token_urlsafe(24).encode() + b"\n")
    if credential is not None:
        process.stdin.write(credential.to_line().encode("ascii") + b"\n")
    process.stdin.flush()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(START_SECONDS)
    line = process.stdout.readline().decode(errors="replace").strip() if ready else ""
    prefix = "scaler-dashboard: "
    if not line.startswith(prefix):
        DashboardProcess(process, "").stop()
        raise DashboardFailed(
            f"the dashboard on {listen} did not start (exit code {process.returncode}); its error is above"
            if line == "" else f"the dashboard on {listen} said {line!r} instead of its URL"
        )  # fmt: skip
    url = line[len(prefix) :]
    # Printed, not only logged: the URL (with its token) is how anyone gets in.
    print(f"scaler-daemon: dashboard at {url}", file=sys.stderr, flush=True)
    log.info("daemon: dashboard process %d serving %s", process.pid, listen)
    return DashboardProcess(process, url)
