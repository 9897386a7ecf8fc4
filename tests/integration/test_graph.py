"""``ScalerExecutor.get`` on plain dict graphs, and futures passed as arguments.

Graphs follow Dask's specification (legacy form): a task is a tuple with a callable
first; keys may appear anywhere in a task's arguments, nested in lists, tuples and
dicts; a value that is a key is an alias; anything else is a literal.  ``get`` returns
results in the nested shape of ``keys`` (a list of keys gives a tuple, as Dask's own
schedulers do).  Dask's newer task objects and Dask itself are in ``test_dask.py``.

Tasks report through marker files; the test waits for states by polling with a
deadline (``wait_until``), never by sleeping.  Every test uses the module's
``executor`` (2 processors) and leaves no task behind in the daemon.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from scaler_testing import wait_until

from scaler_executor import ScalerExecutor
from scaler_executor.exceptions import RemoteTraceback

# --------------------------------------------------------------------------- task functions
# Module level: workers import them from this module (pickled by reference).


class CustomError(ValueError):
    pass


def inc(x: int) -> int:
    return x + 1


def add(x: Any, y: Any) -> Any:
    return x + y


def identity(x: Any) -> Any:
    return x


def collect(*args: Any, **kwargs: Any) -> Any:
    return (args, kwargs) if kwargs else args


def total(values: list[int]) -> int:
    return sum(values)


def fail(message: str) -> int:
    raise CustomError(message)


def touch(path: str, value: Any = None) -> Any:
    Path(path).write_text("ran")
    return value


def wait_for_file(path: str, value: Any = None, timeout: float = 60.0) -> Any:
    """Block until ``path`` exists (the test creates it to release the task)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was never created")
        time.sleep(0.005)
    return value


def announce_then_wait(started: str, release: str, value: Any) -> Any:
    """Say it started (``started`` appears), then block until ``release`` exists."""
    Path(started).write_text("running")
    return wait_for_file(release, value)


def touch_then_inc(path: str, x: int) -> int:
    Path(path).write_text("ran")
    return x + 1


@dataclasses.dataclass
class Pair:
    left: Any
    right: Any


def unpack_pair(pair: Pair) -> tuple[Any, Any]:
    return pair.left, pair.right


def daemon_tasks(ex: ScalerExecutor) -> int:
    return int(ex.statistics()["tasks"])


@pytest.fixture
def ex(executor: ScalerExecutor) -> ScalerExecutor:
    """The module's executor; each test must leave the daemon with no task."""
    assert wait_until(lambda: daemon_tasks(executor) == 0, timeout=10), (
        "a previous test left tasks behind"
    )
    return executor


# =========================================================================== graph semantics


@pytest.mark.timeout(60)
def test_task_tuple_and_literal(ex: ScalerExecutor) -> None:
    dsk = {"x": 1, "y": (inc, "x"), "z": (add, "y", 10)}
    assert ex.get(dsk, "z") == 12
    assert ex.get(dsk, "x") == 1  # a literal value is returned as is
    assert ex.get(dsk, "y") == 2


@pytest.mark.timeout(60)
def test_keys_nested_in_lists_tuples_and_dicts(ex: ScalerExecutor) -> None:
    dsk = {
        "a": 1,
        "b": (inc, "a"),
        "c": (collect, ["a", {"k": "b", "deep": [("a", "b")]}, ("b", ["a"])]),
    }
    assert ex.get(dsk, "c") == ([1, {"k": 2, "deep": [(1, 2)]}, (2, [1])],)


@pytest.mark.timeout(60)
def test_nested_tasks(ex: ScalerExecutor) -> None:
    dsk = {
        "x": 10,
        "y": (add, (inc, 1), "x"),
        "z": (total, [(inc, "x"), (inc, (inc, "y")), (add, (inc, 0), (inc, "x"))]),
    }
    assert ex.get(dsk, "y") == 12
    assert ex.get(dsk, "z") == 11 + 14 + 12


@pytest.mark.timeout(60)
def test_literal_arguments_stay_literal(ex: ScalerExecutor) -> None:
    dsk = {
        "x": "value",
        # "hello" and "missing" are not keys: strings; 3.5 and None: data; the list is data.
        "y": (collect, "hello", "x", 3.5, None, ["missing", "x"], {"x": "x"}),
    }
    assert ex.get(dsk, "y") == ("hello", "value", 3.5, None, ["missing", "value"], {"x": "value"})


