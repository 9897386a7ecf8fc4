"""The C unit tests (native/test_objstore.c, test_objstore_commit.c, test_support.c), built
and run under ASan and UBSan."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"
LIBRARY = ["objstore.c", "os_alloc.c", "os_journal.c", "os_region.c", "os_numpy.c"]
SOURCES = ["test_objstore.c", "test_objstore_commit.c", "test_support.c", *LIBRARY]
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "SUMMARY:")


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_unit_tests_under_sanitizers(tmp_path: Path, region_name: Callable[[], str]) -> None:
    binary = tmp_path / "test_objstore"
    build = subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined",
            "-g",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{NATIVE}",
            *[str(NATIVE / s) for s in SOURCES],
            "-o",
            str(binary),
            "-lrt",
            "-lpthread",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert build.returncode == 0, build.stderr
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    env = dict(
        os.environ,
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=24",
    )
    run = subprocess.run(
        [str(binary), region_name(), str(fallback)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert not [m for m in SANITIZER_MARKS if m in report], report
    assert "all C object store tests passed" in run.stdout
    assert not list(fallback.iterdir()), "file-backed regions left behind"


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_damaged_region_tests_under_sanitizers(
    tmp_path: Path, region_name: Callable[[], str]
) -> None:
    """native/test_damage.c: a region whose layout, undo journal, block headers or index
    were damaged (what the fuzzer found, native/fuzz) is refused, never followed."""
    binary = tmp_path / "test_damage"
    sources = ["test_damage.c", "test_support.c", *LIBRARY]
    build = subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined",
            "-g",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{NATIVE}",
            *[str(NATIVE / s) for s in sources],
            "-o",
            str(binary),
            "-lrt",
            "-lpthread",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert build.returncode == 0, build.stderr
    env = dict(
        os.environ,
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=24",
    )
    run = subprocess.run(
        [str(binary), region_name()],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert not [m for m in SANITIZER_MARKS if m in report], report
    assert "all damaged-region tests passed" in run.stdout
