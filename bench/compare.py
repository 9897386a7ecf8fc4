"""ScalerExecutor side by side with other executors: one run, a table of figures and ratios.

Every (contestant, workload) pair runs in a fresh interpreter::

    python bench/compare.py --run CONTESTANT WORKLOAD --workers N --json

which prints one JSON object; this script without ``--run`` starts those
subprocesses one after another (workload by workload, contestants
interleaved), collects their results, and prints absolute figures per
contestant and each one's ratio to ScalerExecutor's.

    PYTHONPATH=. python bench/compare.py                  # everything, 2 workers
    PYTHONPATH=. python bench/compare.py --quick --only round_trip --contestants scaler,process_pool
    PYTHONPATH=. python bench/compare.py --output docs/performance.rst

Contestants are registered in ``bench/contestants.py``, workloads in
``bench/workloads.py``; see ``bench/README.rst``.  A contestant whose package is
not installed is skipped with a note.  One run is one sample: on a small
machine, repeat a run before reading much into a difference under ~10 %.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
if ROOT not in sys.path:
    # ``bench.workloads`` must import here and in every worker process: the
    # embedded cluster passes sys.path on as PYTHONPATH, forked pools inherit it.
    sys.path.insert(0, ROOT)

from bench.contestants import CONTESTANTS, REFERENCE  # imports no contestant package
from bench.workloads import SCRATCH_ENV, WORKLOADS

DEFAULT_TIMEOUT = 600.0  # seconds per (contestant, workload) subprocess
KILL_GRACE = 15.0  # seconds a timed-out cell has after SIGTERM, before SIGKILL
STDERR_TAIL = 60  # lines of a failed cell's stderr kept in its result (daemon logs land there too)
BUSY_WARNING = 0.2  # cores of other processes' CPU (or of steal) during a cell that make its figures suspect


# =========================================================================== child: one pair


def run_one(contestant_name: str, workload_name: str, workers: int, quick: bool) -> dict[str, Any]:
    contestant = CONTESTANTS[contestant_name]
    workload = WORKLOADS[workload_name]
    result: dict[str, Any] = {
        "contestant": contestant_name,
        "workload": workload_name,
        "workers": workers,
        "quick": quick,
        "pid": os.getpid(),
    }
    reason = contestant.missing()
    if reason is not None:
        result["skipped"] = reason
        return result
    sizes = workload.quick_sizes if quick else workload.sizes
    result["sizes"] = sizes
    if workload_name != "cold_start":  # cold_start times the first import itself
        contestant.load()
    metrics = workload.run(contestant, workers, sizes)
    result["metrics"] = {k: v.to_json() for k, v in metrics.items()}
    result["versions"] = contestant.versions()
    return result


def child_main(args: argparse.Namespace) -> int:
    contestant_name, workload_name = args.run
    if contestant_name not in CONTESTANTS:
        sys.exit(f"unknown contestant {contestant_name!r}; known: {', '.join(CONTESTANTS)}")
    if workload_name not in WORKLOADS:
        sys.exit(f"unknown workload {workload_name!r}; known: {', '.join(WORKLOADS)}")
    try:
        result = run_one(contestant_name, workload_name, args.workers, args.quick)
        code = 0
    except Exception as exc:  # noqa: BLE001  (reported as the cell's result)
        traceback.print_exc()
        result = {
            "contestant": contestant_name,
            "workload": workload_name,
            "workers": args.workers,
            "error": f"{type(exc).__name__}: {exc}",
        }
        code = 1
    if args.json:
        # One line, last on stdout: the parent reads the last line that parses.
        sys.stdout.write("\n" + json.dumps(result) + "\n")
    else:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    sys.stdout.flush()
    return code


# =========================================================================== parent: the table


def machine_cpu_seconds() -> tuple[float, float, float]:
    """(busy, total, steal) CPU-seconds of the whole machine since boot, from /proc/stat.

    ``steal`` is time a virtual machine's CPUs were runnable but the hypervisor ran
    something else; ``busy`` includes it (the CPUs were not ours to use).
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    steal = fields[7] if len(fields) > 7 else 0
    return (total - idle) / tick, total / tick, steal / tick


