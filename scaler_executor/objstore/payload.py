"""Pickled values through the object store: a small header plus zero-copy buffers.

A value is pickled once with cloudpickle, protocol 5. Every out-of-band buffer pickle
offers (a :class:`pickle.PickleBuffer`: contiguous NumPy arrays of a non-object dtype,
and anything else whose protocol-5 reduction yields PickleBuffers) of at least
``threshold`` bytes becomes an object of its own in the store; smaller ones stay in the
pickle stream (the buffer callback answers "in band" for them, so one pickling pass
decides). Readers map those objects straight into their arrays: no copy, no private
memory.

Wire format (the header)::

    PREFIX  = "<4sBBHI": magic b"SXPV", version 1, flags, reserved 0, buffer count
    header  = PREFIX + pickle stream          (flags = 0)
            | PREFIX                          (flags = STREAM_IN_STORE)

    object_ids = [stream object, if STREAM_IN_STORE] + [one object per out-of-band
                 buffer, in the order the unpickler consumes them]

When the pickle stream itself exceeds ``threshold`` (a large ``bytes``, a big list) it is
stored as one object and the header shrinks to the prefix; the pickler's writes are kept
as references and copied once into that object (a large ``bytes`` straight from the
user's object: see :class:`_Parts`), and it is unpickled straight from the shared view,
so reading it costs the one copy that building the objects needs.
:func:`pack_inline` produces the same format with everything in the stream (for peers on
other hosts); :func:`unpack` and :func:`unpack_inline` both read it.

What comes back
---------------
* Out-of-band buffers arrive as read-only views of shared memory: a NumPy array has
  ``flags.writeable == False`` and writing into it raises numpy's "assignment destination
  is read-only" ``ValueError``. Take a private copy with ``arr.copy()``, or unpack with
  ``writable=True`` (every out-of-band buffer is then copied into private memory). The
  worker can add that advice to the user's traceback with :func:`add_readonly_hint`.
  Views stay valid as long as anything holds them, even after the store handle is
  closed or the region unlinked (see :mod:`.store`).
* datetime64/timedelta64 arrays, which NumPy's own reduction copies in band, travel
  zero-copy too (as an integer view of the same memory, viewed back on loading).
* Non-contiguous arrays (``a[::2]``, most transposed slices) are copied into the pickle
  stream by NumPy itself and come back as private, writable, C-ordered copies; pass
  ``np.ascontiguousarray(a)`` to share them zero-copy. Fortran-ordered arrays are
  contiguous and travel zero-copy.
* ``bytearray``: CPython's C pickler writes it in band (it never makes a PickleBuffer
  of it), so a large one travels inside the stream object and comes back as a private
  ``bytearray`` (one copy on each side). ``bytes`` likewise. Wrap data you want to share
  in a NumPy array (``np.frombuffer``) instead.

Ownership
---------
``Packed.created`` lists the objects the call wrote that its caller must delete when the
value is no longer needed (:func:`delete_objects`). Objects written into a ``shared``
cache belong to the cache instead and are not in ``created``: delete them with the cache
(:meth:`SharedBuffers.delete_all`) once every value referring to them is done, so that
freeing one value never pulls a buffer from under its siblings. ``object_ids`` lists
every object the header refers to, shared ones included.
"""

from __future__ import annotations

import copyreg
import os
import pickle
import struct
import sys
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor.objstore.errors import ObjectNotFound
from scaler_executor.objstore.store import ObjectStore

try:
    from scaler_executor.objstore._objstore import ffi
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "the C object store is not built: run `python native/build_objstore.py`"
    ) from exc

__all__ = [
    "DEFAULT_THRESHOLD",
    "Fetched",
    "Packed",
    "SharedBuffers",
    "add_readonly_hint",
    "delete_objects",
    "pack",
    "pack_inline",
    "unpack",
    "unpack_inline",
]

#: Buffers (and pickle streams) this large go to the store as objects of their own.
#: Below it a store object costs more than it saves: a create/seal/get/release round of
#: the lock (~microseconds) and a 64-byte-aligned block, against a memcpy of < 64 KiB.
DEFAULT_THRESHOLD = 64 * 1024

