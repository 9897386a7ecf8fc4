"""The run's report: one self-contained HTML file (``ex.report(path)``, ``scaler-daemon --report``).

:func:`render_report` is pure: a :class:`~.stats.Statistics` snapshot and a
:class:`~scaler_executor.protocol.messages.History` in, text out.  The page has inline CSS
and inline SVG, no script and no external resource (its Content-Security-Policy forbids
both), so it opens offline, anywhere, after the cluster is gone.  Every string that came
from a task, a worker or a traceback is HTML-escaped.

It lives beside the snapshot types (the scheduler's layer) because both the client (``ex.report``)
and the daemon (``--report``) render it, and neither role may import a monitor's module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.stats import STATUS_NAMES, Statistics

__all__ = ["render_report", "write_report"]

WIDTH = 1000  # the charts' width in SVG units (they scale to the page)
LABEL = 170  # the task stream's worker-name column
LANE = 7  # a lane's height in the stream
MAX_LANES = 32  # per worker; more overlapping runs share the least busy lane
COLOURS = {
    m.Status.OK: "#2e9d5b",
    m.Status.ERROR: "#d43a3a",
    m.Status.TIMEOUT: "#e8901b",
    m.Status.CANCELLED: "#9a9a9a",
    m.Status.FORCE_CANCELLED: "#9a9a9a",
}
OTHER_COLOUR = "#a05ab5"

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; border-bottom: 1px solid #ddd; margin-top: 1.6em; }
.meta { color: #666; }
table { border-collapse: collapse; margin: 0.4em 0; } td, th { padding: 2px 10px 2px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.cols { display: flex; gap: 3em; flex-wrap: wrap; }
svg { width: 100%; height: auto; background: #fafafa; border: 1px solid #eee; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
details { margin: 0.4em 0; } summary { cursor: pointer; }
.legend span { display: inline-block; margin-right: 1.2em; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.empty { color: #888; font-style: italic; }
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def _seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def _table(rows: Iterable[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for value in row:
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f'<td class="n">{_e(value)}</td>' if numeric else f"<td>{_e(value)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _status(status: int) -> str:
    return STATUS_NAMES.get(status, f"status {status}")


# --------------------------------------------------------------------------- sections


def _summary(stats: Statistics, history: m.History) -> str:
    c = stats.counters
    keys = ("submitted", "finished", "failed", "cancelled", "retried", "workers_lost", "clients_lost", "refused")
    main = [(k, c.get(k, 0)) for k in keys]
    main.insert(0, ("uptime", _seconds(max(stats.uptime, history.uptime))))
    main.append(("task runs in the stream", f"{len(history.runs)} of {history.runs_seen}"))
    timed = stats.durations
    if timed.count:
        main.append(("mean run time", _seconds(timed.total_seconds / timed.count)))
    states = [(s, n) for s, n in stats.tasks_by_state.items()]
    workers = [
        (
            w.name, w.host, w.processors, w.tasks,
            "" if w.memory is None else _size(w.memory),
            "" if w.memory_limit is None else _size(w.memory_limit),
            "" if w.cpu is None else f"{w.cpu:.2f}",
            w.broken or ("draining" if w.draining else ""),
        )
        for w in stats.workers
    ]  # fmt: skip
    other = sorted((k, v) for k, v in c.items() if k not in keys)
    return (
        '<section id="summary"><h2>Summary</h2><div class="cols">'
        f"<div>{_table(main)}</div><div><b>Tasks now, by state</b>{_table(states)}</div></div>"
        f"<h3>Workers at the time of the report ({len(workers)})</h3>"
        + (
            _table(workers, ("name", "host", "processors", "tasks", "memory", "limit", "cpu", "state"))
            if workers
            else '<p class="empty">no worker connected</p>'
        )
        + f"<details><summary>All counters ({len(other)})</summary>{_table(other)}</details></section>"
    )


def _configuration(history: m.History, client_config: Mapping[str, Any] | None) -> str:
    daemon = _table(sorted(history.config.items())) if history.config else '<p class="empty">not known</p>'
    if client_config is None:
        client = '<p class="empty">none (written by the daemon)</p>'
    else:
        client = _table(sorted((k, "" if v is None else v) for k, v in client_config.items()))
    return (
        '<section id="configuration"><h2>Configuration</h2><div class="cols">'
        f"<div><h3>The daemon's</h3>{daemon}</div><div><h3>The client's</h3>{client}</div></div></section>"
    )


def _pack(runs: list[m.TaskRun]) -> list[int]:
    """A lane for each run (sorted by start) so that runs in a lane do not overlap."""
    ends: list[float] = []
    lanes = []
    for run in runs:
        for i, end in enumerate(ends):
            if end <= run.started:
                ends[i] = run.finished
                lanes.append(i)
                break
        else:
            if len(ends) < MAX_LANES:
                ends.append(run.finished)
                lanes.append(len(ends) - 1)
            else:
                i = min(range(len(ends)), key=ends.__getitem__)
                ends[i] = max(ends[i], run.finished)
                lanes.append(i)
    return lanes


def _stream(history: m.History) -> str:
    runs = history.runs
    head = '<section id="stream"><h2>Task stream</h2>'
    if not runs:
        off = history.config.get("history_runs") == "0"
        text = "task runs are not recorded (the daemon's history_runs is 0)" if off else "no task run recorded"
        return head + f'<p class="empty">{text}</p></section>'
    t0 = min(r.started for r in runs)
    span = max(max(r.finished for r in runs) - t0, 1e-6)
    scale = (WIDTH - LABEL - 10) / span
    by_worker: dict[str, list[m.TaskRun]] = {}
    for run in runs:
        by_worker.setdefault(run.worker, []).append(run)
    body, y = [], 4
    for worker in sorted(by_worker):
        mine = sorted(by_worker[worker], key=lambda r: r.started)
        lanes = _pack(mine)
        height = (max(lanes) + 1) * LANE
        body.append(f'<text x="4" y="{y + min(height, 12) - 2}">{_e(worker[:28])}</text>')
        for run, lane in zip(mine, lanes, strict=True):
            x = LABEL + (run.started - t0) * scale
            w = max((run.finished - run.started) * scale, 0.6)
            colour = COLOURS.get(run.status, OTHER_COLOUR)
            tip = f"{worker}: {_status(run.status)}, {_seconds(run.finished - run.started)}, at +{_seconds(run.started - t0)}"
            body.append(
                f'<rect class="run" x="{x:.2f}" y="{y + lane * LANE}" width="{w:.2f}" height="{LANE - 1}" '
                f'fill="{colour}"><title>{_e(tip)}</title></rect>'
            )
        y += height + 6
        body.append(f'<line x1="0" x2="{WIDTH}" y1="{y - 3}" y2="{y - 3}" stroke="#e4e4e4"/>')
    y += 14
    body.append(f'<text x="{LABEL}" y="{y - 2}">0</text>')
    body.append(f'<text x="{WIDTH - 6}" y="{y - 2}" text-anchor="end">{_e(_seconds(span))}</text>')
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{_e(name)}</span>'
        for name, colour in (("ok", COLOURS[m.Status.OK]), ("error", COLOURS[m.Status.ERROR]),
                             ("timeout", COLOURS[m.Status.TIMEOUT]), ("cancelled", COLOURS[m.Status.CANCELLED]),
                             ("other", OTHER_COLOUR))
    )  # fmt: skip
    dropped = history.runs_seen - len(runs)
    note = f" (the oldest {dropped} runs are not kept)" if dropped > 0 else ""
    return (
        head + f'<p class="meta">{len(runs)} task runs on {len(by_worker)} workers over {_e(_seconds(span))}'
        f"{_e(note)}; a row per worker, overlapping runs in lanes; the workers' clocks.</p>"
        f'<div class="legend">{legend}</div>'
        f'<svg viewBox="0 0 {WIDTH} {y}" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg></section>'
    )


def _chart(
    points: list[tuple[float, float]], end: float, label: str, fmt: Any, colour: str, bars: list[tuple[float, float]] | None = None
) -> str:
    """An SVG step line of ``points`` (x seconds, y) from 0 to ``end``; ``bars``: (x, y) drawn under it."""
    height, pad = 160, 30
    top = max([y for _, y in points] + [y for _, y in bars or []] + [1e-9])
    end = max(end, max((x for x, _ in points), default=0.0), 1e-6)
    sx = (WIDTH - pad - 10) / end
    sy = (height - 30) / top

    def xy(x: float, y: float) -> str:
        return f"{pad + x * sx:.1f},{height - 18 - y * sy:.1f}"

    parts = [f'<line x1="{pad}" x2="{WIDTH - 10}" y1="{height - 18}" y2="{height - 18}" stroke="#bbb"/>']
    for x, y in bars or []:
        parts.append(
            f'<rect x="{pad + x * sx:.1f}" y="{height - 18 - y * sy:.1f}" width="{max(sx * 0.9, 0.5):.1f}" '
            f'height="{y * sy:.1f}" fill="#d43a3a" opacity="0.8"/>'
        )
    if points:
        line, previous = [], None
        for x, y in points:
            if previous is not None:
                line.append(xy(x, previous))
            line.append(xy(x, y))
            previous = y
        line.append(xy(end, previous if previous is not None else 0.0))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(line)}"/>')
    parts.append(f'<text x="{pad}" y="12">{_e(label)}: up to {_e(fmt(top))}</text>')
    parts.append(f'<text x="{pad}" y="{height - 4}">0</text>')
    parts.append(f'<text x="{WIDTH - 10}" y="{height - 4}" text-anchor="end">{_e(_seconds(end))}</text>')
    return f'<svg viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'


def _series(history: m.History, stats: Statistics) -> str:
    series, width = history.series, history.bucket_seconds
    end = max(history.uptime, series[-1].start if series else 0.0)
    note = (
        f'<p class="meta">Buckets of {_e(_seconds(width))} over the whole run (older ones merged as it grew); '
        "the daemon's clock from its start.</p>"
    )
    if not series:
        empty = '<p class="empty">nothing recorded</p>'
        return (
            f'<section id="throughput"><h2>Throughput</h2>{empty}</section>'
            f'<section id="memory"><h2>Memory and workers</h2>{empty}</section>'
        )
    last = series[-1].start

    def per_second(b: m.SeriesBucket, n: int) -> float:
        # the last bucket may still be filling: its rate over the part of it that passed
        return n / (width if b.start < last else max(min(width, history.uptime - b.start), 1.0))

    ended = [(b.start, per_second(b, b.finished + b.failed)) for b in series]
    failed = [(b.start, per_second(b, b.failed)) for b in series if b.failed]
    memory = [(b.start, float(b.memory)) for b in series]
    workers = [(b.start, float(b.workers)) for b in series]
    throughput = _chart(ended, end, "tasks ended per second (red: failed)", lambda v: f"{v:.3g}/s", "#2e6fd4", failed)
    memory_chart = _chart(memory, end, "the workers' memory (the most their heartbeats said)", _size, "#7a3fc0")
    workers_chart = _chart(workers, end, "workers connected", lambda v: f"{v:.0f}", "#555")
    return (
        f'<section id="throughput"><h2>Throughput</h2>{note}{throughput}</section>'
        f'<section id="memory"><h2>Memory and workers</h2>{memory_chart}{workers_chart}</section>'
    )


def _failures(stats: Statistics) -> str:
    failures = stats.failures
    head = '<section id="failures"><h2>Recent failures</h2>'
    if not failures:
        return head + '<p class="empty">none in the daemon\'s recent events</p></section>'
    items = []
    for e in failures:
        where = f" on {e.where}" if e.where else ""
        line = f"{e.kind}: task {e.task_id:#x}{where}, {_seconds(e.ago)} before the report: {e.cause}"
        detail = f"<pre>{_e(e.detail)}</pre>" if e.detail else ""
        items.append(f'<details class="failure" open><summary>{_e(line)}</summary>{detail}</details>')
    others = [e for e in stats.events if e not in failures]
    rest = ""
    if others:
        rows = [(e.kind, e.where, e.cause, _seconds(e.ago)) for e in others]
        rest = f"<details><summary>Other recent events ({len(others)})</summary>{_table(rows, ('kind', 'where', 'cause', 'ago'))}</details>"
    return head + f'<p class="meta">The last {len(failures)} the daemon kept.</p>' + "".join(items) + rest + "</section>"


def _store(stats: Statistics) -> str:
    head = '<section id="store"><h2>Object store</h2>'
    if not stats.store:
        return head + '<p class="empty">no object store on the daemon\'s host</p></section>'
    rows = [(k, _size(v) if "bytes" in k else v) for k, v in sorted(stats.store.items())]
    return head + _table(rows) + _stores(stats) + "</section>"


def _stores(stats: Statistics) -> str:
    """Each store once (the workers of one host share one), with the workers that map it."""
    stores = stats.stores
    if not stores:
        return ""
    rows = [
        (u.name + (" (the daemon's)" if u.daemon else ""), _size(u.bytes), _size(u.capacity), u.objects, len(u.workers), ", ".join(u.hosts))
        for u in stores
    ]
    return '<p class="meta">Each store once; the workers of one host share one.</p>' + _table(
        rows, ("store", "allocated", "capacity", "objects", "workers", "hosts")
    )


def _managers(stats: Statistics) -> str:
    if not stats.managers:
        return ""
    rows = [
        (
            g.name, g.kind or "-", "yes" if g.connected else "no", g.requested, g.starting, g.running, g.draining,
            g.failed, g.infrastructure_ends, g.interrupted_tasks, g.last_error or g.pending_reason or "",
        )
        for g in stats.managers
    ]  # fmt: skip
    header = (
        "manager", "kind", "connected", "requested", "starting", "running", "draining", "failed",
        "infrastructure ends", "interrupted tasks", "last error / waiting for",
    )  # fmt: skip
    return '<section id="managers"><h2>Worker managers</h2>' + _table(rows, header) + "</section>"


# --------------------------------------------------------------------------- the page


def render_report(
    stats: Statistics,
    history: m.History,
    *,
    client_config: Mapping[str, Any] | None = None,
    title: str = "scaler-executor run report",
    generated: float | None = None,
    source: str = "",
) -> str:
    """The report as one self-contained HTML page (see the module's docstring)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(time.time() if generated is None else generated))
    meta = f"Written {when}" + (f" by {source}" if source else "")
    csp = "default-src 'none'; style-src 'unsafe-inline'"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body>"
        f'<h1>{_e(title)}</h1><p class="meta">{_e(meta)}</p>'
        + _summary(stats, history)
        + _stream(history)
        + _series(history, stats)
        + _failures(stats)
        + _store(stats)
        + _managers(stats)
        + _configuration(history, client_config)
        + "</body></html>\n"
    )


def write_report(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
