"""Answers to ``ObjectRequest``s, streamed in chunks with a window per peer (pure state).

A peer that cannot map the daemon host's store asks for objects (``ObjectRequest``); the
answer used to be one ``ObjectData`` with every object as one frame: a 1 GiB object was a
1 GiB frame, which held up every other message to that peer until it was written and gave
the peer no say in how fast it came. Now::

    ObjectRequest(ids)  ──► core: SendObjects(peer, ids) ──► loop: views of the objects
                            (HostStore.read: zero-copy, each holds a reader reference)
      → Outbound.request(peer, ids, sizes, views)
      → Outbound.due(): per peer, answers in the order asked; an object larger than
        CHUNK_BYTES goes as ObjectPart steps of CHUNK_BYTES, cut from the store's view
        (no copy), at most WINDOW_PARTS unanswered; then the ObjectData step ends the
        answer (small objects inline, an empty frame for each streamed one)
    ObjectPartsTaken(n) ──► core: CreditObjects(peer, n) ──► Outbound.taken(peer, n)
    peer lost           ──► core: EndObjectSends(peer)   ──► Outbound.drop(peer): the
                            views go, so their reader references are released

This module decides what goes next and never touches a socket, a store or a buffer: the
``views`` it is given are opaque to it and handed back in the steps (``loop.py`` cuts and
sends them). Small answers (every object at most one chunk) cost what they did: one
``ObjectData`` at once, when nothing streams to that peer before them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scaler_executor.protocol import messages as m

# The same chunk as a put's (messages.OBJECT_CHUNK_BYTES, 4 MiB): large enough that a
# part's own cost (a message, a poll, a credit back) is small beside moving its bytes,
# small enough that another message to the same peer waits behind at most a window of
# them. An object of at most one chunk goes whole in its ObjectData, as before: it is one
# frame either way, and the whole-frame path saves the part's message and its credit.
CHUNK_BYTES = m.OBJECT_CHUNK_BYTES
# Parts sent and not yet answered by ObjectPartsTaken, per peer: 8 x 4 MiB = 32 MiB queued
# toward one peer at most. They are zero-copy frames over the store, so the daemon's heap does
# not grow with them; the receiver's ZeroMQ may hold as much before its agent writes it. The
# window must cover the time a part takes to be written and answered plus the daemon's next
# turn, which on a loaded machine is tens of ms: with bench/multihost.py at load average 8.5
# on 2 cores, 16 parts read back 197 MB/s and 4 parts 172 MB/s (medians of 3, within the noise).
WINDOW_PARTS = 8
# Objects of answers not yet sent, per peer: a peer that asks and never takes its parts must
# not make the daemon hold a record and a store view for every object it names. At this
# many the peer is dropped, as one whose backlog is full is (loop.py MAX_BACKLOG).
MAX_QUEUED_OBJECTS = 100_000


class Part(NamedTuple):
    """Send bytes [offset, offset + length) of ``views[index]`` as ObjectPart(object_id, offset, total)."""

    peer: bytes
    object_id: bytes
    offset: int
    length: int
    total: int
    view: Any


class Finish(NamedTuple):
    """Send ObjectData(object_ids, found): ``frames`` in order, one per found object (the
    whole view of an object sent inline, ``b""`` for one that came as parts)."""

    peer: bytes
    object_ids: list[bytes]
    found: list[bool]
    frames: list[Any]
    streamed: int  # objects of this answer that went as parts
    inline_bytes: int


Step = Part | Finish


@dataclass(slots=True)
class _Answer:
    object_ids: list[bytes]
    sizes: list[int | None]  # None: not in the store
    views: list[Any]  # one per found object, in order
    next_object: int = 0  # the object being streamed (index into object_ids)
    offset: int = 0  # the next byte of it to send


@dataclass(slots=True)
class _Peer:
    answers: deque[_Answer] = field(default_factory=deque)
    in_flight: int = 0  # parts sent, not yet taken
    objects: int = 0  # objects of the answers still queued


class Outbound:
    """What the daemon still has to send to each peer that asked for objects."""

    def __init__(self, chunk: int = CHUNK_BYTES, window: int = WINDOW_PARTS, max_objects: int = MAX_QUEUED_OBJECTS) -> None:
        if chunk < 1 or window < 1:
            raise ValueError(f"chunk ({chunk}) and window ({window}) must be at least 1")
        self.chunk = chunk
        self.window = window
        self.max_objects = max_objects
        self.peers: dict[bytes, _Peer] = {}

    def request(self, peer: bytes, object_ids: list[bytes], sizes: list[int | None], views: list[Any]) -> bool:
        """An answer to send: ``sizes[i]`` is None for an object not in the store; ``views``
        holds one view per found object, in order. False (nothing queued) if the peer's
        queued answers would name more than ``max_objects`` objects: the caller drops it."""
        if len(sizes) != len(object_ids) or len(views) != sum(s is not None for s in sizes):
            raise ValueError("an answer needs one size per object and one view per found object")
        state = self.peers.setdefault(peer, _Peer())
        if state.objects + len(object_ids) > self.max_objects:
            if not state.answers and not state.in_flight:
                del self.peers[peer]
            return False
        state.answers.append(_Answer(list(object_ids), list(sizes), list(views)))
        state.objects += len(object_ids)
        return True

    def taken(self, peer: bytes, count: int) -> None:
        """The peer wrote ``count`` parts. More credit than parts sent is ignored: a peer
        cannot widen its window by answering early."""
        state = self.peers.get(peer)
        if state is not None:
            state.in_flight = max(0, state.in_flight - max(0, count))

    def drop(self, peer: bytes) -> int:
        """The peer is gone: forget what was still to be sent (its views with it). Returns
        how many answers were dropped unfinished."""
        state = self.peers.pop(peer, None)
        return 0 if state is None else len(state.answers)

    def streaming(self, peer: bytes) -> bool:
        return peer in self.peers

    def due(self) -> list[Step]:
        """Every step that may go now, each peer's in order."""
        steps: list[Step] = []
        for peer in list(self.peers):
            state = self.peers[peer]
            while state.answers:
                answer = state.answers[0]
                if not self._advance(peer, state, answer, steps):
                    break  # the window is full
                state.answers.popleft()
                state.objects -= len(answer.object_ids)
            if not state.answers and state.in_flight == 0:
                del self.peers[peer]
        return steps

    def _advance(self, peer: bytes, state: _Peer, answer: _Answer, steps: list[Step]) -> bool:
        """Parts of ``answer`` while the window allows, then its Finish; False if held up."""
        view_index = sum(s is not None for s in answer.sizes[: answer.next_object])
        while answer.next_object < len(answer.object_ids):
            size = answer.sizes[answer.next_object]
            if size is None or size <= self.chunk:
                answer.next_object += 1
                view_index += size is not None
                continue
            view = answer.views[view_index]
            while answer.offset < size:
                if state.in_flight >= self.window:
                    return False
                length = min(self.chunk, size - answer.offset)
                steps.append(Part(peer, answer.object_ids[answer.next_object], answer.offset, length, size, view))
                state.in_flight += 1
                answer.offset += length
            answer.next_object += 1
            answer.offset = 0
            view_index += 1
        frames: list[Any] = []
        found: list[bool] = []
        streamed = inline = 0
        views = iter(answer.views)
        for size in answer.sizes:
            found.append(size is not None)
            if size is None:
                continue
            view = next(views)
            if size > self.chunk:
                frames.append(b"")
                streamed += 1
            else:
                frames.append(view)
                inline += size
        answer.views = []  # the loop holds the inline ones until they are sent
        steps.append(Finish(peer, answer.object_ids, found, frames, streamed, inline))
        return True

    def validate(self) -> None:
        for peer, state in self.peers.items():
            assert 0 <= state.in_flight <= self.window, (peer, state.in_flight)
            assert state.objects == sum(len(a.object_ids) for a in state.answers) <= self.max_objects, peer
            for answer in state.answers:
                assert len(answer.views) == sum(s is not None for s in answer.sizes), peer


# Commands of the core (core.py) for the loop, about these answers.


@dataclass(frozen=True, slots=True)
class CreditObjects:
    """``peer`` wrote ``count`` more parts (ObjectPartsTaken): its window opens by as many."""

    peer: bytes
    count: int


@dataclass(frozen=True, slots=True)
class EndObjectSends:
    """``peer`` is gone: drop what was still to be sent to it, releasing the store's views."""

    peer: bytes
