"""What CURVE costs: no-op throughput and round trip on loopback tcp://, CURVE on and off.

    PYTHONPATH=. python bench/security.py                  # 3 alternating rounds
    PYTHONPATH=. python bench/security.py --rounds 5 --tasks 20000 --trips 2000

Each round starts a fresh ``scaler-daemon --workers 1 --processors-per-worker P`` on a free
loopback port, once with ``--security`` (its local worker gets an ephemeral key) and once
with ``--insecure``, alternating which goes first, and measures from one client:

* throughput: ``list(ex.map(noop, range(N), chunksize=1))``, tasks per second;
* round trip: ``ex.submit(noop, i).result()`` one at a time, the median and p99 in µs.

Figures vary with whatever else the machine runs: repeat, alternate, report the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from scaler_executor import ClusterConfig, ScalerExecutor
from scaler_executor.security.keys import SecurityDir

CLIENT = ClusterConfig(daemon_loss_timeout=30.0)


def noop(x: int) -> int:
    return x


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(secure: bool, keys: SecurityDir, cred: str, tasks: int, trips: int, processors: int) -> dict[str, float]:
    address = f"tcp://127.0.0.1:{free_port()}"
    flags = ["--security", keys.path] if secure else ["--insecure"]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address, "--workers", "1",
         "--processors-per-worker", str(processors), *flags],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        config = CLIENT.replace(credentials=cred) if secure else CLIENT.replace(insecure=True)
        import logging

        logging.getLogger("scaler_executor.security").setLevel(logging.ERROR)  # the insecure warning
        with ScalerExecutor(address=address, config=config) as ex:
            ex.submit(noop, 0).result(timeout=60)  # the worker is up
            list(ex.map(noop, range(1000)))  # warm
            start = time.perf_counter()
            list(ex.map(noop, range(tasks)))
            throughput = tasks / (time.perf_counter() - start)
            rtts = []
            for i in range(trips):
                t = time.perf_counter()
                ex.submit(noop, i).result()
                rtts.append(time.perf_counter() - t)
        rtts.sort()
        return {
            "throughput": throughput,
            "rtt_median_us": 1e6 * statistics.median(rtts),
            "rtt_p99_us": 1e6 * rtts[int(0.99 * (len(rtts) - 1))],
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--trips", type=int, default=1_000)
    parser.add_argument("--processors", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scaler-bench-keys-") as tmp:
        keys = SecurityDir.init(os.path.join(tmp, "keys"))
        cred = os.path.join(tmp, "bench.cred")
        keys.issue("bench", "client", cred)
        results: dict[str, list[dict[str, float]]] = {"curve": [], "insecure": []}
        for r in range(args.rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            for secure in order:
                got = run(secure, keys, cred, args.tasks, args.trips, args.processors)
                results["curve" if secure else "insecure"].append(got)
                print(f"round {r + 1} {'curve   ' if secure else 'insecure'} "
                      f"{got['throughput']:8.0f} tasks/s  rtt median {got['rtt_median_us']:6.0f} us  "
                      f"p99 {got['rtt_p99_us']:6.0f} us", file=sys.stderr, flush=True)  # fmt: skip
    summary = {}
    for name, rows in results.items():
        summary[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    cost = 1 - summary["curve"]["throughput"] / summary["insecure"]["throughput"]
    if args.json:
        print(json.dumps({"rounds": results, "median": summary, "throughput_cost": cost}))
    else:
        for name, row in summary.items():
            print(f"{name:9} median of {args.rounds}: {row['throughput']:8.0f} tasks/s, "
                  f"round trip median {row['rtt_median_us']:.0f} us (p99 {row['rtt_p99_us']:.0f} us)")  # fmt: skip
        print(f"CURVE costs {100 * cost:.1f}% of no-op throughput (goal: <= 20%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
