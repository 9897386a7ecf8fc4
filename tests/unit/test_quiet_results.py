"""Which result pickles the client's agent thread may unpickle itself: those that look up
no global, so unpickling runs nothing of the user's (``serialization.looks_up_globals``).

The byte filter alone sent 42 % of pickled float pairs and almost every string the slow
way (their data holds the bytes of GLOBAL or INST); small pickles are read op by op.
"""

from __future__ import annotations

import collections
import decimal
import pickle
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler_executor.client.serialization import SCAN_LIMIT, looks_up_globals
from scaler_executor.worker.processor import dump_value


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


builtins_only = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(builtins_only)
def test_small_pickles_of_builtins_look_up_no_global(value: object) -> None:
    payload = dump_value(value)
    if len(payload) <= SCAN_LIMIT:
        assert not looks_up_globals(payload), payload


@pytest.mark.parametrize(
    "value",
    [
        (2.0, 0.012345),
        "finished, with a c and an i",
        [random.random() for _ in range(10)],
        {"ci": b"\x93\x82"},
    ],
)
def test_data_bytes_that_are_opcodes_elsewhere_do_not_count(value: object) -> None:
    assert not looks_up_globals(dump_value(value))


@pytest.mark.parametrize(
    "value",
    [Point(1), collections.OrderedDict(a=1), decimal.Decimal("1.5"), [1, Point(2)], print],
)
def test_pickles_that_name_a_class_or_function_look_up_a_global(value: object) -> None:
    for protocol in (0, 2, 5):
        assert looks_up_globals(pickle.dumps(value, protocol=protocol)), (value, protocol)


def test_sets_name_their_class_only_before_protocol_4() -> None:
    for value in ({1, 2}, frozenset({3})):
        assert looks_up_globals(pickle.dumps(value, protocol=2))
        assert not looks_up_globals(pickle.dumps(value, protocol=5))


def test_large_pickles_with_a_suspect_byte_and_unreadable_ones_count_as_looking_up() -> None:
    big = dump_value("c" * (SCAN_LIMIT + 1))
    assert looks_up_globals(big)
    assert not looks_up_globals(dump_value("x" * (SCAN_LIMIT + 1)))  # no suspect byte at all
    assert looks_up_globals(b"\x80\x05c")  # truncated right after GLOBAL's opcode
    assert looks_up_globals(b"ci garbage")