PROTOCOL = 5
_MAGIC = b"SXPV"
_VERSION = 1
_STREAM_IN_STORE = 1
_PREFIX = struct.Struct("<4sBBHI")

_READONLY_HINT = (
    "This array is a read-only view of the shared-memory object store (zero-copy). "
    "Write into a private copy instead: `arr = arr.copy()`, or ask for writable copies "
    "of every argument with writable=True when unpacking."
)

# NumPy's messages: writing into the array, ufunc out=, and arr.flags.writeable = True
_READONLY_MARKERS = ("is read-only", "cannot set WRITEABLE flag")

_Key = tuple[int, int, int]  # (id of the owning object, address, length)
_Entry = tuple[object, bytes]  # (the owning object, kept alive; the store object id)


@dataclass(frozen=True, slots=True)
class Packed:
    """A value packed into a store.

    ``header``: the bytes to send (small unless ``threshold`` is large);
    ``object_ids``: every store object the header refers to, in the order
    :func:`unpack` wants them; ``created``: the objects this call wrote whose lifetime the
    caller owns (shared-cache objects excluded: they belong to the cache).
    """

    header: bytes
    object_ids: list[bytes] = field(default_factory=list)
    created: list[bytes] = field(default_factory=list)


class SharedBuffers(dict[_Key, _Entry]):
    """A cache that stores each buffer once across many :func:`pack` calls.

    Pass the same instance as ``shared`` to every pack of one batch (for example every
    item of one ``map`` call that shares an array); the buffer is written the first time
    and referred to afterwards. Keys are the identity of the object owning the memory
    plus the buffer's address and length, never a hash of the bytes (a hash without a
    byte comparison would alias two different buffers on a collision); the cache keeps
    a strong reference to that owner, so its id cannot be reused while cached.

    The bytes are captured at their first pack: do not modify a cached array in place
    during the batch. Any ``MutableMapping`` works as a cache; this class adds the
    clean-up.
    """

    def object_ids(self) -> list[bytes]:
        """The store objects the cache owns."""
        return [oid for _owner, oid in self.values()]

    def delete_all(self, store: ObjectStore) -> None:
        """Delete every object of the cache from ``store`` (deferred while readers still
        hold them) and empty the cache."""
        ids = self.object_ids()
        self.clear()
        delete_objects(store, ids)


# ------------------------------------------------------------------ pack


# Builtin functions and methods (``len``, ``operator.add``, a bound C method): cloudpickle's
# ``reducer_override`` leaves them to pickle, which saves them by name.
INERT: frozenset[type] = frozenset({type(len)})


