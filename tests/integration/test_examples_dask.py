"""``examples/dask_array_reduction.py`` and ``examples/dask_delayed_pipeline.py`` run end to end.

Each runs in a fresh interpreter (as a user would run it) with a timeout; the test
checks the lines it prints, including the comparison with Dask's own scheduler.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dask")
pytest.importorskip("dask.array")
pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.timeout(180)
def test_dask_array_reduction_example() -> None:
    out = run_example("dask_array_reduction.py")
    assert re.search(r"^cluster ready in [\d.]+ s$", out, re.MULTILINE), out
    assert re.search(r"^array: 2000x2000 in 16 chunks of 500x500$", out, re.MULTILINE), out
    assert re.search(
        r"^scaler-executor: [\d.]+ s, synchronous dask: [\d.]+ s$", out, re.MULTILINE
    ), out
    mean = re.search(r"^result: shape \(2000,\), mean ([\d.]+), first [\d.]+$", out, re.MULTILINE)
    assert mean and abs(float(mean.group(1)) - 1.0) < 0.01, out  # mean of (x + x.T) for x ~ U(0, 1)
    assert re.search(r"^matches dask's synchronous scheduler: True$", out, re.MULTILINE), out
    total = re.search(r"^sum of x: ([\d.]+)$", out, re.MULTILINE)
    assert total and abs(float(total.group(1)) - 2_000_000) < 10_000, out


@pytest.mark.timeout(180)
def test_dask_delayed_pipeline_example() -> None:
    out = run_example("dask_delayed_pipeline.py")
    assert re.search(r"^cluster ready in [\d.]+ s$", out, re.MULTILINE), out
    assert re.search(
        r"^8 loads of 0.25 s each on 2 workers: [\d.]+ s \(serial: 2.00 s\)$", out, re.MULTILINE
    ), out
    kept = [v for v in range(8000) if v % 7]
    assert f"summary: count={len(kept)} mean={sum(kept) / len(kept):.1f}" in out, out
    hist = {r: sum(1 for v in kept if v % 7 == r) for r in range(1, 7)}
    assert f"histogram of v % 7: {hist}" in out, out
