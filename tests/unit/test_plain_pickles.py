"""The client's plain pickles (client/serialization.py): a call's or a map chunk's builtin
arguments pickled by pickle itself, None for anything that needs cloudpickle or the store."""

from __future__ import annotations

import pickle

from scaler_executor.client.serialization import dumps_plain_args, dumps_plain_chunk


def test_a_chunk_of_builtin_scalars_is_a_plain_pickle_of_the_list() -> None:
    chunk = [(1, "a", 2.5), (None, b"x", True), (3 + 4j,)]
    data = dumps_plain_chunk(chunk, 1000)
    assert data is not None and pickle.loads(data) == chunk


def test_a_chunk_with_anything_else_is_not_plain() -> None:
    assert dumps_plain_chunk([(1,), ([1, 2],)], 1000) is None  # a list argument
    assert dumps_plain_chunk([(1,), (len,)], 1000) is None  # a function
    assert dumps_plain_chunk([(1,), (object(),)], 1000) is None


def test_a_chunk_with_a_large_str_or_bytes_goes_the_other_way() -> None:
    assert dumps_plain_chunk([("x" * 999,)], 1000) is not None
    assert dumps_plain_chunk([("x" * 1000,)], 1000) is None
    assert dumps_plain_chunk([(1,), (b"y" * 5000,)], 1000) is None


def test_plain_args_match_the_chunk_rules() -> None:
    assert pickle.loads(dumps_plain_args((1, "a"), {"k": 2.0}) or b"") == ((1, "a"), {"k": 2.0})
    assert dumps_plain_args(([1],), {}) is None
    assert dumps_plain_args(("x" * 10,), {}, limit=10) is None
