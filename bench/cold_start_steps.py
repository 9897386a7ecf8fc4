"""Where the embedded cluster's cold start goes: a breakdown by step, from system calls.

    PYTHONPATH=. python bench/cold_start_steps.py [--runs 7] [--workers 2]
    python bench/cold_start_steps.py --python BEFORE/bin/python --python AFTER/bin/python

With ``--python`` (repeatable) the runs alternate between those interpreters (e.g. two
venvs with two versions installed) and each gets its own table: a before/after
comparison under the same conditions.

Each run is a fresh interpreter that imports scaler_executor, builds a
``ScalerExecutor(max_workers=N)``, waits for one trivial task and shuts down,
once *without* tracing (the end-to-end figures, as ``compare.py``'s cold_start
cell takes them) and once under ``strace -f -ttt --seccomp-bpf`` tracing only a
few rare system calls (process creation, ``bind``/``connect``, ``ftruncate``
of the store, ``unlink``, exits, and ``access`` calls the run makes as marks).
From those it reads when each step happened, as an offset from the constructor
call: the daemon's ``execve``, the worker's start, the zygote's and the
processors' forks, the store's creation, the daemon's ``bind``, the worker's
and the client's successful ``connect``, the first result; then, from the
start of ``shutdown()``, each process's exit and the store's unlink.

Tracing slows every process down (each traced call stops it), so the traced
offsets are larger than the untraced figures; read them for the order and the
shares of the steps.  Medians over the runs, with the range (min-max).
Needs ``strace`` (Linux); without it only the untraced figures are printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, time
def mark(name): os.access("/scaler-cold-start-mark/" + name, os.F_OK)
t0 = time.perf_counter()
from scaler_executor import ScalerExecutor
t1 = time.perf_counter()
mark("construct")
ex = ScalerExecutor(max_workers=int(sys.argv[1]))
t2 = time.perf_counter()
ex.submit(abs, -1).result()
mark("first_result")
t3 = time.perf_counter()
mark("shutdown")
ex.shutdown()
t4 = time.perf_counter()
mark("shutdown_returned")
print(f"RESULT {t1 - t0} {t2 - t1} {t3 - t1} {t4 - t3}")
import scaler_executor
print("FROM", os.path.dirname(scaler_executor.__file__))
"""

SYSCALLS = "execve,clone,clone3,fork,vfork,bind,connect,sendmsg,ftruncate,fallocate,unlink,access,faccessat,faccessat2,exit_group"
LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
PROCESS_CLONE = re.compile(r"^(clone|clone3|fork|vfork)\(")


# -P: not the working directory first in sys.path. Run from a checkout, a child would
# import (and give its daemon, through PYTHONPATH) the checkout's scaler_executor instead
# of the one installed in that interpreter's venv, and every --python would time the same
# code; PYTHONPATH=. still puts the checkout first where that is what is wanted.
FROM: dict[str, str] = {}  # interpreter -> the scaler_executor it imported


