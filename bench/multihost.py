"""Figures across hosts on separate network stacks (network namespaces: tests/multihost).

    sudo PYTHONPATH=. python bench/multihost.py [--repeat 3] [--mtu 1500] [--rate 1gbit] [--json]

Starts the multi-host tests' cluster (a daemon, two workers of two processors each and a
client, each in its own network and mount namespace with a private /dev/shm) and reports:

* no-op throughput (``map`` over 5,000 tasks) and the round-trip median of 300 sequential
  ``submit(...).result()``, beside the embedded cluster's (``ScalerExecutor(max_workers=4)``
  in this process);
* a 100 MB object: ``ex.put`` from the client host (streamed to the daemon), read by a
  task on a worker host (fetched through the daemon), read back by the client
  (``ref.result()``), and a 100 MB task result back to the client (``fetch``: from the
  submit, so with the task making its 100 MB and pickling them; ``fetch_from_end``: from
  the task's end as ``task_info`` gives it, so the transfer and the unpickling alone);
  with raw TCP between the same namespaces and a ``memcpy`` of 100 MB for scale;
* the time from starting a daemon again (the old one killed, no journal) to both workers
  joined, as a new client sees it.

Each run measures the cluster twice, with CURVE (``--security``, a credential per party,
the default) and without (``--insecure``), a fresh cluster each, in alternating order, so
that a busy machine weighs on every figure alike; each is the median of ``--repeat`` runs.
Needs root (namespaces).

Every process runs on this machine's cores, so where the network is faster than they copy
(veth pairs move bytes at memcpy speed) the figures measure CPU, not the network: two
transfers that overlap share the same cores. ``--rate`` shapes every host's link, both
ways (``tc`` token buckets on each end of its veth pair), to measure where the network is
the bottleneck, as between real hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "multihost"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import multihost_net as net  # noqa: E402
import multihost_tasks as tasks  # noqa: E402

MB100 = 100_000_000

RAW_TCP = r"""
import socket, sys, time
host, role = sys.argv[1], sys.argv[2]
if role == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 9999)); s.listen(); print("listening", flush=True)
    c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t = None
    while True:
        k = c.recv_into(buf)
        if t is None: t = time.perf_counter()
        if not k: break
        n += k
    print(n / (time.perf_counter() - t), flush=True)
else:
    c = socket.create_connection((host, 9999)); c.sendall(bytes(MB100)); c.close()
""".replace("MB100", str(MB100))


def raw_tcp(hosts: net.Hosts) -> float:
    server = hosts.spawn("daemon", [sys.executable, "-c", RAW_TCP, hosts.addresses["daemon"], "server"])
    net.poll(lambda: "listening" in server.log(), 30, "the raw TCP server listening")
    client = hosts.spawn("client", [sys.executable, "-c", RAW_TCP, hosts.addresses["daemon"], "client"])
    client.popen.wait(60)
    server.popen.wait(60)
    rate = float(server.log().split()[-1])
    server.stop()
    client.stop()
    return rate


def shape(hosts: net.Hosts, rate: str) -> None:
    """Each host's link at ``rate`` each way: its uplink (its eth0) and its downlink (its
    port on the switch), as a host on a switched network of that speed has."""
    import subprocess

    bucket = ["tbf", "rate", rate, "burst", "1mb", "latency", "100ms"]
    for role in net.ROLES:
        for ns, dev in ((hosts.names[role], "eth0"), (hosts.switch, f"p-{role}")):
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *bucket], check=True)


def memcpy_rate() -> float:
    data = bytes(MB100)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        bytearray(data)
        best = max(best, MB100 / (time.perf_counter() - t))
    return best


def embedded(count: int, trips: int) -> dict[str, float]:
    from scaler_executor import ScalerExecutor

    with ScalerExecutor(max_workers=4) as ex:
        list(ex.map(tasks.noop, range(100)))
        t = time.perf_counter()
        list(ex.map(tasks.noop, range(count)))
        throughput = count / (time.perf_counter() - t)
        times = []
        for i in range(trips):
            t0 = time.perf_counter()
            ex.submit(tasks.noop, i).result()
            times.append(time.perf_counter() - t0)
    return {"throughput": throughput, "round_trip_median": statistics.median(times)}


def restart_to_serving(cluster: net.Cluster) -> float:
    cluster.kill_daemon()
    started = time.monotonic()
    cluster.start_daemon()
    client = cluster.client()
    net.poll(lambda: client.call("stats")["stats"]["workers"] >= 2, 60, "both workers joined again")
    seconds = time.monotonic() - started
    client.call("close")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--rate", default="", help="shape each host's link to this tc rate each way (e.g. 1gbit)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reason = net.probe()
    if reason is not None:
        raise SystemExit(f"bench/multihost.py: {reason}")
    net.sweep()
    runs: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    def measure(cluster: net.Cluster, mode: str) -> None:
        cluster.start_daemon()
        for role in ("w1", "w2"):
            cluster.start_worker(role)
        client = cluster.client()
        net.poll(lambda c=client: c.call("stats")["stats"]["workers"] >= 2, 60, f"two workers joined ({mode})")
        across = client.call("noop", answer_within=600, count=args.count, trips=args.trips)
        note(f"{mode}.throughput", across["throughput"])
        note(f"{mode}.round_trip_ms", across["round_trip_median"] * 1e3)
        objects = client.call("put_fetch", answer_within=600, size=MB100)
        assert objects["remote_ok"] and objects["get_ok"] and objects["back_ok"], objects
        for key in ("put", "read_remotely", "get", "fetch", "fetch_from_end"):
            if objects.get(key):
                note(f"{mode}.object.{key}_MBps", MB100 / objects[key] / 1e6)
        client.call("close")

    with net.Hosts(mtu=args.mtu) as hosts:
        if args.rate:
            shape(hosts, args.rate)
        for run in range(args.repeat):
            for mode in ("curve", "plain") if run % 2 == 0 else ("plain", "curve"):
                cluster = net.Cluster(hosts, [], [], secure=mode == "curve")
                try:
                    measure(cluster, mode)
                    if mode == "curve":
                        note("curve.restart_to_serving_s", restart_to_serving(cluster))
                finally:
                    cluster.stop()
            local = embedded(args.count, args.trips)
            note("embedded.throughput", local["throughput"])
            note("embedded.round_trip_ms", local["round_trip_median"] * 1e3)
            note("raw_tcp_MBps", raw_tcp(hosts) / 1e6)
            note("memcpy_MBps", memcpy_rate() / 1e6)
    medians = {key: statistics.median(values) for key, values in runs.items()}
    if args.json:
        print(json.dumps({"medians": medians, "runs": runs}, indent=2))
    else:
        load = os.getloadavg()[0]
        print(f"{args.repeat} runs, MTU {args.mtu}, rate {args.rate or 'unshaped'}, load average {load:.1f} on {os.cpu_count()} CPUs; medians:")
        for key, value in medians.items():
            print(f"  {key:28s} {value:12.2f}   runs: {', '.join(f'{v:.2f}' for v in runs[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
