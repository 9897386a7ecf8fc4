"""Prometheus ``/metrics`` of ``scaler-daemon --dashboard``: read by prometheus_client's own
text parser and checked against the statistics; refused without the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from dashboard_cluster import WAIT, DashboardCluster
from prometheus_client.parser import text_string_to_metric_families
from scaler_testing import wait_until

from scaler_executor.monitor import metrics
from scaler_executor.scheduler.stats import (
    DURATION_BOUNDS,
    ManagerStatistics,
    Statistics,
    TaskDurations,
    WorkerStatistics,
)

pytestmark = pytest.mark.timeout(180)


def square(x: int) -> int:
    return x * x


def fails(x: int) -> int:
    raise ValueError(f"no {x}")


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """family name → {sorted labels: value}, through Prometheus's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[DashboardCluster]:
    c = DashboardCluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_metrics_parse_and_match_the_statistics(cluster: DashboardCluster) -> None:
    with cluster.client() as ex:
        assert list(ex.map(square, range(20))) == [x * x for x in range(20)]
        with pytest.raises(ValueError, match="no 3"):
            ex.submit(fails, 3).result(timeout=WAIT)
        # Run times reach the daemon summed up in the worker's TaskRuns, within a heartbeat.
        assert wait_until(lambda: ex.statistics().durations.count == 20, timeout=WAIT)
        stats = ex.statistics()
        scraped: list[str] = []

        def caught_up() -> bool:  # monitors share a snapshot up to 0.5 s old (core.py): poll, bounded
            status, text = cluster.get("/metrics", token=cluster.token)
            assert status == 200, text
            scraped[:] = [text]
            return "scaler_tasks_completed_total{outcome=\"failed\"} 1" in text and "scaler_task_duration_seconds_count 20" in text

        assert wait_until(caught_up, timeout=WAIT), scraped
        got = parse(scraped[0])
        assert got["scaler_tasks_completed_total"][(("outcome", "finished"),)] == stats["finished"] >= 20
        assert got["scaler_tasks_completed_total"][(("outcome", "failed"),)] == stats["failed"] == 1
        assert got["scaler_tasks_submitted_total"][()] == stats["submitted"] == 21
        assert got["scaler_workers"][()] == len(stats.workers) == 1
        assert got["scaler_clients"][()] == 1  # the dashboard is a monitor, not a client
        assert got["scaler_processors"][()] == stats["processors"]
        states = {dict(labels)["state"]: v for labels, v in got["scaler_tasks"].items()}
        assert states == dict(stats.tasks_by_state)
        assert got["scaler_object_store_capacity_bytes"][()] == stats.store["capacity"] > 0
        (worker,) = stats.workers
        labels = (("host", worker.host), ("worker", worker.name))
        assert got["scaler_worker_processors"][labels] == worker.processors
        assert got["scaler_worker_tasks"][labels] == 0
        # The run time histogram: every timed task in it once, buckets cumulative up to +Inf.
        histogram = stats.durations
        assert got["scaler_task_duration_seconds_count"][()] == histogram.count >= 20
        assert got["scaler_task_duration_seconds_sum"][()] == pytest.approx(histogram.total_seconds)
        buckets = sorted((float(dict(labels)["le"]), n) for labels, n in got["scaler_task_duration_seconds_bucket"].items())
        assert [n for _, n in buckets] == sorted(n for _, n in buckets)
        assert buckets[-1] == (float("inf"), histogram.count)
        assert buckets[0][0] == histogram.bounds[0]


def test_metrics_and_page_refuse_requests_without_the_token(cluster: DashboardCluster) -> None:
    for path in ("/metrics", "/api/snapshot", "/api/history", "/", "/static/dashboard.js"):
        status, body = cluster.get(path)
        assert status == 401 and "token is required" in body, (path, status, body)
        status, _ = cluster.get(path, token="x" * 32)
        assert status == 403, path
        status, _ = cluster.get(path, cookie="y" * 32)
        assert status == 403, path
    status, body = cluster.get("/api/snapshot", cookie=cluster.token)
    assert status == 200 and '"workers"' in body
    status, body = cluster.get("/api/history", token=cluster.token)
    assert status == 200 and '"bars"' in body and '"series"' in body
    status, _ = cluster.get("/?token=" + "z" * 32)
    assert status == 403


