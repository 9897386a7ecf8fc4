"""Exceptions of the object store, and the one table that maps C statuses to them.

Every ``objstore_status_t`` the C library returns is turned into a Python exception by
:func:`error_for`, through :data:`STATUS_TABLE` below, and nowhere else. A test checks
that the table covers every status the library names.

Misuse (an id that is not 16 bytes, a bad region name or size) raises ``ValueError``, as
everywhere in scaler-executor. Running out of room for objects is a per-task failure, so
:class:`ObjectStoreFull` is a :class:`~scaler_executor.exceptions.TaskError`: the task that
needed the room fails, and the executor stays usable.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Callable
from dataclasses import dataclass

from scaler_executor.exceptions import TaskError

__all__ = [
    "STATUS_TABLE",
    "NoProcessSlot",
    "ObjectAlreadySealed",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectNotHeld",
    "ObjectNotSealed",
    "ObjectStoreError",
    "ObjectStoreFull",
    "ObjectTableFull",
    "RegionExists",
    "RegionInvalid",
    "RegionNoSpace",
    "RegionNotFound",
    "StatusContext",
    "StoreCorrupt",
    "StoreForked",
    "StoreLockTimeout",
    "StoreSystemError",
    "error_for",
]


class ObjectStoreError(Exception):
    """Base class of the object store's errors; ``status`` names the C status."""

    status = ""


class ObjectNotFound(ObjectStoreError):
    """No such object (never created, deleted, or delete pending)."""

    status = "NOT_FOUND"


class ObjectExists(ObjectStoreError):
    """An object with this id exists (possibly delete pending, still held by readers)."""

    status = "EXISTS"


class ObjectNotSealed(ObjectStoreError):
    """The object is still being written: seal it first (or abort it)."""

    status = "NOT_SEALED"


class ObjectAlreadySealed(ObjectStoreError):
    """The object is sealed: it can no longer be sealed again or aborted."""

    status = "SEALED"


class ObjectNotHeld(ObjectStoreError):
    """This process holds no reference on the object, or did not create it."""

    status = "NOT_HELD"


class ObjectStoreFull(ObjectStoreError, TaskError):
    """No room for an object of ``size`` bytes: ``in_use`` of ``limit`` bytes are taken.

    Raised at once, never after waiting; the store serves again as soon as objects are
    released or deleted.
    """

    status = "FULL"

    def __init__(self, size: int, limit: int, in_use: int, detail: str = "") -> None:
        self.size = size
        self.limit = limit
        self.in_use = in_use
        self.detail = detail
        message = (
            f"object store full: no room for an object of {size} bytes "
            f"({in_use} of {limit} bytes in use); release or delete objects, "
            "or create the store with a larger size"
        )
        super().__init__(message + (f" ({detail})" if detail else ""))

    def __reduce__(self):  # type: ignore[no-untyped-def]  # keep the fields across pickling
        return (type(self), (self.size, self.limit, self.in_use, self.detail))


class ObjectTableFull(ObjectStoreFull):
    """The object index or the reference table is full (too many objects or references)."""

    status = "TABLE_FULL"


class StoreLockTimeout(ObjectStoreError):
    """The store's lock was not acquired in time; ``holder_pid`` held it (0: unknown)."""

    status = "LOCK_TIMEOUT"

    def __init__(self, message: str, holder_pid: int = 0) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid

    def __reduce__(self):  # type: ignore[no-untyped-def]  # keep the fields across pickling
        return (type(self), (self.args[0], self.holder_pid))


class RegionNoSpace(ObjectStoreError):
    """No room for the region in /dev/shm (nor in the fallback directory)."""

    status = "NO_SPACE"


class RegionExists(ObjectStoreError):
    """A region with this name already exists."""

    status = "REGION_EXISTS"


class RegionNotFound(ObjectStoreError):
    """No region with this name."""

    status = "NO_REGION"


class RegionInvalid(ObjectStoreError):
    """Not a region of this version, or its creator never finished initialising it."""

    status = "BAD_REGION"


