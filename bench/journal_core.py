"""The journal's cost in the daemon's core alone: ``Scheduler`` against ``DurableScheduler``.

::

    PYTHONPATH=. chrt -r 1 python bench/journal_core.py [--reps 10] [--tasks 40000] [--writer-share]
    PYTHONPATH=. chrt -r 1 python bench/journal_core.py --before /tmp/old-checkout --after . [--reps 10]
    PYTHONPATH=. python bench/journal_core.py --entries [--tasks 40000]

No process, no socket: the core (scheduler/core.py), and the journaled core
(scheduler/durable.py) with a real ``JournalWriter`` (fsync ``interval``), driven by plain
calls as the daemon's loop drives them: one client submits no-op tasks in messages of 500,
keeping 4,000 unanswered; two workers (capacity 8) each return up to 50 results per message;
the client acknowledges every TaskResults message at once (ResultsAck).  Printed: CPU
microseconds per task of each core and the difference (what the journal costs the daemon's
core per task), medians over ``--reps``.  ``--entries``: instead, the journal entries the
journaled core writes per task under the same load, by kind (puts and deletes), counted
instead of written (to count another checkout's, run this script with its package first on
``PYTHONPATH`` and its interpreter).  With ``--before``/``--after`` the two checkouts
(each with its own ``.venv``) alternate, each repetition in a fresh interpreter of its own
tree (this script, the other tree's package), and the mean paired ratio of the journaled
core's time per task (after ÷ before) is given with its 95 % confidence interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import cloudpickle

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.scheduler.core import Received, Scheduler, Send, Tick
from scaler_executor.scheduler.durable import DurableScheduler
from scaler_executor.scheduler.journal import open_journal
from scaler_executor.scheduler.loop import journal_version

try:
    from scaler_executor.scheduler.durable_records import JournalWrite
except ImportError:  # --before a checkout older than durable_records.py (its records were in durable.py)
    from scaler_executor.scheduler.durable import JournalWrite


def _hello(role: str, name: str, capacity: int = 0) -> m.Hello:
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 1, "node", capacity, {}, [])


def per_task(durable: bool, tasks: int, batch: int = 500, in_flight: int = 4000, appends: bool = True) -> float:
    """CPU µs per task of one core driven through ``tasks`` no-op tasks (``appends=False``:
    the journaled core's entries are not written, to see the writer's share)."""
    directory = tempfile.mkdtemp(prefix="journal-core-")
    writer = None
    core: Scheduler
    if durable:
        writer, _ = open_journal(os.path.join(directory, "j"), package_version=journal_version(), policy="interval")
        core = DurableScheduler(ClusterConfig())
    else:
        core = Scheduler(ClusterConfig())
    now = 1000.0
    got = finished = submitted = 0
    held: dict[bytes, list[Any]] = {b"w1": [], b"w2": []}
    payload = cloudpickle.dumps((lambda: None, (), {}))
    result = cloudpickle.dumps(None)
    facts = m.TaskFacts("w", 1.0, 1.0, 0)

    def step(*events: Any) -> None:
        nonlocal got, finished
        for command in core.handle(*events):
            if type(command) is JournalWrite:
                assert writer is not None
                if appends:
                    writer.append(command.entries)
            elif type(command) is Send:
                for message in command.messages:
                    if type(message) is m.DispatchTasks:
                        held[command.peer].extend(message.tasks)
                    elif type(message) is m.TaskResults and command.peer == b"c1":
                        got += 1
                        finished += len(message.results)

    step(Received(b"c1", [_hello(m.Role.CLIENT, "c1")], now))
    step(Received(b"w1", [_hello(m.Role.WORKER, "w1", 8)], now))
    step(Received(b"w2", [_hello(m.Role.WORKER, "w2", 8)], now))
    began = time.process_time()
    while finished < tasks:
        now += 0.001
        room = min(batch, in_flight - (submitted - finished), tasks - submitted)
        if room > 0:
            specs = [
                m.TaskSpec((1 << TASK_ID_BITS) | (submitted + i + 1), 0, 0, TaskFlags.INLINE_FN, payload, [], [], 0)
                for i in range(room)
            ]
            submitted += room
            step(Received(b"c1", [m.SubmitTasks(specs)], now))
        for worker, dispatched in held.items():
            if dispatched:
                results = [m.TaskResult(t.task_id, t.attempt, Status.OK, result, facts, []) for t in dispatched[:50]]
                del dispatched[:50]
                step(Received(worker, [m.TaskResults(results)], now))
        if durable:
            step(Received(b"c1", [m.ResultsAck(got)], now), Tick(now))
        else:
            step(Tick(now))
    elapsed = time.process_time() - began
    if writer is not None:
        writer.close()
    shutil.rmtree(directory, ignore_errors=True)
    return elapsed / tasks * 1e6


class _Counter:
    """A writer that counts the entries it is given, by kind and put/delete."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def append(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in entries:
            name = key[:1].decode(errors="replace") + (" delete" if value is None else " put")
            self.counts[name] = self.counts.get(name, 0) + 1

    def close(self) -> None:
        pass


