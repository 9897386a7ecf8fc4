"""How the worker agent deals tasks to its processors: pure decisions, time a parameter.

* ``task_depth``: how many tasks a processor may hold (the running one included) for a task
  of a callable with a given mean duration (``processor_depth`` by the mean alone).
* ``takes_more``: whether a processor holding some short tasks is topped up now.
* ``recall_due``: whether the tasks queued behind a processor's running one are asked back
  (when another processor is idle; the agent decides that part).

The agent (worker/agent.py) keeps the state (each processor's tasks, the means it measured)
and passes in what these need; ``tests/unit/test_processor_depth.py`` pins them.
"""

from __future__ import annotations

SHORT_TASK_SECONDS = 0.005  # below this mean duration a processor gets tasks queued ahead
# Short tasks: a processor holds up to SHORT_DEPTH and is topped up once it is down to
# REFILL_AT, so each top-up is one write (and one wake-up) carrying two tasks, not one each.
SHORT_DEPTH = 3
REFILL_AT = 1
# Sub-millisecond tasks: deeper, up to MAX_DEPTH while the tasks queued behind the running
# one add up to at most QUEUED_WORK_SECONDS (what one can wait behind the others while a
# processor elsewhere is idle).  A write to a processor and the wake-up it causes cost
# more than a no-op task; a top-up of 7 instead of 2 raised no-op throughput by ~20 %, and
# MAX_DEPTH 32 instead of 8 by another ~15 % (docs/performance.rst, "Deeper for no-ops").
# It binds only below QUEUED_WORK_SECONDS / 31 (65 us) a task: slower ones stop at the budget.
MAX_DEPTH = 32
UNTIMED_DEPTH = 2  # see task_depth
QUEUED_WORK_SECONDS = 0.002
# A processor whose running task has run this long gets nothing queued behind it, and the
# tasks already queued there are recalled (handed back) when another processor is idle:
# they were dealt as short work expected to wait at most QUEUED_WORK_SECONDS.
RECALL_AFTER = 0.02


def processor_depth(mean_task: float | None) -> int:
    """How many tasks a processor may hold (the running one included) for this mean duration."""
    if mean_task is None or mean_task >= SHORT_TASK_SECONDS:
        return 1  # unknown or long: none behind the running one
    fits = int(QUEUED_WORK_SECONDS / max(mean_task, 1e-6)) + 1
    return min(MAX_DEPTH, max(SHORT_DEPTH, fits))


def task_depth(fn_mean: float | None, worker_mean: float | None) -> int:
    """The depth for a task whose callable's tasks took ``fn_mean`` on this worker (None: not
    timed here yet) while all its tasks took ``worker_mean``.

    What a callable's earlier tasks took says more than what the worker's last tasks took:
    after a run of no-ops, a batch of 20 tasks of 12 ms each was dealt 10/10 up front (both
    processors at MAX_DEPTH), and the processor that lost the most CPU to the worker's own
    processes set the tail (measured: 10 ms in a 130 ms batch).  An untimed callable gets
    at most one task queued behind the running one until its first task finishes; not
    none, since callables made afresh per call (partials, lambdas) are never timed."""
    if fn_mean is not None:
        return processor_depth(fn_mean)
    return min(UNTIMED_DEPTH, processor_depth(worker_mean))


def takes_more(held: int, head_age: float) -> bool:
    """Whether a processor holding ``held`` short tasks, the running one (the first) sent or
    started ``head_age`` seconds ago, is dealt more now (how many: ``task_depth``).

    Only once it is down to REFILL_AT, so that a top-up carries several tasks; and never
    behind a running task that has turned out long (``recall_due``): what was dealt to
    wait at most QUEUED_WORK_SECONDS would wait for it.  ``head_age`` means nothing when
    it holds none."""
    return held <= REFILL_AT and (held == 0 or head_age < RECALL_AFTER)


def recall_due(head_age: float) -> bool:
    """Whether the tasks queued behind a running task sent or started ``head_age`` seconds
    ago are recalled now, another processor being idle (until then the agent looks again
    every HOUSEKEEPING_SECONDS)."""
    return head_age >= RECALL_AFTER