@pytest.mark.timeout(60)
def test_literal_data_values(ex: ScalerExecutor) -> None:
    dsk = {"list": [1, 2, 3], "dict": {"a": 1}, "sum": (total, "list")}
    assert ex.get(dsk, ["list", "dict", "sum"]) == ([1, 2, 3], {"a": 1}, 6)


@pytest.mark.timeout(60)
def test_aliases_and_alias_chains(ex: ScalerExecutor) -> None:
    dsk = {
        "x": 1,
        "y": (inc, "x"),
        "alias": "y",
        "alias2": "alias",
        "alias3": "alias2",
        "after": (inc, "alias3"),
        "literal_alias": "x",
    }
    assert ex.get(dsk, "alias3") == 2
    assert ex.get(dsk, ["alias", "alias2", "after", "literal_alias"]) == (2, 2, 3, 1)


@pytest.mark.timeout(60)
def test_tuple_keys(ex: ScalerExecutor) -> None:
    dsk = {
        ("x", 0): 1,
        ("x", 1): (inc, ("x", 0)),
        ("sum", 0): (add, ("x", 0), ("x", 1)),
        ("list", 0): (collect, [("x", 0), ("x", 1)]),
        ("alias", 0): ("sum", 0),
    }
    assert ex.get(dsk, ("sum", 0)) == 3
    assert ex.get(dsk, [("x", 0), ("alias", 0), ("list", 0)]) == (1, 3, ([1, 2],))


@pytest.mark.timeout(60)
def test_results_in_the_nested_shape_of_keys(ex: ScalerExecutor) -> None:
    dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b")}
    assert ex.get(dsk, "c") == 3
    assert ex.get(dsk, ["c"]) == (3,)
    assert ex.get(dsk, ["a", "b", "c"]) == (1, 2, 3)
    assert ex.get(dsk, [["a", "b"], ["c"], [], "a"]) == ((1, 2), (3,), (), 1)
    assert ex.get(dsk, [[["c"]]]) == (((3,),),)
    assert ex.get(dsk, ["c", "c"]) == (3, 3)  # a key asked twice
    assert ex.get(dsk, []) == ()


@pytest.mark.timeout(60)
def test_missing_key_raises_key_error(ex: ScalerExecutor) -> None:
    dsk = {"a": 1, "b": (inc, "a")}
    with pytest.raises(KeyError, match="nope"):
        ex.get(dsk, "nope")
    with pytest.raises(KeyError, match="nope"):
        ex.get(dsk, ["b", ["nope"]])
    assert ex.get(dsk, "b") == 2  # still usable


@pytest.mark.timeout(60)
def test_options_apply_to_the_graph(ex: ScalerExecutor) -> None:
    dsk = {"a": 1, "b": (inc, "a")}
    assert ex.get(dsk, "b", priority=3, max_retries=0) == 2
    assert ex.options(priority=1).get(dsk, ["a", "b"]) == (1, 2)


# --------------------------------------------------------------------------- failures


@pytest.mark.timeout(60)
def test_failure_raises_the_original_exception(ex: ScalerExecutor) -> None:
    with pytest.raises(CustomError, match="boom") as info:
        ex.get({"bad": (fail, "boom")}, "bad")
    assert isinstance(info.value.__cause__, RemoteTraceback)


@pytest.mark.timeout(60)
def test_failing_intermediate_fails_only_its_dependents(ex: ScalerExecutor, tmp_path: Path) -> None:
    never = tmp_path / "dependent-ran"
    other = tmp_path / "independent-ran"
    dsk = {
        "bad": (fail, "intermediate failed"),
        "mid": (touch_then_inc, str(never), "bad"),
        "top": (inc, "mid"),
        "ok": (touch, str(other), 7),
    }
    with pytest.raises(CustomError, match="intermediate failed") as info:
        ex.get(dsk, ["top", "ok"])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "did not run" in notes, notes
    # The independent branch still ran; the daemon then forgets every task of the graph,
    # after which a dependent of the failure can no longer run.
    assert wait_until(other.exists, timeout=10)
    assert wait_until(lambda: daemon_tasks(ex) == 0, timeout=10)
    assert not never.exists()
    # The keys that do not depend on the failure can be computed from the same graph.
    assert ex.get(dsk, "ok") == 7