def test_metrics_without_token_is_an_explicit_flag_only_for_metrics(tmp_path: Path) -> None:
    c = DashboardCluster(tmp_path, "--metrics-without-token")
    try:
        status, text = c.get("/metrics")
        assert status == 200 and "# TYPE scaler_workers gauge" in text, text
        assert c.get("/api/snapshot")[0] == 401
        assert c.get("/api/history")[0] == 401
        assert c.get("/")[0] == 401
    finally:
        c.close()


def _worker(name: str) -> WorkerStatistics:
    return WorkerStatistics(name, "host-a", 1, 2, 1, 0, 0, 0, 1, 0.5, 1000, 0.1, 0.0, False, None)


def _stats(*workers: WorkerStatistics, store: dict[str, int] | None = None, store_name: str = "", managers: tuple[ManagerStatistics, ...] = ()) -> Statistics:
    counts = (0,) * (len(DURATION_BOUNDS) + 1)
    return Statistics(
        MappingProxyType({"finished": 3, "processors": 2 * len(workers)}), MappingProxyType({"pending": 0}),
        1.0, workers, (), (), (), MappingProxyType(store or {}), TaskDurations(DURATION_BOUNDS, counts, 0.0),
        store_name, managers,
    )  # fmt: skip


def test_store_use_per_worker_and_per_store_counted_once() -> None:
    """Two workers of one host map the daemon's store, a third maps none: the per-worker
    series repeat the shared store's figures (labelled with it), the per-store ones count it once."""
    import dataclasses

    def mapping(name: str, used: int) -> WorkerStatistics:
        return dataclasses.replace(_worker(name), store="scaler-9", store_bytes=used, store_capacity=1 << 30, store_objects=4)

    stats = _stats(
        mapping("w1", 1 << 20), mapping("w2", 2 << 20), _worker("w3"), store_name="scaler-9",
        store={"capacity": 1 << 30, "in_use": 3 << 20, "data_bytes": 3 << 20, "objects": 5},
    )  # fmt: skip
    got = parse(metrics.render(stats))
    label = (("host", "host-a"), ("store", "scaler-9"))
    assert got["scaler_worker_store_bytes"] == {(*label, ("worker", "w1")): 1 << 20, (*label, ("worker", "w2")): 2 << 20}
    assert got["scaler_worker_store_capacity_bytes"][(*label, ("worker", "w1"))] == 1 << 30
    assert got["scaler_worker_store_objects"][(*label, ("worker", "w2"))] == 4
    # Each store once, from the daemon's own figures: a cluster total does not double count.
    assert got["scaler_store_bytes"] == {(("store", "scaler-9"),): 3 << 20}
    assert got["scaler_store_capacity_bytes"] == {(("store", "scaler-9"),): 1 << 30}
    assert got["scaler_store_objects"] == {(("store", "scaler-9"),): 5}
    assert got["scaler_store_workers"] == {(("store", "scaler-9"),): 2}
    text = metrics.render(stats)
    assert "# HELP scaler_worker_store_bytes" in text and "share one store" in text


def test_managers_are_series_labelled_by_manager() -> None:
    cpu = ManagerStatistics("cpu", "slurm", True, 8, 1, 2, 3, 1, 2, 1, "Priority", "worker cpu-4 gone", 5.0, 4, 7)
    gone = ManagerStatistics("old", "local", False, 2, 0, 0, 0, 0, 0, 0, None, None, None, 1, 0)
    got = parse(metrics.render(_stats(managers=(cpu, gone))))
    assert got["scaler_manager_connected"] == {(("kind", "slurm"), ("manager", "cpu")): 1, (("kind", "local"), ("manager", "old")): 0}
    workers = got["scaler_manager_workers"]
    assert {dict(k)["state"]: v for k, v in workers.items() if dict(k)["manager"] == "cpu"} == {
        "requested": 1, "starting": 2, "running": 3, "draining": 1,
    }  # fmt: skip
    assert got["scaler_manager_max_workers"][(("manager", "cpu"),)] == 8
    assert got["scaler_manager_pending_keys"][(("manager", "cpu"),)] == 1
    assert got["scaler_manager_workers_failed_total"][(("manager", "cpu"),)] == 2
    assert got["scaler_manager_infrastructure_ends_total"] == {(("manager", "cpu"),): 4, (("manager", "old"),): 1}
    assert got["scaler_manager_interrupted_tasks_total"][(("manager", "cpu"),)] == 7
    names = [f.name for f in text_string_to_metric_families(metrics.render(_stats(managers=(cpu,))))]
    assert len(names) == len(set(names))


