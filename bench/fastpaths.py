"""Each client fast path, A/B with all the others on: what it gains, with a 95 % interval.

The fast paths (``PATHS`` below; issue 20): lanes, reply datagrams, pick-up,
pick-up spin.  (Three more were measured here and removed: direct send, the submitting
thread writing a lone task itself, and the leader/follower hand-off of the agent role,
whose intervals included zero; and quiet results, the agent thread completing a few
small results itself, which cost 8 % of burst throughput.)  For each one, ``--reps`` times,
a cell with every path on and a cell with that one turned off run one after the
other (the order swaps every repetition: on/off, off/on, ... so that a drift of the
machine cancels), each in a fresh interpreter::

    python bench/fastpaths.py --cell PATH on|off

which starts a ``ScalerExecutor(max_workers=2)`` (embedded cluster), warms it up,
measures the round trip and the throughput of no-op tasks, shuts it down and prints
one JSON line.  The parent waits until every process of a cell is gone before the
next starts, then reports per path and metric the mean of the paired differences
(positive: the path gains) with a 95 % confidence interval from the t distribution::

    PYTHONPATH=. python bench/fastpaths.py                          # every path, 10 reps
    PYTHONPATH=. python bench/fastpaths.py --reps 2 --paths pick_up,pickup_spin
    PYTHONPATH=. python bench/fastpaths.py --output docs/fastpaths.rst
    PYTHONPATH=. python bench/fastpaths.py --probe-only             # which path each switch changes

Before the timed cells (unless ``--no-probe``) one *probe* cell per path and variant
counts, with the client's functions wrapped, which route tasks and results took and
which thread completed them: the evidence that each switch changes what it says.
See bench/README.rst.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
if ROOT not in sys.path:
    # bench.workloads (noop) must import here and in the workers: the embedded cluster
    # passes sys.path on as PYTHONPATH.
    sys.path.insert(0, ROOT)

from bench.workloads import no_gc, noop  # noqa: E402  (imports no scaler_executor module)

WORKERS = 2
CELL_TIMEOUT = 300.0  # seconds per cell
KILL_GRACE = 10.0  # seconds a timed-out cell has after SIGTERM
GONE_GRACE = 15.0  # seconds a finished cell's processes have to exit before they are killed
BUSY_WARNING = 0.2  # cores of other processes' CPU (or steal) during a cell that make it suspect
TAG_ENV = (
    "FASTPATHS_CELL"  # in every process of a cell (the daemon's too): how its leftovers are found
)
STDERR_TAIL = 40


# =========================================================================== the paths


@dataclass(frozen=True)
class Path:
    name: str
    summary: str
    switch: str  # what turning it off sets, for the table's notes
    read: str  # when the client reads the switch
    turn_off: Callable[[Any], Any]  # (config) -> config, after setting module attributes


def _set(module: str, attr: str, value: Any) -> Callable[[Any], Any]:
    def turn_off(config: Any) -> Any:
        import importlib

        mod = importlib.import_module(module)
        if not hasattr(mod, attr):
            raise AttributeError(f"{module}.{attr} does not exist: the switch moved or was removed")
        setattr(mod, attr, value)
        return config

    return turn_off


def _no_lanes(config: Any) -> Any:
    return config.replace(worker_lanes=False)


PATHS: dict[str, Path] = {
    p.name: p
    for p in (
        Path(
            "lanes",
            "a lone task goes straight to a worker on this host, past the daemon",
            "ClusterConfig.worker_lanes=False",
            "at executor start",
            _no_lanes,
        ),
        Path(
            "reply_inbox",
            "processors send a sequential caller's result as a datagram to the client",
            "client.agent.REPLY_INBOX=False (no reply socket: lanes and pick-up go too)",
            "at executor start",
            _set("scaler_executor.client.agent", "REPLY_INBOX", False),
        ),
        Path(
            "pick_up",
            "the caller waiting in result() reads its own result datagram",
            "client.submit.PICK_UP=False",
            "at executor start",
            _set("scaler_executor.client.submit", "PICK_UP", False),
        ),
        Path(
            "pickup_spin",
            "a picking-up caller polls without sleeping for 2 ms first",
            "client.routes.PICKUP_SPIN_SECONDS=0",
            "per wait",
            _set("scaler_executor.client.routes", "PICKUP_SPIN_SECONDS", 0),
        ),
    )
}


# =========================================================================== metrics


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    unit: str
    better: str  # "lower" or "higher": the sign of a gain
    decides: bool  # part of the verdict (the round trip and throughput)


METRICS = [
    MetricSpec("rt_median_us", "round trip, median", "µs", "lower", True),
    MetricSpec("burst_tasks_per_s", "throughput, submit + wait", "tasks/s", "higher", True),
    MetricSpec("rt_p99_us", "round trip, p99", "µs", "lower", False),
    MetricSpec("map_items_per_s", "throughput, map", "items/s", "higher", False),
]

SIZES = {"warmup": 200, "warmup_burst": 2_000, "rt": 2_000, "burst": 20_000, "map": 20_000}
PROBE_SIZES = {"warmup": 100, "warmup_burst": 500, "rt": 300, "burst": 3_000, "map": 0}


# =========================================================================== child: one cell


class Probes:
    """Counters on the client's routes, installed before the executor starts (probe cells only:
    the wrappers cost a few microseconds per call)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._main = threading.main_thread()

    def add(self, key: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            out = dict(self.counts)
            self.counts.clear()
        return out

    def install(self) -> None:
        from scaler_executor.client import completion, inbound, routes

        probes = self

        def wrap(cls: Any, name: str, after: Callable[[Any, tuple[Any, ...], Any], None]) -> None:
            original = getattr(cls, name)

            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                out = original(self, *args, **kwargs)
                after(self, args, out)
                return out

            setattr(cls, name, wrapper)

        def where() -> str:
            return "caller" if threading.current_thread() is self._main else "pool"

        wrap(
            routes.LaneRoute,
            "submit",
            lambda s, a, ok: probes.add("lane submit" if ok else "lane submit refused"),
        )
        wrap(
            routes.ReplyInbox,
            "read",
            lambda s, a, res: probes.add(f"results read: inbox by {where()}", len(res)),
        )
        wrap(
            inbound.DaemonMessages,
            "_on_results",
            lambda s, a, res: probes.add("results read: daemon socket", len(a[0].results)),
        )
        wrap(
            routes.LaneRoute,
            "receive",
            lambda s, a, res: probes.add("results read: lane socket", len(res[0])),
        )
        wrap(
            routes.ReplyInbox,
            "pick_up",
            lambda s, a, res: probes.add(
                "pick-up got its result" if res else "pick-up came back empty"
            ),
        )

        original_complete = completion.Completion.complete

        def complete(self: Any, result: Any, quietly: bool = False) -> None:
            probes.add(f"completed {'quietly ' if quietly else ''}by {where()}")
            original_complete(self, result, quietly)

        completion.Completion.complete = complete  # type: ignore[method-assign]

        original_yield = os.sched_yield

        def sched_yield() -> (
            None
        ):  # only ReplyInbox._await calls it in the client: one per spin turn
            probes.add("pick-up spin turns")
            original_yield()

        os.sched_yield = sched_yield


BASE_ENV = "FASTPATHS_BASE"  # the configuration both variants share (--base)


def run_cell(
    path_name: str, variant: str, sizes: dict[str, int], probe: bool, workers: int
) -> dict[str, Any]:
    from concurrent.futures import wait

    from scaler_executor import ScalerExecutor
    from scaler_executor.client import agent as client_agent
    from scaler_executor.client import routes
    from scaler_executor.client import submit as client_submit
    from scaler_executor.config import ClusterConfig

    path = PATHS[path_name]
    config = ClusterConfig()
    if os.environ.get(BASE_ENV) == "no-inbox":
        # The configuration of a client whose daemon is on another host: no reply socket,
        # so no lanes and no pick-up; results come through the daemon's socket.
        client_agent.REPLY_INBOX = False
    if variant == "off":
        config = path.turn_off(config)
    probes = Probes() if probe else None
    if probes is not None:
        probes.install()
    out: dict[str, Any] = {"path": path_name, "variant": variant, "probe": probe}
    t_start = time.perf_counter()
    ex = ScalerExecutor(max_workers=workers, config=config)
    try:
        for i in range(sizes["warmup"]):
            ex.submit(noop, i).result()
        warm = [ex.submit(noop, i) for i in range(sizes["warmup_burst"])]
        wait(warm)
        for f in warm:
            f.result()
        del warm
        for i in range(
            20
        ):  # after the burst, back to sequential: the lane (re)connected, spin state settled
            ex.submit(noop, i).result()
        agent = ex._agent
        out["state"] = {
            "reply inbox bound": agent.inbox is not None,
            "lane open": agent.lane.open,
            "worker_lanes": agent.config.worker_lanes,
            "PICK_UP": client_submit.PICK_UP,
            "PICKUP_SPIN_SECONDS": routes.PICKUP_SPIN_SECONDS,
            "spin worthwhile (more than one CPU)": routes.SPIN_WORTHWHILE,
        }
        out["warmup_s"] = time.perf_counter() - t_start
        if probes is not None:
            probes.snapshot()  # what the warm-up counted goes

        # (a) the round trip: N sequential submit(noop).result()
        clock = time.perf_counter
        samples: list[float] = []
        submit = ex.submit
        with no_gc():
            for _ in range(sizes["rt"]):
                t0 = clock()
                submit(noop, 0).result()
                samples.append(clock() - t0)
        us = sorted(s * 1e6 for s in samples)
        out["rt_median_us"] = statistics.median(us)
        out["rt_p99_us"] = statistics.quantiles(us, n=100, method="inclusive")[98]
        out["rt_mean_us"] = statistics.fmean(us)
        if probes is not None:
            out["probe_rt"] = probes.snapshot()

        # (b) throughput: a burst of submits, waited for with concurrent.futures.wait
        n = sizes["burst"]
        with no_gc():
            t0 = clock()
            futures = [submit(noop, i) for i in range(n)]
            t1 = clock()
            done, not_done = wait(futures)
            t2 = clock()
        if not_done:
            raise AssertionError(f"{len(not_done)} futures not done after wait()")
        failed = [f for f in futures if f.exception() is not None]
        if failed:
            raise AssertionError(
                f"{len(failed)} burst tasks failed, the first with {failed[0].exception()!r}"
            )
        del futures, done
        out["burst_tasks_per_s"] = n / (t2 - t0)
        out["burst_submit_us"] = (t1 - t0) / n * 1e6
        if probes is not None:
            out["probe_burst"] = probes.snapshot()

        # (c) map with the default chunksize (1)
        n = sizes["map"]
        if n:
            with no_gc():
                t0 = clock()
                results = list(ex.map(noop, range(n)))
                t1 = clock()
            if len(results) != n:
                raise AssertionError(f"map returned {len(results)} results for {n} items")
            out["map_items_per_s"] = n / (t1 - t0)
            if probes is not None:
                out["probe_map"] = probes.snapshot()
    finally:
        t0 = time.perf_counter()
        ex.shutdown(wait=True)
        out["shutdown_s"] = time.perf_counter() - t0
    out["cell_s"] = time.perf_counter() - t_start
    return out


def child_main(args: argparse.Namespace) -> int:
    path_name, variant = args.cell
    if path_name not in PATHS:
        sys.exit(f"unknown path {path_name!r}; known: {', '.join(PATHS)}")
    if variant not in ("on", "off"):
        sys.exit(f"variant must be on or off, not {variant!r}")
    sizes = PROBE_SIZES if args.probe else SIZES
    try:
        result = run_cell(path_name, variant, sizes, args.probe, args.workers)
        code = 0
    except Exception as exc:  # noqa: BLE001  (reported as the cell's result)
        import traceback

        traceback.print_exc()
        result = {"path": path_name, "variant": variant, "error": f"{type(exc).__name__}: {exc}"}
        code = 1
    sys.stdout.write("\n" + json.dumps(result) + "\n")  # one line, last on stdout
    sys.stdout.flush()
    return code


# =========================================================================== parent: spawning cells


def _tagged(tag: str) -> list[Any]:
    """This user's live processes whose environment carries ``tag`` (a cell's, daemon included:
    the embedded cluster runs it in a session of its own, so no process group holds them all)."""
    import psutil

    found = []
    me = os.getpid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid == me or (p.info["uids"] and p.info["uids"].real != os.getuid()):
                continue
            if p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _reap() -> None:
    """Reap the cell's orphans (ours, as the child subreaper), so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return


def wait_gone(tag: str, grace: float) -> int:
    """Wait until no process of the cell is left; past ``grace`` kill the rest.  Returns how
    many had to be killed."""
    import psutil

    deadline = time.monotonic() + grace
    while True:
        _reap()
        left = _tagged(tag)
        if not left:
            return 0
        if time.monotonic() >= deadline:
            for p in left:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=5)
            _reap()
            return len(left)
        time.sleep(0.1)


def spawn_cell(
    path: str, variant: str, probe: bool, workers: int, timeout: float
) -> dict[str, Any]:
    from bench.compare import children_cpu_seconds, machine_cpu_seconds

    tag = uuid.uuid4().hex
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--cell",
        path,
        variant,
        "--workers",
        str(workers),
    ]
    if probe:
        command.append("--probe")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.pop("PYTHONSTARTUP", None)
    env[TAG_ENV] = tag
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
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)  # EOF: every process holding the pipes is gone
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in [proc, *_tagged(tag)]:
                try:
                    os.kill(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                out, err = proc.communicate(timeout=KILL_GRACE)
                break
            except subprocess.TimeoutExpired:
                out, err = b"", b""
    except BaseException:  # Ctrl-C: take the cell down with us
        for p in [proc, *_tagged(tag)]:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        raise
    killed = wait_gone(tag, GONE_GRACE)
    elapsed = time.monotonic() - started
    busy1, _, steal1 = machine_cpu_seconds()
    own = children_cpu_seconds() - own0
    steal = max(0.0, steal1 - steal0)
    foreign = max(0.0, (busy1 - busy0) - own - steal)
    result: dict[str, Any] | None = None
    for line in reversed(out.decode(errors="replace").splitlines()):
        if line.strip().startswith("{"):
            try:
                result = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if result is None:
        result = {
            "path": path,
            "variant": variant,
            "error": f"timed out after {timeout:g} s"
            if timed_out
            else f"exit {proc.returncode}, no JSON result",
        }
    if "error" in result:
        result["stderr"] = "\n".join(
            err.decode(errors="replace").strip().splitlines()[-STDERR_TAIL:]
        )
    result["elapsed"] = elapsed
    result["foreign_cores"] = foreign / elapsed if elapsed > 0 else 0.0
    result["steal_cores"] = steal / elapsed if elapsed > 0 else 0.0
    if killed:
        result["killed_leftovers"] = killed
    return result


def become_subreaper() -> bool:
    from bench.compare import become_subreaper as become

    return bool(become())


# =========================================================================== statistics


# Two-sided 95 %: the 0.975 quantile of Student's t for 1..30 degrees of freedom.
T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t975(df: int) -> float:
    """The 0.975 quantile of t with ``df`` degrees of freedom (scipy's if installed)."""
    try:
        from scipy.stats import t

        return float(t.ppf(0.975, df))
    except ImportError:
        pass
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion about the normal quantile: < 1e-4 off for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass
class Interval:
    n: int
    mean: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def interval(diffs: list[float]) -> Interval | None:
    n = len(diffs)
    if n == 0:
        return None
    mean = statistics.fmean(diffs)
    if n == 1:
        return Interval(1, mean, -math.inf, math.inf)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)


def gains(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], spec: MetricSpec
) -> tuple[Interval | None, Interval | None, float, float]:
    """(absolute interval, relative interval, mean with the path, mean without) of one metric.

    A pair's gain is off - on for a "lower is better" metric, on - off otherwise, so that
    positive means the path gains; relative, that gain over the figure without the path.
    """
    absolute, relative, on_values, off_values = [], [], [], []
    for on, off in pairs:
        a, b = on.get(spec.key), off.get(spec.key)
        if a is None or b is None:
            continue
        gain = (b - a) if spec.better == "lower" else (a - b)
        absolute.append(gain)
        relative.append(gain / b if b else 0.0)
        on_values.append(a)
        off_values.append(b)
    if not absolute:
        return None, None, math.nan, math.nan
    return (
        interval(absolute),
        interval(relative),
        statistics.fmean(on_values),
        statistics.fmean(off_values),
    )


