"""The joblib backend's version-sensitive tests under joblib 1.4.x and 1.5.x, not only the installed one.

joblib 1.4 calls ``apply_async`` and has no ``initializer`` for loky; 1.5 calls ``submit`` and
passes ``Parallel``'s extra keywords to the backend.  Each version is installed once with
``pip install --target`` into a cache (inside the virtual environment, else the temp dir),
and a subprocess runs the tests below with it first on ``PYTHONPATH`` (the embedded
cluster's workers inherit that path, so they import the same joblib).  If the package index
cannot be reached the test skips with the reason — except under ``CI=true``, where that is a
failure: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("joblib")

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("1.4.2", "1.5.3")  # the newest patch release of each minor release
# What differs between joblib versions: the entry point and retrieval path, nesting,
# initializer, thread limits, arrays, prefer/require, keywords, exception types.
TESTS = (
    "tests/integration/test_joblib.py::test_results_in_order",
    "tests/integration/test_joblib.py::test_generator_is_lazy_and_ordered",
    "tests/integration/test_joblib.py::test_error_keeps_its_type_message_and_remote_traceback",
    "tests/integration/test_joblib.py::test_retrieval_without_retrieve_callback",
    "tests/integration/test_joblib.py::test_entry_point_used_by_this_joblib",
    "tests/integration/test_joblib.py::test_apply_async_path_with_errors_and_generators",
    "tests/integration/test_joblib.py::test_backend_is_picklable",
    "tests/integration/test_joblib_contract.py::test_nested_parallel_agrees_with_loky",
    "tests/integration/test_joblib_contract.py::test_effective_n_jobs_at_top_level_agrees_with_loky",
    "tests/integration/test_joblib_contract.py"
    "::test_initializer_runs_once_per_process_before_its_first_task_as_loky",
    "tests/integration/test_joblib_contract.py::test_initializer_arguments_are_checked",
    "tests/integration/test_joblib_contract.py"
    "::test_thread_limits_of_the_processes_agree_with_loky[inner_max_num_threads=3]",
    "tests/integration/test_joblib_contract.py"
    "::test_arrays_arrive_writable_or_read_only_as_with_loky[max_nbytes=10K]",
    "tests/integration/test_joblib_contract.py::test_prefer_and_require_agree_with_loky",
    "tests/integration/test_joblib_contract.py::test_a_keyword_the_backend_does_not_take_is_an_error",
    "tests/integration/test_joblib_contract.py"
    "::test_exceptions_keep_their_type_as_with_loky[in nested threads]",
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_unless_ci(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the joblib version tests must run in CI)")
    pytest.skip(reason)


def cache_root() -> Path:
    if sys.prefix != sys.base_prefix:  # a virtual environment: keep it with the environment
        return Path(sys.prefix) / "scaler-test-cache"
    return Path(tempfile.gettempdir()) / f"scaler_executor-test-cache-{os.getuid()}"


def installed_joblib(version: str) -> Path:
    """A directory holding joblib ``version`` alone, installed on first use."""
    target = cache_root() / f"joblib-{version}"
    if (target / f"joblib-{version}.dist-info").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"joblib-{version}-", dir=target.parent))
    try:
        pip = subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                "--disable-pip-version-check", "--timeout", "15", "--retries", "1",
                "--target", str(staging), f"joblib=={version}",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )  # fmt: skip
        if pip.returncode != 0:
            last = (pip.stderr.strip().splitlines() or ["no output"])[-1]
            skip_unless_ci(f"cannot install joblib=={version} from the package index: {last}")
        try:
            staging.rename(target)  # whole or not at all: a half install is never reused
        except OSError:  # another run installed it meanwhile
            if not (target / f"joblib-{version}.dist-info").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", VERSIONS)
def test_joblib_tests_pass_under(version: str) -> None:
    target = installed_joblib(version)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(target), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    probe = subprocess.run(
        [sys.executable, "-c", "import joblib; print(joblib.__version__, joblib.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.split()[0] == version, probe.stdout
    assert probe.stdout.split()[1].startswith(str(target)), probe.stdout
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=-ra",
            *TESTS,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    summary = proc.stdout[-4000:]
    assert proc.returncode == 0, summary + proc.stderr[-2000:]
    assert " passed" in summary and " failed" not in summary, summary
