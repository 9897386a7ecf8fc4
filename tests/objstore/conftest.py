"""Fixtures of the object store tests.

* The C extension is built in place (``native/build_objstore.py``) if it is missing, so
  ``pytest tests/objstore`` works right after a checkout.
* ``region_name()`` gives names unique to this test run; after every test, nothing with
  this run's prefix may remain in /dev/shm (anything left is removed, then the test fails).
* ``store``: a fresh 4 MiB store whose invariants are validated after the test.
* ``spawn``: the multiprocessing spawn context. Spawning starts multiprocessing's
  resource tracker, a child process that would outlive the module and trip the suite's
  leak check, so it is stopped when the module ends.
"""

from __future__ import annotations

import glob
import importlib
import itertools
import multiprocessing
import multiprocessing.context
import multiprocessing.resource_tracker
import os
import sys
from collections.abc import Callable, Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # spawned children import objstore_workers from here
    sys.path.insert(0, HERE)


def _ensure_built() -> None:
    try:
        importlib.import_module("scaler_executor.objstore._objstore")
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "native"))
        build = importlib.import_module("build_objstore")
        build.build_inplace()
        importlib.invalidate_caches()


_ensure_built()

RUN_PREFIX = f"sxos-t{os.getpid()}"
_counter = itertools.count()


def shm_leftovers() -> list[str]:
    return sorted(glob.glob(f"/dev/shm/{RUN_PREFIX}-*"))


@pytest.fixture
def region_name() -> Callable[[], str]:
    """A factory of region names unique to this run (and checked for leaks)."""
    return lambda: f"{RUN_PREFIX}-{next(_counter)}"


@pytest.fixture(autouse=True)
def no_shm_leak() -> Iterator[None]:
    yield
    left = shm_leftovers()
    for path in left:
        os.unlink(path)
    assert not left, f"shared-memory segments left behind: {left}"


@pytest.fixture
def store(region_name: Callable[[], str]) -> Iterator[object]:
    from scaler_executor.objstore import ObjectStore

    s = ObjectStore.create(region_name(), 4 << 20)
    try:
        yield s
        if not s.closed:
            s.validate()
    finally:
        s.unlink()
        s.close()


@pytest.fixture(scope="module")
def spawn(request: pytest.FixtureRequest) -> Iterator[multiprocessing.context.SpawnContext]:
    if "no_leaks" in request.fixturenames:
        request.getfixturevalue("no_leaks")  # set up first, so it checks after our teardown
    yield multiprocessing.get_context("spawn")
    # private API, no public one exists (3.11): stops the tracker started by spawning
    tracker = multiprocessing.resource_tracker._resource_tracker
    tracker._stop()  # type: ignore[attr-defined]  # private, see above