def verdict(deciding: list[Interval | None]) -> str:
    known = [i for i in deciding if i is not None]
    if len(known) < len(deciding) or any(i.n < 2 for i in known):
        return "too few reps for a verdict"
    if any(i.low > 0 for i in known):
        if any(i.high < 0 for i in known):
            return "keeps its place (a trade-off: it loses on the other)"
        return "keeps its place"
    if all(not i.excludes_zero for i in known):
        return "interval includes zero on both: candidate for removal"
    return "loses: candidate for removal"


# =========================================================================== formatting


def fmt(value: float, unit: str, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if unit == "%":
        text = f"{value * 100:+.1f} %" if signed else f"{value * 100:.1f} %"
        return text
    if unit in ("tasks/s", "items/s"):
        text = f"{value:+,.0f}" if signed else f"{value:,.0f}"
    else:
        text = f"{value:+.1f}" if signed else f"{value:.1f}"
    return text


def fmt_interval(i: Interval | None, unit: str) -> str:
    if i is None:
        return "—"
    if not (math.isfinite(i.low) and math.isfinite(i.high)):
        return f"{fmt(i.mean, unit, True)} [no interval, n=1]"
    return f"{fmt(i.mean, unit, True)} [{fmt(i.low, unit, True)}, {fmt(i.high, unit, True)}]"


def build_table(
    results: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]],
) -> tuple[list[str], list[list[str]], dict[str, str]]:
    header = ["path", "metric", "on", "off", "gain [95 % CI]", "relative [95 % CI]", "n", "verdict"]
    rows: list[list[str]] = []
    verdicts: dict[str, str] = {}
    for name, pairs in results.items():
        good = [(a, b) for a, b in pairs if "error" not in a and "error" not in b]
        computed = [(spec, *gains(good, spec)) for spec in METRICS]
        decide = verdict([absolute for spec, absolute, *_ in computed if spec.decides])
        verdicts[name] = decide
        for k, (spec, absolute, relative, on_mean, off_mean) in enumerate(computed):
            arrow = " ↓" if spec.better == "lower" else " ↑"
            rows.append(
                [
                    name if k == 0 else "",
                    f"{spec.label} ({spec.unit}){arrow}",
                    fmt(on_mean, spec.unit),
                    fmt(off_mean, spec.unit),
                    fmt_interval(absolute, spec.unit),
                    fmt_interval(relative, "%"),
                    str(absolute.n if absolute else 0),
                    decide if k == 0 else "",
                ]
            )
    return header, rows, verdicts


