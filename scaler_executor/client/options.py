"""``ex.options(...)``: every scheduling option checked where it enters.

A value that reached the wire unchecked could break the whole executor (an int the codec
cannot pack fails the connection's send, not the one call), so each option is checked here
against the range the wire and the daemon accept:

==============  ==========================================  ===============================
option          allowed                                     why that range
==============  ==========================================  ===============================
resources       a mapping of non-empty ``str`` names to     quantities travel as floats and
                finite numbers >= 0 (0 drops the name)      are compared with workers' own
tags            an iterable (not a ``str``) of non-empty    matched with workers' tag sets
                ``str``
priority        ``int`` from -2**63 to 2**63 - 1            msgpack packs signed 64-bit ints
task_timeout    finite seconds > 0, at most                 a deadline the worker computes;
                ``threading.TIMEOUT_MAX``, or None           None means no limit
max_retries     ``int`` from 0 to 2**63 - 1, or None        as priority; None: the daemon's
                                                            ``max_retries``
writable        ``bool``                                    a flag bit
capture_output  ``bool``, or None for the config's          a flag bit (worker/capture.py)
                ``capture_output``
==============  ==========================================  ===============================

A value of the wrong type raises ``TypeError`` (a ``bool`` is not a number here); one out of
range raises ``ValueError`` naming the option and its range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from scaler_executor.config import FLOAT_MAX, INT_MAX
from scaler_executor.protocol.messages import DEFAULT_OPTIONS, TaskOptions

__all__ = ["INT_MIN", "OPTION_NAMES", "make_options"]

OPTION_NAMES = ("resources", "tags", "priority", "task_timeout", "max_retries")
INT_MIN = -(2**63)  # msgpack's signed 64-bit range, with config.INT_MAX


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """``repr`` that stays short (and works) for an int of any size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _integer(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r:.60}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {_shown(value)}")
    return value


def _resources(resources: object) -> dict[str, float]:
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources must be a dict like {{'gpu': 1}}, got {type(resources).__name__}")
    checked: dict[str, float] = {}
    for name, quantity in resources.items():
        if not isinstance(name, str):
            raise TypeError(f"resource names must be strings, got {type(name).__name__} {name!r:.60}")
        if not name.strip():
            raise ValueError(f"resource names must be non-empty, got {name!r}")
        if not _is_number(quantity):
            raise TypeError(
                f"resource {name!r} needs a number as its quantity, got {type(quantity).__name__} {quantity!r:.60}"
            )
        try:
            amount = float(quantity)
        except OverflowError:  # an int beyond any float
            amount = math.inf
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"resource {name!r} needs a finite quantity >= 0, got {_shown(quantity)}")
        if amount:
            checked[name] = amount
    return checked


def _tags(tags: object) -> list[str]:
    if isinstance(tags, (str, bytes)):
        raise TypeError(f"tags must be a collection of strings such as {{'linux'}}, not the single value {tags!r}")
    if not isinstance(tags, Iterable):
        raise TypeError(f"tags must be a collection of strings such as {{'linux'}}, got {type(tags).__name__}")
    unique: set[str] = set()
    for tag in tags:
        if not isinstance(tag, str):
            raise TypeError(f"tags must be strings, got {type(tag).__name__} {tag!r:.60}")
        if not tag.strip():
            raise ValueError(f"tags must be non-empty strings, got {tag!r}")
        unique.add(tag)
    return sorted(unique)


def _task_timeout(value: object) -> float:
    if not _is_number(value):
        raise TypeError(f"task_timeout must be a number of seconds or None, got {type(value).__name__} {value!r:.60}")
    assert isinstance(value, (int, float))
    if not 0 < value <= FLOAT_MAX:  # nan and inf fail it too
        raise ValueError(f"task_timeout must be seconds > 0 and <= {FLOAT_MAX:g}, or None, got {_shown(value)}")
    return float(value)


def make_options(
    resources: Any = None,
    tags: Any = None,
    priority: Any = 0,
    task_timeout: Any = None,
    max_retries: Any = None,
) -> TaskOptions:
    """The TaskOptions for ``ex.options(...)``'s arguments; TypeError or ValueError naming the
    option (and its range) for a value the wire or the daemon would not take."""
    options = TaskOptions(
        {} if resources is None else _resources(resources),
        [] if tags is None else _tags(tags),
        _integer("priority", priority, INT_MIN, INT_MAX),
        None if task_timeout is None else _task_timeout(task_timeout),
        None if max_retries is None else _integer("max_retries", max_retries, 0, INT_MAX),
    )
    return DEFAULT_OPTIONS if options == DEFAULT_OPTIONS else options
