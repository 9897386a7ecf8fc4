"""What a task's exception looks like in the client.

* An exception that cannot be pickled in the worker arrives as its own type, rebuilt from
  its arguments (or its message), with the remote traceback as ``__cause__``; only one
  whose type cannot be built that way arrives as ``RemoteError``.
* Remote tracebacks of by-value functions (``__main__``'s: here, a script run as a
  program) name the real file and line and show the source, and are printed once.
* A write into a read-only view of a large argument names the fix.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest
from scaler_testing import child_env

from scaler_executor import ScalerExecutor
from scaler_executor.exceptions import RemoteError, RemoteTraceback

pytestmark = pytest.mark.timeout(120)


def deep(n: int) -> int:
    return deep(n + 1) + 1


class Holding(Exception):
    """An exception with an attribute that does not pickle (a lock) and one that does."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message, code)
        self.lock = threading.Lock()
        self.code = code


class Unbuildable(Exception):
    """Needs a keyword its args do not carry: it cannot be rebuilt."""

    def __init__(self, *, reason: str) -> None:
        super().__init__()
        self.reason = reason
        self.lock = threading.Lock()


def raise_holding() -> None:
    raise Holding("holds a lock", 7)


def raise_oserror() -> None:
    raise OSError(errno.ENOENT, "No such file or directory", "/no/such/file")


def raise_unpicklable_oserror() -> None:
    exc = PermissionError(errno.EACCES, "Permission denied", "/root/secret")
    exc.handle = threading.Lock()  # type: ignore[attr-defined]
    raise exc


def raise_too_deep() -> None:
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    raise ValueError(nested)  # pickling its args recurses past the limit


def raise_unbuildable() -> None:
    raise Unbuildable(reason="no")


def remote_text(exc: BaseException) -> str:
    cause = exc.__cause__
    assert isinstance(cause, RemoteTraceback), repr(cause)
    return cause.tb


def test_deep_recursion_arrives_as_recursion_error(executor: ScalerExecutor) -> None:
    with pytest.raises(RecursionError) as info:
        executor.submit(deep, 0).result(timeout=60)
    text = remote_text(info.value)
    assert "in deep" in text and "Previous line repeated" in text


def test_an_exception_with_an_unpicklable_attribute_keeps_its_type(executor: ScalerExecutor) -> None:
    with pytest.raises(Holding) as info:
        executor.submit(raise_holding).result(timeout=30)
    exc = info.value
    assert exc.args == ("holds a lock", 7) and exc.code == 7  # rebuilt from its args; code travelled
    text = remote_text(exc)
    assert "raise_holding" in text and "could not be pickled" in text and "rebuilt from its arguments" in text


def test_oserror_keeps_errno_strerror_and_filename(executor: ScalerExecutor) -> None:
    with pytest.raises(FileNotFoundError) as info:
        executor.submit(raise_oserror).result(timeout=30)
    assert (info.value.errno, info.value.strerror, info.value.filename) == (
        errno.ENOENT, "No such file or directory", "/no/such/file",
    )
    with pytest.raises(PermissionError) as rebuilt:
        executor.submit(raise_unpicklable_oserror).result(timeout=30)
    exc = rebuilt.value
    assert (exc.errno, exc.strerror, exc.filename) == (errno.EACCES, "Permission denied", "/root/secret")
    assert "could not be pickled" in remote_text(exc)


def test_arguments_too_deep_to_pickle_rebuild_from_the_message(executor: ScalerExecutor) -> None:
    with pytest.raises(ValueError) as info:
        executor.submit(raise_too_deep).result(timeout=60)
    assert "deep recursion" in remote_text(info.value)  # cloudpickle: "excessively deep recursion required"


def test_only_an_unbuildable_exception_is_a_remote_error(executor: ScalerExecutor) -> None:
    with pytest.raises(RemoteError) as info:
        executor.submit(raise_unbuildable).result(timeout=30)
    assert info.value.type_name.endswith("Unbuildable")
    assert "raise_unbuildable" in remote_text(info.value)


def test_a_write_into_a_read_only_argument_names_the_fix(executor: ScalerExecutor) -> None:
    def write(a: np.ndarray) -> None:
        a[0] = 1.0

    def write_memoryview(a: np.ndarray) -> None:
        memoryview(a)[0] = 1.0

    big = np.zeros(1 << 17)  # 1 MiB: through the object store, a read-only view
    for fn, kind in ((write, ValueError), (write_memoryview, TypeError)):
        with pytest.raises(kind, match="read-only") as info:
            executor.submit(fn, big).result(timeout=30)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "ex.options(writable=True)" in notes and "np.array(x)" in notes, notes
    with pytest.raises(ValueError, match="read-only") as chunked:
        list(executor.map(write, [big, big], chunksize=2))
    assert "ex.options(writable=True)" in "\n".join(getattr(chunked.value, "__notes__", []))
    # A small array arrives writable; an error about a read-only array the task made itself
    # gets no note about arguments.
    def own_read_only(n: int) -> None:
        a = np.zeros(n)
        a.flags.writeable = False
        a[0] = 1.0

    with pytest.raises(ValueError, match="read-only") as own:
        executor.submit(own_read_only, 4).result(timeout=30)
    assert not getattr(own.value, "__notes__", [])
    assert executor.options(writable=True).submit(write, big).result(timeout=30) is None


SCRIPT = textwrap.dedent(
    '''
    import traceback
    from scaler_executor import ClusterConfig, ScalerExecutor

    def divide(x):
        return 1 / x  # the line the traceback must show

    if __name__ == "__main__":
        with ScalerExecutor(max_workers=1, config=ClusterConfig(heartbeat_interval=0.1)) as ex:
            future = ex.submit(divide, 0)
            try:
                future.result()
            except ZeroDivisionError:
                traceback.print_exc()
            print("UNCAUGHT", flush=True)
            import sys
            sys.stderr.write("UNCAUGHT\\n")
            ex.submit(divide, 0).result()
    '''
)


def test_main_functions_tracebacks_show_file_line_and_source_once(tmp_path: Any) -> None:
    script = tmp_path / "program.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, timeout=90, cwd=tmp_path)
    assert run.returncode == 1, run.stderr.decode()
    printed, uncaught = run.stderr.decode().split("UNCAUGHT\n")
    for text in (printed, uncaught):
        assert "<dynamic-code>" not in text, text
        assert f'File "{script}", line 6, in divide' in text, text
        assert "return 1 / x  # the line the traceback must show" in text, text
        assert text.count("in divide") == 1, text  # the remote traceback once, not twice
        assert "worker/processor.py" not in text, text  # no frame of the processor's own
        assert text.rstrip().endswith("ZeroDivisionError: division by zero"), text


def test_sources_the_worker_cannot_show_come_from_the_client(tmp_path: Any, executor: ScalerExecutor) -> None:
    """A by-value function whose file the worker cannot read (gone by the time it fails):
    the client fills in the line from its own linecache."""
    source = "def gone(x):\n    raise KeyError(x)  # from the client's linecache\n"
    path = str(tmp_path / "vanishing.py")
    code = compile(source, path, "exec")
    namespace: dict[str, Any] = {"__name__": "__main__"}  # by value, as __main__'s are
    exec(code, namespace)
    import linecache

    linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # the client has it
    assert not os.path.exists(path)  # nobody else does
    with pytest.raises(KeyError) as info:
        executor.submit(namespace["gone"], 3).result(timeout=30)
    text = remote_text(info.value)
    assert f'File "{path}", line 2, in gone' in text
    assert "raise KeyError(x)  # from the client's linecache" in text
