"""The web dashboard and Prometheus ``/metrics``: a separate process reading through the monitor role.

::

    browser / Prometheus ──HTTP──► scaler-dashboard (this module, its own process)
                                   ├ every request: the token (query once → cookie, or a
                                   │  bearer token header), else 401 (none) / 403 (wrong)
                                   ├ /            index.html + /static/* (package data)
                                   ├ /api/snapshot  the snapshot as JSON (the page polls it 1/s)
                                   ├ /api/history   the task stream and memory series as JSON
                                   │  (the page polls it every HISTORY_SECONDS)
                                   └ /metrics     Prometheus text (metrics.py)
                                        │ one Monitor (monitor/client.py), under a lock; a
                                        │ snapshot reused for SNAPSHOT_SECONDS, a history
                                        │ (its JSON) for HISTORY_SECONDS
                                        ▼
                                   scaler-daemon (a monitor: can change nothing)

Why a separate process and not HTTP inside the daemon's poller: the daemon's loop then never
parses HTTP, never runs a thread that takes the GIL from it, and never holds a socket for a
slow browser; the only work a watcher costs it is a snapshot, rate-limited per monitor by the
daemon itself (core.py).  Nobody watching costs nothing: the monitor connects on the first
request, not at start.  ``scaler-daemon --dashboard HOST:PORT`` starts this process beside
itself (its lifeline is its stdin: EOF, and it exits); ``scaler-dashboard ADDRESS`` runs it
by hand, on any host with a monitor key.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scaler_executor.config import parse_listen
from scaler_executor.exceptions import ProtocolError
from scaler_executor.monitor import metrics
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.stats import Statistics

__all__ = ["DashboardServer", "SnapshotSource", "history_json", "main", "snapshot_json"]

COOKIE = "scaler_dashboard_token"
SNAPSHOT_SECONDS = 0.5  # the daemon shares one snapshot among monitors this long anyway
# The history (up to 20,000 runs, ~1 MB from the daemon) is fetched at most this often,
# however many pages poll; the page polls it as often (dashboard.js HISTORY_MS).
HISTORY_SECONDS = 5.0
STREAM_SECONDS = 300.0  # the task stream's window: runs that ended in the last 5 minutes,
STREAM_MERGE = STREAM_SECONDS / 1000  # a worker's runs of one status this close merge into one bar,
STREAM_BARS = 5000  # and the most recent this many bars are sent (one SVG rect each on the page)
SERIES_SECONDS = 3600.0  # the memory series' window: the last hour of the daemon's buckets
STATUS_NAMES = {v: k.lower() for k, v in vars(m.Status).items() if isinstance(v, int)}
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


class SnapshotSource:
    """Snapshots for every request thread, from one Monitor made on first use.

    ``connect``: makes the Monitor (called under the lock, again after a failure).
    """

    def __init__(self, connect: Any) -> None:
        self._connect = connect
        self._monitor: Any = None
        self._lock = threading.Lock()  # guards the monitor and the cached snapshot
        self._cached: tuple[float, Statistics] | None = None
        self._history: tuple[float, bytes] | None = None  # (fetched at, the JSON every page gets)

    def get(self) -> Statistics:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < SNAPSHOT_SECONDS:
                return self._cached[1]
            stats: Statistics = self._ask(lambda monitor: monitor.snapshot(timeout=5.0))
            self._cached = (now, stats)
            return stats

    def history(self) -> bytes:
        """``history_json`` of the daemon's history, encoded, fetched at most every HISTORY_SECONDS."""
        with self._lock:
            now = time.monotonic()
            if self._history is not None and now - self._history[0] < HISTORY_SECONDS:
                return self._history[1]
            history: m.History = self._ask(lambda monitor: monitor.history(timeout=5.0))
            body = json.dumps(history_json(history, time.time())).encode()
            self._history = (now, body)
            return body

    def _ask(self, call: Any) -> Any:
        """``call(monitor)``, under the lock, joining first if need be."""
        try:
            if self._monitor is None:
                self._monitor = self._connect()
            return call(self._monitor)
        except BaseException:  # a broken connection is not reused: the next request joins again
            if self._monitor is not None:
                self._monitor.close()
            self._monitor = None
            raise

    def close(self) -> None:
        with self._lock:
            if self._monitor is not None:
                self._monitor.close()
                self._monitor = None


