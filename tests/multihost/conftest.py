"""Fixtures of the multi-host tests: hosts on separate network stacks (``multihost_net``)
and a cluster on them: a daemon, two workers and a client, each on its own host.

Security: tcp:// without keys needs ``allow_tcp_unauthenticated`` for now; ``Cluster``
passes ``SECURITY_FLAGS`` to every command and ``CLIENT_SECURITY`` to the client, the one
place to put credentials once the daemon has them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import multihost_net as net
import pytest

from scaler_testing import requires_system

SECURITY_FLAGS: list[str] = ["--allow-tcp-unauthenticated"]
CLIENT_SECURITY: dict[str, Any] = {"allow_tcp_unauthenticated": True}

# Liveness on the multi-host tests' clusters: a peer silent for LIVENESS_LIMIT seconds is lost.
HEARTBEAT = 0.2
LIVENESS = 25  # 5 s: a loaded 2-core machine's starved process stays well inside it
LIVENESS_LIMIT = HEARTBEAT * LIVENESS
COMMON = ["--heartbeat-interval", str(HEARTBEAT), "--heartbeat-liveness", str(LIVENESS), "--log-level", "info"]


@pytest.fixture(scope="session")
def netns_ready() -> None:
    """Skip (a failure under CI=true) where namespaces cannot be made; sweep an earlier run's."""
    requires_system(net.probe())
    net.sweep()


class Cluster:
    """A daemon on ``daemon``, workers on ``w1`` and ``w2``, a driven client on ``client``."""

    def __init__(self, hosts: net.Hosts, daemon_flags: list[str], worker_flags: list[str]) -> None:
        self.hosts = hosts
        self.address = hosts.daemon_address()
        self.daemon_flags = daemon_flags
        self.worker_flags = worker_flags
        self.daemon: net.Party | None = None
        self.workers: dict[str, net.Party] = {}
        self.clients: list[net.Driver] = []

    def start_daemon(self) -> net.Party:
        argv = [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address,
                "--workers", "0", "--object-store-size", "768M", *COMMON, *SECURITY_FLAGS, *self.daemon_flags]
        self.daemon = self.hosts.spawn("daemon", argv)
        return self.daemon

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        self.daemon.stop(signal.SIGKILL)

    def start_worker(self, role: str) -> net.Party:
        argv = [sys.executable, "-m", "scaler_executor.cli.worker", self.address, "--name", role,
                "--processors", "2", *COMMON, *SECURITY_FLAGS, *self.worker_flags]
        self.workers[role] = party = self.hosts.spawn(role, argv)
        return party

    def client(self, **config: Any) -> net.Driver:
        here = os.path.dirname(os.path.abspath(__file__))
        party = self.hosts.spawn("client", [sys.executable, os.path.join(here, "multihost_client.py")], stdin=True)
        assert party.popen.stdout is not None
        driver = net.Driver(party, party.popen.stdout)
        settings = {"heartbeat_interval": HEARTBEAT, "heartbeat_liveness": LIVENESS, **CLIENT_SECURITY, **config}
        driver.call("open", address=self.address, config=settings)
        self.clients.append(driver)
        return driver

    def logs(self) -> str:
        return "\n".join(f"--- {p.host} ({p.pid}) ---\n{p.log()[-3000:]}" for p in self.hosts.parties)


@pytest.fixture
def hosts(netns_ready: None) -> Iterator[net.Hosts]:
    with net.Hosts() as made:
        yield made


@pytest.fixture
def make_cluster(hosts: net.Hosts, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(daemon_flags: list[str] = (), worker_flags: list[str] = (), workers: tuple[str, ...] = ("w1", "w2")) -> Cluster:
        cluster = Cluster(hosts, list(daemon_flags), list(worker_flags))
        made.append(cluster)
        cluster.start_daemon()
        for role in workers:
            cluster.start_worker(role)
        return cluster

    yield make
    failed = getattr(request.node, "rep_call", None)
    for cluster in made:
        for driver in cluster.clients:
            if driver.party.alive():
                try:
                    driver.call("close", answer_within=20)
                except AssertionError:
                    pass
        if failed is not None and failed.failed:
            sys.stderr.write(cluster.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]  # read by make_cluster's teardown
