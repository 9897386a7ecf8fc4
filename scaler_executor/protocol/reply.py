"""Results sent straight from a processor to its client: one unix datagram each.

A sequential caller's round trip crosses seven processes and threads on the normal
path (daemon, worker agent, processor, worker agent, daemon, client agent, caller).
For a task submitted while no other is outstanding (``TaskFlags.REPLY_DIRECT``), the
processor also sends the result to the client's *reply socket*: a unix datagram
socket the client binds in its private (mode 0700) cluster directory.  The client
completes the future from it, and the worker agent's copy of the result, marked
``delivered``, only does the daemon's bookkeeping.  Two hops leave the caller's path.

Why it cannot lose a result:

* A unix datagram is delivered whole or ``sendto`` fails (no partial writes, no loss
  in the kernel).  On any failure (the client gone, its queue full, a path this
  process may not write to) the processor reports the result the normal way.
* The directory's mode lets only the client's user in, so a datagram that was sent
  is one the client reads; the daemon refuses peers of another package version, so
  it decodes.
* Only results that ran under ``DIRECT_SECONDS`` with a payload of at most
  ``MAX_PAYLOAD`` bytes and no object-store objects go this way.
"""

from __future__ import annotations

from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m

MAX_PAYLOAD = 64 * 1024  # larger results take the daemon's path (one copy fewer to skip)
DATAGRAM_LIMIT = MAX_PAYLOAD + 4096  # what the client reads at once: any datagram we send fits
DIRECT_SECONDS = 0.01  # longer tasks gain nothing measurable (and their memory peak is sampled)
SOCKET_NAME = "reply.sock"


def encode(result: m.TaskResult) -> bytes:
    """One datagram carrying ``result`` (a TaskResults batch body of this protocol version)."""
    return codec.encode((m.TaskResults([result]),))[1]  # type: ignore[no-any-return]


def decode(datagram: bytes) -> list[m.TaskResult]:
    """The results in a datagram; raises codec.DecodeError for anything else."""
    messages, _ = codec.decode([codec.VERSION_FRAME, datagram])
    results: list[m.TaskResult] = []
    for message in messages:
        if type(message) is not m.TaskResults:
            raise codec.DecodeError(f"a reply datagram carries {type(message).__name__}, not TaskResults")
        results.extend(message.results)
    return results