def entries_per_task(tasks: int) -> dict[str, float]:
    counter = _Counter()
    global open_journal
    real, open_journal = open_journal, lambda *args, **kwargs: (counter, None)  # type: ignore[assignment]
    try:
        per_task(True, tasks)
    finally:
        open_journal = real
    return {name: count / tasks for name, count in sorted(counter.counts.items())}


def one(tasks: int, writer_share: bool = False) -> dict[str, float]:
    got = {"plain": per_task(False, tasks), "durable": per_task(True, tasks)}
    if writer_share:
        got["durable, no appends"] = per_task(True, tasks, appends=False)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=40000)
    parser.add_argument("--before")
    parser.add_argument("--after")
    parser.add_argument("--one", action="store_true", help="one repetition, printed as JSON")
    parser.add_argument("--writer-share", action="store_true", help="also the journaled core without its appends")
    parser.add_argument("--entries", action="store_true", help="count the journal entries per task instead")
    args = parser.parse_args()
    if args.entries:
        counts = entries_per_task(args.tasks)
        per_task_kinds = {name: round(n, 3) for name, n in counts.items() if n >= 0.001}
        tasks_only = sum(n for name, n in counts.items() if name[0] in "tdrk")
        print(f"journal entries per task: {per_task_kinds}; of task records (t, d, r, k): {tasks_only:.3f}")
        return 0
    if args.one:
        print(json.dumps(one(args.tasks)))
        return 0
    print(f"load before: {os.getloadavg()}", flush=True)
    if not args.before:
        runs = [one(args.tasks, args.writer_share) for _ in range(args.reps)]
        plain = statistics.median(r["plain"] for r in runs)
        durable = statistics.median(r["durable"] for r in runs)
        extra = statistics.median(r["durable"] - r["plain"] for r in runs)
        print(f"core {plain:.2f} µs/task, journaled core {durable:.2f} µs/task, difference {extra:.2f} µs/task (medians of {args.reps})")
        if args.writer_share:
            bare = statistics.median(r["durable, no appends"] for r in runs)
            share = statistics.median(r["durable"] - r["durable, no appends"] for r in runs)
            print(f"journaled core without its appends {bare:.2f} µs/task: the writer's share {share:.2f} µs/task")
    else:
        from bench.ab import summarize

        script = os.path.abspath(__file__)
        pairs: dict[str, list[tuple[float, float]]] = {"plain": [], "durable": [], "difference": []}
        for rep in range(args.reps):
            got: dict[str, dict[str, float]] = {}
            for side in (("before", "after") if rep % 2 == 0 else ("after", "before")):
                tree = os.path.abspath(getattr(args, side))
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.dirname(os.path.dirname(script))]))
                out = subprocess.run(
                    [os.path.join(tree, ".venv", "bin", "python"), script, "--one", "--tasks", str(args.tasks)],
                    cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=True,
                )
                got[side] = json.loads(out.stdout.strip().splitlines()[-1])
            for name in ("plain", "durable"):
                pairs[name].append((got["before"][name], got["after"][name]))
            pairs["difference"].append(
                (got["before"]["durable"] - got["before"]["plain"], got["after"]["durable"] - got["after"]["plain"])
            )
            print(f"rep {rep + 1}: before {got['before']}, after {got['after']}", flush=True)
        print(f"{'µs per task':12} {'before':>8} {'after':>8} {'after÷before':>13} {'95% CI of the mean paired ratio':>32}")
        for name, values in pairs.items():
            before, after, ratio, low, high = summarize(values)
            print(f"{name:12} {before:8.2f} {after:8.2f} {ratio:13.3f} {low:15.3f}-{high:.3f}")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