def test_a_departed_workers_series_are_dropped_and_labels_escaped() -> None:
    before = parse(metrics.render(_stats(_worker("w-1"), _worker('odd "name"\\\n'))))
    assert set(before["scaler_worker_tasks"]) == {
        (("host", "host-a"), ("worker", "w-1")), (("host", "host-a"), ("worker", 'odd "name"\\\n')),
    }  # fmt: skip
    after = parse(metrics.render(_stats(_worker("w-1"))))
    assert set(after["scaler_worker_tasks"]) == {(("host", "host-a"), ("worker", "w-1"))}
    assert after["scaler_worker_task_peak_memory_bytes"] == {(("host", "host-a"), ("worker", "w-1")): 1000}
    # One family per name: none is another's name plus a suffix the parser would fold into it.
    names = [f.name for f in text_string_to_metric_families(metrics.render(_stats(_worker("w"))))]
    assert len(names) == len(set(names))


def test_a_secured_tcp_daemon_gives_its_dashboard_a_monitor_key(tmp_path: Path) -> None:
    import re
    import urllib.request

    from test_security import Cluster

    cluster = Cluster(tmp_path)
    try:
        cluster.secure_daemon("--workers", "1", "--dashboard", "127.0.0.1:0")
        found: list[str] = []
        assert wait_until(lambda: bool(found.extend(re.findall(r"dashboard at (\S+)", cluster.log())) or found), timeout=WAIT)
        base, _, token = found[0].partition("/?token=")

        def scraped_worker() -> bool:
            request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=WAIT) as reply:
                return "scaler_workers 1" in reply.read().decode()

        assert wait_until(scraped_worker, timeout=WAIT), cluster.log()
        assert "refused" not in cluster.log().lower(), cluster.log()
    finally:
        cluster.close()


def test_the_embedded_cluster_serves_a_dashboard_and_prints_its_url(capfd: pytest.CaptureFixture[str]) -> None:
    import re
    import urllib.request

    from scaler_executor import ScalerExecutor

    with pytest.raises(ValueError, match="not HOST:PORT"):
        ScalerExecutor(dashboard="8787")
    with pytest.raises(ValueError, match="scaler-daemon --dashboard"):
        ScalerExecutor(address="ipc:///nowhere", dashboard="127.0.0.1:0")
    with ScalerExecutor(2, dashboard="127.0.0.1:0") as ex:
        assert ex.submit(square, 4).result(timeout=WAIT) == 16
        err: list[str] = []
        assert wait_until(lambda: bool(err.append(capfd.readouterr().err) or re.search(r"dashboard at \S+", "".join(err))), timeout=WAIT)
        url = re.findall(r"dashboard at (\S+)", "".join(err))[0]
        base, _, token = url.partition("/?token=")
        request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {token}"})

        def counted() -> bool:
            with urllib.request.urlopen(request, timeout=WAIT) as reply:
                return 'scaler_tasks_completed_total{outcome="finished"} 1' in reply.read().decode()

        assert wait_until(counted, timeout=WAIT)


def test_a_connection_reset_mid_request_is_no_traceback_and_the_server_serves_on(cluster: DashboardCluster) -> None:
    """Browsers drop connections they preconnected: routine, not an error to print."""
    import socket
    import struct
    from urllib.parse import urlsplit

    parts = urlsplit(cluster.base)
    for _ in range(3):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=WAIT)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the request is never finished
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # linger 0: a reset, not a clean close
    status, text = cluster.get("/metrics", token=cluster.token)
    assert status == 200 and "# TYPE scaler_workers gauge" in text
    # The fixture's close() asserts the daemon's log (the dashboard's stderr too) has no traceback.


