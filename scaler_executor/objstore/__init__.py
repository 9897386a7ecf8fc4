"""The host's shared-memory object store (a C library in ``native/``, used through cffi).

>>> with ObjectStore.create("scaler-demo", 64 << 20) as store:   # doctest: +SKIP
...     store.put(object_id, payload)                           # create + write + seal
...     view = store.get(object_id)                             # zero-copy, read-only
...     view.release()                                          # or let it go
...     store.delete(object_id)

Other local processes use ``ObjectStore.attach(name)``. See :mod:`.store` for how views
hold references and how long the mapping lives, :mod:`.errors` for the exceptions, and
:mod:`.payload` for pickled values whose large buffers travel through the store.
"""

from __future__ import annotations

from scaler_executor.objstore.errors import (
    NoProcessSlot,
    ObjectAlreadySealed,
    ObjectExists,
    ObjectNotFound,
    ObjectNotHeld,
    ObjectNotSealed,
    ObjectStoreError,
    ObjectStoreFull,
    ObjectTableFull,
    RegionExists,
    RegionInvalid,
    RegionNoSpace,
    RegionNotFound,
    StoreCorrupt,
    StoreForked,
    StoreLockTimeout,
    StoreSystemError,
)
from scaler_executor.objstore.store import CRASH_POINTS, ObjectState, ObjectStore, ObjectStoreStats

__all__ = [
    "CRASH_POINTS",
    "NoProcessSlot",
    "ObjectAlreadySealed",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectNotHeld",
    "ObjectNotSealed",
    "ObjectState",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreFull",
    "ObjectStoreStats",
    "ObjectTableFull",
    "RegionExists",
    "RegionInvalid",
    "RegionNoSpace",
    "RegionNotFound",
    "StoreCorrupt",
    "StoreForked",
    "StoreLockTimeout",
    "StoreSystemError",
]
