"""Fixtures of the multi-host tests: hosts on separate network stacks (``multihost_net``)
and a cluster on them: a daemon, two workers and a client, each on its own host.

The cluster itself is ``multihost_net.Cluster`` (``bench/multihost.py`` uses it too).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import multihost_net as net
import pytest
from scaler_testing import requires_system


@pytest.fixture(scope="session")
def netns_ready() -> None:
    """Skip (a failure under CI=true) where namespaces cannot be made; sweep an earlier run's."""
    requires_system(net.probe())
    net.sweep()


@pytest.fixture
def hosts(netns_ready: None) -> Iterator[net.Hosts]:
    with net.Hosts() as made:
        yield made


@pytest.fixture
def make_cluster(hosts: net.Hosts, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[net.Cluster] = []

    def make(daemon_flags: list[str] = (), worker_flags: list[str] = (), workers: tuple[str, ...] = ("w1", "w2"),
             parties: dict[str, str] | None = None, revoked: tuple[str, ...] = (), secure: bool = True) -> net.Cluster:
        """A cluster, its daemon and ``workers`` started; ``parties`` (name: role) get credentials,
        ``revoked`` are revoked, before the daemon starts; ``secure=False``: no keys (``--insecure``)."""
        cluster = net.Cluster(hosts, list(daemon_flags), list(worker_flags), secure=secure, parties=parties)
        made.append(cluster)
        for name in revoked:
            assert cluster.security is not None, "revoked keys need secure=True"
            cluster.security.revoke(name)
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