def pack(
    obj: Any,
    store: ObjectStore,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    shared: MutableMapping[_Key, _Entry] | None = None,
    reducer: Any = None,
    inert: frozenset[type] = INERT,
    by_reference: frozenset[Any] = frozenset(),
) -> Packed:
    """Pickle ``obj``, writing its large buffers (and a large stream) into ``store``.

    ``threshold``: buffers of at least this many bytes become store objects, and so does
    a pickle stream longer than this; ``shared``: a cache (see :class:`SharedBuffers`)
    through which buffers seen by an earlier pack are referred to instead of written;
    ``reducer``: called for each object pickled, returning a reduce tuple to override its
    pickling (the executor turns futures and object refs into references) or NotImplemented;
    ``inert``: types whose instances neither ``reducer`` nor cloudpickle changes (``INERT``
    by default; pickled by pickle's own rules without asking either: ``Pickler.reducer_override``'s chain is
    Python calls for every object that is not an int, a str, a list...); ``by_reference``:
    classes known to be importable wherever the value is read, pickled by name without
    cloudpickle's check. Returns :class:`Packed`. Raises :class:`~.errors.ObjectStoreFull` (or another store
    error) at once when a write fails, after deleting every object this call wrote and
    removing what it added to ``shared``; pickling errors propagate before anything is
    written.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    out_of_band: list[pickle.PickleBuffer] = []

    def decide(buffer: pickle.PickleBuffer) -> bool:
        with buffer.raw() as raw:
            large = raw.nbytes >= threshold
        if large:
            out_of_band.append(buffer)
        return not large  # true: pickle writes it in band

    stream = _dump(obj, decide, reducer, inert, by_reference)
    writer = _Writer(store, shared)
    try:
        ids = [writer.buffer(buffer) for buffer in out_of_band]
        if _PREFIX.size + stream.size > threshold:  # the header it would otherwise be
            ids.insert(0, writer.fresh_parts(stream.parts, stream.size))
            header = _PREFIX.pack(_MAGIC, _VERSION, _STREAM_IN_STORE, 0, len(out_of_band))
        else:
            header = stream.join(_PREFIX.pack(_MAGIC, _VERSION, 0, 0, len(out_of_band)))
    except BaseException:
        writer.undo()
        raise
    finally:
        for buffer in out_of_band:
            buffer.release()
        stream.parts.clear()
    return Packed(header, ids, writer.created)


def pack_inline(obj: Any) -> bytes:
    """The value format of :func:`pack` with everything in band, for a peer without
    access to the store. Read it with :func:`unpack_inline` (or :func:`unpack`)."""
    return _dump(obj, None).join(_PREFIX.pack(_MAGIC, _VERSION, 0, 0, 0))


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    """cloudpickle, plus out-of-band buffers for NumPy datetime64/timedelta64 arrays
    (NumPy's own reduction copies those in band): pickled as an integer view of the same
    memory, and viewed back as the original dtype when loaded."""

    reducer: Any = None  # the caller's hook: obj -> a reduce tuple, or NotImplemented
    inert: frozenset[type] = INERT  # types whose instances go by pickle's own rules (pack)
    by_reference: frozenset[Any] = frozenset()  # classes pickled by name, unchecked (pack)

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in self.inert or (kind is type and obj in self.by_reference):
            return NotImplemented
        if self.reducer is not None:
            reduced = self.reducer(obj)
            if reduced is not NotImplemented:
                return reduced
        numpy = sys.modules.get("numpy")
        if (
            numpy is not None
            and type(obj) is numpy.ndarray
            and obj.dtype.kind in "mM"
            and (obj.flags.c_contiguous or obj.flags.f_contiguous)
        ):
            return _view_as, (obj.view(f"<i{obj.dtype.itemsize}"), obj.dtype)
        return super().reducer_override(obj)


def _view_as(array: Any, dtype: Any) -> Any:
    return array.view(dtype)


class _Parts:
    """The pickler's file: it keeps what the pickler writes instead of copying it.

    CPython's pickler writes its own buffer in frames of about 64 KiB, and hands a large
    ``bytes``, ``bytearray`` or in-band buffer to ``write`` as the very object, unframed
    (``_Pickler_write_bytes``). A ``BytesIO`` would copy each into one growing buffer,
    which is then copied again into the store: two private copies of a large ``bytes``
    argument on the way to its one copy in the store. Holding references instead, the
    bytes are copied once, straight from the user's object into the store object
    (:meth:`_Writer.fresh_parts`); small values are joined into the header.

    The references are read before :func:`pack` returns, so a ``bytearray`` changed
    later does not change what was sent.
    """

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0

    def write(self, data: Any) -> int:
        if type(data) is bytes:  # what the pickler's frames are
            size = len(data)
        else:
            with memoryview(data) as view:
                size = view.nbytes
        self.parts.append(data)
        self.size += size
        return size

    def join(self, prefix: bytes) -> bytes:
        """``prefix`` + the stream, as one bytes object (one copy)."""
        parts = self.parts
        if len(parts) == 1 and type(parts[0]) is bytes:  # a small pickle: one frame
            return prefix + parts[0]
        return b"".join([prefix, *map(_raw_bytes, parts)])


def _raw_bytes(part: Any) -> Any:
    # bytes and bytearray join as they are; an in-band PickleBuffer (or anything else)
    # as its raw bytes, which also flattens a Fortran-ordered buffer in memory order
    if type(part) is bytes or type(part) is bytearray:
        return part
    with pickle.PickleBuffer(part).raw() as raw:
        return raw.tobytes()


def _dump(
    obj: Any, buffer_callback: Any, reducer: Any = None, inert: frozenset[type] = INERT, by_reference: frozenset[Any] = frozenset()
) -> _Parts:
    stream = _Parts()
    plain_dispatch_table(_Pickler)
    pickler = _Pickler(stream, protocol=PROTOCOL, buffer_callback=buffer_callback)
    pickler.reducer = reducer  # e.g. the executor's: futures and object refs become references
    if inert is not INERT:
        pickler.inert = inert
    if by_reference:
        pickler.by_reference = by_reference
    pickler.dump(obj)
    return stream


def plain_dispatch_table(pickler_class: Any) -> None:
    """Give a cloudpickle ``Pickler`` subclass its dispatch table as a plain ``dict``.

    cloudpickle's is a ``ChainMap`` of its own reducers and ``copyreg.dispatch_table``, and
    the C pickler looks every object's type up in it: for the usual miss, a Python
    ``__getitem__`` and ``__missing__`` raising ``KeyError`` (~0.6 µs an object, about a
    fifth of pickling a graph's node; ``docs/performance.rst``). The merged ``dict`` answers
    in C. It is made again whenever ``copyreg.dispatch_table`` changed since (a reducer
    registered with ``copyreg.pickle`` later still counts): one dict comparison a pickling.
    The C pickler reads the table when it is made, so call this before making one."""
    table = copyreg.dispatch_table
    if pickler_class.__dict__.get("_copyreg_seen") != table:
        pickler_class._copyreg_seen = dict(table)
        pickler_class.dispatch_table = dict(cloudpickle.Pickler.dispatch_table)  # its own entries first


def stream_in_store_header() -> bytes:
    """The header of a value whose whole pickle stream (with no out-of-band buffers) is
    one store object: a peer that cannot map the store sends this with a large inline
    pickle it streamed there (the worker agent, for its processors' large results)."""
    return _PREFIX.pack(_MAGIC, _VERSION, _STREAM_IN_STORE, 0, 0)


def inline_stream(header: bytes) -> bytes | None:
    """The bare pickle stream of a header that refers to no store object, else None."""
    flags, count, body = _parse(header)
    return None if flags or count else bytes(body)


class _Writer:
    """Writes one pack's objects; remembers them to undo the pack if a write fails."""

    def __init__(self, store: ObjectStore, shared: MutableMapping[_Key, _Entry] | None) -> None:
        self.store = store
        self.shared = shared
        self.created: list[bytes] = []
        self.shared_added: list[tuple[_Key, bytes]] = []

    def fresh(self, data: Any) -> bytes:
        oid = os.urandom(16)
        self.store.put(oid, data)
        self.created.append(oid)
        return oid

    def fresh_parts(self, parts: list[Any], size: int) -> bytes:
        """A new object holding ``parts`` end to end: each copied once, in place."""
        if len(parts) == 1:
            with pickle.PickleBuffer(parts[0]).raw() as raw:
                return self.fresh(raw)
        if not hasattr(self.store, "create_buffer"):
            # The daemon's store seen from another host (client/remote_store.py) is written
            # through the network in chunks cut from the parts: no copy here.
            oid = os.urandom(16)
            views = [pickle.PickleBuffer(part).raw() for part in parts]  # 1-D bytes, whatever its shape
            try:
                self.store.put_parts(oid, views)  # type: ignore[attr-defined]  # a RemoteStore
            finally:
                for view in views:
                    view.release()
            self.created.append(oid)
            return oid
        oid = os.urandom(16)
        target = self.store.create_buffer(oid, size)
        try:
            offset = 0
            for part in parts:
                with pickle.PickleBuffer(part).raw() as raw:  # 1-D bytes, whatever its shape
                    end = offset + raw.nbytes
                    target[offset:end] = raw
                offset = end
            self.store.seal(oid)  # releases the view (dropping it unsealed would abort)
        except BaseException:
            self.store.abort(oid)  # releases the view too
            raise
        self.created.append(oid)
        return oid

    def buffer(self, buffer: pickle.PickleBuffer) -> bytes:
        with buffer.raw() as raw:
            if self.shared is None:
                adopted = self.adopt(raw)
                return adopted if adopted is not None else self.fresh(raw)
            owner = _owner(raw.obj)
            with ffi.from_buffer(raw) as pointer:
                key = (id(owner), int(ffi.cast("uintptr_t", pointer)), raw.nbytes)
            hit = self.shared.get(key)
            if hit is not None and hit[0] is owner and self.store.contains(hit[1]):
                return hit[1]
            # new, or its object is gone (deleted, or a different store): write it again
            oid = os.urandom(16)
            self.store.put(oid, raw)
            self.shared[key] = (owner, oid)
            self.shared_added.append((key, oid))
            return oid

    def adopt(self, raw: memoryview) -> bytes | None:
        """The id of the store block ``raw`` already is, sealed now; None if it is not one.

        An array allocated in the store by this process (:mod:`.numpy_alloc`) needs no
        copy: its block becomes the object. The array owning that memory is made
        read-only, since readers now share those bytes.
        """
        with ffi.from_buffer(raw) as pointer:
            address = int(ffi.cast("uintptr_t", pointer))
        oid = self.store.seal_at(address, raw.nbytes)
        if oid is None:
            return None
        self.created.append(oid)
        owner = _owner(raw.obj)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(owner, numpy.ndarray):
            try:
                owner.flags.writeable = False
            except ValueError:  # pragma: no cover - an owning array can always drop it
                pass
        return oid

    def undo(self) -> None:
        for key, oid in self.shared_added:
            if self.shared is not None and self.shared.get(key, (None, b""))[1] == oid:
                del self.shared[key]
        delete_objects(self.store, self.created + [oid for _key, oid in self.shared_added])
        self.created = []
        self.shared_added = []


def _owner(exporter: object) -> object:
    """The object that owns the memory of a buffer exported by ``exporter``.

    NumPy's protocol-5 reduction of a Fortran-ordered array exports a fresh transposed
    view each time, and views of one array share its memory: keying the shared cache by
    the base array lets those share one store object. Same owner + same address + same
    length means the very same bytes, so this cannot alias different data.
    """
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        while isinstance(exporter, numpy.ndarray) and exporter.base is not None:
            exporter = exporter.base
    return exporter


def delete_objects(store: ObjectStore, object_ids: Iterable[bytes]) -> None:
    """Delete each object (deferred while readers hold it); ids already gone are skipped."""
    for oid in object_ids:
        try:
            store.delete(oid)
        except ObjectNotFound:
            pass


# ------------------------------------------------------------------ unpack


class Fetched:
    """Objects fetched over the network, read like a store (``get``) by :func:`unpack`:
    for a client or worker that cannot map the store the objects live in."""

    def __init__(self, blobs: dict[bytes, bytes]) -> None:
        self.blobs = blobs

    def get(self, object_id: bytes) -> memoryview:
        try:
            blob: Any = self.blobs[object_id]
        except KeyError:
            raise LookupError(f"object {object_id.hex()} was not fetched for this task") from None
        # An object kept as the parts it came in (protocol/chunks.py Parts): put together.
        return blob.join() if hasattr(blob, "reader") else memoryview(blob)

    def stream(self, object_id: bytes) -> Any:
        """A pickle stream's object: a reader of its parts if it came in parts (``pickle.load``
        then copies each part once, into the objects it builds), else its view."""
        blob: Any = self.blobs.get(object_id)
        return blob.reader() if hasattr(blob, "reader") else self.get(object_id)


def unpack(
    header: bytes,
    object_ids: Sequence[bytes],
    store: ObjectStore | Fetched | None,
    *,
    writable: bool = False,
) -> Any:
    """The value packed by :func:`pack` (or :func:`pack_inline`, with no ids).

    Out-of-band buffers come back as read-only zero-copy views of the store (NumPy
    arrays with ``flags.writeable == False``); ``writable=True`` copies each into
    private, writable memory instead. Each view holds a reference on its object until
    the last thing using it is gone. Raises ValueError for a header that is not this
    format or ids that do not match it, and the store's errors (ObjectNotFound when an
    object was deleted).
    """
    flags, count, body = _parse(header)
    stream_in_store = bool(flags & _STREAM_IN_STORE)
    want = count + stream_in_store
    if len(object_ids) != want:
        raise ValueError(f"this value refers to {want} store objects, {len(object_ids)} ids given")
    if want and store is None:
        raise ValueError("this value refers to store objects: pass the store to unpack")
    views: list[memoryview] = []
    buffers: list[Any] = []
    done = False
    reader: Any = None  # the stream as a file (a store that has it in parts: Fetched.stream)
    in_views = stream_in_store  # the stream is views[0]
    try:
        ids = iter(object_ids)
        if stream_in_store and hasattr(store, "stream"):
            source = store.stream(next(ids))  # type: ignore[union-attr]  # checked above
            if type(source) is memoryview:
                views.append(source)
            else:
                reader, in_views = source, False
        for oid in ids:
            views.append(store.get(oid))  # type: ignore[union-attr]  # checked above
        if in_views:
            body = views[0]
        for view in views[in_views:]:
            buffers.append(bytearray(view) if writable else view)
        # a stream view (or its parts) is read in place: the objects pickle builds are the one copy
        value = pickle.load(reader, buffers=buffers) if reader is not None else pickle.loads(body, buffers=buffers)
        done = True
        return value
    finally:
        # Release now what nothing uses any more (copied buffers, the stream; every view
        # if unpickling failed, since a traceback would keep this frame's views alive);
        # views the value's arrays use are released when those arrays go.
        del body, buffers, reader
        for index, view in enumerate(views):
            if not done or writable or (in_views and index == 0):
                try:
                    view.release()
                except BufferError:  # still used by a half-built object: freed with it
                    pass
        views.clear()


def unpack_inline(data: bytes) -> Any:
    """The value packed by :func:`pack_inline`."""
    flags, count, body = _parse(data)
    if flags or count:
        raise ValueError("this value refers to objects in a store: use unpack(header, ids, store)")
    return pickle.loads(body)


def own_ids(header: bytes, object_ids: Sequence[bytes]) -> Sequence[bytes]:
    """The ids of ``object_ids`` that :func:`pack` made for ``header`` itself: the last ones.

    A task's object list also names the objects of the ``ObjectRef`` values among its
    arguments (added first, while pickling, so the daemon pins them and a remote worker
    fetches them); each of those refs unpacks its own ids from inside the pickle.
    """
    flags, count, _body = _parse(header)
    want = count + bool(flags & _STREAM_IN_STORE)
    return object_ids[len(object_ids) - want :] if want <= len(object_ids) else object_ids


def _parse(header: bytes) -> tuple[int, int, memoryview]:
    view = memoryview(header)
    if len(view) < _PREFIX.size:
        raise ValueError(f"not a packed value: {len(view)} bytes is shorter than its prefix")
    magic, version, flags, _reserved, count = _PREFIX.unpack_from(view)
    if magic != _MAGIC:
        raise ValueError(f"not a packed value (prefix {bytes(view[:4])!r}, expected {_MAGIC!r})")
    if version != _VERSION:
        raise ValueError(
            f"packed value format version {version}; this scaler-executor reads version "
            f"{_VERSION}: run the same version on every host"
        )
    return flags, count, view[_PREFIX.size :]


# ------------------------------------------------------------------ errors


def add_readonly_hint(exc: BaseException) -> bool:
    """If ``exc`` is NumPy's "assignment destination is read-only" error, add a note
    telling the user how to get a writable array (``arr.copy()`` or ``writable=True``),
    shown under its traceback; return True if it did. For the worker to call on the
    exceptions of user code that received unpacked arguments."""
    message = str(exc)
    if (
        isinstance(exc, ValueError)
        and any(marker in message for marker in _READONLY_MARKERS)
        and _READONLY_HINT not in getattr(exc, "__notes__", ())
    ):
        exc.add_note(_READONLY_HINT)
        return True
    return False