def burn_holding(megabytes: int, stop_file: str) -> int:
    """Hold ``megabytes`` of private memory and keep a core busy until ``stop_file`` exists."""
    import os

    held = bytearray(megabytes << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1  # touched: resident, private
    spins = 0
    while not os.path.exists(stop_file):
        spins += 1
    return len(held) + (spins & 0)


def test_a_busy_workers_memory_and_cpu_reach_the_snapshot_and_metrics(cluster: DashboardCluster, tmp_path: Path) -> None:
    stop = str(tmp_path / "stop")
    with cluster.client() as ex:
        future = ex.submit(burn_holding, 64, stop)
        try:
            seen: list[Any] = []

            def busy() -> bool:
                seen[:] = list(ex.statistics().workers)
                return any(w.memory is not None and w.memory >= 64 << 20 and (w.cpu or 0.0) > 0.05 for w in seen)

            assert wait_until(busy, timeout=WAIT), seen  # heartbeats come while it runs
            (worker,) = seen  # the cluster has one worker
            assert worker.memory_limit is None or worker.memory_limit > worker.memory
            labels = (("host", worker.host), ("worker", worker.name))
            scraped: list[str] = []

            def scraped_busy() -> bool:
                status, text = cluster.get("/metrics", token=cluster.token)
                scraped[:] = [text]
                got = parse(text)
                return got.get("scaler_worker_memory_bytes", {}).get(labels, 0) >= 64 << 20 and got.get(
                    "scaler_worker_cpu_cores", {}
                ).get(labels, 0) > 0.05

            assert wait_until(scraped_busy, timeout=WAIT), scraped
        finally:
            Path(stop).touch()
        assert future.result(timeout=WAIT) == 64 << 20


def test_store_use_of_a_real_cluster_after_a_put_of_a_known_size(tmp_path: Path) -> None:
    """Two local workers map the daemon's host store: each reports it on its heartbeats, the
    snapshot and /metrics count it once, and the figures follow a put and its release."""
    import json

    size = 8 << 20
    c = DashboardCluster(tmp_path, workers=2)
    try:
        with c.client() as ex:
            ref = ex.put(b"\x07" * size)

            def reported(stats: Statistics, least: int) -> bool:
                return len(stats.workers) == 2 and all(
                    w.store == stats.store_name and (w.store_bytes or 0) >= least for w in stats.workers
                )

            assert wait_until(lambda: reported(ex.statistics(), size), timeout=WAIT), ex.statistics().workers
            stats = ex.statistics()
            assert stats.store_name and stats.store["data_bytes"] >= size
            (store,) = stats.stores  # one store, however many workers map it
            assert store.daemon and store.bytes >= size and sorted(store.workers) == sorted(w.name for w in stats.workers)
            for w in stats.workers:
                assert w.store_capacity == stats.store["capacity"] and (w.store_objects or 0) >= 1
            scraped: list[str] = []

            def scraped_both() -> bool:
                status, text = c.get("/metrics", token=c.token)
                assert status == 200, text
                scraped[:] = [text]
                got = parse(text).get("scaler_worker_store_bytes", {})
                return len(got) == 2 and all(v >= size for v in got.values())

            assert wait_until(scraped_both, timeout=WAIT), scraped
            got = parse(scraped[0])
            assert {dict(k)["store"] for k in got["scaler_worker_store_bytes"]} == {stats.store_name}
            ((labels, once),) = got["scaler_store_bytes"].items()
            assert labels == (("store", stats.store_name),) and once >= size
            assert got["scaler_store_workers"][labels] == 2
            status, body = c.get("/api/snapshot", token=c.token)
            page = json.loads(body)
            assert status == 200 and [s["name"] for s in page["stores"]] == [stats.store_name]
            assert all(w["store_bytes"] >= size for w in page["workers"])
            del ref  # released: the daemon deletes it, the workers' next heartbeats say so
            assert wait_until(lambda: reported(ex.statistics(), 0) and all(
                (w.store_bytes or 0) < size for w in ex.statistics().workers), timeout=WAIT), ex.statistics().workers
    finally:
        c.close()