def snapshot_json(stats: Statistics) -> dict[str, Any]:
    """What the page reads: plain JSON types only."""
    return {
        "counters": dict(stats.counters),
        "tasks_by_state": dict(stats.tasks_by_state),
        "uptime": stats.uptime,
        "workers": [
            {
                "name": w.name, "host": w.host, "pid": w.pid, "processors": w.processors, "tasks": w.tasks,
                "queued": w.queued, "running": w.running, "load": w.load, "mean_task_seconds": w.mean_task_seconds,
                "peak_memory": w.peak_memory, "last_heard": w.last_heard, "draining": w.draining, "broken": w.broken,
                "memory": w.memory, "memory_limit": w.memory_limit, "cpu": w.cpu, "store": w.store,
                "store_bytes": w.store_bytes, "store_capacity": w.store_capacity, "store_objects": w.store_objects,
            }
            for w in stats.workers
        ],
        "clients": [{"name": c.name, "host": c.host, "tasks": c.tasks, "last_heard": c.last_heard} for c in stats.clients],
        "windows": [
            {"seconds": w.seconds, "finished": w.finished, "failed": w.failed, "throughput": w.throughput,
             "mean_seconds": w.mean_seconds}
            for w in stats.windows
        ],
        "failures": [
            {"ago": e.ago, "kind": e.kind, "task_id": e.task_id, "where": e.where, "cause": e.cause, "detail": e.detail}
            for e in stats.failures
        ],
        "store": dict(stats.store),
        "stores": [
            {"name": u.name, "bytes": u.bytes, "capacity": u.capacity, "objects": u.objects, "workers": len(u.workers),
             "hosts": list(u.hosts), "daemon": u.daemon}
            for u in stats.stores
        ],
        "managers": [
            {"name": g.name, "kind": g.kind, "connected": g.connected, "max_workers": g.max_workers,
             "requested": g.requested, "starting": g.starting, "running": g.running, "draining": g.draining,
             "failed": g.failed, "pending_keys": g.pending_keys, "pending_reason": g.pending_reason,
             "last_error": g.last_error, "last_error_ago": g.last_error_ago,
             "infrastructure_ends": g.infrastructure_ends, "interrupted_tasks": g.interrupted_tasks}
            for g in stats.managers
        ],
    }


