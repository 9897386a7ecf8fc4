"""Fault in a large read's destination a window ahead of the copy.

A reader that builds a large object as its bytes arrive (a processor's ``pickle.load`` of
a streamed argument, ``worker/handoff.py``; a client's of a fetched object or a large
result, ``protocol/chunks.py``) copies into a ``bytes`` that was just allocated, so each
4 KiB page of it faults on its first write: 25,000 faults for 100 MB, which cost the
processor more than the copy itself (``perf`` across the namespaces cluster). Faulting
each window in with one ``MADV_POPULATE_WRITE`` call (``objstore_populate_write``) before
the copy reaches it takes the traps away and leaves the rest (allocating and zeroing the
pages) as it was, overlapped with the transfer: a task reading 100 MB on another host went
from 1,077 to 1,238 MB/s (``docs/security.rst``, "Freed after the reply, faulted in
ahead"). Populating the whole destination at once, before the first byte, gained nothing
there: the copy waited for it.

Only reads of at least ``MIN_BYTES`` call it, and only they load the store's C extension
(the client imports this module at start without it); where the kernel has no
``MADV_POPULATE_WRITE`` (Linux before 5.14) the first call says so and none follow.
"""

from __future__ import annotations

import errno
from typing import Any

MIN_BYTES = 8 << 20  # smaller reads: the faults cost less than loading the extension
WINDOW = 4 << 20  # faulted in at a time, a little ahead of the copy
SLACK = 1 << 20  # the next window is faulted in when the copy comes this close

_usable = True


class Ahead:
    """Faults in ``target`` (writable bytes being filled from its start) window by window:
    ``limit(filled)`` faults in the next window when ``filled`` comes within ``SLACK`` of
    the end of what is done, and gives how far the copy may go before asking again."""

    __slots__ = ("_lib", "_pointer", "_size", "_ready")

    def __init__(self, target: memoryview) -> None:
        self._size = target.nbytes
        self._ready = 0
        self._lib: Any = None
        self._pointer: Any = None
        if _usable and self._size >= MIN_BYTES:
            from scaler_executor.objstore._objstore import ffi, lib

            self._lib = lib
            self._pointer = ffi.from_buffer(target, require_writable=True)
        else:
            self._ready = self._size  # nothing to do: the copy goes to the end

    def limit(self, filled: int) -> int:
        global _usable
        if self._ready - filled < SLACK and self._ready < self._size:
            end = min(self._size, self._ready + WINDOW)
            if _usable:
                failed = self._lib.objstore_populate_write(self._pointer + self._ready, end - self._ready)
                if failed in _UNSUPPORTED:
                    _usable = False  # the faults will do, here and in every later read
            # (any other error, ENOMEM say: this window faults as it is copied)
            self._ready = end if _usable else self._size
        return self._ready


# MADV_POPULATE_WRITE unknown to the kernel, or refused to this process (a seccomp filter)
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EPERM)
