"""Lazy commitment: a store maps its full size but backs it with memory only as objects
need it (native/os_region.c), from whichever process allocates."""

from __future__ import annotations

import errno
import multiprocessing.context
import os
import time
from collections.abc import Callable

import pytest
from objstore_workers import content_big, grow_and_crash, make_id, read_back

from scaler_executor.objstore import ObjectStore, ObjectStoreFull

pytestmark = pytest.mark.timeout(60)
CRASH_EXIT = 86
MiB = 1 << 20
Spawn = multiprocessing.context.SpawnContext


def shm_bytes(path: str) -> int:
    """Bytes of memory really allocated to the region's file."""
    return os.stat(path).st_blocks * 512


def test_a_large_store_costs_one_step(region_name: Callable[[], str]) -> None:
    size = 4 << 30  # 4 GiB: committing it up front took seconds and 4 GiB of RAM
    start = time.monotonic()
    with ObjectStore.create(region_name(), size) as store:
        elapsed = time.monotonic() - start
        s = store.stats()
        tables = s.region_size - s.capacity
        assert s.capacity == size
        assert s.committed == tables + 4 * MiB  # the tables and a 4 MiB first step
        assert shm_bytes(store.path) <= s.committed + MiB
        assert os.stat(store.path).st_size == s.committed
        assert elapsed < 2.0, f"creating a {size >> 30} GiB store took {elapsed:.2f} s"
        base, length = store.mapping
        assert base != 0 and length == s.region_size  # the whole region is mapped


def test_growth_is_visible_to_processes_attached_before(
    spawn: Spawn, region_name: Callable[[], str]
) -> None:
    with ObjectStore.create(region_name(), 512 * MiB) as store:
        first = store.stats().committed
        oids = [make_id(1, n) for n in range(3)]
        parent_end, child_end = spawn.Pipe()
        p = spawn.Process(target=read_back, args=(store.name, oids, child_end))
        p.start()
        assert parent_end.recv() == "attached"
        for oid in oids:  # 3 x 100 MiB: two more steps, committed by this process
            store.put(oid, content_big(oid, 100 * MiB))
        grown = store.stats().committed
        assert grown > first + 200 * MiB
        parent_end.send("go")
        result = parent_end.recv()
        p.join()
        assert result == {"same": [True] * 3}, result
        assert os.stat(store.path).st_size == grown
        store.validate()


def test_full_filesystem_is_object_store_full(region_name: Callable[[], str]) -> None:
    with ObjectStore.create(region_name(), 256 * MiB) as store:
        first = store.stats().committed
        store._test_set_commit_limit(first + 4 * MiB)  # /dev/shm "fills up" here
        made = []
        with pytest.raises(ObjectStoreFull) as info:
            for n in range(100):
                oid = make_id(2, n)
                store.put(oid, content_big(oid, MiB))
                made.append(oid)
        err = info.value
        assert (err.size, err.limit) == (MiB, 256 * MiB)
        assert "/dev/shm has no room to grow the store" in str(err)
        assert errno.errorcode[errno.ENOSPC] in str(err) and "--shm-size" in str(err)
        assert 6 <= len(made) <= 8  # 4 MiB (the first step) + 4 MiB of 1 MiB objects
        assert store.stats().committed <= first + 4 * MiB
        store.validate()
        # still usable: a freed object's memory serves again, nothing died of SIGBUS
        store.delete(made[0])
        store.put(made[0], content_big(made[0], MiB))
        assert bytes(store.get(made[-1])) == content_big(made[-1], MiB)
        store._test_set_commit_limit(0)
        store.put(make_id(3, 0), b"x" * (8 * MiB))  # room again: grows
        assert store.stats().committed > first + 4 * MiB
        store.validate()


@pytest.mark.parametrize("point", ["grow", "create_after_alloc"])
def test_crash_while_growing_is_recovered(
    spawn: Spawn, region_name: Callable[[], str], point: str
) -> None:
    with ObjectStore.create(region_name(), 256 * MiB) as store:
        before = store.stats()
        p = spawn.Process(target=grow_and_crash, args=(store.name, point, 100 * MiB))
        p.start()
        p.join()
        assert p.exitcode == CRASH_EXIT, f"{point}: exit code {p.exitcode}"
        store.validate()  # first lock after the crash: recovers
        after = store.stats()
        assert after.recoveries == 1 and after.objects == 0 and after.in_use == 0
        assert os.stat(store.path).st_size > before.committed  # the child's fallocate
        if point == "grow":  # the new mark was not committed: rolled back
            assert after.committed == before.committed
        else:  # the commitment was its own update, committed before the create began
            assert after.committed > before.committed
        assert store.reap() == 1
        oid = make_id(4, 0)
        store.put(oid, content_big(oid, 150 * MiB))
        assert store.get(oid) == content_big(oid, 150 * MiB)
        store.validate()
