"""ObjectStore across processes: attach, reaping, lock timeouts, every crash point."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
from collections.abc import Callable

import pytest
from objstore_workers import (
    attach_check_put,
    content,
    crash_at,
    hold_and_vanish,
    make_id,
    proc_state,
    stop_in_lock,
    wait_for,
)

from scaler_executor.objstore import CRASH_POINTS, ObjectStore, StoreLockTimeout

pytestmark = pytest.mark.timeout(60)
CRASH_EXIT = 86

Spawn = multiprocessing.context.SpawnContext


def test_attach_from_a_second_process(spawn: Spawn, region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 1 << 20) as store:
        a, b = make_id(1, 1), make_id(1, 2)
        store.put(a, content(a))
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=attach_check_put, args=(store.name, a, content(a), b, child_end))
        p.start()
        result = parent_end.recv()
        p.join()
        assert p.exitcode == 0, result
        assert result["same"] and result["processes"] == 2
        assert bytes(store.get(b)) == b"from the child " + str(result["pid"]).encode()
        s = store.stats()
        assert s.processes == 1 and s.references == 0  # the child closed cleanly
        store.validate()


def test_references_of_a_dead_process_are_reaped(
    spawn: Spawn, region_name: Callable[[], str]
) -> None:
    with ObjectStore.create(region_name(), 1 << 20) as store:
        ids = [make_id(2, n) for n in range(3)]
        for oid in ids:
            store.put(oid, content(oid))
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=hold_and_vanish, args=(store.name, ids, child_end))
        p.start()
        result = parent_end.recv()
        p.join()
        assert result["held"] == 3
        s = store.stats()
        assert (s.references, s.processes, s.objects) == (4, 2, 4)  # 3 gets + 1 unsealed
        assert store.delete(ids[0]) is False  # held by the dead child: pending
        store.validate()
        assert store.reap() == 1
        s = store.stats()
        assert (s.references, s.processes, s.objects, s.reaped_processes) == (0, 1, 2, 1)
        assert store.state(ids[0]) == "absent"
        assert store.reap() == 0
        store.validate()


def test_attach_reaps_dead_processes(spawn: Spawn, region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 1 << 20) as store:
        oid = make_id(3, 0)
        store.put(oid, b"x")
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=hold_and_vanish, args=(store.name, [oid], child_end))
        p.start()
        parent_end.recv()
        p.join()
        with ObjectStore.attach(store.name) as other:
            assert other.stats().references == 0 and other.stats().reaped_processes == 1


def test_lock_timeout_names_the_holder_then_recovers(
    spawn: Spawn, region_name: Callable[[], str]
) -> None:
    with ObjectStore.create(region_name(), 1 << 20, lock_timeout=0.2) as store:
        oid = make_id(4, 0)
        store.put(oid, b"x")
        p = spawn.Process(target=stop_in_lock, args=(store.name, oid))
        p.start()
        pid = p.pid
        assert pid is not None
        try:
            assert wait_for(lambda: proc_state(pid) == "T"), "child never stopped in the lock"
            with pytest.raises(StoreLockTimeout) as info:
                store.get(oid)
            assert info.value.holder_pid == pid == store.last_holder_pid
            assert str(pid) in str(info.value)
        finally:
            os.kill(pid, signal.SIGKILL)
            p.join()
        view = store.get(oid)  # EOWNERDEAD: the stopped get is rolled back
        s = store.stats()
        assert s.recoveries == 1 and s.references == 1
        del view
        assert store.reap() == 1
        store.validate()


# "grow" is only reached by a store that commits more memory: see test_commit.py
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p != "grow"])
def test_crash_inside_the_lock_is_recovered(
    spawn: Spawn, region_name: Callable[[], str], point: str
) -> None:
    with ObjectStore.create(region_name(), 1 << 20) as store:
        ids = [make_id(5, n) for n in range(4)]
        for oid in ids:
            store.put(oid, content(oid))
        before = store.stats()
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=crash_at, args=(store.name, point, ids[0], child_end))
        p.start()
        if point == "reap":  # make a process die holding references, for p to reap
            assert parent_end.recv() == "attached"
            dead_end, dead_child_end = spawn.Pipe()
            d = spawn.Process(target=hold_and_vanish, args=(store.name, ids, dead_child_end))
            d.start()
            dead_end.recv()
            d.join()
            parent_end.send("go")
        p.join()
        assert p.exitcode == CRASH_EXIT, f"{point}: exit code {p.exitcode}"
        store.validate()  # first lock after the crash: rolls back, then checks
        assert store.stats().recoveries == 1
        assert store.reap() == (2 if point == "reap" else 1)
        victims_own = make_id(500, 0)  # sealed by the victim before later points crash it
        if store.state(victims_own) == "sealed":
            assert store.get(victims_own) == content(victims_own)
            store.delete(victims_own)
        after = store.stats()
        assert (after.objects, after.in_use, after.references, after.processes) == (
            before.objects,
            before.in_use,
            0,
            1,
        )
        for oid in ids:
            assert store.get(oid) == content(oid)
        store.validate()
