"""Fixtures shared by the integration tests' modules.

* ``slurm`` (session): a running single-node Slurm (``slurm_testing.slurm_session``), shared
  by test_slurm.py and test_slurm_managers.py: started once for the session (or one already
  up is used), stopped at its end if it started it; skipped where Slurm cannot be started,
  a failure under ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_testing import slurm_session


@pytest.fixture(scope="session")
def slurm() -> Iterator[int]:
    """A running single-node Slurm; yields the node's CPU count."""
    with slurm_session() as cpus:
        yield cpus
