"""Large NumPy arrays allocated in the object store, so that results travel without a copy.

A worker's processors install this (``arrays_in_store`` in the config): from then on the
data of every NumPy array of at least that many bytes that a task creates with
``np.empty``, ``np.full``, ``np.ones``, arithmetic, ``copy()``... lives in a block of the
host's object store instead of private memory (NumPy's NEP 49 memory handler, written in
C in ``native/os_numpy.c``). When a task returns such an array, :func:`.payload.pack`
seals that block as the result's object (:meth:`.ObjectStore.seal_at`) instead of
copying the bytes, so the caller maps the very pages the task wrote. A 50 MB result then
costs no memcpy at all, where private memory costs one copy into the store plus the page
faults of pages the processor had not mapped yet.

What users see:

* An array the task returned and that the store took over becomes read-only in the
  processor after the task (``flags.writeable`` is cleared on the array that owns the
  memory): the caller is reading those bytes. Views taken before the return keep their
  own flag; writing through one after the task is a bug this cannot catch.
* Temporaries go back to the store's free list when freed, most recently freed reused
  first: a task that allocates large arrays over and over writes into pages it has
  mapped already, where private memory of that size is a fresh mmap each time.
* ``np.zeros`` (calloc, whose private pages cost nothing until touched), arrays under
  the threshold, and every allocation while the store has more than half its capacity
  in use go to NumPy's own allocator as before. So do arrays made in threads other than
  the one running the task (NumPy keeps the handler in a context variable).
* The handler is installed the first time a task starts with NumPy already imported: a
  processor's very first NumPy task allocates privately.
* Store pages are 4 KiB (where /dev/shm has no huge pages), while NumPy asks for
  transparent huge pages for large private arrays: allocation-heavy code gains (no page
  faults on reused blocks), repeated passes over one long-lived huge array lose some
  speed to TLB misses (README: figures).

Needs NumPy >= 1.22 (the handler API); :func:`install` returns None for anything older.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from scaler_executor.objstore.store import ObjectStore

try:
    from scaler_executor.objstore._objstore import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError("the C object store is not built: run `python native/build_objstore.py`") from exc

__all__ = ["HANDLER_NAME", "Installed", "install", "uninstall"]

#: The handler's name, as ``numpy.core.multiarray.get_handler_name(arr)`` reports it.
HANDLER_NAME = "scaler_executor_objstore"

# NumPy's C-API table (numpy/__multiarray_api.h): PyDataMem_SetHandler and a pointer to
# the PyDataMem_DefaultHandler capsule. Stable since NumPy 1.22, when they were added.
_SET_HANDLER = 304
_DEFAULT_HANDLER = 306

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass
class Installed:
    """A handler installed by :func:`install`."""

    store: ObjectStore
    handler: Any  # the C handler (void *)
    capsule: object  # what NumPy holds
    previous: object  # the handler it replaced, for uninstall
    pin: int | None  # keeps the store's mapping while arrays may point into it

    def _after_fork_in_child(self) -> None:
        # A child forked by a task (a fork-based multiprocessing pool) inherits these
        # arrays: its mapping becomes copy-on-write, so that its writes stay its own, as
        # with private memory.
        handle = self.store._region.handle
        if self.pin is not None and handle is not None:
            lib.objstore_privatize(handle)

    def stats(self) -> dict[str, int]:
        """Counters: ``store`` arrays given a store block, ``declined`` large requests sent
        to NumPy's allocator, ``released`` store arrays freed, ``lost`` releases that failed."""
        out = ffi.new("uint64_t[4]")
        lib.objstore_np_stats(self.handler, out)
        return {"store": out[0], "declined": out[1], "released": out[2], "lost": out[3]}


def _api(numpy: Any) -> Any:
    core = getattr(numpy, "_core", None) or numpy.core  # NumPy 2 renamed numpy.core
    table = _capsule_pointer(core._multiarray_umath._ARRAY_API, None)
    return ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))


def supported(numpy: Any) -> bool:
    """True if this NumPy has the memory-handler API (>= 1.22)."""
    match = re.match(r"(\d+)\.(\d+)", getattr(numpy, "__version__", ""))
    return match is not None and (int(match[1]), int(match[2])) >= (1, 22)


def install(store: ObjectStore, threshold: int, limit: int | None = None) -> Installed | None:
    """Make arrays of at least ``threshold`` bytes (> 0) live in ``store``, in this thread's
    context, while the store has fewer than ``limit`` bytes in use (default: half its
    capacity). Returns what :func:`uninstall` takes, or None when NumPy is not imported
    or too old. The store's mapping is kept for the rest of the process (arrays from it
    may live that long), even if the store is closed."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not supported(numpy):
        return None
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0 bytes, got {threshold}")
    if limit is None:
        limit = store.stats().capacity // 2
    api = _api(numpy)
    default_capsule = ctypes.cast(api[_DEFAULT_HANDLER], ctypes.POINTER(ctypes.py_object))[0]
    default = _capsule_pointer(default_capsule, b"mem_handler")
    out = ffi.new("void **")
    store._check(
        store._call(lib.objstore_np_handler, threshold, limit, ffi.cast("void *", default), out),
        "install the NumPy handler",
    )
    name = int(ffi.cast("uintptr_t", lib.objstore_np_capsule_name()))  # static: outlives the capsule
    capsule = _capsule_new(int(ffi.cast("uintptr_t", out[0])), name, None)
    set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(api[_SET_HANDLER])
    installed = Installed(store, out[0], capsule, None, store._region.pin())
    os.register_at_fork(after_in_child=installed._after_fork_in_child)
    installed.previous = set_handler(capsule)
    return installed


def uninstall(installed: Installed) -> None:
    """Put back the handler :func:`install` replaced (in this thread's context); it takes
    no more store blocks in any context. Arrays it made stay valid and are freed through
    it; the store's mapping is let go once none of them is left in the store."""
    numpy = sys.modules["numpy"]
    set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(_api(numpy)[_SET_HANDLER])
    set_handler(installed.previous)
    lib.objstore_np_disable(installed.handler)
    counts = installed.stats()
    if counts["store"] == counts["released"] + counts["lost"] and installed.pin is not None:
        installed.store._region.unpin(installed.pin)
        installed.pin = None
