"""Tasks and objects across hosts on separate network stacks (tests/multihost/conftest.py)."""

from __future__ import annotations

import multihost_net as net
import pytest

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def _workers_joined(client: net.Driver, count: int) -> bool:
    return client.call("stats")["stats"]["workers"] >= count


def test_tasks_cross_hosts_both_ways(make_cluster) -> None:
    cluster = make_cluster()
    client = cluster.client()
    net.poll(lambda: _workers_joined(client, 2), 60, f"two workers joined\n{cluster.logs()}")
    batch = client.call("submit", fn="where", args=[[i] for i in range(200)])["batch"]
    answer = client.call("wait", batch=batch, timeout=60)
    assert answer["errors"] == [None] * 200, answer["errors"][:3]
    assert [r[0] for r in answer["results"]] == list(range(200))
    hosts = {r[1] for r in answer["results"]}
    assert hosts == {cluster.hosts.names["w1"], cluster.hosts.names["w2"]}, hosts
