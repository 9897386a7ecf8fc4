"""A large argument or result costs the client at most one copy beyond the user's own.

The store holds one copy of a large argument (written straight from the user's object)
and of a large result; what these tests bound is the client's private memory on top of
that, measured with ``tracemalloc``: it traces every allocation of Python objects and of
NumPy's data (NumPy reports its buffers to it), deterministically, so the bound holds on
a loaded machine and needs no sampling. Only what is allocated after ``start()`` counts:
the user's own object is made before. ``bench/memory.py`` measures the whole figure
(USS outside the store, plus the store's bytes, sampled at the peak) for larger sizes.

Before this was fixed, a 128 MiB ``bytes`` argument cost two private copies (the plain
fast path's pickle, kept alive while the call was pickled again into a ``BytesIO``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scaler_testing import fast_config

from scaler_executor import ScalerExecutor

SIZE = 128 << 20
SLACK = SIZE // 4  # generous: what the client allocates besides copies is a few MiB at most


def size_of(value: Any) -> int:
    if isinstance(value, list):
        return sum(size_of(v) for v in value)
    return int(value.nbytes if isinstance(value, np.ndarray) else len(value))


def make_bytes(n: int) -> bytes:
    return b"\x01" * n


def make_array(n: int) -> Any:
    return np.full(n, 1, dtype=np.uint8)


@pytest.fixture(scope="module")
def ex() -> Iterator[ScalerExecutor]:
    executor = ScalerExecutor(max_workers=1, config=fast_config(object_store_size="1G"))
    executor.submit(size_of, b"warm").result(timeout=60)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def traced_peak(call: Callable[[], Any]) -> tuple[int, Any]:
    """The peak of memory allocated during ``call()`` (above what was allocated before it)."""
    tracemalloc.start()
    try:
        value = call()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, value


ARGUMENTS: dict[str, Callable[[], Any]] = {
    "bytes": lambda: b"\x01" * SIZE,
    "bytearray": lambda: bytearray(b"\x01") * SIZE,
    "bytes in a list": lambda: [b"\x01" * SIZE],
    "ndarray": lambda: np.full(SIZE, 1, dtype=np.uint8),
    "Fortran ndarray": lambda: np.asfortranarray(np.full((SIZE // 4096, 4096), 1, dtype=np.uint8)),
}


@pytest.mark.parametrize("kind", list(ARGUMENTS))
def test_a_large_argument_is_not_copied_in_private_memory(ex: ScalerExecutor, kind: str) -> None:
    value = ARGUMENTS[kind]()
    peak, seen = traced_peak(lambda: ex.submit(size_of, value).result(timeout=120))
    assert seen == SIZE
    assert peak < SLACK, f"a {kind} argument of {SIZE >> 20} MiB cost {peak / SIZE:.2f} private copies in the client"


@pytest.mark.parametrize(("kind", "make", "copies"), [("bytes", make_bytes, 1), ("ndarray", make_array, 0)])
def test_a_large_result_is_read_with_at_most_one_copy(
    ex: ScalerExecutor, kind: str, make: Callable[[int], Any], copies: int
) -> None:
    """A bytes result is copied once out of the store (it must be the client's own); an
    array result is a view of the store, no copy."""
    peak, value = traced_peak(lambda: ex.submit(make, SIZE).result(timeout=120))
    assert size_of(value) == SIZE
    assert peak < copies * SIZE + SLACK, f"a {kind} result of {SIZE >> 20} MiB cost {peak / SIZE:.2f} private copies"


@pytest.mark.timeout(120)
def test_bench_memory_runs() -> None:
    """``bench/memory.py`` (the whole figure: USS outside the store plus the store's bytes)
    runs, at a size too small for its figures to mean anything: asserting none of them."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "bench" / "memory.py"), "--sizes", "1M", "--json"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cases = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(c["kind"], c["direction"]) for c in cases} == {
        (kind, direction) for kind in ("bytes", "ndarray") for direction in ("argument", "result")
    }
    assert all({"private", "store", "peak", "copies"} <= set(c) for c in cases)
