"""The daemon's core and the worker agent are classes built of layers, a module each, and
each layer calls only the layers below it (scheduler/core.py, worker/agent.py).  This keeps
that true: a method that uses ``self.m()`` for an ``m`` first defined in a later layer is
named, with the layer that should hold ``m`` instead."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from scaler_executor.scheduler.core import Scheduler
from scaler_executor.worker.agent import WorkerAgent

pytestmark = pytest.mark.timeout(60)


def layers(top: type) -> list[type]:
    """The project's classes ``top`` is built of, bottom first."""
    return [c for c in reversed(top.__mro__) if c.__module__.startswith("scaler_executor.")]


def upward_calls(top: type) -> list[str]:
    chain = layers(top)
    first_defined: dict[str, int] = {}
    for rank, layer in enumerate(chain):
        for name, value in vars(layer).items():
            if inspect.isfunction(value):
                first_defined.setdefault(name, rank)
    found = []
    for rank, layer in enumerate(chain):
        for name, value in vars(layer).items():
            if not inspect.isfunction(value) or name == "__init__":  # __init__ of the top binds handlers
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(value)))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and first_defined.get(node.attr, -1) > rank
                ):
                    above = chain[first_defined[node.attr]]
                    found.append(f"{layer.__name__}.{name} uses self.{node.attr}, first defined above it in {above.__name__}")
    return found


@pytest.mark.parametrize("top", [Scheduler, WorkerAgent], ids=lambda c: c.__name__)
def test_each_layer_calls_only_the_layers_below_it(top: type) -> None:
    assert len(layers(top)) >= 5, f"{top.__name__} is no longer built of layers: update this test and the docs"
    assert upward_calls(top) == []


def test_the_check_finds_a_call_upward() -> None:
    class Low:
        __module__ = "scaler_executor.example"

        def step(self) -> None:
            self.later()

    class High(Low):
        __module__ = "scaler_executor.example"

        def later(self) -> None:
            pass

    assert upward_calls(High) == ["Low.step uses self.later, first defined above it in High"]
