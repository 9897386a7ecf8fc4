"""What watching costs the daemon: no-op throughput and daemon CPU per task with 0, 1 and 3
scripted dashboard pages and with a Prometheus scrape every second.

    python bench/dashboard_cost.py [--tasks 20000] [--rounds 3]

One ``scaler-daemon --workers 2 --dashboard 127.0.0.1:0`` serves every configuration; a
configuration's pollers run in a separate process (so they take no GIL from the client) and
poll exactly what the page polls: ``/api/snapshot`` once a second and ``/api/history`` every
5 s per page (``/metrics`` once a second for the scrape). Configurations alternate within
each round; the figures are the median over rounds, and each round's against the same
round's "none" (paired: a shared machine's slow drift cancels). The daemon's and the
dashboard process's CPU come from psutil. On a shared machine the noise between rounds is
printed beside the medians: read it first. Give each run several seconds (``--tasks``) so
that it spans several of the pages' 5 s history polls.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil

from scaler_executor import ScalerExecutor

CONFIGS = (("none", 0, 0), ("1 page", 1, 0), ("3 pages", 3, 0), ("scrape/s", 0, 1))


def noop(x: int) -> int:
    return x


def poll(base: str, token: str, pages: int, scrapes: int) -> None:
    """Run until stdin closes: per page, a poller of /api/snapshot (1/s) and one of /api/history
    (every 5 s, as dashboard.js's HISTORY_MS); ``scrapes`` pollers of /metrics, 1/s each."""
    stop = threading.Event()

    def loop(path: str, every: float) -> None:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        while not stop.is_set():
            with urllib.request.urlopen(request, timeout=30) as reply:
                reply.read()
            stop.wait(every)

    threads = [threading.Thread(target=loop, args=("/api/snapshot", 1.0)) for _ in range(pages)]
    threads += [threading.Thread(target=loop, args=("/api/history", 5.0)) for _ in range(pages)]
    threads += [threading.Thread(target=loop, args=("/metrics", 1.0)) for _ in range(scrapes)]
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    # The pollers' process: base URL, pages, scrapes; the token in the environment (it may begin with "-").
    parser.add_argument("--poll", nargs=3, metavar=("BASE", "PAGES", "SCRAPES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        base, pages, scrapes = args.poll
        poll(base, os.environ["DASHBOARD_TOKEN"], int(pages), int(scrapes))
        return 0
    tmp = tempfile.mkdtemp(prefix="dashboard-cost-")
    address = f"ipc://{tmp}/daemon.sock"
    log = open(f"{tmp}/daemon.log", "w+b")  # noqa: SIM115  (closed in finally)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address, "--workers", "2",
         "--dashboard", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            log.seek(0)
            found = re.findall(rb"dashboard at (http://\S+)", log.read())
            url = found[0].decode() if found else None
            time.sleep(0.1)
        assert url is not None, "no dashboard URL"
        base, _, token = url.partition("/?token=")
        env = {**os.environ, "DASHBOARD_TOKEN": token}
        proc = psutil.Process(daemon.pid)
        (dash,) = [p for p in proc.children() if "monitor.dashboard" in " ".join(p.cmdline())]
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in CONFIGS}
        with ScalerExecutor(address=address) as ex:
            list(ex.map(noop, range(2000)))  # warm
            for rnd in range(args.rounds):
                for name, pages, scrapes in CONFIGS:
                    pollers = subprocess.Popen(
                        [sys.executable, __file__, "--poll", base, str(pages), str(scrapes)], stdin=subprocess.PIPE, env=env
                    )
                    time.sleep(1.5)  # let the pollers start before the clock does
                    cpu0, dcpu0 = sum(proc.cpu_times()[:2]), sum(dash.cpu_times()[:2])
                    t0 = time.perf_counter()
                    list(ex.map(noop, range(args.tasks), chunksize=1))
                    elapsed = time.perf_counter() - t0
                    cpu, dcpu = sum(proc.cpu_times()[:2]) - cpu0, sum(dash.cpu_times()[:2]) - dcpu0
                    assert pollers.stdin is not None
                    pollers.stdin.close()
                    assert pollers.wait(30) == 0, "a poller failed"
                    results[name].append((args.tasks / elapsed, cpu / args.tasks * 1e6, dcpu))
                    print(f"round {rnd + 1} {name:9s} {args.tasks / elapsed:8.0f} tasks/s  daemon {cpu / args.tasks * 1e6:6.1f} us CPU/task  dashboard {dcpu:5.2f} s CPU", flush=True)
            # idle: the daemon's CPU over 10 s with one page open, against 10 s with none
            for name, pages in (("idle, none", 0), ("idle, 1 page", 1)):
                pollers = subprocess.Popen([sys.executable, __file__, "--poll", base, str(pages), "0"], stdin=subprocess.PIPE, env=env)
                time.sleep(1.5)
                cpu0 = sum(proc.cpu_times()[:2])
                time.sleep(10)
                idle = (sum(proc.cpu_times()[:2]) - cpu0) / 10 * 100
                assert pollers.stdin is not None
                pollers.stdin.close()
                pollers.wait(30)
                print(f"{name:13s} daemon CPU {idle:.2f} % of a core", flush=True)
        base_tp = statistics.median(r[0] for r in results["none"])
        print("\nmedian over rounds (spread = max-min of the rounds):")
        for name, _, _ in CONFIGS:
            tps = [r[0] for r in results[name]]
            cpus = [r[1] for r in results[name]]
            print(f"  {name:9s} {statistics.median(tps):8.0f} tasks/s (spread {max(tps) - min(tps):6.0f}, "
                  f"{(statistics.median(tps) / base_tp - 1) * 100:+5.1f} % vs none)  daemon {statistics.median(cpus):6.1f} us CPU/task")  # fmt: skip
        # Paired: each round's throughput against the same round's "none" (run seconds apart, so
        # a machine's slow drift cancels); their median, and their range as the noise.
        print("\npaired with the same round's none (median, min..max of the rounds' ratios):")
        for name, _, _ in CONFIGS[1:]:
            ratios = [(r[0] / n[0] - 1) * 100 for r, n in zip(results[name], results["none"], strict=True)]
            print(f"  {name:9s} {statistics.median(ratios):+5.1f} %  ({min(ratios):+5.1f} .. {max(ratios):+5.1f})")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
