"""The worker's fetch bookkeeping (worker/fetches.py), driven by plain calls.

Every step is followed by ``validate()``. The last test runs random sequences of events
(hypothesis' state machine) against a model written from the rules in the module's
docstring: which tasks run, which fail, what is requested and what is kept.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scaler_executor.worker.fetches import Arrival, Fetches, Need

A, B, C = b"object-a", b"object-b", b"object-c"
STREAM = object()  # stands for a handoff.Unsealed: the bookkeeping never looks inside


def checked(f: Fetches, result: Any) -> Any:
    f.validate()
    return result


def test_a_task_whose_objects_are_here_runs_at_once_and_each_object_is_asked_for_once() -> None:
    f = Fetches()
    assert checked(f, f.hold(1, [])) == Need(True, []), "a task that reads no object"
    assert len(f) == 0, "is not recorded"
    assert checked(f, f.hold(2, [A, B, A])) == Need(False, [A, B])
    assert checked(f, f.hold(3, [B])) == Need(False, []), "B is on its way already"
    assert checked(f, f.arrived(A, b"a")) == Arrival([], [], [], None), "task 2 still waits for B"
    assert sorted(checked(f, f.arrived(B, b"b")).ready) == [2, 3]
    assert f.parked() == []
    assert f.for_run(2) == {A: b"a", B: b"b"}
    assert checked(f, f.hold(4, [A])) == Need(True, []), "A is here: no request"


def test_an_object_is_kept_while_a_held_task_reads_it_and_no_longer() -> None:
    f = Fetches()
    f.hold(1, [A])
    f.hold(2, [A])
    f.arrived(A, b"a")
    checked(f, f.forget(1))
    assert f.for_run(2) == {A: b"a"}, "task 2 still reads it"
    checked(f, f.forget(2))
    assert f.blobs == {}, "no held task reads it: dropped"
    assert checked(f, f.hold(3, [A])) == Need(False, [A]), "asked for again"
    checked(f, f.forget(3))
    assert checked(f, f.arrived(A, b"a")) == Arrival([], [], [], None)
    assert f.blobs == {}, "an answer nobody waits for any more is not kept"


def test_a_task_runs_when_its_one_missing_object_is_a_stream_arriving() -> None:
    f = Fetches()
    f.hold(1, [A])
    f.hold(2, [A, B])
    assert checked(f, f.started(A, STREAM)) == [1], "task 2 waits for B too"
    assert f.for_run(1) == {A: STREAM}
    assert checked(f, f.hold(3, [A])) == Need(True, []), "dispatched while it arrives: reads it as it comes"
    # B whole while A still arrives: task 2 reads B whole and A as it comes.
    assert checked(f, f.arrived(B, b"b")).ready == [2]
    assert f.for_run(2) == {A: STREAM, B: b"b"}
    arrival = checked(f, f.arrived(A, b"a"))
    assert arrival == Arrival([], [], [], STREAM)
    assert f.for_run(1) == {A: b"a"}, "a task still queued gets it whole"


def test_two_streams_at_once_wait_for_one_to_be_whole() -> None:
    f = Fetches()
    f.hold(1, [A, B])
    assert checked(f, f.started(A, STREAM)) == []
    assert checked(f, f.started(B, STREAM)) == [], "a RUN feeds one stream"
    assert checked(f, f.arrived(A, b"a")).ready == [1]
    assert f.for_run(1) == {A: b"a", B: STREAM}


def test_an_object_that_does_not_come_fails_its_parked_tasks_and_its_readers() -> None:
    f = Fetches()
    f.hold(1, [A])  # a reader once A streams
    f.hold(2, [A, B])  # parked (waits for B too)
    f.hold(3, [C])
    f.started(A, STREAM)
    arrival = checked(f, f.arrived(A, None))
    assert arrival.failed == [2] and arrival.readers == [1] and arrival.stream is STREAM
    assert 2 not in f.objects_of, "a failed parked task is forgotten"
    assert 1 in f.objects_of, "a reader is still held: its caller decides"
    assert f.parked() == [3]
    # Not a stream: nobody reads it yet, so only parked tasks fail.
    assert checked(f, f.arrived(C, None)) == Arrival([], [3], [], None)
    assert f.parked() == []


def test_a_failed_answer_asked_for_again_leaves_a_whole_copy_alone() -> None:
    f = Fetches()
    f.hold(1, [A])
    f.arrived(A, b"a")
    f.clear()  # the daemon lost track: asked again
    assert f.hold(1, [A]) == Need(False, [A])
    f.arrived(A, b"a")
    assert checked(f, f.arrived(A, None)) == Arrival([], [], [], None), "a late answer of the first request"
    assert f.for_run(1) == {A: b"a"}


def test_a_new_attempt_replaces_the_old_and_after_clear_nothing_is_awaited() -> None:
    f = Fetches()
    f.hold(1, [A])
    assert checked(f, f.hold(1, [B])) == Need(False, [B])
    assert f.users == {B: {1}}, "the old attempt's objects are not its any more"
    assert checked(f, f.hold(1, [])) == Need(True, [])
    assert len(f) == 0
    f.hold(2, [A])
    f.clear()
    checked(f, None)
    assert f.started(A, STREAM) == [], "an answer asked for before clear()"
    assert f.streaming == {}


TASKS = st.integers(0, 5)
OBJECTS = st.sampled_from([A, B, C, b"object-d"])


class FetchesModel(RuleBasedStateMachine):
    """Random events against a model of the rules: a task runs once each of its objects is
    whole, or all but one and that one is arriving as a stream; an object is requested once
    until answered; an object is kept while a held task reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.f = Fetches()
        self.tasks: dict[int, set[bytes]] = {}  # held tasks with objects
        self.released: set[int] = set()  # held tasks told to run
        self.outstanding: set[bytes] = set()
        self.streaming: set[bytes] = set()
        self.whole: set[bytes] = set()

    def runnable(self, task_id: int) -> bool:
        missing = self.tasks[task_id] - self.whole
        return not missing or (len(missing) == 1 and missing <= self.streaming)

    def newly_runnable(self) -> set[int]:
        return {t for t in self.tasks if t not in self.released and self.runnable(t)}

    def drop(self, task_id: int) -> None:
        self.tasks.pop(task_id, None)
        self.released.discard(task_id)
        used = set().union(*self.tasks.values())
        self.whole &= used

    @rule(task_id=TASKS, objects=st.lists(OBJECTS, max_size=3))
    def hold(self, task_id: int, objects: list[bytes]) -> None:
        self.drop(task_id)
        need = self.f.hold(task_id, objects)
        if not objects:
            assert need == Need(True, [])
            return
        self.tasks[task_id] = set(objects)
        expect = [o for o in dict.fromkeys(objects) if o not in self.whole and o not in self.outstanding]
        assert need.request == expect
        self.outstanding.update(expect)
        assert need.ready == self.runnable(task_id)
        if need.ready:
            self.released.add(task_id)

    @precondition(lambda self: self.outstanding - self.streaming)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        object_id = data.draw(st.sampled_from(sorted(self.outstanding - self.streaming)))
        self.streaming.add(object_id)
        ready = self.f.started(object_id, ("stream", object_id))
        assert sorted(ready) == sorted(self.newly_runnable())
        self.released.update(ready)

    @precondition(lambda self: self.outstanding)
    @rule(data=st.data(), whole=st.booleans())
    def arrive(self, data: st.DataObject, whole: bool) -> None:
        object_id = data.draw(st.sampled_from(sorted(self.outstanding)))
        was_streaming = object_id in self.streaming
        self.outstanding.discard(object_id)
        self.streaming.discard(object_id)
        users = {t for t, objects in self.tasks.items() if object_id in objects}
        arrival = self.f.arrived(object_id, b"blob:" + object_id if whole else None)
        assert arrival.stream == (("stream", object_id) if was_streaming else None)
        if whole:
            if users:
                self.whole.add(object_id)
            assert sorted(arrival.ready) == sorted(self.newly_runnable())
            assert arrival.failed == [] and arrival.readers == []
            self.released.update(arrival.ready)
            return
        assert arrival.ready == []
        assert sorted(arrival.failed) == sorted(users - self.released)
        assert sorted(arrival.readers) == (sorted(users & self.released) if was_streaming else [])
        for task_id in arrival.failed:
            self.drop(task_id)

    @rule(task_id=TASKS)
    def forget(self, task_id: int) -> None:
        self.f.forget(task_id)
        self.drop(task_id)

    @rule()
    def clear(self) -> None:
        self.f.clear()
        self.tasks.clear()
        self.released.clear()
        self.outstanding.clear()
        self.streaming.clear()
        self.whole.clear()

    @invariant()
    def agrees(self) -> None:
        self.f.validate()
        assert set(self.f.blobs) == self.whole
        assert sorted(self.f.parked()) == sorted(set(self.tasks) - self.released)
        for task_id in self.released:
            if not self.tasks[task_id] <= self.whole | self.streaming:
                continue  # it read a stream that failed since: it fails on it, never runs again
            run = self.f.for_run(task_id)
            assert run == {o: b"blob:" + o if o in self.whole else ("stream", o) for o in self.tasks[task_id]}


FetchesModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_fetches_against_a_model = FetchesModel.TestCase
