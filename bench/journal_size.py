"""The journal's size against the live state it holds, over 10^6 tasks (issue 25).

::

    PYTHONPATH=. python bench/journal_size.py [--tasks 1000000] [--in-flight 10000]
                                              [--batch 1000] [--samples 20] [--dir DIR]

Not a standalone daemon: the daemon's journaled core (``DurableScheduler``, the code the
daemon runs) driven directly, its every turn's ``JournalWrite`` appended to a real
``JournalWriter`` (scheduler/journal.py: the daemon's files, its default fsync policy
``interval`` and its compaction thresholds), so that 10^6 tasks take minutes and not an
hour on a shared machine.  What is measured (the files) is what a daemon writes for the
same turns; the turns here are larger than a loaded daemon's (``--batch`` tasks per
message), which journals the same entries per task.

The load: one client submits no-op tasks (``lambda: None``, pickled as the client does)
in messages of ``--batch``, keeping ``--in-flight`` submitted and not yet answered; two
workers (capacity 8 each) return every task they are dispatched, one TaskResults message
per turn; the client acknowledges each TaskResults (ResultsAck) at once.  Sampled every
``tasks / samples`` completions: the journal directory's size on disk (sum of its files'
sizes, and of their allocated blocks), the writer's ``live_bytes`` / ``live_keys``
(``stats()``), bytes written and compactions done.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import cloudpickle

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.scheduler.core import Received, Send, Tick
from scaler_executor.scheduler.durable import DurableScheduler
from scaler_executor.scheduler.durable_records import JournalWrite
from scaler_executor.scheduler.journal import open_journal
from scaler_executor.scheduler.loop import journal_version


def _hello(role: str, name: str, capacity: int = 0) -> m.Hello:
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 1, "node", capacity, {}, [])


def _disk(path: str) -> tuple[int, int]:
    size = blocks = 0
    with os.scandir(path) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            size += st.st_size
            blocks += st.st_blocks * 512
    return size, blocks


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f}"


def _ratio(files: float, live: float) -> str:
    return f"{files / live:.1f}" if live >= 1 << 20 else "-"  # (of a near-empty state: meaningless)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--dir", default=None, help="where the journal goes (default: a temporary directory)")
    args = parser.parse_args()

    base = args.dir or tempfile.mkdtemp(prefix="journal-size-")
    path = os.path.join(base, "journal")
    shutil.rmtree(path, ignore_errors=True)
    config = ClusterConfig(max_prefetch=args.batch)
    writer, _ = open_journal(path, package_version=journal_version(), policy=config.journal_fsync, interval=config.journal_fsync_interval)
    core = DurableScheduler(config)
    now = 1000.0
    got = 0  # TaskResults messages the client received
    finished = 0
    held: dict[bytes, list[m.TaskDispatch]] = {b"w1": [], b"w2": []}
    payload = cloudpickle.dumps((lambda: None, (), {}))
    result_payload = cloudpickle.dumps(None)
    facts = m.TaskFacts("w", 1.0, 1.0, 0)
    samples: list[tuple[int, int, int, int, int, int, int, float]] = []
    every = max(1, args.tasks // args.samples)
    next_sample = every

    def step(*events: Any) -> None:
        nonlocal got, finished
        for command in core.handle(*events):
            if type(command) is JournalWrite:
                writer.append(command.entries)
            elif type(command) is Send:
                for message in command.messages:
                    kind = type(message)
                    if kind is m.DispatchTasks:
                        held[command.peer].extend(message.tasks)
                    elif kind is m.TaskResults and command.peer == b"c1":
                        got += 1
                        finished += len(message.results)

    step(Received(b"c1", [_hello(m.Role.CLIENT, "c1")], now))
    step(Received(b"w1", [_hello(m.Role.WORKER, "w1", 8)], now))
    step(Received(b"w2", [_hello(m.Role.WORKER, "w2", 8)], now))
    client_id = 1
    submitted = 0
    started = time.perf_counter()
    load_before = os.getloadavg()
    while finished < args.tasks:
        now += 0.001
        room = min(args.batch, args.in_flight - (submitted - finished), args.tasks - submitted)
        if room > 0:
            specs = [
                m.TaskSpec((client_id << TASK_ID_BITS) | (submitted + i + 1), 0, 0, TaskFlags.INLINE_FN, payload, [], [], 0)
                for i in range(room)
            ]
            submitted += room
            step(Received(b"c1", [m.SubmitTasks(specs)], now))
        for worker, tasks in held.items():
            if tasks:
                results = [m.TaskResult(t.task_id, t.attempt, Status.OK, result_payload, facts, []) for t in tasks]
                tasks.clear()
                step(Received(worker, [m.TaskResults(results)], now))
        step(Received(b"c1", [m.ResultsAck(got)], now), Tick(now))
        if finished >= next_sample or finished >= args.tasks:
            next_sample += every
            stats = writer.stats()
            size, blocks = _disk(path)
            samples.append((
                finished, submitted - finished, size, blocks, int(stats["live_bytes"]), int(stats["live_keys"]),
                int(stats["compactions"]), float(stats["bytes_written"]),
            ))
    elapsed = time.perf_counter() - started
    # Wait for a compaction still running, then the final figures.
    deadline = time.monotonic() + 120
    while writer.stats()["compacting"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = writer.stats()
    size, blocks = _disk(path)
    writer.close()
    load_after = os.getloadavg()

    print(f"journal_size: {args.tasks:,} no-op tasks, {args.in_flight:,} kept in flight, messages of {args.batch:,}; "
          f"pure DurableScheduler + real JournalWriter (fsync {config.journal_fsync}); {elapsed:.0f} s")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} cpus)")
    print()
    header = f"{'tasks done':>11} {'in flight':>9} {'files MiB':>9} {'blocks MiB':>10} {'live MiB':>8} {'live keys':>9} {'ratio':>6} {'compactions':>11} {'written MiB':>11}"
    print(header)
    print("-" * len(header))
    for done, flight, fsize, fblocks, live, keys, compactions, written in samples:
        print(f"{done:>11,} {flight:>9,} {_mib(fsize):>9} {_mib(fblocks):>10} {_mib(live):>8} {keys:>9,} {_ratio(fsize, live):>6} {compactions:>11} {_mib(written):>11}")
    print(f"{'at the end':>11} {0:>9} {_mib(size):>9} {_mib(blocks):>10} {_mib(stats['live_bytes']):>8} {int(stats['live_keys']):>9,} "
          f"{_ratio(size, stats['live_bytes']):>6} {int(stats['compactions']):>11} {_mib(stats['bytes_written']):>11}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