# --------------------------------------------------------------------------- cycles, culling


@pytest.mark.timeout(60)
def test_cycle_is_an_error_naming_a_key_on_it(ex: ScalerExecutor) -> None:
    dsk = {"start": (inc, "a"), "a": (inc, "b"), "b": (inc, "c"), "c": (add, 1, "a"), "x": 1}
    with pytest.raises(ValueError, match="cycle") as info:
        ex.get(dsk, "start")
    assert any(repr(k) in str(info.value) for k in ("a", "b", "c")), str(info.value)
    assert "'start'" not in str(info.value)  # start leads into the cycle but is not on it
    # A cycle the requested keys do not need is culled away, not an error.
    assert ex.get(dsk, "x") == 1


@pytest.mark.timeout(60)
def test_self_reference_is_a_cycle(ex: ScalerExecutor) -> None:
    with pytest.raises(ValueError, match="cycle") as info:
        ex.get({"a": (inc, "a")}, "a")
    assert "'a'" in str(info.value)


@pytest.mark.timeout(60)
def test_alias_cycle_is_an_error(ex: ScalerExecutor) -> None:
    with pytest.raises(ValueError, match="cycle"):
        ex.get({"a": "b", "b": "a"}, "a")


@pytest.mark.timeout(60)
def test_keys_not_needed_never_run(ex: ScalerExecutor, tmp_path: Path) -> None:
    unneeded = tmp_path / "unneeded"
    needed = tmp_path / "needed"
    dsk = {
        "x": 1,
        "unneeded": (touch, str(unneeded)),
        "unneeded-child": (inc, "unneeded"),
        "needed": (touch, str(needed), 41),
        "y": (add, "x", "needed"),
    }
    assert ex.get(dsk, "y") == 42
    assert needed.exists()  # the marker mechanism works
    assert daemon_tasks(ex) == 0  # nothing else was sent: nothing left that could still run it
    assert not unneeded.exists()


# --------------------------------------------------------------------------- memory


@pytest.mark.timeout(60)
def test_intermediates_freed_after_get(ex: ScalerExecutor) -> None:
    dsk: dict[Any, Any] = {("leaf", i): (inc, i) for i in range(50)}
    dsk.update({("mid", i): (add, ("leaf", i), ("leaf", (i + 1) % 50)) for i in range(50)})
    dsk["top"] = (total, [("mid", i) for i in range(50)])
    assert ex.get(dsk, "top") == 2 * sum(range(1, 51))
    assert daemon_tasks(ex) == 0


@pytest.mark.timeout(60)
def test_intermediates_freed_while_the_graph_runs(ex: ScalerExecutor, tmp_path: Path) -> None:
    """In a chain whose last task blocks, the finished links are already freed."""
    started, release = tmp_path / "started", tmp_path / "release"
    n = 100
    dsk: dict[Any, Any] = {"c0": 0}
    for i in range(1, n):
        dsk[f"c{i}"] = (inc, f"c{i - 1}")
    dsk["last"] = (announce_then_wait, str(started), str(release), f"c{n - 1}")
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(ex.get, dsk, "last")
        try:
            # The whole chain before "last" has finished once "last" runs.  Only "last" and
            # the one result it holds (c99) may remain; c1..c98 are needed by nothing.
            assert wait_until(started.exists, timeout=30)
            stats: dict[str, Any] = {}

            def freed() -> bool:
                stats.update(ex.statistics())
                return int(stats["tasks"]) <= 2

            assert wait_until(freed, timeout=10), f"finished intermediates still held: {stats}"
        finally:
            release.write_text("go")
        assert result.result(timeout=30) == n - 1
    assert daemon_tasks(ex) == 0


# --------------------------------------------------------------------------- size


