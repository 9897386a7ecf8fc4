from __future__ import annotations

import pytest

from scaler_executor import ScalerExecutor


def square(x: int) -> int:
    return x * x


@pytest.mark.timeout(60)
def test_submit_map_and_kwargs(executor: ScalerExecutor) -> None:
    assert executor.submit(square, 7).result(timeout=30) == 49
    assert list(executor.map(square, range(10))) == [x * x for x in range(10)]
    assert executor.submit(lambda a, b=1: a + b, 1, b=5).result(timeout=30) == 6