def untraced(python: str, workers: int) -> dict[str, float]:
    out = subprocess.run([python, "-P", "-c", CHILD, str(workers)], capture_output=True, text=True, check=True)
    FROM[python] = next(x for x in out.stdout.splitlines() if x.startswith("FROM "))[5:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    imp, construct, first, shutdown = (float(v) for v in line.split()[1:])
    return {"import": imp, "construct": construct, "first result": first, "shutdown": shutdown}


def traced(python: str, workers: int, strace: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "trace")
        subprocess.run(
            [strace, "-f", "-ttt", "--seccomp-bpf", "-q", "-e", f"trace={SYSCALLS}", "-e", "signal=none",
             "-o", log, python, "-P", "-c", CHILD, str(workers)],
            check=True, capture_output=True,
        )
        with open(log) as f:
            return milestones(f.read().splitlines())


def milestones(lines: list[str]) -> dict[str, float]:
    """Offsets (s) from the construct mark of the steps found in an ``strace -f -ttt`` log."""
    events: list[tuple[int, float, str]] = []
    pending: dict[int, str] = {}  # pid -> the start of an unfinished call
    for raw in lines:
        match = LINE.match(raw)
        if not match:
            continue
        pid, ts, text = int(match.group(1)), float(match.group(2)), match.group(3)
        if text.endswith("<unfinished ...>"):
            pending[pid] = text[: -len("<unfinished ...>")]
            continue
        if text.startswith("<... "):
            text = pending.pop(pid, "") + text.split("resumed>", 1)[-1]
        events.append((pid, ts, text))
    client = events[0][0]
    at: dict[str, float] = {}
    parent: dict[int, int] = {}
    owner: dict[int, int] = {}  # thread id -> its process
    daemon = worker = zygote = -1
    exits: dict[int, float] = {}
    to_daemon: dict[int, int] = {}  # process -> the fd of its connection to the daemon

    def first(name: str, ts: float) -> None:
        at.setdefault(name, ts)

    for tid, ts, text in events:
        pid = owner.get(tid, tid)
        if text.startswith(("access(", "faccessat")):
            mark = re.search(r"/scaler-cold-start-mark/(\w+)", text)
            if mark:
                first(mark.group(1), ts)
        elif PROCESS_CLONE.match(text):
            child = re.search(r"= (\d+)\s*$", text)
            if not child:
                continue
            kid = int(child.group(1))
            if "CLONE_THREAD" in text:
                owner[kid] = pid
                continue
            parent[kid] = pid
            if pid == daemon and worker < 0:
                worker = kid  # forked by the daemon (its execve, if any, is seen below)
                first("worker started", ts)
            elif pid == worker and zygote < 0:
                zygote = kid
                first("zygote forked", ts)
            elif pid == zygote:
                first("first processor forked", ts)
        elif text.startswith("execve(") and text.rstrip().endswith("= 0"):
            if "scaler_executor.cli.daemon" in text:
                daemon = pid
                first("daemon execve", ts)
            elif "scaler_executor.cli.worker" in text:
                worker = pid
                at["worker started"] = ts
        elif text.startswith(("ftruncate(", "fallocate(")) and pid == daemon:
            first("store created", ts)
        elif text.startswith("bind(") and "daemon.sock" in text and pid == daemon:
            first("daemon bound", ts)
        elif text.startswith("connect(") and "daemon.sock" in text and text.rstrip().endswith("= 0"):
            fd = int(text[len("connect(") :].split(",")[0])
            to_daemon.setdefault(pid, fd)
            if pid == worker:
                first("worker connected", ts)
            elif pid == client:
                first("client connected", ts)
        elif text.startswith("sendmsg("):
            fd = int(text[len("sendmsg(") :].split(",")[0])
            if pid == daemon:
                first("daemon's first reply sent", ts)
            elif to_daemon.get(pid) == fd and pid == worker:
                first("worker's Hello sent", ts)
            elif to_daemon.get(pid) == fd and pid == client:
                first("client's Hello sent", ts)
        elif text.startswith("unlink(") and "/dev/shm/scaler-" in text and text.rstrip().endswith("= 0"):
            first("store unlinked", ts)
        elif text.startswith(("+++ exited", "+++ killed")) and tid not in owner:
            exits[tid] = ts
    zero = at["construct"]
    out = {k: v - zero for k, v in at.items() if k not in ("construct", "shutdown", "shutdown_returned")}
    if "shutdown" in at:
        stop = at["shutdown"]
        kids = [p for p in exits if (p != client and p in parent) or p in (daemon, worker)]
        for name, pid in (("daemon exited", daemon), ("worker exited", worker), ("zygote exited", zygote)):
            if pid in exits:
                out["shutdown: " + name] = exits[pid] - stop
        if kids:
            out["shutdown: last process exited"] = max(exits[p] for p in kids) - stop
        if "store unlinked" in out:
            out["shutdown: store unlinked"] = at["store unlinked"] - stop
            del out["store unlinked"]
        out["shutdown: returned"] = at.get("shutdown_returned", stop) - stop
    return out


def summarize(samples: list[dict[str, float]]) -> list[tuple[str, float, float, float]]:
    names: list[str] = []
    for s in samples:
        for k in s:
            if k not in names:
                names.append(k)
    rows = []
    for k in names:
        values = [s[k] for s in samples if k in s]
        rows.append((k, statistics.median(values), min(values), max(values)))
    start = [r for r in rows if not r[0].startswith("shutdown")]
    return sorted(start, key=lambda r: r[1]) + [r for r in rows if r[0].startswith("shutdown")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--python", action="append", help="interpreter to run (repeatable; default this one)")
    p.add_argument("--no-trace", action="store_true", help="only the untraced figures")
    args = p.parse_args(argv)
    pythons = args.python or [sys.executable]
    strace = None if args.no_trace else shutil.which("strace")
    plain: dict[str, list[dict[str, float]]] = {py: [] for py in pythons}
    steps: dict[str, list[dict[str, float]]] = {py: [] for py in pythons}
    for i in range(args.runs):  # alternated, so that a busy spell hits every kind alike
        for py in pythons if i % 2 == 0 else pythons[::-1]:
            plain[py].append(untraced(py, args.workers))
            if strace:
                steps[py].append(traced(py, args.workers, strace))
    for py in pythons:
        print(f"== {py} (scaler_executor from {FROM.get(py, '?')})")
        print(f"untraced, {args.runs} fresh interpreters, {args.workers} processors: median (min-max), ms")
        for k, med, lo, hi in summarize(plain[py]):
            print(f"  {k:34} {med * 1e3:7.1f}  ({lo * 1e3:.1f}-{hi * 1e3:.1f})")
        if strace:
            print("traced steps, offset from ScalerExecutor() (shutdown: from shutdown()), ms")
            for k, med, lo, hi in summarize(steps[py]):
                print(f"  {k:34} {med * 1e3:7.1f}  ({lo * 1e3:.1f}-{hi * 1e3:.1f})")
        elif not args.no_trace:
            print("strace not found: no breakdown by step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
