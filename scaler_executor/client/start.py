"""The embedded executor's client agent, built on a thread of its own.

``ScalerExecutor()`` starts its embedded daemon and returns; the client's machinery (the
agent, pickling, the client core, the wire's records: about 16 ms of imports and
construction) is imported and built on a ``scaler-client-start`` thread meanwhile, so
the constructor blocks for neither the daemon's start nor the client's.  The first use
of the executor (``submit``, ``map``, ``shutdown``, ...) joins that thread, which by then
has usually finished: the daemon and its workers take longer to start than the client
(docs/performance.rst, "The constructor").

Three things make a thread that imports safe here:

* The package's modules import one another without cycles at module level
  (tests/unit/test_layers.py checks it), so the start thread and a user thread importing
  the same modules at once wait for each other's module locks but never deadlock, and
  neither sees a module half-initialised.
* A fork (``os.fork``, multiprocessing's fork start method) first joins every start
  still running: a child must not inherit a module lock held by a thread it does not
  have.
* The thread is not a daemon thread: an interpreter that exits right after the
  constructor waits for it, and then the agent module's ``atexit`` hook shuts the agent
  down, with its cluster.

If the build fails, the embedded cluster is stopped at once (no agent exists to stop
it) and every use of the executor raises ``BrokenScalerExecutor`` with the failure as
its cause; ``shutdown()`` returns quietly.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from scaler_executor.exceptions import BrokenScalerExecutor

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.cluster import EmbeddedCluster
    from scaler_executor.config import ClusterConfig

_running: set[AgentStart] = set()  # starts whose thread has not finished (joined before a fork)


class AgentStart:
    """A ``ClientAgent`` being built for an embedded cluster; ``agent()`` waits for it."""

    def __init__(self, config: ClusterConfig, address: str, cluster: EmbeddedCluster) -> None:
        self._cluster = cluster
        self._agent: ClientAgent | None = None
        self._error: BaseException | None = None
        # Set when the constructor returns (``go``): the build waits for it, so that it
        # never holds the GIL while the constructor finishes. With equal real-time
        # priorities (``chrt``) and both cores busy with the daemon's start, a thread
        # that holds the GIL is never asked to drop it, and the constructor used to
        # wait for the whole build.
        self._go = threading.Event()
        self._thread = threading.Thread(
            target=self._build, args=(config, address), name="scaler-client-start", daemon=False
        )
        _running.add(self)
        try:
            self._thread.start()
        except BaseException:
            _running.discard(self)
            raise

    def go(self) -> None:
        """Let the build begin (the executor's constructor is done)."""
        self._go.set()

    def _build(self, config: ClusterConfig, address: str) -> None:
        try:
            self._go.wait()
            from scaler_executor.client.agent import ClientAgent

            self._agent = ClientAgent(config, address, self._cluster, None)
        except BaseException as exc:  # noqa: BLE001 - any failure is the executor's, raised at its first use
            self._error = exc
            self._cluster.stop()
        finally:
            _running.discard(self)

    def agent(self) -> ClientAgent:
        """The agent, once built.

        Raises:
            BrokenScalerExecutor: the build failed; its cause is the error it raised.
        """
        self.join()
        if self._agent is None:
            raise BrokenScalerExecutor(
                f"the executor's client could not start: {self._error!r}; the embedded cluster "
                "was stopped, create a new executor once the cause is fixed"
            ) from self._error
        return self._agent

    def join(self) -> None:
        self._go.set()  # a constructor that raised after the start was made
        if self._thread is not threading.current_thread():
            self._thread.join()

    def shutdown(self, wait: bool) -> None:
        """``ClientAgent.shutdown`` once built; nothing left to do when the build failed."""
        self.join()
        if self._agent is not None:
            self._agent.shutdown(wait)


def _join_all_before_fork() -> None:
    for start in list(_running):
        start.join()


os.register_at_fork(before=_join_all_before_fork)

