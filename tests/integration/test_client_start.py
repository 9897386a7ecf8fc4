"""An embedded executor's client starts on a thread of its own (client/start.py).

The constructor returns once the daemon is started; the first use waits for the client.
What must hold whatever the timing: a client that cannot start breaks the executor with
a clear error and leaves no process behind; many threads may make the first use at once;
a fork right after the constructor gets a child whose imports work; an interpreter that
exits right after the constructor stops everything it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from typing import Any

import psutil
import pytest
from scaler_testing import child_env

from scaler_executor import ScalerExecutor

pytestmark = pytest.mark.timeout(120)


def run_script(
    tmp_path: Any, source: str, timeout: float = 60.0
) -> tuple[dict[str, Any], list[int]]:
    """Run ``source`` in a fresh interpreter; (its last stdout line as JSON, the pids of the
    processes it had started, which the caller expects gone)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    out = subprocess.run(
        [sys.executable, str(script)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    return record, record.get("children", [])


def assert_gone(pids: list[int], timeout: float = 15.0) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        p.kill()
    assert not alive, f"still running after the script ended: {alive}"


def test_a_client_that_cannot_start_breaks_the_executor_and_stops_its_cluster(
    tmp_path: Any,
) -> None:
    """The agent's module cannot be imported (a finder refuses it): every use raises
    BrokenScalerExecutor caused by that ImportError, shutdown() is quiet, and the daemon and
    workers are gone although no agent ever existed to stop them."""
    record, children = run_script(
        tmp_path,
        """
        import json, sys, time
        import psutil

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "scaler_executor.client.agent":
                    raise ImportError("refused by the test")
                return None

        sys.meta_path.insert(0, Refuse())
        from scaler_executor import ScalerExecutor
        from scaler_executor.exceptions import BrokenScalerExecutor

        ex = ScalerExecutor(max_workers=1)
        procs = psutil.Process().children(recursive=True)
        children = [p.pid for p in procs]
        errors = []
        for use in (lambda: ex.submit(abs, -1), lambda: list(ex.map(abs, [1])), lambda: ex.get({"a": 1}, "a")):
            try:
                use()
                errors.append("no error")
            except BrokenScalerExecutor as exc:
                errors.append(f"{exc} | cause: {exc.__cause__!r}")
        ex.shutdown()
        # Gone now, not only once this interpreter exits (its daemon would notice that).
        _, alive = psutil.wait_procs(procs, timeout=15)
        alive = [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        print(json.dumps({"errors": errors, "repr": repr(ex), "children": children, "alive": alive}))
        """,
    )
    assert len(record["errors"]) == 3
    for error in record["errors"]:
        assert "could not start" in error and "refused by the test" in error, error
        assert "cause: ImportError('refused by the test')" in error, error
    assert "its client did not start" in record["repr"]
    assert record["children"], "the embedded cluster started no process"
    assert record["alive"] == [], "the cluster outlived its executor's failed start"
    assert_gone(children)


def test_many_threads_make_the_first_use_at_once() -> None:
    ex = ScalerExecutor(max_workers=2)
    try:
        barrier = threading.Barrier(8)
        results: list[Any] = [None] * 8

        def first_use(i: int) -> None:
            barrier.wait()
            results[i] = ex.submit(pow, i, 2).result(timeout=60)

        threads = [threading.Thread(target=first_use, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert results == [i * i for i in range(8)]
    finally:
        ex.shutdown()


def test_a_fork_right_after_the_constructor_gets_a_child_whose_imports_work(tmp_path: Any) -> None:
    """The fork waits for the client's start: the child finds the client's modules whole,
    never one half-imported with its lock held by a thread the child does not have (an
    import of it in the child would wait forever)."""
    record, children = run_script(
        tmp_path,
        """
        import json, os, sys
        import psutil
        from scaler_executor import ScalerExecutor

        ex = ScalerExecutor(max_workers=1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                # The fork waited for the start: the module is there whole, before any import.
                agent = sys.modules.get("scaler_executor.client.agent")
                state = "absent" if agent is None else "whole" if hasattr(agent, "ClientAgent") else "partial"
            except BaseException as exc:
                state = repr(exc)
            os.write(w, state.encode())
            os._exit(0)
        os.close(w)
        child = os.read(r, 200).decode()
        os.waitpid(pid, 0)
        children = [p.pid for p in psutil.Process().children(recursive=True)]
        answer = ex.submit(abs, -5).result(timeout=60)
        ex.shutdown()
        print(json.dumps({"child": child, "answer": answer, "children": children}))
        """,
    )
    assert record == {"child": "whole", "answer": 5, "children": children}
    assert_gone(children)


def test_an_interpreter_that_exits_right_after_the_constructor_stops_its_cluster(
    tmp_path: Any,
) -> None:
    record, children = run_script(
        tmp_path,
        """
        import json
        import psutil
        from scaler_executor import ScalerExecutor

        ex = ScalerExecutor(max_workers=2)
        children = [p.pid for p in psutil.Process().children(recursive=True)]
        print(json.dumps({"children": children}))
        """,
    )
    assert record["children"], "the embedded cluster started no process"
    assert_gone(children)