class NoProcessSlot(ObjectStoreError):
    """Every process slot of the region is taken by a live process."""

    status = "NO_SLOT"


class StoreCorrupt(ObjectStoreError):
    """An invariant of the region does not hold (see the message)."""

    status = "CORRUPT"


class StoreForked(ObjectStoreError):
    """The store handle was opened by the parent process; attach again after fork."""

    status = "FORKED"


class StoreSystemError(ObjectStoreError):
    """A system call failed; ``errno`` says which error."""

    status = "SYSTEM"

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno

    def __reduce__(self):  # type: ignore[no-untyped-def]  # keep the fields across pickling
        return (type(self), (self.args[0], self.errno))


@dataclass(frozen=True, slots=True)
class StatusContext:
    """What the caller knows when a status comes back, to write a useful message."""

    operation: str
    message: str  # the C library's text for the status
    object_id: bytes | None = None
    region: str = ""
    size: int = 0
    limit: int = 0
    in_use: int = 0
    holder_pid: int = 0
    errno: int = 0
    detail: str = ""


def _where(c: StatusContext) -> str:
    what = f"{c.operation}"
    if c.object_id is not None:
        what += f"(object {c.object_id.hex()})"
    if c.region:
        what += f" on region {c.region!r}"
    text = f"{what}: {c.message}"
    return text + (f": {c.detail}" if c.detail else "")


def _simple(cls: type[ObjectStoreError]) -> Callable[[StatusContext], Exception]:
    return lambda c: cls(_where(c))


def _full(c: StatusContext) -> Exception:
    return ObjectStoreFull(c.size, c.limit, c.in_use, c.detail)


def _table_full(c: StatusContext) -> Exception:
    return ObjectTableFull(c.size, c.limit, c.in_use, c.detail or c.message)


def _timeout(c: StatusContext) -> Exception:
    who = f"process {c.holder_pid}" if c.holder_pid else "an unknown process"
    return StoreLockTimeout(
        f"{c.operation}: timed out waiting for the store lock, held by {who} "
        "(stopped or stuck inside the store?)",
        c.holder_pid,
    )


def _system(c: StatusContext) -> Exception:
    name = _errno.errorcode.get(c.errno, str(c.errno)) if c.errno else "unknown errno"
    return StoreSystemError(f"{_where(c)} ({name})", c.errno)


#: C status number -> (C status name, factory of the exception). OK (0) is absent.
STATUS_TABLE: dict[int, tuple[str, Callable[[StatusContext], Exception]]] = {
    1: ("INVALID", lambda c: ValueError(_where(c))),
    2: ("NOT_FOUND", _simple(ObjectNotFound)),
    3: ("EXISTS", _simple(ObjectExists)),
    4: ("NOT_SEALED", _simple(ObjectNotSealed)),
    5: ("SEALED", _simple(ObjectAlreadySealed)),
    6: ("NOT_HELD", _simple(ObjectNotHeld)),
    7: ("FULL", _full),
    8: ("TABLE_FULL", _table_full),
    9: ("LOCK_TIMEOUT", _timeout),
    10: ("NO_SPACE", _simple(RegionNoSpace)),
    11: ("REGION_EXISTS", _simple(RegionExists)),
    12: ("NO_REGION", _simple(RegionNotFound)),
    13: ("BAD_REGION", _simple(RegionInvalid)),
    14: ("NO_SLOT", _simple(NoProcessSlot)),
    15: ("CORRUPT", _simple(StoreCorrupt)),
    16: ("FORKED", _simple(StoreForked)),
    17: ("SYSTEM", _system),
}


def error_for(status: int, context: StatusContext) -> Exception:
    """The exception for a non-OK C ``status``; an unknown status is a StoreCorrupt."""
    entry = STATUS_TABLE.get(status)
    if entry is None:
        return StoreCorrupt(f"{context.operation}: unknown status {status} from the C library")
    return entry[1](context)
