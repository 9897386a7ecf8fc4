"""The static checks pyproject.toml declares, run as part of the suite so CI enforces them.

* ``ruff check scaler_executor`` with the rules in ``[tool.ruff.lint]``;
* ``mypy scaler_executor`` with ``[tool.mypy]`` (strict).

Both read their settings from pyproject.toml, so they run from the project root.
The same two commands run as pre-commit hooks (.pre-commit-config.yaml).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _check(*command: str) -> None:
    """Run ``python -m <command>`` from the project root; fail the test with its report."""
    out = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    if out.returncode != 0:
        pytest.fail(f"{' '.join(command)} (exit {out.returncode}):\n{out.stdout}{out.stderr}", pytrace=False)


@pytest.mark.timeout(300)
def test_ruff_finds_nothing() -> None:
    _check("ruff", "check", "--no-fix", "--output-format", "concise", "scaler_executor")


@pytest.mark.timeout(300)
def test_mypy_finds_nothing() -> None:
    _check("mypy", "scaler_executor")