def children_cpu_seconds() -> float:
    """CPU of every reaped descendant (a child's own reaped children roll up into it)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
ORPHAN_GRACE = 10.0  # seconds a finished cell's orphaned processes have to exit


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux), so that
    ``RUSAGE_CHILDREN`` counts every process a cell started and that was waited for,
    even those their parent left behind (a daemon's workers), and so that none runs on
    into the next cell.  False where prctl is not available.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(grace: float) -> int:
    """Reap the cell's orphans (ours as the subreaper); wait up to ``grace`` s for those
    still running.  Returns how many were still running after it."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # none left
        if pid:
            continue
        if time.monotonic() >= deadline:
            return len(_live_children())
        time.sleep(0.05)


class TreeCpu:
    """CPU of a process tree, sampled every ``interval`` s while it runs, from /proc.

    For processes ``RUSAGE_CHILDREN`` never sees: children of a parent that ignores
    SIGCHLD are reaped by the kernel, uncounted (Ray's cells lost ~0.8 cores that way).
    Each sample reads every /proc/PID/stat (~1.5 ms of CPU with 65 processes); a psutil
    walk of the tree every 0.2 s had cost ~3 ms a sample, a burst beside the cell that
    doubled the round trip's p99, hence once a second and without psutil.
    """

    def __init__(self, interval: float = 1.0) -> None:
        import threading

        # From this process down, itself excluded: the cell's process and, once they are
        # orphaned, its leftovers (reparented to us, the subreaper).
        self._pid = os.getpid()
        self._seen: dict[int, int] = {}  # pid -> most clock ticks of CPU seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._sample()

    def _sample(self) -> None:
        parent: dict[int, int] = {}
        ticks: dict[int, int] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            return
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
                fields = data[data.rindex(b")") + 2 :].split()
                pid = int(name)
                parent[pid] = int(fields[1])
                ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, ValueError, IndexError):
                continue
        children: dict[int, list[int]] = {}
        for pid, ppid in parent.items():
            children.setdefault(ppid, []).append(pid)
        stack = [self._pid]
        while stack:
            pid = stack.pop()
            if pid != self._pid and pid in ticks and ticks[pid] > self._seen.get(pid, 0):
                self._seen[pid] = ticks[pid]
            stack.extend(children.get(pid, ()))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self._seen.values()) / os.sysconf("SC_CLK_TCK")


def _live_children() -> list[int]:
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def wait_idle(limit: float, threshold: float = 0.15) -> float:
    """Wait up to ``limit`` s for the machine to be under ``threshold`` busy; returns the last busy fraction."""
    deadline = time.monotonic() + limit
    while True:
        b0, t0, _ = machine_cpu_seconds()
        time.sleep(0.5)
        b1, t1, _ = machine_cpu_seconds()
        busy = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
        if busy < threshold or time.monotonic() >= deadline:
            return busy


