"""``ScalerExecutor.get`` as a Dask scheduler, on the installed Dask.

``dask.compute(x, scheduler=ex.get)`` and ``dask.config.set(scheduler=ex.get)`` for
``dask.delayed``, ``dask.array``, ``dask.bag`` and (when it imports) ``dask.dataframe``,
each compared with Dask's own synchronous scheduler.

What the installed Dask hands a scheduler is checked first (``test_what_dask_hands_the_
scheduler``): recent releases build their graphs from the *task spec* classes of
``dask._task_spec`` (``Task``, ``Alias``, ``DataNode``, ``List``…, no legacy tuples), and
since Dask 2025 ``dask.compute`` passes the scheduler an expression object with
``__dask_graph__()`` rather than a dict.  The same graphs are also given to ``ex.get``
already materialised (``test_materialised_*``), and hand-built task-spec graphs test the
duck typing directly.  The package itself must not import Dask.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
np = pytest.importorskip("numpy")
da = pytest.importorskip("dask.array")
db = pytest.importorskip("dask.bag")
from numpy.testing import assert_allclose

from scaler_executor import ScalerExecutor

ROOT = Path(__file__).resolve().parents[2]
TASK_SPEC_NAMES = {"Task", "Alias", "DataNode", "List", "Dict", "Tuple", "Set"}


# --------------------------------------------------------------------------- task functions


class CustomError(ValueError):
    pass


def inc(x: int) -> int:
    return x + 1


def add(x: Any, y: Any) -> Any:
    return x + y


def load(i: int) -> list[int]:
    return list(range(i * 100, (i + 1) * 100))


def clean(values: list[int], log: str) -> list[int]:
    # O_APPEND: one short write per call, from any process, is never interleaved.
    with open(log, "a") as f:
        f.write("clean\n")
    return [v for v in values if v % 3]


def summarize(parts: list[list[int]]) -> dict[str, int]:
    flat = [v for part in parts for v in part]
    return {"count": len(flat), "total": sum(flat)}


def histogram(parts: list[list[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for part in parts:
        for v in part:
            counts[v % 10] = counts.get(v % 10, 0) + 1
    return counts


def report(stats: dict[str, int], hist: dict[int, int]) -> tuple[int, int, int]:
    return stats["count"], stats["total"], sum(hist.values())


def fail(x: Any) -> Any:
    raise CustomError(f"bad input {x!r}")


def collect(*args: Any) -> tuple[Any, ...]:
    return args


def graph_of(collection_or_expr: Any) -> Mapping[Any, Any]:
    """The materialised graph of what ``dask.compute`` hands a scheduler, in either form."""
    if isinstance(collection_or_expr, Mapping):
        return collection_or_expr
    return collection_or_expr.__dask_graph__()  # type: ignore[no-any-return]


def node_kinds(dsk: Mapping[Any, Any]) -> set[str]:
    return {"tuple (legacy task)" if type(v) is tuple else type(v).__name__ for v in dsk.values()}


# =========================================================================== what Dask hands us


@pytest.mark.timeout(60)
def test_what_dask_hands_the_scheduler(record_property: Any) -> None:
    """Documents the graph form of the installed Dask (no cluster involved)."""
    seen: list[Any] = []

    def spy(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        seen.append(dsk)
        return dask.get(graph_of(dsk), keys)

    x = da.ones((20, 20), chunks=10)
    dask.compute((x + x.T).mean(axis=0), scheduler=spy)
    dsk = graph_of(seen[0])
    kinds = node_kinds(dsk)
    form = (
        f"dask {dask.__version__}: the scheduler receives {type(seen[0]).__module__}.{type(seen[0]).__name__}"
        f" ({'a Mapping' if isinstance(seen[0], Mapping) else 'not a Mapping; has __dask_graph__()'})"
        f"; node types {sorted(kinds)}"
    )
    print(form)
    record_property("dask_graph_form", form)
    if tuple(int(p) for p in dask.__version__.split(".")[:2]) >= (2025, 1):
        assert kinds <= TASK_SPEC_NAMES, kinds  # task-spec objects only, no legacy tuples
        assert "Task" in kinds


@pytest.mark.timeout(90)
def test_package_does_not_import_dask() -> None:
    code = (
        "import sys, scaler_executor, scaler_executor.client.graph, scaler_executor.protocol.refs;"
        "bad = sorted(m for m in sys.modules if m == 'dask' or m.startswith('dask.'));"
        "assert not bad, bad"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# =========================================================================== dask.delayed


def pipeline(log: str) -> Any:
    """load → clean (shared by two reductions) → summarize / histogram → report."""
    from dask import delayed

    cleaned = [delayed(clean)(delayed(load)(i), log) for i in range(8)]
    stats = delayed(summarize)(cleaned)
    hist = delayed(histogram)(cleaned)
    return delayed(report)(stats, hist), stats


def expected_pipeline() -> tuple[tuple[int, int, int], dict[str, int]]:
    parts = [[v for v in load(i) if v % 3] for i in range(8)]
    stats = summarize(parts)
    return (stats["count"], stats["total"], sum(histogram(parts).values())), stats


@pytest.mark.timeout(90)
def test_delayed_pipeline_with_compute(executor: ScalerExecutor, tmp_path: Path) -> None:
    log = tmp_path / "clean.log"
    final, stats = pipeline(str(log))
    assert dask.compute(final, stats, scheduler=executor.get) == expected_pipeline()
    assert log.read_text().count("clean") == 8  # each shared intermediate ran once


@pytest.mark.timeout(90)
def test_delayed_pipeline_with_config_set(executor: ScalerExecutor, tmp_path: Path) -> None:
    final, _ = pipeline(str(tmp_path / "clean.log"))
    with dask.config.set(scheduler=executor.get):
        assert final.compute() == expected_pipeline()[0]


@pytest.mark.timeout(90)
def test_delayed_failure_raises_the_original_exception(executor: ScalerExecutor) -> None:
    from dask import delayed

    bad = delayed(inc)(delayed(fail)(3))
    with pytest.raises(CustomError, match="bad input 3"):
        dask.compute(bad, scheduler=executor.get)


# =========================================================================== dask.array


def array_expression() -> Any:
    x = da.random.default_rng(42).random((2000, 2000), chunks=500)
    return (x + x.T).mean(axis=0)


@pytest.mark.timeout(180)
def test_array_reduction_matches_sync(executor: ScalerExecutor) -> None:
    y = array_expression()
    expected = y.compute(scheduler="sync")
    (got,) = dask.compute(y, scheduler=executor.get)
    assert got.shape == (2000,)
    assert_allclose(got, expected, rtol=1e-12)
    with dask.config.set(scheduler=executor.get):
        assert_allclose(y.sum().compute(), expected.sum(), rtol=1e-9)


@pytest.mark.timeout(180)
def test_materialised_array_graph(executor: ScalerExecutor) -> None:
    """The task-spec graph itself (Task, Alias…), as a dict, through ``ex.get``."""
    y = array_expression()
    dsk = dict(y.__dask_graph__())
    assert node_kinds(dsk) & {"Task"}, node_kinds(dsk)
    keys = y.__dask_keys__()  # a list of chunk keys: results come as a tuple
    chunks = executor.get(dsk, keys)
    assert type(chunks) is tuple and len(chunks) == 4
    assert_allclose(np.concatenate(chunks), y.compute(scheduler="sync"), rtol=1e-12)


# =========================================================================== dask.bag


def double(v: int) -> int:
    return 2 * v


def not_multiple_of_3(v: int) -> bool:
    return v % 3 != 0


@pytest.mark.timeout(120)
def test_bag_map_filter_fold(executor: ScalerExecutor) -> None:
    b = db.from_sequence(range(1000), npartitions=8).map(double).filter(not_multiple_of_3)
    total = b.fold(add, add, initial=0)
    count = b.count()
    kept = [v for v in (2 * i for i in range(1000)) if v % 3]
    assert dask.compute(total, count, scheduler=executor.get) == (sum(kept), len(kept))
    assert dask.compute(total, scheduler="sync") == (sum(kept),)
    with dask.config.set(scheduler=executor.get):
        assert sorted(b.take(5, npartitions=-1)) == [2, 4, 8, 10, 14]


# =========================================================================== dask.dataframe (optional)


@pytest.mark.timeout(180)
def test_dataframe_groupby(executor: ScalerExecutor) -> None:
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    pdf = pd.DataFrame({"k": [i % 7 for i in range(700)], "v": range(700)})
    ddf = dd.from_pandas(pdf, npartitions=4)
    result = ddf.groupby("k").v.sum()
    (got,) = dask.compute(result, scheduler=executor.get)
    pd.testing.assert_series_equal(got.sort_index(), pdf.groupby("k").v.sum().sort_index())


# =========================================================================== hand-built task spec


def task_spec() -> Any:
    return pytest.importorskip("dask._task_spec")


@pytest.mark.timeout(60)
def test_hand_built_task_spec_graph(executor: ScalerExecutor) -> None:
    ts = task_spec()
    dsk = {
        "a": ts.DataNode("a", 2),
        "b": ts.Task("b", inc, ts.TaskRef("a")),
        "c": ts.Task("c", add, ts.TaskRef("b"), ts.TaskRef("a")),
        "alias": ts.Alias("alias", "c"),
        "alias2": ts.Alias("alias2", "alias"),
        ("t", 0): ts.Task(("t", 0), collect, ts.List(ts.TaskRef("a"), ts.TaskRef("alias2")), 10),
        "unneeded": ts.Task("unneeded", fail, 0),
    }
    assert executor.get(dsk, "c") == 5
    assert executor.get(dsk, ["a", ["alias2", ("t", 0)]]) == (2, (5, ([2, 5], 10)))
    assert executor.statistics()["tasks"] == 0


@pytest.mark.timeout(60)
def test_hand_built_task_spec_errors(executor: ScalerExecutor) -> None:
    ts = task_spec()
    dsk = {
        "x": ts.DataNode("x", 1),
        "bad": ts.Task("bad", fail, ts.TaskRef("x")),
        "after": ts.Task("after", inc, ts.TaskRef("bad")),
        "loop1": ts.Task("loop1", inc, ts.TaskRef("loop2")),
        "loop2": ts.Task("loop2", inc, ts.TaskRef("loop1")),
    }
    with pytest.raises(CustomError, match="bad input 1"):
        executor.get(dsk, "after")
    with pytest.raises(KeyError):
        executor.get(dsk, "missing")
    with pytest.raises(ValueError, match="cycle.*loop"):
        executor.get(dsk, "loop1")
