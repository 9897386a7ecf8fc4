"""``scaler-top ADDRESS``: a terminal view of a running cluster, refreshed every second.

::

    scaler-top ── Monitor (monitor role, read-only) ── StatsRequest/Stats ──► scaler-daemon
       │
       └ render(snapshot) -> lines (pure, tested without a terminal) ─► curses screen

It connects as a monitor (``--credentials`` a file issued with ``--role monitor``, or
``--insecure`` for a daemon run with ``--insecure``; ipc:// needs neither), so it can change
nothing.  The worker table sorts by any column: press the column's key (shown in the
footer), the same key again to reverse; ``q`` or Ctrl-C quits.  Plain curses, no colours or
mouse: it works over SSH on any terminal with a terminfo entry.
"""

from __future__ import annotations

import argparse
import curses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from scaler_executor.exceptions import ConfigError, ProtocolError
from scaler_executor.scheduler.stats import Statistics, WorkerStatistics

REFRESH_SECONDS = 1.0
KEY_POLL_MS = 100  # how long the screen waits for a key between checks of the clock


def _mib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.1f}M" if n < 2**30 else f"{n / 2**30:.2f}G"


def _short(n: int | None) -> str:
    """Bytes in at most 4 characters (``512B``, ``8.0M``, ``123M``, ``1.5G``), for a narrow column."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in "BKMGTP":
        if value < 1000 or unit == "P":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if unit == "B" or value >= 10 else f"{value:.1f}{unit}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


# (key, heading, width, sort key, cell)
Column = tuple[str, str, int, Callable[[WorkerStatistics], Any], Callable[[WorkerStatistics], str]]
COLUMNS: list[Column] = [  # 79 characters in all: an 80-column terminal shows every column
    ("n", "NAME", 12, lambda w: w.name, lambda w: w.name[:12]),
    ("h", "HOST", 7, lambda w: w.host, lambda w: w.host[:7]),
    ("p", "PROCS", 5, lambda w: w.processors, lambda w: str(w.processors)),
    ("t", "TASKS", 5, lambda w: w.tasks, lambda w: str(w.tasks)),
    ("l", "LOAD", 5, lambda w: w.load, lambda w: f"{w.load:.2f}"),
    ("u", "QUEUE", 5, lambda w: w.queued, lambda w: str(w.queued)),
    ("r", "RUN", 4, lambda w: w.running, lambda w: str(w.running)),
    ("c", "CPU", 4, lambda w: w.cpu or 0.0, lambda w: "-" if w.cpu is None else f"{w.cpu:.1f}"),
    ("e", "MEANMS", 6, lambda w: w.mean_task_seconds or 0.0, lambda w: _ms(w.mean_task_seconds)[:6]),
    ("m", "MEM", 5, lambda w: w.memory or 0, lambda w: _short(w.memory)),
    # Bytes in use in the host store the worker maps: shared by the workers of its host.
    ("o", "STORE", 5, lambda w: w.store_bytes or 0, lambda w: _short(w.store_bytes)),
    ("s", "HEARD", 5, lambda w: w.last_heard, lambda w: f"{w.last_heard:.1f}"),
]
SORT_KEYS = {c[0]: c for c in COLUMNS}


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return " ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def render(stats: Statistics, address: str, sort: str = "n", reverse: bool = False, error: str = "") -> list[str]:
    """The screen's lines for one snapshot (not clipped to the terminal)."""
    c = stats.counters
    lines = [
        f"scaler-top {address}  up {stats.uptime:.0f}s  monitors {c.get('monitors', 0)}",
        f"workers {c.get('workers', 0)}  procs {c.get('processors', 0)}  clients {c.get('clients', 0)}  "
        f"tasks {c.get('tasks', 0)}: " + " ".join(f"{state} {n}" for state, n in stats.tasks_by_state.items() if n),
    ]
    for window in stats.windows:
        lines.append(
            f"last {window.seconds:.0f}s: finished {window.finished} failed {window.failed} "
            f"{window.throughput:.1f}/s mean {_ms(window.mean_seconds)}ms max {_ms(window.max_seconds)}ms"
        )
    totals = [f"{k} {c.get(k, 0)}" for k in ("submitted", "finished", "failed", "cancelled", "retried")]
    lines.append("total: " + " ".join(totals))
    lost = [f"{k} {c.get(k, 0)}" for k in ("workers_lost", "clients_lost", "refused", "dropped_messages")]
    lines.append("       " + " ".join(lost))
    for store in stats.stores:  # each once, however many workers (the STORE column) map it
        whose = "the daemon's" if store.daemon else ", ".join(store.hosts)[:20]
        lines.append(
            f"store ({whose}): {_mib(store.bytes)} of {_mib(store.capacity)} in use, {store.objects} objects, "
            f"{len(store.workers)} worker(s) map it"
        )
    lines.append(error)
    column = SORT_KEYS.get(sort, COLUMNS[0])
    widths = [col[2] for col in COLUMNS]
    headings = [col[1] + ("v" if col is column and reverse else "^" if col is column else "") for col in COLUMNS]
    lines.append(_row(headings, widths))
    for w in sorted(stats.workers, key=column[3], reverse=reverse):
        lines.append(_row([col[4](w) for col in COLUMNS], widths))
    if stats.managers:
        lines.append("")
        lines.append("managers:")
        for g in stats.managers:
            lines.append(
                f"  {g.name[:16]} {g.kind[:8] or '-'}{'' if g.connected else ' (gone)'}: workers requested "
                f"{g.requested} starting {g.starting} running {g.running} draining {g.draining}"
            )
            if g.failed or g.infrastructure_ends or g.interrupted_tasks:
                lines.append(
                    f"    failed {g.failed}, ended by the infrastructure {g.infrastructure_ends}, "
                    f"tasks interrupted {g.interrupted_tasks}"
                )
            if g.pending_reason:
                lines.append(f"    waiting: {g.pending_reason}")
            if g.last_error:
                lines.append(f"    last error {g.last_error_ago or 0.0:.0f}s ago: {g.last_error.splitlines()[0]}")
    failures = stats.failures[-5:]
    if failures:
        lines.append("")
        lines.append("recent failures:")
        for e in reversed(failures):
            lines.append(f"  {e.ago:6.1f}s ago  {e.kind}  task {e.task_id:#x}  {e.where}  {e.cause}")
    lines.append("")
    keys = [f"{col[0]}={col[1]}" for col in COLUMNS]
    lines.append("sort by: " + " ".join(keys[:7]))
    lines.append("         " + " ".join(keys[7:]) + "  (same key: reverse)  q: quit")
    return lines


