"""A simulated worker's processors, dealt to as a real agent deals to its own (bench/scale.py).

A real worker (worker/agent.py) does not run a dispatched task at once: it deals tasks to
its processors by worker/dealing.py, a processor holding up to ``task_depth`` of them (for
sub-millisecond tasks up to ``MAX_DEPTH``, 8), topped up only once it is down to
``REFILL_AT`` (1), so each top-up is one write carrying several tasks; the processor wakes
(a pipe, a process the OS must schedule), runs them back to back and writes each result;
the agent reads what has arrived and sends it.  So its results come in runs shaped by the
top-ups, and the daemon sees fewer, larger transmissions than one answer per task, spaced
by the processors' wake-ups.  ``Processors`` keeps that shape: each top-up (the same
decisions, from the same functions) starts after a wake-up drawn from ``wake`` (seconds;
the time a real processor takes to be scheduled and read its pipe, which a loaded host
makes long), and its tasks then run in series for their drawn durations.  With
``Sim.shared_core`` the wake-ups (and the client's) are CPU time on one simulated core,
served in turn, as the processes of real workers sharing a core are: their answers reach
the daemon one after another, not in a burst, and their rate is the core's.

Not modelled: recalls (a real agent takes back the tasks queued behind a task that turned
out long when another processor idles, worker/dealing.py ``recall_due``); with mixed long
and short durations the simulated queue behind a long task waits it out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from scaler_executor.worker.dealing import MAX_DEPTH, takes_more, task_depth

EWMA = 0.2  # as the agent's mean task time (worker/agent.py)


class Processors:
    """The processors of one simulated worker: what each holds and when it is next free."""

    __slots__ = ("free_at", "held", "head_since", "mean")

    def __init__(self, count: int) -> None:
        self.free_at = [0.0] * count  # when each processor's last dealt task ends
        self.held = [0] * count  # tasks dealt to each and not finished (the running one included)
        self.head_since = [0.0] * count
        self.mean: float | None = None  # the worker's mean task time, as the agent keeps it

    def running(self) -> int:
        return sum(1 for n in self.held if n)

    def timed(self, seconds: float) -> None:
        self.mean = seconds if self.mean is None else self.mean + EWMA * (seconds - self.mean)

    def done(self, index: int, now: float) -> None:
        self.held[index] -= 1
        self.head_since[index] = now

    def deal(self, queue: deque[tuple[int, int, bytes]], now: float, duration: Callable[[], float],
             woken: Callable[[], float]) -> list[tuple[int, float, float, float, tuple[int, int, bytes]]]:
        """Take tasks off ``queue`` as the agent's ``_assign`` would; for each, (processor, when
        it starts, when it ends, its run time, the task), in the order they run.  ``woken()``:
        when a processor dealt a top-up now has woken to run it (Sim: now plus a drawn wake-up,
        or after the shared core's earlier work)."""
        if not queue:
            return []
        mean = self.mean
        depth = task_depth(mean, mean)
        short = depth > 1
        held, free_at = self.held, self.free_at
        live = [i for i in range(len(held)) if not short or takes_more(held[i], now - self.head_since[i])]
        dealt = []
        ready: dict[int, float] = {}
        for level in range(1, (MAX_DEPTH if short else 1) + 1):
            if level > depth:
                break
            for i in live:
                while held[i] < level and queue:
                    if i not in ready:  # one write, one wake-up, per processor per top-up
                        ready[i] = woken()
                    if not held[i]:
                        self.head_since[i] = now
                    held[i] += 1
                    seconds = duration()
                    start = max(free_at[i], ready[i])
                    free_at[i] = start + seconds
                    dealt.append((i, start, start + seconds, seconds, queue.popleft()))
                if not queue:
                    return dealt
        return dealt
