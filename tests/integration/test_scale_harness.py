"""The scale harness (bench/scale.py) is right before its figures mean anything.

A real daemon, simulated workers and clients at a small size, on each transport: every
task the clients submitted is dispatched exactly once, and its result reaches the client
that submitted it (and no other); the pending phase's tasks are all queued in the daemon
while no worker is connected.  Figures are never asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import scale


def _check(row: dict[str, Any], size: scale.Size) -> None:
    total = size.tasks + size.pending
    assert row["dispatched_more_than_once"] == 0, row
    assert row["never_dispatched"] == 0, row
    assert row["results_missing"] == 0, row
    assert row["results_duplicated"] == 0, row
    assert row["results_to_wrong_client"] == 0, row
    assert row["daemon_finished"] == total, row
    assert row["pending_queued"] == size.pending, row
    assert row["workers"] == size.workers and row["clients"] == size.clients
    assert row["rejoins"] == 0, row  # at this size nothing reconnects


@pytest.mark.timeout(120)
def test_ipc_every_task_dispatched_once_and_answered_to_its_client(tmp_path: Path) -> None:
    size = scale.Size(
        workers=6, processors=2, clients=3, tasks=900, window=25, idle=0.6, pending=150,
        duration="uniform:0:0.002", timeout=90,
    )
    _check(scale.run_size(size, str(tmp_path)), size)


@pytest.mark.timeout(120)
def test_tcp_with_curve_credentials(tmp_path: Path) -> None:
    size = scale.Size(
        workers=3, processors=3, clients=2, tasks=300, window=10, idle=0.6, pending=40,
        transport="tcp", timeout=90,
    )
    row = scale.run_size(size, str(tmp_path))
    assert row["transport"] == "tcp curve"
    _check(row, size)


@pytest.mark.timeout(120)
def test_tcp_insecure(tmp_path: Path) -> None:
    size = scale.Size(
        workers=3, processors=1, clients=2, tasks=300, window=10, idle=0.6, pending=40,
        transport="tcp", insecure=True, duration="exp:0.001", timeout=90,
    )
    row = scale.run_size(size, str(tmp_path))
    assert row["transport"] == "tcp insecure"
    _check(row, size)


def test_duration_spelling_is_checked() -> None:
    with pytest.raises(SystemExit, match="bad --duration 'normal:1'"):
        scale.duration_sampler("normal:1")
    assert scale.duration_sampler("fixed:0.25")() == 0.25
    assert 1.0 <= scale.duration_sampler("uniform:1:2")() <= 2.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["tree", "shuffle"])
def test_graph_mode_every_node_dispatched_once_with_its_dependencies(tmp_path: Path, shape: str) -> None:
    """Simulated workers handle dependencies (bench/scale_graph.py): every node is dispatched
    once, with the dependencies (and their values) its client declared, and every requested
    result reaches the client with the value a local evaluation gives."""
    from bench import scale_graph

    row = scale_graph.run_graph(shape, 600, 4, 2, str(tmp_path), duration=scale.duration_sampler("uniform:0:0.002"), timeout=90)
    for check in ("dispatched_more_than_once", "never_dispatched", "dep_errors", "values_wrong", "results_missing",
                  "results_duplicated", "results_to_wrong_client"):
        assert row[check] == 0, (check, row)
    assert row["nodes"] >= 600 and row["daemon_finished"] == row["nodes"], row
    assert row["daemon_tasks_left"] == 0, row  # every kept result released once its dependents ran


def test_graph_cells_are_checked() -> None:
    from bench import scale_graph

    with pytest.raises(SystemExit, match="bad --graph cell 'ring:10'"):
        scale_graph.parse("ring:10")
    deps, values, wanted = scale_graph.tree(8)
    assert len(deps) == 7 and wanted == [6] and scale_graph.evaluate(deps, values)[6] == sum(range(4))


@pytest.mark.timeout(120)
def test_paced_peers_every_task_dispatched_once_and_answered(tmp_path: Path) -> None:
    """Simulated processors dealt top-ups with wake-ups (bench/scale_worker.py), a client that
    waits before it submits more, each its own or all on one simulated core: still every task
    once, to its own client."""
    size = scale.Size(
        workers=4, processors=2, clients=2, tasks=600, window=20, idle=0.3, pending=60,
        duration="exp:0.0002", wake="exp:0.002", client_wake="exp:0.001", timeout=90,
    )
    (tmp_path / "own").mkdir()
    (tmp_path / "shared").mkdir()
    _check(scale.run_size(size, str(tmp_path / "own")), size)
    size.shared_core = True
    size.wake, size.client_wake = "exp:0.0005", "exp:0.0002"
    _check(scale.run_size(size, str(tmp_path / "shared")), size)


def test_processors_are_dealt_as_the_agent_deals() -> None:
    """bench/scale_worker.py: top-ups as worker/dealing.py decides them, each task dealt
    once, in series per processor after the top-up's wake-up."""
    from collections import deque
    from itertools import pairwise

    from bench.scale_worker import Processors
    from scaler_executor.worker.dealing import MAX_DEPTH

    procs = Processors(2)
    total = 2 + 3 * MAX_DEPTH + 6  # the first two, three top-ups, and some left over
    queue = deque((i, 0, b"") for i in range(total))
    dealt = procs.deal(queue, 10.0, lambda: 0.001, lambda: 10.5)
    assert [(d[0], d[1], d[4][0]) for d in dealt] == [(0, 10.5, 0), (1, 10.5, 1)]  # untimed: one each, after the wake-up
    assert procs.deal(queue, 10.0, lambda: 0.001, lambda: 10.5) == []  # both busy
    procs.timed(1e-6)  # now timed as sub-millisecond: a processor holds up to MAX_DEPTH
    procs.done(0, 10.6)
    more = procs.deal(queue, 10.6, lambda: 0.001, lambda: 11.1)
    # processor 1's task has run 0.6 s (past RECALL_AFTER): nothing queued behind it
    assert {d[0] for d in more} == {0} and len(more) == MAX_DEPTH
    assert more[0][1] == 11.1 and all(a[2] == b[1] for a, b in pairwise(more))  # in series
    assert procs.held == [MAX_DEPTH, 1]
    procs.done(1, 10.61)
    again = procs.deal(queue, 10.61, lambda: 0.001, lambda: 10.61)
    assert {d[0] for d in again} == {1} and len(again) == MAX_DEPTH  # a fresh head: topped up
    for _ in range(MAX_DEPTH - 1):
        procs.done(0, 10.62)
    top = procs.deal(queue, 10.62, lambda: 0.001, lambda: 10.62)
    assert {d[0] for d in top} == {0} and len(top) == MAX_DEPTH - 1  # down to REFILL_AT: one top-up
    seen = [d[4][0] for d in dealt + more + again + top]
    assert len(seen) == len(set(seen)) and len(queue) == total - len(seen)