def history_json(history: m.History, now: float) -> dict[str, Any]:
    """What the page's task stream and memory panel read, trimmed to what they draw.

    ``bars``: [worker index, start, end, status, runs] — a worker's runs of one status that
    ended in the last STREAM_SECONDS, merged when less than STREAM_MERGE apart (a bar is
    then ``runs`` runs: at thousands of tasks a second a bar per run would be millions of
    rects), times in seconds relative to ``now`` (this host's clock; the runs carry their
    workers' wall clocks); the most recent STREAM_BARS.  ``series``: [start, memory bytes,
    workers] per bucket of ``bucket_seconds``, start relative to the daemon's uptime (so
    ≤ 0), the last SERIES_SECONDS of it.  ``runs_recorded``: false when the daemon records
    no runs (its ``history_runs`` is 0), so the page says why the stream is empty.
    """
    since = now - STREAM_SECONDS
    recent = sorted((run for run in history.runs if run.finished >= since), key=lambda run: (run.worker, run.started))
    workers: dict[str, int] = {}
    bars: list[list[Any]] = []
    for run in recent:
        index = workers.setdefault(run.worker, len(workers))
        status = STATUS_NAMES.get(run.status, "?")
        start, end = round(run.started - now, 3), round(run.finished - now, 3)
        last = bars[-1] if bars else None
        if last is not None and last[0] == index and last[3] == status and start <= last[2] + STREAM_MERGE:
            last[2] = max(last[2], end)
            last[4] += 1
        else:
            bars.append([index, start, end, status, 1])
    if len(bars) > STREAM_BARS:
        bars = sorted(bars, key=lambda bar: bar[2])[-STREAM_BARS:]
    series = [
        [round(b.start - history.uptime, 1), b.memory, b.workers]
        for b in history.series
        if b.start + history.bucket_seconds >= history.uptime - SERIES_SECONDS
    ]
    return {
        "workers": list(workers), "bars": bars, "runs_seen": history.runs_seen, "runs_kept": len(history.runs),
        "runs_recorded": history.config.get("history_runs") != "0",
        "stream_seconds": STREAM_SECONDS, "series": series, "bucket_seconds": history.bucket_seconds,
        "series_seconds": SERIES_SECONDS, "uptime": history.uptime,
    }  # fmt: skip


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server; ``token`` is required on every request (``/metrics`` too unless
    ``metrics_without_token``)."""

    daemon_threads = True

    def __init__(self, listen: tuple[str, int], source: SnapshotSource, token: str, *, metrics_without_token: bool = False) -> None:
        if len(token) < 16:
            raise ValueError("a dashboard token must be at least 16 characters")
        self.source = source
        self.token = token
        self.metrics_without_token = metrics_without_token
        super().__init__(listen, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that closes or resets its connection mid-request (a preconnected socket
        it no longer needs, a page closed) is routine: said nothing of.  Anything else is a
        fault of this server's, printed with its traceback as the base class does."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        address = self.server_address
        host, port = str(address[0]), int(address[1])
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/?token={self.token}"


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        pass  # one line per poll would drown the daemon's log

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query).get("token", [])
        if query:  # the URL printed at start: keep the token as a cookie, drop it from the address bar
            if not self._matches(query[0]):
                return self._refuse(HTTPStatus.FORBIDDEN, "wrong token")
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", url.path or "/")
            self.send_header("Set-Cookie", f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if not (url.path == "/metrics" and self.server.metrics_without_token):
            given = self._given_token()
            if given is None:
                return self._refuse(HTTPStatus.UNAUTHORIZED, "a token is required: open the URL the dashboard printed")
            if not self._matches(given):
                return self._refuse(HTTPStatus.FORBIDDEN, "wrong token")
        if url.path in STATIC:
            name, kind = STATIC[url.path]
            return self._reply(HTTPStatus.OK, kind, resources.files("scaler_executor.monitor").joinpath("static", name).read_bytes())
        if url.path not in ("/api/snapshot", "/api/history", "/metrics"):
            return self._reply(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")
        try:
            if url.path == "/api/history":
                return self._reply(HTTPStatus.OK, "application/json", self.server.source.history())
            stats = self.server.source.get()
        except (ProtocolError, ValueError, OSError) as exc:  # the daemon is gone or refuses us (TimeoutError is an OSError)
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", f"daemon unavailable: {exc}\n".encode())
        if url.path == "/metrics":
            return self._reply(HTTPStatus.OK, metrics.CONTENT_TYPE, metrics.render(stats).encode())
        return self._reply(HTTPStatus.OK, "application/json", json.dumps(snapshot_json(stats)).encode())

    def _given_token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header[len("Bearer ") :].strip()
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def _matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.server.token.encode())

    def _refuse(self, status: HTTPStatus, text: str) -> None:
        self._reply(status, "text/plain; charset=utf-8", f"{status.value} {status.phrase}: {text}\n".encode(),
                    (("WWW-Authenticate", 'Bearer realm="scaler"'),) if status is HTTPStatus.UNAUTHORIZED else ())  # fmt: skip

    def _reply(self, status: HTTPStatus, kind: str, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


# --------------------------------------------------------------------------- the process


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scaler-dashboard",
        description="Serve the web dashboard and Prometheus /metrics of a scaler-executor daemon (read-only).",
    )
    parser.add_argument("address", help="the daemon's address (tcp://HOST:PORT or ipc:///PATH)")
    parser.add_argument("--listen", default="127.0.0.1:8787", help="HOST:PORT to serve HTTP on (default 127.0.0.1:8787)")
    parser.add_argument("--credentials", help="a monitor credential file (scaler-keys issue DIR NAME --role monitor)")
    parser.add_argument("--insecure", action="store_true", help="connect to a daemon run with --insecure")
    parser.add_argument(
        "--metrics-without-token", action="store_true",
        help="serve /metrics without the token (everything else still needs it)",
    )  # fmt: skip
    parser.add_argument("--token-stdin", action="store_true", help=argparse.SUPPRESS)  # started by scaler-daemon
    parser.add_argument("--credential-stdin", action="store_true", help=argparse.SUPPRESS)  # and its monitor key
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        listen = parse_listen(args.listen)
    except ValueError as exc:
        parser.exit(2, f"scaler-dashboard: {exc}\n")
    # Started by scaler-daemon: the token is stdin's first line, and EOF after it means the daemon is gone.
    token = sys.stdin.readline().strip() if args.token_stdin else secrets.token_urlsafe(24)
    from scaler_executor.monitor.client import Monitor

    security = None
    if args.credential_stdin:  # the ephemeral monitor key a secured daemon issued us, the line after the token
        from scaler_executor.security.client import ClientSecurity
        from scaler_executor.security.keys import Credential

        security = ClientSecurity(Credential.from_line(sys.stdin.readline(), "the credential on stdin"), args.address)

    def connect() -> Monitor:
        return Monitor(
            args.address, credentials=args.credentials, insecure=args.insecure, name="dashboard", timeout=5.0,
            security=security,
        )  # fmt: skip

    source = SnapshotSource(connect)
    try:
        server = DashboardServer(listen, source, token, metrics_without_token=args.metrics_without_token)
    except OSError as exc:
        parser.exit(1, f"scaler-dashboard: cannot listen on {args.listen}: {exc.strerror or exc}; choose another port\n")
    print(f"scaler-dashboard: {server.url}", flush=True)
    thread = threading.Thread(target=server.serve_forever, name="scaler-dashboard", daemon=True)
    thread.start()
    try:
        if args.token_stdin:
            while os.read(0, 4096):  # the lifeline: returns b"" when the daemon's end closes
                pass
        else:
            thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
