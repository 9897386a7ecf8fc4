"""The journal's storage cost (scheduler/journal.py), on the disk that holds ``--dir``.

A script, not a test::

    PYTHONPATH=. python bench/journal.py                 # in a temporary directory under /tmp
    PYTHONPATH=. python bench/journal.py --dir /mnt/ssd  # on another disk

Prints, with the load (``uptime``) before and after:

* the cost of ``append()`` per turn and per entry, for each fsync policy (``turn``,
  ``interval`` at 10 ms, ``os``), for turns of 1, 100 and 1000 entries of 100-byte and
  2 KiB values (each configuration runs for about ``--seconds``; the three policies are
  alternated per configuration so that a change of load hits them alike);
* the latency of one ``fsync`` after a 4 KiB write on this disk (median, p90, max);
* loading (``open_journal``) and compacting a journal of 10^5 live keys (100-byte values,
  each key written twice so that half the file is history), and the sizes before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from scaler_executor.scheduler.journal import POLICIES, open_journal

V = "bench"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def appends(where: str, policy: str, entries: int, size: int, seconds: float) -> tuple[float, int]:
    """Seconds per append() and the number of turns, for turns of ``entries`` values of ``size``."""
    path = tempfile.mkdtemp(dir=where, prefix=f"j-{policy}-")
    writer, _ = open_journal(path, package_version=V, policy=policy)
    value = os.urandom(size)
    turns = [[(b"task-%012d" % (t * entries + i), value) for i in range(entries)] for t in range(64)]
    try:
        n, began = 0, time.perf_counter()
        deadline = began + seconds
        while True:
            writer.append(turns[n % 64])
            n += 1
            if n % 8 == 0 and time.perf_counter() > deadline:
                break
        elapsed = time.perf_counter() - began
    finally:
        writer.close()
        shutil.rmtree(path)
    return elapsed / n, n


def fsync_latency(where: str, n: int = 200) -> list[float]:
    fd, name = tempfile.mkstemp(dir=where)
    block = os.urandom(4096)
    out = []
    try:
        for _ in range(n):
            os.write(fd, block)
            began = time.perf_counter()
            os.fsync(fd)
            out.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        os.unlink(name)
    return sorted(out)


def compaction(where: str, keys: int) -> dict[str, float]:
    path = tempfile.mkdtemp(dir=where, prefix="j-compact-")
    try:
        writer, _ = open_journal(path, package_version=V, policy="os")
        for rewrite in range(2):
            for start in range(0, keys, 1000):
                writer.append([(b"task-%012d" % k, os.urandom(100)) for k in range(start, start + 1000)])
            del rewrite
        writer.close()
        began = time.perf_counter()
        writer, live = open_journal(path, package_version=V, policy="os")
        load = time.perf_counter() - began
        assert len(live) == keys
        del live
        before = writer.stats()["size_on_disk"]
        began = time.perf_counter()
        for _ in writer.compaction():
            pass
        compact = time.perf_counter() - began
        after = writer.stats()
        writer.close()
        return {"load": load, "compact": compact, "before": before, "after": after["size_on_disk"], "live": after["live_bytes"]}
    finally:
        shutil.rmtree(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the journals are written (its disk is measured)")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per configuration and policy")
    parser.add_argument("--keys", type=int, default=100_000, help="live keys for the compaction figure")
    args = parser.parse_args()
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout.splitlines()[-1].split()
    print(f"load before: {uptime()}")
    print(f"disk: {args.dir} on {fs[0]} ({fs[1]}); python {sys.version.split()[0]}")
    print()
    print(f"{'entries/turn':>12} {'value':>6} | " + " | ".join(f"{p + ' per turn':>16} {'per entry':>10}" for p in POLICIES))
    for entries in (1, 100, 1000):
        for size in (100, 2048):
            row = {}
            for policy in POLICIES:
                per_turn, _ = appends(args.dir, policy, entries, size, args.seconds)
                row[policy] = per_turn
            cells = " | ".join(f"{row[p] * 1e6:13.1f} us {row[p] / entries * 1e6:7.2f} us" for p in POLICIES)
            print(f"{entries:>12} {size:>6} | {cells}")
    print()
    lat = fsync_latency(args.dir)
    print(f"fsync after a 4 KiB write ({len(lat)} runs): median {statistics.median(lat) * 1e3:.2f} ms, "
          f"p90 {lat[int(len(lat) * 0.9)] * 1e3:.2f} ms, max {lat[-1] * 1e3:.2f} ms")
    c = compaction(args.dir, args.keys)
    print(f"{args.keys} live keys (100-byte values, each written twice): load {c['load']:.2f} s, "
          f"compaction {c['compact']:.2f} s, files {c['before'] / 1e6:.1f} MB -> {c['after'] / 1e6:.1f} MB "
          f"(live keys+values {c['live'] / 1e6:.1f} MB)")
    print()
    print(f"load after: {uptime()}")


if __name__ == "__main__":
    main()
