"""A bad ``options()`` value is refused at the call, and the executor stays usable: before,
``ex.options(priority=2**70)`` passed and broke the whole executor in the codec."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scaler_testing import fast_config

from scaler_executor import ScalerExecutor
from scaler_executor.client.options import INT_MIN
from scaler_executor.config import INT_MAX

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ex() -> Iterator[ScalerExecutor]:
    executor = ScalerExecutor(max_workers=1, config=fast_config())
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def test_refused_values_leave_the_executor_usable(ex: ScalerExecutor) -> None:
    with pytest.raises(ValueError, match="priority must be an integer from -9223372036854775808 to 9223372036854775807"):
        ex.options(priority=2**70)
    view = ex.options(priority=1)
    with pytest.raises(ValueError, match="max_retries must be an integer from 0 to 9223372036854775807"):
        view.options(max_retries=10**23)
    with pytest.raises(TypeError, match="task_timeout must be a number of seconds or None, got str"):
        view.options(task_timeout="3")
    with pytest.raises(TypeError, match="priority must be an integer, got bool"):
        ex.get({"x": 1}, "x", priority=True)
    assert ex.submit(pow, 2, 5).result(timeout=60) == 32
    assert view.submit(pow, 2, 6).result(timeout=60) == 64


def test_the_extremes_travel_and_run(ex: ScalerExecutor) -> None:
    for priority in (INT_MAX, INT_MIN):
        view = ex.options(priority=priority, max_retries=INT_MAX, task_timeout=1e9, resources={"cpu": 0})
        assert list(view.map(pow, [2, 3], [2, 2], timeout=60)) == [4, 9]
    assert repr(ex).startswith("<ScalerExecutor running")  # the connection survived what it carried
