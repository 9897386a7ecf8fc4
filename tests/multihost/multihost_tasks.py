"""Task functions of the multi-host tests (imported by reference on the workers' hosts)."""

from __future__ import annotations

import hashlib
import os
import socket
import time


def noop(x: int = 0) -> int:
    return x


def where(x: int = 0) -> tuple[int, str, int]:
    """Which host and worker agent ran it (a processor's parent is its agent)."""
    return x, socket.gethostname(), os.getppid()


def hold(seconds: float, x: int = 0) -> tuple[int, int]:
    """A task that stays running across a link cut (time.sleep is the work here)."""
    time.sleep(seconds)
    return x, os.getppid()


def digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def sample(value: bytes) -> tuple[int, bytes]:
    """A cheap fingerprint of a large value (its length and every millionth byte): a
    transfer's timing should not be a hash's."""
    return len(value), bytes(memoryview(value)[::1_000_000])


def make_bytes(size: int, seed: int) -> bytes:
    return pattern(size, seed)


def pattern(size: int, seed: int) -> bytes:
    """``size`` bytes that differ per seed, made fast (no os.urandom of 100 MB)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    whole, rest = divmod(size, len(block))
    return block * whole + block[:rest]


def array_digest(value: object) -> tuple[int, str]:
    """The length and SHA-256 of a buffer (a NumPy array read from the store, say)."""
    view = memoryview(value)  # type: ignore[arg-type]
    return view.nbytes, hashlib.sha256(view.cast("B") if view.ndim != 1 or view.format != "B" else view).hexdigest()


def array_of(size: int) -> object:
    """``size`` bytes as a NumPy uint8 array: one store object of exactly that size."""
    import numpy as np

    return np.frombuffer(pattern(size, 3), dtype=np.uint8)


def random_bytes(size: int, seed: int) -> bytes:
    """``size`` bytes with no period (a part out of place changes the digest)."""
    import random

    return random.Random(seed).randbytes(size)
