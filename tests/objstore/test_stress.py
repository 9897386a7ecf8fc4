"""Many processes on one region: creators, readers, deleters, processes that die inside
the lock (test hook) and one killed with SIGKILL at an arbitrary point. Afterwards every
byte of every surviving object is checked, the invariants validated, the dead reaped."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from objstore_workers import content, creator, deleter, doomed_reader, make_id, reader, victim

from scaler_executor.objstore import ObjectStore

CRASH_EXIT = 86
RUN_SECONDS = 5.0  # of concurrent work, counted once every process has attached
GROUPS, COUNT = [10, 11], 150  # 300 ids of 0-24 KB: more than the region holds at once
VICTIMS = [
    ("create_after_index", 7, 1),
    ("release_after_decref", 19, 2),
    ("free_after_unlink", 31, 3),
]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stress_with_crashes(
    spawn: multiprocessing.context.SpawnContext, region_name: Callable[[], str]
) -> None:
    workers: list[tuple[str, Any, Any]] = []
    try:
        _run(spawn, region_name(), workers)
    finally:  # on a failure, leave no process behind
        for _, p, _ in workers:
            if p.exitcode is None:
                p.kill()
                p.join(10)


def _run(spawn: multiprocessing.context.SpawnContext, name: str, workers: list[Any]) -> None:
    with ObjectStore.create(name, 2_500_000, max_objects=1024) as store:

        def start(label: str, target: Any, *args: Any) -> Any:
            parent_end, child_end = spawn.Pipe()
            p = spawn.Process(target=target, args=(store.name, *args, child_end))
            p.start()
            workers.append((label, p, parent_end))
            return parent_end

        for g in GROUPS:
            start(f"creator{g}", creator, g, COUNT)
        for seed in (1, 2):
            start(f"reader{seed}", reader, GROUPS, COUNT, seed)
        start("deleter", deleter, GROUPS, COUNT, 3)
        hold = [make_id(g, n) for g in GROUPS for n in range(0, COUNT, 15)]
        for point, countdown, group in VICTIMS:
            start(f"victim-{point}", victim, point, countdown, group, hold)
        doomed = start("doomed", doomed_reader, GROUPS, COUNT, 4)

        for label, _, conn in workers:  # all attached: now run together
            assert conn.poll(60) and conn.recv() == "ready", f"{label} did not start"
        deadline = time.monotonic() + RUN_SECONDS
        for _, _, conn in workers:
            conn.send(deadline)

        assert doomed.poll(30) and doomed.recv() == "busy", "the doomed reader did no work"
        doomed_proc = next(p for label, p, _ in workers if label == "doomed")
        os.kill(doomed_proc.pid, signal.SIGKILL)  # wherever it is: maybe inside the lock

        results: dict[str, Any] = {}
        for label, p, conn in workers:
            if not label.startswith(("victim", "doomed")):
                assert conn.poll(60), f"{label} did not report"
                results[label] = conn.recv()
            p.join(30)
            assert p.exitcode is not None, f"{label} did not exit"
            results[f"{label}.exit"] = p.exitcode
        for label, value in results.items():
            assert not (isinstance(value, dict) and "error" in value), f"{label}: {value['error']}"

        # what the run did (a run that did nothing would prove nothing)
        assert sum(results[f"creator{g}"]["made"] for g in GROUPS) > 100, results
        assert sum(results[f"reader{s}"]["read"] for s in (1, 2)) > 100, results
        assert results["deleter"]["deleted"] + results["deleter"]["deferred"] > 10, results
        assert sum(results[f"reader{s}"]["bad"] for s in (1, 2)) == 0, [
            results[f"reader{s}"] for s in (1, 2)
        ]
        for point, _, _ in VICTIMS:
            assert results[f"victim-{point}.exit"] == CRASH_EXIT, results
        assert results["doomed.exit"] == -signal.SIGKILL

        # the dead are reaped (by a later attach, or now), their updates rolled back
        store.reap()
        s = store.stats()
        assert s.reaped_processes == len(VICTIMS) + 1, s
        assert len(VICTIMS) <= s.recoveries <= len(VICTIMS) + 1, s
        assert (s.references, s.processes, s.pending_delete) == (0, 1, 0), s
        store.validate()

        # every byte of every surviving object (the victims' own ones included)
        survivors = store.list_ids()
        assert len(survivors) == s.objects > 0, s
        for oid in survivors:
            assert store.state(oid) == "sealed"
            view = store.get(oid)
            assert view == content(oid)
            view.release()
            store.delete(oid)
        s = store.stats()
        assert (s.objects, s.in_use, s.free_blocks) == (0, 0, 1), s  # all coalesced back
        store.validate()