def spawn(
    contestant: str, workload: str, workers: int, quick: bool, timeout: float
) -> dict[str, Any]:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--run",
        contestant,
        workload,
        "--workers",
        str(workers),
        "--json",
    ]
    if quick:
        command.append("--quick")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.pop("PYTHONSTARTUP", None)
    # Files a workload needs (pending_memory's release and started flags) go here, and
    # go away with it even when the cell is killed before its own clean-up runs.
    scratch = tempfile.mkdtemp(prefix="bench-cell-")
    env[SCRATCH_ENV] = scratch
    try:
        return _spawn(command, env, contestant, workload, timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(
    command: list[str], env: dict[str, str], contestant: str, workload: str, timeout: float
) -> dict[str, Any]:
    started = time.monotonic()
    busy0, _, steal0 = machine_cpu_seconds()
    own0 = children_cpu_seconds()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # so a timeout can kill the child's whole process group
    )
    tree = TreeCpu()
    try:
        # Waits for EOF, i.e. until every process holding the pipes (the contestant's
        # workers too) is gone: the next pair starts on a quiet machine.
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the cell's processes end, and a multiprocessing resource tracker
        # (which ignores SIGTERM and holds our pipes) sees them gone, unlinks the
        # semaphores they left and exits.  A SIGKILL to the whole group took the tracker
        # with them and left those semaphores in /dev/shm.
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                out, err = b"", b""
        _signal_group(proc.pid, signal.SIGKILL)  # whatever outlived the pipes
        reap_orphans(KILL_GRACE)
        tree.stop()
        return {
            "contestant": contestant,
            "workload": workload,
            "error": f"timed out after {timeout:.0f} s",
        }
    # Every process the cell started is now our child (become_subreaper) or gone:
    # reaped, its CPU is in RUSAGE_CHILDREN.
    lingering = reap_orphans(ORPHAN_GRACE)
    elapsed = time.monotonic() - started
    busy1, _, steal1 = machine_cpu_seconds()
    # Whatever the machine was busy with that was not this cell (its processes are all
    # reaped by now, so their CPU is in RUSAGE_CHILDREN, or in the samples for those
    # reaped uncounted): other people's work, in this machine (foreign) or on its
    # hypervisor's host (steal).
    own = max(children_cpu_seconds() - own0, tree.stop())
    steal = max(0.0, steal1 - steal0)
    foreign = max(0.0, (busy1 - busy0) - own - steal)
    parsed = None
    for line in reversed(out.decode(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if parsed is None:
        tail = err.decode(errors="replace").strip().splitlines()[-STDERR_TAIL:]
        parsed = {
            "contestant": contestant,
            "workload": workload,
            "error": f"exit {proc.returncode}, no JSON result",
        }
        parsed["stderr"] = "\n".join(tail)
    elif proc.returncode != 0 and "error" not in parsed:
        parsed["error"] = f"exit {proc.returncode}"
    if "error" in parsed and "stderr" not in parsed:
        parsed["stderr"] = "\n".join(
            err.decode(errors="replace").strip().splitlines()[-STDERR_TAIL:]
        )
    parsed["elapsed"] = elapsed
    if lingering:
        parsed["lingering"] = lingering
    parsed["foreign_cores"] = foreign / elapsed if elapsed > 0 else 0.0
    parsed["steal_cores"] = steal / elapsed if elapsed > 0 else 0.0
    return parsed


# --------------------------------------------------------------------------- machine


def machine_info() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "?"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "CPU": cpu,
        "cores": f"{os.cpu_count()} ({usable} usable by this process)",
        "RAM": ram,
        "OS": platform.platform(),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    commit = _git("rev-parse", "--short", "HEAD")
    if commit:
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "scaler_executor")
        info["scaler-executor commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    return info


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# --------------------------------------------------------------------------- formatting


def fmt_value(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return str(value)
    if unit in ("tasks/s", "items/s"):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:#.3g}"  # three significant figures, trailing zeros kept: 0.500, 1.20, 12.0


def fmt_ratio(value: float, reference: float) -> str:
    if reference == 0:
        return "—"
    return f"{value / reference:.2f}×"


def build_rows(
    results: dict[tuple[str, str], dict[str, Any]], contestants: list[str], workloads: list[str]
) -> tuple[list[str], list[list[str]]]:
    """Header and rows: workload, metric, one column per contestant, then one ratio column each."""
    others = [c for c in contestants if c != REFERENCE]
    ref_present = REFERENCE in contestants
    header = ["workload", "metric", *contestants]
    if ref_present:
        header += [f"{c} ÷ {REFERENCE}" for c in others]
    rows = []
    for w in workloads:
        metric_names: list[str] = []
        units: dict[str, tuple[str, str]] = {}
        for c in contestants:
            for name, m in results.get((c, w), {}).get("metrics", {}).items():
                if name not in units:
                    metric_names.append(name)
                    units[name] = (m["unit"], m["better"])
        if not metric_names:
            metric_names = ["—"]
        for i, name in enumerate(metric_names):
            unit, better = units.get(name, ("", ""))
            arrow = {"higher": " ↑", "lower": " ↓"}.get(better, "")
            row = [w if i == 0 else "", f"{name} ({unit}){arrow}" if unit else name]
            values: dict[str, float | None] = {}
            for c in contestants:
                r = results.get((c, w), {})
                if "skipped" in r:
                    row.append("skipped")
                elif "error" in r:
                    row.append("error")
                elif name in r.get("metrics", {}):
                    value = r["metrics"][name]["value"]
                    if value is None:  # the contestant has no way to do this (see the notes)
                        row.append("n/a")
                    else:
                        values[c] = value
                        cell = fmt_value(value, unit)
                        spread = r["metrics"][name].get("spread")
                        if spread is not None:
                            cell += f" ({fmt_value(spread[0], unit)}-{fmt_value(spread[1], unit)})"
                        row.append(cell)
                else:
                    row.append("—")
            if ref_present:
                ref = values.get(REFERENCE)
                for c in others:
                    v = values.get(c)
                    row.append(fmt_ratio(v, ref) if v is not None and ref is not None else "—")
            rows.append(row)
    return header, rows


def render_text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = [i >= 2 for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)
        ).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def render_markdown(header: list[str], rows: list[list[str]]) -> str:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(":---" if i < 2 else "---:" for i in range(len(header))) + "|",
    ]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def render_rst(header: list[str], rows: list[list[str]]) -> str:
    """A grid table (readable as plain text, and rows may have empty cells)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head_sep = "+" + "+".join("=" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return (
            "|"
            + "|".join(
                " " + (c.rjust(w) if i >= 2 else c.ljust(w)) + " "
                for i, (c, w) in enumerate(zip(cells, widths))
            )
            + "|"
        )

    out = [sep, line(header), head_sep]
    for r in rows:
        out += [line(r), sep]
    return "\n".join(out)


def notes(
    results: dict[tuple[str, str], dict[str, Any]],
    contestants: list[str],
    workloads: list[str],
    skipped: dict[str, str],
) -> list[str]:
    lines = []
    if REFERENCE in contestants:
        lines.append(
            f"ratio = contestant ÷ {REFERENCE}; ↑ higher is better, ↓ lower is better "
            f"(so a ratio > 1 on a ↑ row, or < 1 on a ↓ row, means the contestant beat {REFERENCE})."
        )
    for name, reason in skipped.items():
        lines.append(f"{name} skipped: {reason}")
    # Notes the workloads attached to metrics ("n/a" and why, how a figure was measured):
    # one line per workload and note, naming the metrics and contestants it applies to.
    by_note: dict[tuple[str, str], dict[str, list[str]]] = {}
    for (c, w), r in results.items():
        for name, m in r.get("metrics", {}).items():
            if m.get("note") or m.get("value") is None:
                text = ("n/a, " if m.get("value") is None else "") + (m.get("note") or "")
                who = by_note.setdefault((w, text), {})
                who.setdefault(name, [])
                if c not in who[name]:
                    who[name].append(c)
    for (w, text), who in by_note.items():
        contestants_ = sorted({c for cs in who.values() for c in cs}, key=contestants.index)
        lines.append(f"{w} ({', '.join(who)}): {', '.join(contestants_)}: {text}")
    for (c, w), r in results.items():
        if "error" in r:
            detail = f" — {r['stderr'].splitlines()[-1]}" if r.get("stderr") else ""
            lines.append(f"{c} / {w}: {r['error']}{detail}")
    lingering = {k: r["lingering"] for k, r in results.items() if r.get("lingering")}
    if lingering:
        lines.append(
            f"WARNING: processes of {len(lingering)} cells were still running {ORPHAN_GRACE:g} s after the cell "
            "ended, beside the next cells ("
            + ", ".join(f"{c}/{w} {n}" for (c, w), n in lingering.items())
            + "): the figures after them are suspect."
        )
    measured = sum("foreign_cores" in r for r in results.values())
    for key, who, fix in (
        ("foreign_cores", "other processes kept the machine busy", "rerun on a quiet machine (see --wait-idle)"),
        ("steal_cores", "the hypervisor ran something else on this VM's CPUs (steal time)",
         "rerun when the host is quieter"),
    ):
        busy = {k: r[key] for k, r in results.items() if r.get(key, 0.0) >= BUSY_WARNING}
        if busy:
            worst = sorted(busy.items(), key=lambda kv: -kv[1])
            lines.append(
                f"WARNING: {who} during {len(busy)} of {measured} cells (on average, in cores: "
                + ", ".join(f"{c}/{w} {v:.2f}" for (c, w), v in worst[:6])
                + (", ..." if len(worst) > 6 else "")
                + f"): those figures are suspect; {fix}."
            )
    sizes = {w: r["sizes"] for (c, w), r in results.items() if r.get("sizes")}
    if sizes:
        lines.append(
            "sizes: "
            + "; ".join(
                f"{w} {', '.join(f'{k}={v:,}' for k, v in s.items())}"
                for w, s in sizes.items()
                if s
            )
        )
    versions: dict[str, str] = {}
    for r in results.values():
        versions.update(r.get("versions", {}))
    if versions:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    return lines


def write_rst(
    path: str,
    table: str,
    machine: dict[str, str],
    note_lines: list[str],
    workers: int,
    quick: bool,
    command: str,
    contestants: list[str],
    versions: dict[str, str],
) -> None:
    title = "Performance: ScalerExecutor side by side"
    machine = dict(machine)
    if versions:
        machine["packages"] = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    labels = "\n".join(f"* ``{c}``: {CONTESTANTS[c].label}" for c in contestants)
    machine_rows = "\n".join(f"   * - {k}\n     - {v}" for k, v in machine.items())
    workload_lines = "\n".join(f"* ``{w.name}``: {w.summary}" for w in WORKLOADS.values())
    text = f"""{title}
{"=" * len(title)}

Generated by ``bench/compare.py`` ({workers} worker processes per contestant{", --quick sizes" if quick else ""};
every cell in a fresh interpreter; a cell run more than once shows its median (min-max))::

    {command}

Contestants:

{labels}

Workloads:

{workload_lines}

{table}

{chr(10).join("* " + n for n in note_lines)}

Machine
-------

.. list-table::
   :widths: 25 75

{machine_rows}
"""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def byte_compile_scaler() -> str:
    """Compile scaler_executor's modules to bytecode, as ``pip install`` does.

    The peers are installed packages with their bytecode. A source checkout installed with
    ``pip install -e`` has none until an import writes it, and with PYTHONDONTWRITEBYTECODE
    set (some CI images do) none is ever written: then every process of every cold start
    compiles every module again (~0.15 s on the 2-core VM, in each of the client, daemon
    and worker). Returns a note for the page.
    """
    import compileall

    try:
        import scaler_executor
    except ImportError as exc:
        return f"scaler_executor not byte-compiled first: {exc}"
    package = os.path.dirname(scaler_executor.__file__)
    ok = compileall.compile_dir(package, quiet=1, force=True)  # bench/ab.py's byte_compile says why
    state = "compiled" if ok else "compiled with errors"
    return f"scaler_executor's modules were byte-{state} first (in {package}), as pip install does."


def _print_status(r: dict[str, Any]) -> None:
    status = "error: " + r["error"] if "error" in r else f"{r.get('elapsed', 0):.1f} s"
    if r.get("foreign_cores", 0.0) >= BUSY_WARNING:
        status += f" (machine busy: other processes used {r['foreign_cores']:.2f} cores)"
    if r.get("steal_cores", 0.0) >= BUSY_WARNING:
        status += f" (steal: the hypervisor took {r['steal_cores']:.2f} cores)"
    if r.get("lingering"):
        status += f" ({r['lingering']} of its processes still running after {ORPHAN_GRACE:g} s)"
    print(f" {status}", file=sys.stderr, flush=True)


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from repeated cells: each metric's median, with its min and max as "spread".

    A cell that failed makes the whole result that failure (its error and stderr), so that
    no median hides it. The busy-machine figures are the worst run's."""
    if len(runs) == 1:
        return runs[0]
    for r in runs:
        if "error" in r or "skipped" in r:
            return r
    merged = dict(runs[0])
    metrics: dict[str, Any] = {}
    for name, first in runs[0].get("metrics", {}).items():
        values = [r["metrics"][name]["value"] for r in runs if name in r.get("metrics", {})]
        m = dict(first)
        numbers = [v for v in values if v is not None]
        if len(numbers) < len(values):
            # n/a in some run: the table shows n/a, and the note of such a run says why
            m["value"] = None
            m["note"] = next(
                r["metrics"][name].get("note", "") for r in runs
                if r["metrics"].get(name, {}).get("value") is None
            )
        else:
            m["value"] = statistics.median(numbers)
            m["spread"] = [min(numbers), max(numbers)]
            m["runs"] = len(numbers)
        metrics[name] = m
    merged["metrics"] = metrics
    merged["elapsed"] = sum(r.get("elapsed", 0.0) for r in runs)
    merged["runs"] = len(runs)
    for key in ("foreign_cores", "steal_cores", "lingering"):
        merged[key] = max(r.get(key, 0) for r in runs)
    return merged


def parent_main(args: argparse.Namespace) -> int:
    contestants = (
        [c.strip() for c in args.contestants.split(",") if c.strip()]
        if args.contestants
        else list(CONTESTANTS)
    )
    for c in contestants:
        if c not in CONTESTANTS:
            sys.exit(f"unknown contestant {c!r}; known: {', '.join(CONTESTANTS)}")
    workloads = (
        [w.strip() for w in args.only.split(",") if w.strip()] if args.only else list(WORKLOADS)
    )
    for w in workloads:
        if w not in WORKLOADS:
            sys.exit(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    skipped: dict[str, str] = {}
    for c in contestants:
        reason = CONTESTANTS[c].missing()
        if reason is not None:
            skipped[c] = reason
            print(f"note: skipping {c}: {reason}", file=sys.stderr)
    running = [c for c in contestants if c not in skipped]
    if not become_subreaper():
        print(
            "note: cannot become the child subreaper (not Linux?): CPU of processes a cell "
            "left to init counts as other processes' (foreign)",
            file=sys.stderr,
        )
    compiled = byte_compile_scaler()
    # Before the cells: the commit (and date) of the code they run, not of what the
    # checkout holds by the time the last cell ends.
    machine = machine_info()
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for c, reason in skipped.items():
        for w in workloads:
            results[(c, w)] = {"skipped": reason}
    repeats = {w: args.repeat or WORKLOADS[w].repeat for w in workloads}
    total = sum(len(running) * repeats[w] for w in workloads)
    done = 0
    for w in workloads:
        samples: dict[str, list[dict[str, Any]]] = {c: [] for c in running}
        for rep in range(repeats[w]):
            # Alternate the order, so that no contestant always runs right after another.
            for c in running if rep % 2 == 0 else running[::-1]:
                done += 1
                if args.wait_idle:
                    wait_idle(args.wait_idle)
                tag = f" (run {rep + 1}/{repeats[w]})" if repeats[w] > 1 else ""
                print(f"[{done}/{total}] {c} / {w}{tag} ...", end="", file=sys.stderr, flush=True)
                r = spawn(c, w, args.workers, args.quick, args.timeout)
                samples[c].append(r)
                _print_status(r)
        for c in running:
            results[(c, w)] = merge_runs(samples[c])
    shown = [c for c in contestants if c not in skipped] or contestants
    header, rows = build_rows(results, shown, workloads)
    note_lines = [compiled, *notes(results, contestants, workloads, skipped)]
    if args.markdown:
        table = render_markdown(header, rows)
    elif args.rst:
        table = render_rst(header, rows)
    else:
        table = render_text(header, rows)
    print()
    runs = sorted(set(repeats.values()))
    print(
        f"{args.workers} workers per contestant{' (--quick sizes)' if args.quick else ''}; fresh interpreter per cell; "
        + ("one run per cell" if runs == [1] else "cells run more than once show the median (min-max)")
    )
    print(table)
    print()
    for n in note_lines:
        print(("* " if args.markdown or args.rst else "") + n)
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine.items()))
    if args.output:
        command = "python bench/compare.py " + " ".join(sys.argv[1:])
        versions: dict[str, str] = {}
        for r in results.values():
            versions.update(r.get("versions", {}))
        write_rst(
            args.output,
            render_rst(header, rows),
            machine,
            note_lines,
            args.workers,
            args.quick,
            command,
            shown,
            versions,
        )
        print(f"wrote {args.output}")
    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump(
                {
                    "machine": machine,
                    "results": [dict(r, contestant=c, workload=w) for (c, w), r in results.items()],
                },
                f,
                indent=2,
            )
    return 1 if any("error" in r for r in results.values()) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--workers", type=int, default=2, help="worker processes per contestant (default 2)"
    )
    p.add_argument(
        "--only",
        metavar="WORKLOAD[,...]",
        help=f"workloads to run (default all: {', '.join(WORKLOADS)})",
    )
    p.add_argument(
        "--contestants",
        metavar="NAME[,...]",
        help=f"contestants (default all: {', '.join(CONTESTANTS)})",
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller sizes (a smoke run, noisier figures)"
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    fmt.add_argument(
        "--rst", action="store_true", help="print the table as a reStructuredText grid table"
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        help="also write an .rst page (table, notes, machine), e.g. docs/performance.rst",
    )
    p.add_argument("--save-json", metavar="FILE", help="also write every raw result as JSON")
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each cell, wait up to SECONDS for the machine to be under 15%% busy (shared machines)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds per subprocess (default %(default)s)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="run each cell N times (contestants alternating) and show the median (min-max); "
        "default: the workload's own (cold_start 7, others 1)",
    )
    p.add_argument("--list", action="store_true", help="list contestants and workloads, then exit")
    p.add_argument(
        "--run",
        nargs=2,
        metavar=("CONTESTANT", "WORKLOAD"),
        help="(internal) run one pair in this process",
    )
    p.add_argument(
        "--json", action="store_true", help="with --run: print the result as one JSON line"
    )
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be >= 1")
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.list:
        for c in CONTESTANTS.values():
            reason = c.missing()
            print(
                f"contestant {c.name:15} {c.label}" + (f"  [skipped: {reason}]" if reason else "")
            )
        for w in WORKLOADS.values():
            print(f"workload   {w.name:15} {w.summary}")
        return 0
    if args.run:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
