"""TaskRecord's state machine: the transition table, the per-state counts, the story."""

from __future__ import annotations

import pytest

from scaler_executor.protocol.messages import DEFAULT_OPTIONS
from scaler_executor.scheduler.state import (
    STORY_LENGTH,
    TRANSITIONS,
    IllegalTransition,
    TaskRecord,
    TaskState,
)


def record(counts: dict[TaskState, int] | None = None) -> TaskRecord:
    return TaskRecord(0x7001, b"client", 1, DEFAULT_OPTIONS, 0, b"", [], [], 0, counts)


@pytest.mark.parametrize("key", sorted(TRANSITIONS, key=lambda k: (k[0].value, k[1])), ids=lambda k: f"{k[0].value}-{k[1]}")
def test_every_allowed_transition_moves_the_state_and_its_count(key: tuple[TaskState, str]) -> None:
    state, event = key
    counts: dict[TaskState, int] = {}
    task = record(counts)
    task.set_state(state)
    assert task.transition(event) is TRANSITIONS[key]
    assert task.state is TRANSITIONS[key]
    assert {s: n for s, n in counts.items() if n} == {TRANSITIONS[key]: 1}
    assert task.story == [state.value, f"{event}:{TRANSITIONS[key].value}"]


def test_an_illegal_transition_names_the_event_the_state_and_the_story() -> None:
    task = record()
    task.transition("dispatch")
    task.transition("result-kept")
    with pytest.raises(IllegalTransition) as info:
        task.transition("dispatch")
    text = str(info.value)
    assert "event 'dispatch' is illegal in state finished" in text
    assert "story: pending -> dispatch:dispatched -> result-kept:finished" in text
    assert task.state is TaskState.FINISHED  # nothing changed


def test_the_story_keeps_the_recent_transitions_only() -> None:
    counts: dict[TaskState, int] = {}
    task = record(counts)
    task.transition("dispatch")
    task.transition("cancel")
    for _ in range(10 * STORY_LENGTH):  # a cancel repeated while the worker's answer is awaited
        task.transition("cancel")
        assert len(task.story or []) <= 2 * STORY_LENGTH
    task.transition("result")
    assert task.story is not None and len(task.story) >= STORY_LENGTH
    assert task.story[-2:] == ["cancel:cancelling", "result:done"]
    assert {s: n for s, n in counts.items() if n} == {TaskState.DONE: 1}
