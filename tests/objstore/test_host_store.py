"""The daemon's host store: its object index is sized by the object-store threshold."""

from __future__ import annotations

import os

import pytest

from scaler_executor.config import ClusterConfig
from scaler_executor.scheduler.objects import HostStore, index_size

MiB = 1 << 20


def test_index_holds_one_entry_per_threshold_bytes_with_floors() -> None:
    config = ClusterConfig()
    assert config.object_store_threshold == 64 * 1024
    assert index_size(6 << 30, config) == (6 << 30) // (64 * 1024)
    # A lower threshold means smaller objects: more entries, down to one per 8 KiB.
    assert index_size(1 << 30, config.replace(object_store_threshold=16 * 1024)) == (1 << 30) // 16384
    assert index_size(1 << 30, config.replace(object_store_threshold=0)) == (1 << 30) // 8192
    assert index_size(1 * MiB, config) == 256  # tiny stores keep the store's own minimum


@pytest.mark.timeout(60)
def test_host_store_is_created_with_that_index() -> None:
    config = ClusterConfig().replace(object_store_size="256MiB", object_store_threshold=128 * 1024)
    host = HostStore(config)
    try:
        assert host.store is not None
        stats = host.store.stats()
        assert stats.max_objects == (256 * MiB) // (128 * 1024) == 2048
        assert stats.capacity >= 256 * MiB
    finally:
        path = host.store._path if host.store is not None else None
        host.close()
    assert path is not None and not os.path.exists(path)