@pytest.mark.timeout(300)
def test_chain_of_10000_nodes(ex: ScalerExecutor) -> None:
    n = 10_000
    dsk: dict[Any, Any] = {"c0": 0}
    for i in range(1, n):
        dsk[f"c{i}"] = (inc, f"c{i - 1}")
    start = time.perf_counter()
    assert ex.get(dsk, f"c{n - 1}") == n - 1
    elapsed = time.perf_counter() - start
    print(f"10,000-node chain: {elapsed:.2f} s ({elapsed / n * 1e3:.2f} ms per node)")
    assert daemon_tasks(ex) == 0


@pytest.mark.timeout(120)
def test_deeply_nested_keys_argument(ex: ScalerExecutor) -> None:
    """A 5,000-deep nesting of key lists needs no recursion either."""
    keys: list[Any] = ["a"]
    for _ in range(5000):
        keys = [keys]
    result = ex.get({"a": (inc, 1)}, keys)
    for _ in range(5001):
        assert type(result) is tuple and len(result) == 1
        result = result[0]
    assert result == 2


def tree_graph(leaves: int) -> tuple[dict[Any, Any], Any]:
    """A pairwise reduction of ``leaves`` leaves; returns (graph, root key)."""
    dsk: dict[Any, Any] = {("leaf", i): (identity, i) for i in range(leaves)}
    level, keys = 0, [("leaf", i) for i in range(leaves)]
    while len(keys) > 1:
        level += 1
        nxt = []
        for j in range(0, len(keys), 2):
            pair = keys[j : j + 2]
            key = ("sum", level, j // 2)
            dsk[key] = (operator.add, *pair) if len(pair) == 2 else (identity, pair[0])
            nxt.append(key)
        keys = nxt
    return dsk, keys[0]


@pytest.mark.timeout(120)
def test_tree_reduction_of_1000_nodes(ex: ScalerExecutor) -> None:
    dsk, root = tree_graph(500)
    assert len(dsk) >= 999
    start = time.perf_counter()
    assert ex.get(dsk, root) == sum(range(500))
    print(f"{len(dsk)}-node tree reduction: {time.perf_counter() - start:.2f} s")
    assert daemon_tasks(ex) == 0


@pytest.mark.timeout(120)
def test_repeated_gets_of_the_same_graph(ex: ScalerExecutor) -> None:
    """Running a graph again (on a warm cluster) gives the same answer every time."""
    dsk: dict[Any, Any] = {"c0": 0}
    for i in range(1, 300):
        dsk[f"c{i}"] = (inc, f"c{i - 1}")
    for _ in range(5):
        assert ex.get(dsk, "c299") == 299
    assert daemon_tasks(ex) == 0


# =========================================================================== futures as arguments


@pytest.mark.timeout(60)
def test_future_as_argument(ex: ScalerExecutor) -> None:
    assert ex.submit(inc, ex.submit(inc, 1)).result(timeout=30) == 3


@pytest.mark.timeout(60)
def test_futures_nested_in_containers_and_dataclasses(ex: ScalerExecutor) -> None:
    a, b, c = ex.submit(inc, 0), ex.submit(inc, 1), ex.submit(inc, 2)
    nested = ex.submit(collect, [a, (b, {"k": c, "l": [a]})], key={"c": c})
    assert nested.result(timeout=30) == (([1, (2, {"k": 3, "l": [1]})],), {"key": {"c": 3}})
    pair = ex.submit(unpack_pair, Pair(a, Pair(b, [c])))
    left, right = pair.result(timeout=30)
    assert left == 1 and right == Pair(2, [3])


@pytest.mark.timeout(60)
def test_chain_of_futures(ex: ScalerExecutor) -> None:
    f = ex.submit(inc, 0)
    for _ in range(199):
        f = ex.submit(inc, f)
    assert f.result(timeout=50) == 200


@pytest.mark.timeout(60)
def test_dependent_does_not_wait_on_the_client(ex: ScalerExecutor, tmp_path: Path) -> None:
    gate, done = tmp_path / "gate", tmp_path / "dependent-done"
    f = ex.submit(wait_for_file, str(gate), 20)
    g = ex.submit(touch_then_inc, str(done), f)
    assert not f.done() and not g.done()
    gate.write_text("go")
    # g runs on f's value inside the cluster; this thread never asks for f's result.
    assert wait_until(done.exists, timeout=30)
    assert g.result(timeout=30) == 21
    assert f.result() == 20


@pytest.mark.timeout(60)
def test_failed_dependency_fails_the_dependent_unrun(ex: ScalerExecutor, tmp_path: Path) -> None:
    gate, never = tmp_path / "gate", tmp_path / "dependent-ran"
    blocker = ex.submit(wait_for_file, str(gate), "dependency broke")
    f = ex.submit(fail, blocker)  # still pending when g is submitted: resolved in the cluster
    g = ex.submit(touch_then_inc, str(never), f)
    gate.write_text("go")
    with pytest.raises(CustomError, match="dependency broke") as info:
        g.result(timeout=30)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "dependency" in notes and "did not run" in notes, notes
    assert isinstance(info.value.__cause__, RemoteTraceback)  # the original failure's traceback
    with pytest.raises(CustomError):
        f.result()
    assert wait_until(lambda: daemon_tasks(ex) == 0, timeout=10)
    assert not never.exists()


@pytest.mark.timeout(60)
def test_already_failed_future_as_argument(ex: ScalerExecutor, tmp_path: Path) -> None:
    never = tmp_path / "dependent-ran"
    f = ex.submit(fail, "failed before")
    with pytest.raises(CustomError):
        f.result(timeout=30)
    g = ex.submit(touch_then_inc, str(never), f)
    with pytest.raises(CustomError, match="failed before") as info:
        g.result(timeout=30)
    assert "did not run" in "\n".join(getattr(info.value, "__notes__", []))
    assert not never.exists()


@pytest.mark.timeout(60)
def test_cancelling_a_pending_dependency_cancels_dependents(
    ex: ScalerExecutor, tmp_path: Path
) -> None:
    gate, never = tmp_path / "gate", tmp_path / "dependent-ran"
    blocker = ex.submit(wait_for_file, str(gate), 1)
    f = ex.submit(inc, blocker)  # waits in the daemon for blocker: pending, cancellable
    g = ex.submit(touch_then_inc, str(never), f)
    h = ex.submit(inc, g)
    try:
        assert f.cancel()
        assert wait_until(lambda: g.cancelled() and h.cancelled(), timeout=20), (g, h)
    finally:
        gate.write_text("go")
    assert blocker.result(timeout=30) == 1
    with pytest.raises(CancelledError):
        g.result(timeout=1)
    assert wait_until(lambda: daemon_tasks(ex) == 0, timeout=10)
    assert not never.exists()


@pytest.mark.timeout(60)
def test_cancelled_future_as_argument(ex: ScalerExecutor, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    blocker = ex.submit(wait_for_file, str(gate), 1)
    f = ex.submit(inc, blocker)
    try:
        assert f.cancel()
        g = ex.submit(inc, f)
        with pytest.raises(CancelledError):
            g.result(timeout=20)
    finally:
        gate.write_text("go")
    assert blocker.result(timeout=30) == 1


@pytest.mark.timeout(60)
def test_done_future_as_argument(ex: ScalerExecutor) -> None:
    f = ex.submit(inc, 1)
    assert f.result(timeout=30) == 2
    assert ex.submit(inc, f).result(timeout=30) == 3
    # A finished future that no executor made is just its value.
    plain: Future[int] = Future()
    plain.set_result(41)
    assert ex.submit(total, [plain, f]).result(timeout=30) == 43


@pytest.mark.timeout(60)
def test_pending_future_of_another_executor_is_a_type_error(ex: ScalerExecutor) -> None:
    foreign: Future[int] = Future()
    with pytest.raises(TypeError, match="another executor"):
        ex.submit(inc, foreign).result(timeout=30)
    with ThreadPoolExecutor(1) as pool:
        release = threading.Event()
        pending = pool.submit(release.wait)
        try:
            with pytest.raises(TypeError, match="another executor"):
                ex.submit(collect, {"x": [pending]}).result(timeout=30)
        finally:
            release.set()


@pytest.mark.timeout(120)
def test_pending_future_of_another_scaler_executor_is_a_type_error(
    ex: ScalerExecutor, fresh_executor: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    other = fresh_executor(max_workers=1)
    pending = other.submit(wait_for_file, str(gate), 5)
    try:
        with pytest.raises(TypeError, match="another executor"):
            ex.submit(inc, pending).result(timeout=30)
    finally:
        gate.write_text("go")
    assert pending.result(timeout=30) == 5
