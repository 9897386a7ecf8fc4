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


def _cpu(daemon_pid: int) -> tuple[float, float, float]:
    """CPU seconds so far of the daemon, of its workers (with their processors), of this client."""
    import psutil

    daemon = psutil.Process(daemon_pid)
    times = daemon.cpu_times()
    workers = 0.0
    for child in daemon.children(recursive=True):
        try:
            t = child.cpu_times()
            workers += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    client = os.times()
    return times.user + times.system, workers, client.user + client.system


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
            cpu_before = _cpu(daemon.pid)
            start = time.perf_counter()
            list(ex.map(noop, range(tasks)))
            throughput = tasks / (time.perf_counter() - start)
            cpu_after = _cpu(daemon.pid)
            rtts = []
            for i in range(trips):
                t = time.perf_counter()
                ex.submit(noop, i).result()
                rtts.append(time.perf_counter() - t)
        rtts.sort()
        return {
            "throughput": throughput,
            # CPU per task, which a busy machine disturbs far less than wall-clock rates
            "daemon_cpu_us": 1e6 * (cpu_after[0] - cpu_before[0]) / tasks,
            "worker_cpu_us": 1e6 * (cpu_after[1] - cpu_before[1]) / tasks,
            "client_cpu_us": 1e6 * (cpu_after[2] - cpu_before[2]) / tasks,
            "rtt_median_us": 1e6 * statistics.median(rtts),
            "rtt_p99_us": 1e6 * rtts[int(0.99 * (len(rtts) - 1))],
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def channel_cost(messages: int, size: int) -> dict[str, float]:
    """CPU per message of this project's channel, CURVE on and off: a DEALER sends ``messages``
    transmissions of ``size`` bytes to a ROUTER in the same process, both ends' I/O threads
    included (process CPU time, which a busy machine disturbs less than wall-clock time)."""
    import zmq

    from scaler_executor.protocol import channel
    from scaler_executor.security.client import ClientSecurity
    from scaler_executor.security.server import ServerSecurity

    out = {}
    with tempfile.TemporaryDirectory(prefix="scaler-bench-keys-") as tmp:
        keys = SecurityDir.init(os.path.join(tmp, "keys"))
        cred_path = os.path.join(tmp, "c.cred")
        keys.issue("c", "client", cred_path)
        from scaler_executor.security.keys import load_credential

        for secure in (False, True, False, True):
            server = ServerSecurity(keys) if secure else None
            router = channel.bind("tcp://127.0.0.1:*", hwm=10**6, security=server)
            endpoint = router.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            client = ClientSecurity(load_credential(cred_path), endpoint) if secure else None
            dealer = channel.connect(endpoint, hwm=10**6, linger=0, security=client)
            poller = channel.Poller()
            poller.register(router.pollable)
            if server is not None:
                for target in server.pollables():
                    poller.register(target)
            payload = os.urandom(size)
            got = 0
            cpu = wall = 0.0
            for phase in ("warm", "measure"):
                n = 1000 if phase == "warm" else messages
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(n):
                    dealer.send([b"\x01", payload])
                seen = 0
                while seen < n:
                    ready = poller.poll(1000)
                    if server is not None:
                        server.on_ready(ready)
                    while router.readable():
                        if secure:
                            router.recv_authenticated()
                        else:
                            router.recv()
                        seen += 1
                got += seen
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            dealer.close()
            if server is not None:
                server.close()
            router.close()
            name = "curve" if secure else "insecure"
            out[f"{name}_cpu_us"] = min(out.get(f"{name}_cpu_us", 1e9), 1e6 * cpu / messages)
            out[f"{name}_rate"] = max(out.get(f"{name}_rate", 0.0), messages / wall)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--trips", type=int, default=1_000)
    parser.add_argument("--processors", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--channel", type=int, metavar="BYTES", help="only the channel's CPU per message of BYTES, CURVE on and off")
    args = parser.parse_args()
    if args.channel is not None:
        cost = channel_cost(200_000, args.channel)
        print(f"channel, {args.channel}-byte messages, best of 2: insecure {cost['insecure_cpu_us']:.2f} us CPU/message "
              f"({cost['insecure_rate']:.0f}/s), curve {cost['curve_cpu_us']:.2f} us CPU/message "
              f"({cost['curve_rate']:.0f}/s)")  # fmt: skip
        return 0
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
                      f"p99 {got['rtt_p99_us']:6.0f} us  CPU/task daemon {got['daemon_cpu_us']:5.1f} "
                      f"worker {got['worker_cpu_us']:5.1f} client {got['client_cpu_us']:5.1f} us",
                      file=sys.stderr, flush=True)  # fmt: skip
    summary = {}
    for name, rows in results.items():
        summary[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    cost = 1 - summary["curve"]["throughput"] / summary["insecure"]["throughput"]
    if args.json:
        print(json.dumps({"rounds": results, "median": summary, "throughput_cost": cost}))
    else:
        for name, row in summary.items():
            print(f"{name:9} median of {args.rounds}: {row['throughput']:8.0f} tasks/s, "
                  f"round trip median {row['rtt_median_us']:.0f} us (p99 {row['rtt_p99_us']:.0f} us), "
                  f"CPU per task: daemon {row['daemon_cpu_us']:.1f} us, worker {row['worker_cpu_us']:.1f} us, "
                  f"client {row['client_cpu_us']:.1f} us")  # fmt: skip
        print(f"CURVE costs {100 * cost:.1f}% of no-op throughput (goal: <= 20%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
