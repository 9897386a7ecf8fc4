"""The C object store under libFuzzer with ASan and UBSan (native/fuzz, docs/fuzzing.rst).

Builds the harness with clang, replays the committed corpus (tests/fuzz/objstore_corpus:
seeds and every input that once found a bug), then fuzzes for a bounded time
(OBJSTORE_FUZZ_SECONDS, default 30: with the build and the replay, under a minute) from a
copy of it. Any crash, sanitizer report, broken invariant, leak or timeout fails the test
with libFuzzer's report. Needs clang and libFuzzer's runtime (.ci/system-deps): skipped
without them, a failure under CI=true.

Regions: the harness names them ``<prefix>-<pid>-<n>`` with this run's prefix, and removes
each before the next input; whatever a crashed run left is removed here (and the module's
leak check would name it).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from scaler_testing import missing_system, requires_system

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "fuzz" / "build_fuzz.sh"
CORPUS = ROOT / "tests" / "fuzz" / "objstore_corpus"
FAILURE_MARKS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "ERROR: libFuzzer",
    "runtime error:",
    "invariant broken",
)


def _missing_libfuzzer() -> str | None:
    """Why clang cannot link a libFuzzer binary here, or None."""
    reason = missing_system(("clang",))
    if reason is not None:
        return reason
    run = subprocess.run(
        ["clang", "--print-runtime-dir"], check=False, capture_output=True, text=True, timeout=30
    )
    runtime_dir = Path(run.stdout.strip())
    if not list(runtime_dir.glob("libclang_rt.fuzzer-*.a")) and not list(
        runtime_dir.glob("libclang_rt.fuzzer.a")
    ):
        return (
            f"needs libFuzzer's runtime (libclang_rt.fuzzer, none in {runtime_dir}): "
            "install libclang-rt-14-dev (.ci/system-deps)"
        )
    return None


def _run(binary: Path, args: list[str], env: dict[str, str], timeout: float) -> str:
    # Through a shell that forks it (the ``exit`` stops the shell from exec'ing it in its
    # place): libFuzzer's RSS limit reads the peak RSS (getrusage), which Linux carries
    # across exec from the forking process's memory — a pytest process grown to 3 GB by the
    # whole suite made the fuzzer report "out-of-memory" before its first input.
    run = subprocess.run(
        ["/bin/sh", "-c", '"$@"; exit $?', "sh", str(binary), *args],
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=env,
    )
    report = run.stdout
    assert run.returncode == 0, report[-6000:]
    assert not [m for m in FAILURE_MARKS if m in report], report[-6000:]
    return report


def test_fuzz_objstore(tmp_path: Path, region_name: Callable[[], str]) -> None:
    requires_system(_missing_libfuzzer())
    binary = tmp_path / "fuzz_objstore"
    build = subprocess.run(
        [str(BUILD), str(binary)], check=False, capture_output=True, text=True, timeout=240
    )
    assert build.returncode == 0, build.stdout + build.stderr
    prefix = region_name()
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    env = dict(
        os.environ,
        OBJSTORE_FUZZ_PREFIX=prefix,
        OBJSTORE_FUZZ_FALLBACK=str(fallback),
        ASAN_OPTIONS="detect_leaks=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    seconds = int(os.environ.get("OBJSTORE_FUZZ_SECONDS", "30"))
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work)
    assert len(list(work.iterdir())) > 10, f"the corpus {CORPUS} is missing"
    common = ["-timeout=30", "-max_len=1024", f"-artifact_prefix={artifacts}/"]
    try:
        # the committed corpus, each input once: seeds and the inputs of every bug found
        _run(binary, [*common, "-runs=0", str(work)], env, timeout=240)
        report = _run(
            binary, [*common, f"-max_total_time={seconds}", str(work)], env, timeout=seconds + 240
        )
    finally:
        left = glob.glob(f"/dev/shm/{prefix}-*") + [str(p) for p in fallback.iterdir()]
        for path in left:
            os.unlink(path)
    assert not list(artifacts.iterdir()), f"libFuzzer wrote artifacts: {list(artifacts.iterdir())}"
    done = [line for line in report.splitlines() if "DONE" in line or line.startswith("Done ")]
    print("\n".join(done))  # executions and coverage of this run, for the log
    assert done, report[-3000:]
