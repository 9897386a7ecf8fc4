"""Tasks queued with no connected worker able to run them: noticed, timed, told once.

A cluster with no worker (none started yet, or the only one died), or whose workers lack
the resources or tags some tasks ask for, leaves those tasks queued and their futures
pending with no word.  The daemon decides it from its own state, with time as an input
(``check(now, ...)`` on every tick, part of the pure core):

* A queue is *stuck* while it holds tasks and no usable worker could ever take one: for
  the plain queue, no worker that is neither broken nor draining; for a queue of tasks
  with resources or tags, no such worker with all of them (``WorkerRecord.fits_ever``).
  Busy workers that could run them later are not a problem, just a wait.
* An *episode* of a queue starts at the first tick that sees it stuck and ends at the
  first that does not (a worker that can run them joined, or the tasks left).  Once it
  has lasted ``no_worker_warning`` seconds, every client with tasks in it gets one
  ``TasksWithoutWorker`` (its count, how long, why) and the daemon logs one warning; a
  client whose tasks join the queue later in the episode is told at the next walk
  (walks are at most one per ``no_worker_warning``: they visit every queued task).
* ``statistics()`` says how many tasks wait so now, and how many episodes there were.

The reason names what is missing, one clause per queue: "no worker is connected", "the
2 connected workers are stopping or broken", "no connected worker has gpu=1 tags ssd".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.state import ConstraintKey, ReadyQueue, WorkerRecord, describe_key

log = logging.getLogger("scaler_executor.daemon")

PLAIN: ConstraintKey | None = None  # the queue of tasks without resources or tags


@dataclass(slots=True)
class Episode:
    since: float  # the first tick that saw the queue stuck
    walked: float | None = None  # the last walk over its tasks (None: not yet due)
    told: set[bytes] = field(default_factory=set)  # clients told in this episode


class NoWorkerWatch:
    """The episodes of every stuck queue (see the module doc)."""

    def __init__(self, after: float | None) -> None:
        self.after = after  # no_worker_warning; None: never warn
        self.episodes: dict[ConstraintKey | None, Episode] = {}
        self.episodes_warned = 0  # episodes that lasted long enough to be told
        # The queues stuck for longer than ``after`` at the last check; a snapshot counts
        # those of their tasks that are still stuck when it is taken (statistics()).
        self.due: list[tuple[ConstraintKey | None, ReadyQueue]] = []

    def check(
        self,
        now: float,
        ready: ReadyQueue,
        constrained: dict[ConstraintKey, ReadyQueue],
        workers: Iterable[WorkerRecord],
    ) -> list[tuple[bytes, m.TasksWithoutWorker]]:
        """Update the episodes at ``now``; the messages due to clients."""
        if self.after is None:
            return []
        connected = list(workers)
        usable = [w for w in connected if w.broken is None and not w.draining]
        queues: list[tuple[ConstraintKey | None, ReadyQueue]] = [(PLAIN, ready), *constrained.items()]
        stuck = {
            key: queue
            for key, queue in queues
            if queue.live and not (usable if key is None else any(w.fits_ever(key) for w in usable))
        }
        for key in [k for k in self.episodes if k not in stuck]:
            episode = self.episodes.pop(key)
            if episode.told:
                log.info("tasks waiting for %s can run now", _what(key))
        for key in stuck:
            self.episodes.setdefault(key, Episode(now))
        due = [key for key, e in self.episodes.items() if now - e.since >= self.after]
        self.due = [(key, stuck[key]) for key in due]
        walk = [key for key in due if (w := self.episodes[key].walked) is None or now - w >= self.after]
        if not walk:
            return []
        per_client: dict[bytes, list[tuple[int, ConstraintKey | None]]] = {}
        for key in walk:
            episode = self.episodes[key]
            if episode.walked is None:
                self.episodes_warned += 1
                log.warning(
                    "%d task(s) have waited %.1f s: %s (no_worker_warning)",
                    stuck[key].live, now - episode.since, _reason(key, len(connected)),
                )
            episode.walked = now
            counts: dict[bytes, int] = {}
            for task in stuck[key].entries():
                if task.client not in episode.told:
                    counts[task.client] = counts.get(task.client, 0) + 1
            for client, count in counts.items():
                episode.told.add(client)
                per_client.setdefault(client, []).append((count, key))
        out = []
        for client, parts in per_client.items():
            total = sum(count for count, _ in parts)
            waited = max(now - self.episodes[key].since for _, key in parts)
            if len(parts) == 1:
                reason = _reason(parts[0][1], len(connected))
            else:
                reason = "; ".join(f"{count}: {_reason(key, len(connected))}" for count, key in parts)
            out.append((client, m.TasksWithoutWorker(total, round(waited, 1), reason)))
        return out

    def forget_client(self, client: bytes) -> None:
        """The client left (its tasks went with it)."""
        for episode in self.episodes.values():
            episode.told.discard(client)

    def statistics(self, workers: Iterable[WorkerRecord]) -> dict[str, int]:
        """``tasks_without_worker``: tasks of the queues found stuck at the last check that
        are still queued and still have no worker that can run them (a worker that joined
        since counts at once, not at the next check); ``no_worker_episodes``."""
        waiting = 0
        if self.due:
            usable = [w for w in workers if w.broken is None and not w.draining]
            for key, queue in self.due:
                if queue.live and not (usable if key is None else any(w.fits_ever(key) for w in usable)):
                    waiting += queue.live
        return {"tasks_without_worker": waiting, "no_worker_episodes": self.episodes_warned}


def _what(key: ConstraintKey | None) -> str:
    return "any worker" if key is None else f"a worker with {describe_key(key)}"


def _reason(key: ConstraintKey | None, connected: int) -> str:
    if key is not None:
        return f"no connected worker has {describe_key(key)}"
    if not connected:
        return "no worker is connected"
    return f"the {connected} connected worker(s) are stopping or broken"