def render_text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def render_rst(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head = "+" + "+".join("=" * (w + 2) for w in widths) + "+"
    right = {2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return (
            "|"
            + "|".join(
                " " + (c.rjust(w) if i in right else c.ljust(w)) + " "
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + "|"
        )

    out = [sep, line(header), head]
    for r in rows:
        out += [line(r), sep]
    return "\n".join(out)


PROBE_KEYS = [
    "lane submit",
    "lane submit refused",
    "results read: lane socket",
    "results read: inbox by caller",
    "results read: inbox by pool",
    "results read: daemon socket",
    "pick-up got its result",
    "pick-up came back empty",
    "pick-up spin turns",
    "completed quietly by caller",
    "completed quietly by pool",
    "completed by pool",
    "completed by caller",
]


def probe_lines(probes: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per path and variant: the counts of its round-trip and burst phases."""
    lines = []
    for name, variants in probes.items():
        for variant in ("on", "off"):
            r = variants.get(variant)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{name} {variant}: error: {r['error']}")
                continue
            state = r.get("state", {})
            parts = [
                f"inbox {'bound' if state.get('reply inbox bound') else 'NONE'}",
                f"lane {'open' if state.get('lane open') else 'closed'}",
            ]
            for phase, key in (("round trip", "probe_rt"), ("burst", "probe_burst")):
                counts = r.get(key, {})
                shown = ", ".join(f"{k} {counts[k]}" for k in PROBE_KEYS if counts.get(k))
                extra = ", ".join(
                    f"{k} {v}" for k, v in counts.items() if k not in PROBE_KEYS and v
                )
                parts.append(f"{phase}: {shown}{', ' + extra if extra else ''}")
            lines.append(f"{name} {variant}: " + "; ".join(parts))
    return lines


# The counts that show a path taken: what turning it off must bring to zero.
EVIDENCE: dict[str, tuple[str, ...]] = {
    "lanes": ("lane submit",),
    "reply_inbox": ("results read: inbox by caller", "results read: inbox by pool"),
    "pick_up": ("pick-up got its result", "pick-up came back empty"),
    "pickup_spin": ("pick-up spin turns",),
}


def probe_findings(probes: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Per path: how often its own route was taken, on and off, per phase; and what is wrong
    with that (taken although off, or hardly taken although on)."""
    findings = []
    for name, variants in probes.items():
        on, off = variants.get("on"), variants.get("off")
        if not on or not off or "error" in on or "error" in off:
            continue
        keys = EVIDENCE.get(name, ())
        parts, problems = [], []
        for key, phase, tasks in (
            ("probe_rt", "round trip", PROBE_SIZES["rt"]),
            ("probe_burst", "burst", PROBE_SIZES["burst"]),
        ):
            a = sum(on.get(key, {}).get(k, 0) for k in keys)
            b = sum(off.get(key, {}).get(k, 0) for k in keys)
            parts.append(f"{phase} {a} on / {b} off (of {tasks} tasks)")
            if b:
                problems.append(f"WARNING: taken {b} times in the {phase} phase although off")
            if a == 0:
                problems.append(f"not taken at all in the {phase} phase with every path on")
            elif a < 0.02 * tasks and name != "pickup_spin":
                problems.append(f"taken by only {a} of {tasks} tasks in the {phase} phase")
        findings.append(
            f"{name} ({' + '.join(keys)}): "
            + "; ".join(parts)
            + (": " + "; ".join(problems) if problems else "")
        )
    return findings


def machine_lines() -> list[str]:
    from bench.compare import machine_info

    info = machine_info()
    try:
        lscpu = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        model = fields.get("Model name", "").strip()
        if model:
            info["CPU"] = model
        cpus = fields.get("CPU(s)", "").strip()
        per_socket = fields.get("Core(s) per socket", "").strip()
        sockets = fields.get("Socket(s)", "").strip()
        threads = fields.get("Thread(s) per core", "").strip()
        if cpus:
            usable = len(os.sched_getaffinity(0))
            shape = (
                f"{sockets} socket(s) of {per_socket} cores, {threads} thread(s) per core"
                if per_socket and sockets and threads
                else ""
            )
            info["cores"] = (
                f"{cpus} CPUs{' (' + shape + ')' if shape else ''}, {usable} usable by this process"
            )
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return [f"{k}: {v}" for k, v in info.items()]


def write_rst(
    path: str,
    command: str,
    table: str,
    machine: list[str],
    notes: list[str],
    probes: list[str],
    reps: int,
    workers: int,
) -> None:
    title = "Client fast paths, each A/B with all the others on"
    out = [
        title,
        "=" * len(title),
        "",
        "Written by ``bench/fastpaths.py``::",
        "",
        "    " + command,
        "",
        (
            f"{reps} repetitions per path, each an on cell and an off cell in alternating order "
            "(on/off, then off/on, ...), every cell in a fresh interpreter with a "
            f"``ScalerExecutor(max_workers={workers})`` (embedded cluster).  *gain*: the mean over "
            "the repetitions of the paired difference, off - on for the round trip and on - off for "
            "throughput (positive: the path gains), with its 95 % confidence interval from the t "
            "distribution; *relative*: the same for each pair's gain divided by its off figure.  "
            "The verdict uses the round trip's median and the submit + wait throughput."
        ),
        "",
        table,
        "",
    ]
    if notes:
        out += ["Notes:", ""] + [f"* {n}" for n in notes] + [""]
    if probes:
        out += (
            ["What each switch changed (probe cells, counts per phase)::", ""]
            + [f"    {p}" for p in probes]
            + [""]
        )
    out += ["Machine:", ""] + [f"* {m}" for m in machine] + [""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


# =========================================================================== parent


def parent_main(args: argparse.Namespace) -> int:
    paths = [p.strip() for p in args.paths.split(",") if p.strip()] if args.paths else list(PATHS)
    for p in paths:
        if p not in PATHS:
            sys.exit(f"unknown path {p!r}; known: {', '.join(PATHS)}")
    if args.reps < 1:
        sys.exit("--reps must be >= 1")
    if not become_subreaper():
        print(
            "note: cannot become the child subreaper: a cell's orphans are found by their environment only",
            file=sys.stderr,
        )
    from bench.compare import byte_compile_scaler

    compiled = byte_compile_scaler()
    machine = machine_lines()  # before the cells: the commit of the code they run
    run_started = time.monotonic()

    def status(r: dict[str, Any]) -> str:
        if "error" in r:
            return "error: " + str(r["error"])
        text = f"{r['elapsed']:.1f} s"
        if "rt_median_us" in r:
            text += f", rt {r['rt_median_us']:.0f} µs, burst {r['burst_tasks_per_s']:,.0f}/s"
        if r.get("foreign_cores", 0) >= BUSY_WARNING:
            text += f" (machine busy: other processes used {r['foreign_cores']:.2f} cores)"
        if r.get("steal_cores", 0) >= BUSY_WARNING:
            text += f" (steal {r['steal_cores']:.2f} cores)"
        if r.get("killed_leftovers"):
            text += f" ({r['killed_leftovers']} leftover processes killed)"
        return text

    probes: dict[str, dict[str, dict[str, Any]]] = {}
    if not args.no_probe:
        for name in paths:
            probes[name] = {}
            for variant in ("on", "off"):
                print(f"[probe] {name} {variant} ...", end="", file=sys.stderr, flush=True)
                r = spawn_cell(name, variant, True, args.workers, args.timeout)
                probes[name][variant] = r
                print(" " + status(r), file=sys.stderr, flush=True)
        for line in probe_lines(probes):
            print("probe: " + line, file=sys.stderr)
        if args.probe_only:
            for f in probe_findings(probes):
                print("finding: " + f)
            return 0

    results: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    raw: list[dict[str, Any]] = []
    total = len(paths) * args.reps * 2
    done = 0
    cell_seconds: list[float] = []
    for name in paths:
        results[name] = []
        for rep in range(args.reps):
            order = ("on", "off") if rep % 2 == 0 else ("off", "on")
            pair: dict[str, dict[str, Any]] = {}
            for variant in order:
                done += 1
                eta = ""
                if cell_seconds:
                    eta = f" (about {statistics.fmean(cell_seconds) * (total - done + 1) / 60:.0f} min left)"
                print(
                    f"[{done}/{total}] {name} rep {rep + 1} {variant}{eta} ...",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                r = spawn_cell(name, variant, False, args.workers, args.timeout)
                r["rep"] = rep
                cell_seconds.append(r["elapsed"])
                pair[variant] = r
                raw.append(r)
                print(" " + status(r), file=sys.stderr, flush=True)
            results[name].append((pair["on"], pair["off"]))
    elapsed = time.monotonic() - run_started

    header, rows, verdicts = build_table(results)
    notes = [
        compiled,
        (
            f"{len(raw)} timed cells in {elapsed / 60:.1f} min, "
            f"{statistics.fmean(cell_seconds):.1f} s per cell (interpreter start to every process gone)."
        ),
    ]
    notes += [f"``{p}`` off: {PATHS[p].switch} (read {PATHS[p].read})." for p in paths]
    if "reply_inbox" in paths:
        notes.append(
            "``reply_inbox`` off also takes lanes and pick-up away (both need the reply socket), "
            "and makes pick-up spin moot: its gain is theirs too."
        )
    busy = [
        r
        for r in raw
        if r.get("foreign_cores", 0) >= BUSY_WARNING or r.get("steal_cores", 0) >= BUSY_WARNING
    ]
    if busy:
        notes.append(
            f"WARNING: in {len(busy)} of {len(raw)} cells other processes or the hypervisor took "
            f"{BUSY_WARNING} cores or more: "
            + ", ".join(f"{r['path']} rep {r['rep'] + 1} {r['variant']}" for r in busy[:12])
            + (" ..." if len(busy) > 12 else "")
        )
    errors = [r for r in raw if "error" in r]
    for r in errors:
        notes.append(
            f"ERROR in {r['path']} rep {r['rep'] + 1} {r['variant']}: {r['error']}"
            + (f" (last stderr line: {r['stderr'].splitlines()[-1]})" if r.get("stderr") else "")
        )
    findings = probe_findings(probes)
    notes += [f"probe: {f}" for f in findings]

    print()
    print(f"{args.reps} reps per path, {args.workers} workers; positive gain: the path helps")
    print(render_text(header, rows))
    print()
    for n in notes:
        print("* " + n)
    if probes:
        print("what each switch changed (probe cells):")
        for line in probe_lines(probes):
            print("  " + line)
    print("machine: " + "; ".join(machine))
    if args.output:
        command = "PYTHONPATH=. python bench/fastpaths.py " + " ".join(sys.argv[1:])
        write_rst(
            args.output,
            command,
            render_rst(header, rows),
            machine,
            notes,
            probe_lines(probes),
            args.reps,
            args.workers,
        )
        print(f"wrote {args.output}")
    if args.save_json:
        with open(args.save_json, "w") as out:
            json.dump(
                {"machine": machine, "cells": raw, "probes": probes, "verdicts": verdicts},
                out,
                indent=2,
            )
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=10, help="on/off pairs per path (default 10)")
    p.add_argument(
        "--paths", metavar="PATH[,...]", help=f"paths to measure (default all: {', '.join(PATHS)})"
    )
    p.add_argument(
        "--output", metavar="FILE.rst", help="also write the table as a reStructuredText page"
    )
    p.add_argument("--save-json", metavar="FILE", help="also write every cell's raw result")
    p.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help=f"max_workers of each executor (default {WORKERS})",
    )
    p.add_argument(
        "--timeout", type=float, default=CELL_TIMEOUT, help="seconds per cell (default %(default)s)"
    )
    p.add_argument(
        "--base",
        choices=("all", "no-inbox"),
        default="all",
        help="what both variants share: every path on (default), or no reply inbox "
        "(as a client of a daemon on another host: no lanes, no pick-up)",
    )
    p.add_argument("--no-probe", action="store_true", help="skip the probe cells")
    p.add_argument(
        "--probe-only",
        action="store_true",
        help="only the probe cells: which route each switch changes",
    )
    p.add_argument(
        "--list", action="store_true", help="list the paths and their switches, then exit"
    )
    p.add_argument(
        "--cell", nargs=2, metavar=("PATH", "on|off"), help="(internal) run one cell, print JSON"
    )
    p.add_argument(
        "--probe", action="store_true", help="with --cell: count routes and threads (smaller sizes)"
    )
    args = p.parse_args(argv)
    if args.list:
        for path in PATHS.values():
            print(f"{path.name:14} {path.summary}\n{'':14} off: {path.switch} (read {path.read})")
        return 0
    if args.cell:
        return child_main(args)
    os.environ[BASE_ENV] = args.base
    if args.probe_only and args.no_probe:
        p.error("--probe-only and --no-probe contradict each other")
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