def _draw(screen: Any, lines: list[str]) -> None:
    height, width = screen.getmaxyx()
    screen.erase()
    for y, line in enumerate(lines[: max(0, height - 1)]):
        screen.addnstr(y, 0, line, max(0, width - 1))
    screen.refresh()


CTRL_C = 3


def _run(screen: Any, monitor: Any, address: str, interval: float) -> int:
    # Raw mode: Ctrl-C arrives as a key, read between snapshots, rather than as SIGINT
    # raised wherever the program is (inside a socket call, say); q and Ctrl-C quit alike.
    curses.raw()
    curses.curs_set(0)
    screen.timeout(KEY_POLL_MS)
    sort, reverse = "n", False
    stats: Statistics | None = None
    error = ""
    next_fetch = 0.0
    while True:
        now = time.monotonic()
        if now >= next_fetch:
            next_fetch = now + interval
            try:
                stats, error = monitor.snapshot(timeout=max(interval, 2.0)), ""
            except TimeoutError as exc:
                error = f"no answer: {exc}"
        if stats is not None:
            _draw(screen, render(stats, address, sort, reverse, error))
        else:
            _draw(screen, [f"scaler-top  {address}", error or "waiting for the first snapshot..."])
        key = screen.getch()
        if key in (ord("q"), ord("Q"), CTRL_C):
            return 0
        if 0 <= key < 256 and chr(key) in SORT_KEYS:
            pressed = chr(key)
            sort, reverse = pressed, (not reverse if pressed == sort else False)
            next_fetch = 0.0 if stats is None else next_fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scaler-top",
        description="A live terminal view of a scaler cluster's workers and tasks (read-only).",
    )
    parser.add_argument("address", help="the daemon's address, tcp://HOST:PORT or ipc://PATH")
    parser.add_argument("--credentials", metavar="FILE", help="a monitor credential (scaler-keys issue ... --role monitor)")
    parser.add_argument("--insecure", action="store_true", help="connect without CURVE (a daemon run with --insecure)")
    parser.add_argument("--interval", type=float, default=REFRESH_SECONDS, metavar="SECONDS", help="refresh period (default 1)")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    from scaler_executor.monitor import Monitor, MonitorRefused

    try:
        monitor = Monitor(args.address, credentials=args.credentials, insecure=args.insecure)
    except (ConfigError, MonitorRefused, TimeoutError) as exc:
        print(f"scaler-top: {exc}", file=sys.stderr)
        return 2
    try:
        return int(curses.wrapper(_run, monitor, args.address, args.interval))
    except KeyboardInterrupt:
        return 0  # Ctrl-C: curses.wrapper has restored the terminal
    except (MonitorRefused, ProtocolError) as exc:
        print(f"scaler-top: {exc}", file=sys.stderr)
        return 2
    finally:
        monitor.close()


if __name__ == "__main__":
    sys.exit(main())
