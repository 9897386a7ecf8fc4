"""The package's public names: ``__all__``, the lazy table and what they resolve to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import scaler_executor

ROOT = Path(__file__).resolve().parents[2]


def test_all_lists_exactly_the_lazy_names_and_the_version() -> None:
    assert len(set(scaler_executor.__all__)) == len(scaler_executor.__all__)
    assert set(scaler_executor.__all__) == {"__version__", *scaler_executor._LAZY}


def test_every_public_name_resolves() -> None:
    for name in scaler_executor.__all__:
        assert getattr(scaler_executor, name) is not None, name


def test_star_import_exports_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from scaler_executor import *", namespace)
    assert set(scaler_executor.__all__) <= set(namespace)


def test_importing_the_package_does_not_import_the_client() -> None:
    # the daemon and worker import the package too: the client stays lazy
    code = "import sys, scaler_executor; print(any(m.startswith('scaler_executor.client') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.timeout(300)
def test_a_strict_type_checker_sees_the_public_names() -> None:
    # __all__ used to be built from _LAZY at run time; mypy cannot read that, so
    # under --strict 'from scaler_executor import ScalerExecutor' was an error
    # ("does not explicitly export") for every user of the typed package.
    code = f"from scaler_executor import {', '.join(scaler_executor.__all__)}"
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "No module named mypy" not in out.stderr, out.stderr
    # errors elsewhere in the package are test_static's business; here, only the import line
    assert [line for line in out.stdout.splitlines() if line.startswith("<string>:")] == [], out.stdout
