"""The report's renderer (scheduler/report.py) on a snapshot built by the pure core: every
section is there, every untrusted string (worker names, tracebacks, causes) is escaped, and the
page refers to nothing outside itself."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from core_testing import Cluster, client_with_function, spec, tid

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.scheduler.history import history_message
from scaler_executor.scheduler.report import render_report, write_report
from scaler_executor.worker.processor import dump_exception

EVIL = "<script>alert('x')</script>"
SECTIONS = ("summary", "stream", "throughput", "memory", "failures", "store", "configuration")


def _error(text: str) -> bytes:
    try:
        raise ValueError(text)
    except ValueError as exc:
        return dump_exception(exc)


def _run() -> tuple[Cluster, m.History]:
    cluster = Cluster()
    cluster.tick()
    cid, fn = client_with_function(cluster)
    cluster.join(b"w1", m.Hello(**{**_hello_fields(), "name": EVIL, "capacity": 4}))
    cluster.send(b"w1", m.Heartbeat(0, 0, memory=3 << 20, memory_limit=1 << 30, cpu=1.5), dt=1.0)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(2, 6)]))
    tasks = sorted(cluster.scheduler.tasks)
    results = [
        m.TaskResult(t, 0, Status.OK if i else Status.ERROR, _error(f"bad <b>{i}</b> & more") if not i else b"v",
                     m.TaskFacts(EVIL, 100.0 + i, 100.4 + i * 1.3, 0), [])
        for i, t in enumerate(tasks)
    ]  # fmt: skip
    cluster.send(b"w1", m.TaskResults(results), dt=2.0)
    runs = RunLog(len(results))  # what the worker reports of them beside its heartbeat
    for result in results:
        runs.ran(result.facts.started, result.facts.finished, result.status)
    cluster.send(b"w1", runs.take())
    return cluster, history_message(cluster.scheduler)


def _hello_fields() -> dict[str, object]:
    from core_testing import hello

    return hello(m.Role.WORKER)._asdict()


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_every_section_and_the_figures_are_in_the_page() -> None:
    cluster, history = _run()
    stats = cluster.scheduler.statistics()
    page = render_report(stats, history, client_config={"address": "ipc:///x", "heartbeat_interval": 0.1}, generated=0.0)
    parser = _Collector()
    parser.feed(page)
    ids = {attrs.get("id") for tag, attrs in parser.tags if tag == "section"}
    assert set(SECTIONS) <= ids
    runs = [attrs for tag, attrs in parser.tags if tag == "rect" and attrs.get("class") == "run"]
    assert len(runs) == 4  # a bar per task run
    assert {attrs["fill"] for attrs in runs} == {"#2e9d5b", "#d43a3a"}  # ok and error
    text = "".join(parser.text)
    assert "ValueError: bad <b>0</b> & more" in text  # the failure's line, as text
    assert "raise ValueError(text)" in text  # and its traceback
    assert "ipc:///x" in text and "heartbeat_interval" in text  # the client's and the daemon's config
    assert "3.0 MiB" in text  # the worker's memory


def test_untrusted_strings_are_escaped_and_nothing_is_loaded() -> None:
    cluster, history = _run()
    page = render_report(cluster.scheduler.statistics(), history, client_config={"name": EVIL})
    assert "<script" not in page.lower()
    assert "<b>0</b>" not in page  # the exception's message, escaped
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page  # the worker's name, in the stream and table
    parser = _Collector()
    parser.feed(page)
    assert not [t for t, attrs in parser.tags if t == "script"]
    for tag, attrs in parser.tags:
        assert not {"src", "href", "action"} & set(attrs), (tag, attrs)
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
    assert "url(" not in page and "@import" not in page
    # The only http:// is SVG's namespace; the CSP forbids loading anything anyway.
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in page


def test_an_empty_run_still_renders_every_section(tmp_path: Path) -> None:
    cluster = Cluster()
    page = render_report(cluster.scheduler.statistics(), history_message(cluster.scheduler))
    for section in SECTIONS:
        assert f'id="{section}"' in page
    assert "no task run recorded" in page
    path = tmp_path / "r.html"
    write_report(path, page)
    assert path.read_text() == page and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_the_stores_once_and_the_managers_are_in_the_page() -> None:
    cluster, history = _run()
    scheduler = cluster.scheduler
    scheduler.object_store = "scaler-7-r"
    scheduler.store_stats = lambda: {"capacity": 1 << 30, "in_use": 5 << 20, "data_bytes": 5 << 20, "objects": 2}
    cluster.send(b"w1", m.Heartbeat(0, 0, store="scaler-7-r", store_bytes=5 << 20, store_capacity=1 << 30, store_objects=2))
    cluster.join(b"m1", m.Hello(**{**_hello_fields(), "role": m.Role.MANAGER, "name": "cpu"}))
    cluster.send(b"m1", m.ManagerOffer("slurm", 4, 0, 2, {}, [], 1.0, "partition p", []))
    page = render_report(scheduler.statistics(), history)
    parser = _Collector()
    parser.feed(page)
    text = "".join(parser.text)
    assert "scaler-7-r (the daemon's)" in text and "Each store once" in text
    assert 'id="managers"' in page and "slurm" in text and "Worker managers" in text
