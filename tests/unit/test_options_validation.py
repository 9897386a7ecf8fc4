"""``ex.options(...)`` values are checked where they enter, against the ranges the wire takes.

``make_options`` is what ``ScalerExecutor.options`` and an options view call; the
integration test ``test_inputs_checked.py`` drives it through a real executor.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from scaler_executor.client.options import INT_MIN, make_options
from scaler_executor.config import FLOAT_MAX, INT_MAX
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode_one


def round_trip(options: m.TaskOptions) -> m.TaskOptions:
    (message,), _ = decode(encode_one(m.RegisterOptions(1, options)))
    return message.options  # type: ignore[no-any-return]  # decode returns the message types


@pytest.mark.parametrize(
    ("changes", "error", "text"),
    [
        ({"priority": 2**70}, ValueError, "priority must be an integer from -9223372036854775808 to 9223372036854775807, got 1180591620717411303424"),
        ({"priority": INT_MIN - 1}, ValueError, "priority must be an integer from"),
        ({"priority": True}, TypeError, "priority must be an integer, got bool True"),
        ({"priority": 1.0}, TypeError, "priority must be an integer, got float"),
        ({"priority": "1"}, TypeError, "priority must be an integer, got str"),
        ({"max_retries": 10**23}, ValueError, "max_retries must be an integer from 0 to 9223372036854775807, got 100000000000000000000000"),
        ({"max_retries": -1}, ValueError, "max_retries must be an integer from 0 to"),
        ({"max_retries": 10**5000}, ValueError, "got an integer of 16610 bits"),
        ({"max_retries": False}, TypeError, "max_retries must be an integer, got bool"),
        ({"max_retries": 2.0}, TypeError, "max_retries must be an integer, got float"),
        ({"task_timeout": 0}, ValueError, "task_timeout must be seconds > 0 and <= 9.22337e+09, or None, got 0"),
        ({"task_timeout": -1.5}, ValueError, "task_timeout must be seconds > 0"),
        ({"task_timeout": math.inf}, ValueError, "got inf"),
        ({"task_timeout": math.nan}, ValueError, "got nan"),
        ({"task_timeout": 10**400}, ValueError, "got an integer of 1329 bits"),
        ({"task_timeout": "3"}, TypeError, "task_timeout must be a number of seconds or None, got str '3'"),
        ({"task_timeout": True}, TypeError, "got bool"),
        ({"resources": [("gpu", 1)]}, TypeError, "resources must be a dict like {'gpu': 1}, got list"),
        ({"resources": {1: 1}}, TypeError, "resource names must be strings, got int 1"),
        ({"resources": {"": 1}}, ValueError, "resource names must be non-empty"),
        ({"resources": {"gpu": "1"}}, TypeError, "resource 'gpu' needs a number as its quantity, got str '1'"),
        ({"resources": {"gpu": True}}, TypeError, "needs a number as its quantity, got bool"),
        ({"resources": {"gpu": -1}}, ValueError, "resource 'gpu' needs a finite quantity >= 0, got -1"),
        ({"resources": {"gpu": math.nan}}, ValueError, "got nan"),
        ({"resources": {"gpu": math.inf}}, ValueError, "got inf"),
        ({"resources": {"gpu": 10**400}}, ValueError, "got an integer of 1329 bits"),
        ({"tags": "linux"}, TypeError, "not the single value 'linux'"),
        ({"tags": b"linux"}, TypeError, "not the single value b'linux'"),
        ({"tags": 5}, TypeError, "tags must be a collection of strings such as {'linux'}, got int"),
        ({"tags": ["a", 1]}, TypeError, "tags must be strings, got int 1"),
        ({"tags": ["a", ""]}, ValueError, "tags must be non-empty strings"),
    ],
)
def test_bad_values_raise_naming_the_option(changes: dict[str, Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error) as info:
        make_options(**changes)
    assert type(info.value) is error
    assert text in str(info.value)


def test_the_extremes_accepted_are_the_extremes_the_codec_carries() -> None:
    options = make_options(
        resources={"gpu": 2, "mem": 1.7e308, "none": 0},
        tags=("b", "a", "a"),
        priority=INT_MAX,
        task_timeout=FLOAT_MAX,
        max_retries=INT_MAX,
    )
    assert options == m.TaskOptions({"gpu": 2.0, "mem": 1.7e308}, ["a", "b"], INT_MAX, FLOAT_MAX, INT_MAX)
    assert round_trip(options) == options
    assert round_trip(make_options(priority=INT_MIN, max_retries=0)).priority == INT_MIN
    # Below INT_MIN msgpack packs nothing; above INT_MAX it still packs unsigned ints up to
    # 2**64 - 1, which make_options refuses so that every integer option has one signed
    # 64-bit range (a C int64_t) on every peer.
    for beyond in (INT_MIN - 1, 2**64):
        with pytest.raises(OverflowError):
            encode_one(m.RegisterOptions(1, m.TaskOptions({}, [], beyond, None, None)))


def test_defaults_intern_to_the_default_record() -> None:
    assert make_options() is m.DEFAULT_OPTIONS
    assert make_options(resources={"gpu": 0}, tags=[]) is m.DEFAULT_OPTIONS
    assert make_options(task_timeout=3).task_timeout == 3.0 and type(make_options(task_timeout=3).task_timeout) is float
