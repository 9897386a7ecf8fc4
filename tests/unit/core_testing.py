"""Helpers shared by the unit tests of the daemon's core beyond test_core.py's ``Cluster``
(test_core_fuzz.py, test_result_stream.py, test_object_chunks.py, test_object_stream.py), in
a module with a unique name (see tests/scaler_testing.py for why not conftest.py).
"""

from __future__ import annotations

from typing import Any

import cloudpickle
from test_core import Cluster, Out

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.scheduler.core import Received, Send

#: A client, a worker and a monitor: the roles that may, may also and may not send objects.
PEERS_OF_EVERY_ROLE: tuple[tuple[bytes, str], ...] = ((b"c", m.Role.CLIENT), (b"w", m.Role.WORKER), (b"m", m.Role.MONITOR))


class CommandsCluster(Cluster):
    """test_core's ``Cluster`` whose steps may also yield commands other than ``Send`` (store,
    object and manager commands): the sends are checked as ``Cluster`` checks them and
    returned as an ``Out``; the other commands of the last step are kept in ``others``."""

    others: list[Any]

    def step(self, *events: Any) -> Out:
        commands = self.scheduler.handle(*events)
        self.scheduler.validate()
        sends = [c for c in commands if type(c) is Send]
        for command in sends:
            assert decode(encode(command.messages))[0] == command.messages
        self.others = [c for c in commands if type(c) is not Send]
        return Out(sends)


def role_hello(role: str) -> m.Hello:
    """A ``Hello`` of a peer of ``role``, named after it, with one processor."""
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
                   role, 1, "h", 1, {}, [])


def joining(peers: tuple[tuple[bytes, str], ...] = PEERS_OF_EVERY_ROLE, now: float = 1.0) -> list[Received]:
    """The events of ``peers`` (peer, role) joining a core at ``now``."""
    return [Received(peer, [role_hello(role)], now) for peer, role in peers]
