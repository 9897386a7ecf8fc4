"""Fixtures shared by the unit tests (helpers that are not fixtures are in the
``*_testing.py`` modules: a test module never imports from a conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scaler_executor.config import ClusterConfig
from scaler_executor.scheduler.objects import HostStore


@pytest.fixture
def host_store() -> Iterator[HostStore]:
    """The daemon's object store on this host (16 MiB), closed after the test."""
    store = HostStore(ClusterConfig(object_store_size="16M"))
    assert store.store is not None
    yield store
    store.close()
