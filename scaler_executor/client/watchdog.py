"""The daemon's watchdog: is the daemon still there, and what to do when it is not.

Called by the agent loop once per turn (``agent.py``), on the agent thread: an embedded
daemon that exited is restarted on its journal (``cluster.py``) or breaks the agent; a
restarted journaled daemon is asked again to resume (``resume.py``); a daemon silent for
``daemon_loss_timeout``, or whose address refuses connections (``connect.ListenerProbe``),
breaks the agent with ``DaemonLost``, failing every pending future.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scaler_executor.client import connect
from scaler_executor.exceptions import DaemonLost

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent

log = logging.getLogger("scaler_executor.client")


def check_daemon(agent: ClientAgent, now: float) -> None:
    if agent.cluster is not None:
        how = agent.cluster.exit_status()
        if how is not None and agent.config.journal and not agent.shutdown_requested:
            refused = agent.cluster.restart(now)  # its workers wait for it (client/cluster.py)
            if refused is None:
                log.warning("client: the embedded scaler-daemon exited (%s); restarted it on its journal", how)
                return
            agent.break_with(DaemonLost(f"the embedded scaler-daemon exited ({how}): {refused}"))
            return
        if how is not None:
            agent.break_with(DaemonLost(f"the embedded scaler-daemon exited unexpectedly ({how})"))
            return
    daemon = agent.daemon
    resume = agent.resume
    if resume.resuming:
        if resume.again_due(now):  # no Welcome yet: that daemon died too, say
            daemon.send([resume.start(now)])
    elif not daemon.welcomed and agent.cluster is None:
        if now - daemon.started > agent.config.connect_timeout:  # no answer to the first Hello
            agent.break_with(DaemonLost(connect.no_welcome(agent.address, now - daemon.started)))
        return
    silence = now - daemon.last_recv
    listener = agent.listener
    # A journaled daemon may be down for its restart: refused connections are expected
    # then, for its grace period (connect.py's ListenerProbe is asked after it).
    waited = resume.silence_limit(daemon.heartbeat_interval)
    if listener is not None and silence > max(listener.silent_after, waited):
        gone = listener.check(now)  # refused: the daemon is gone, not slow (connect.py)
        if gone is not None:
            agent.break_with(DaemonLost(f"the daemon at {agent.address} is gone (it died or was stopped): no message for {silence:.1f} s, and {gone}"))
            return
    elif listener is not None:
        listener.quiet()
    if silence > max(agent.config.daemon_loss_timeout, waited):
        if daemon.welcomed or resume.resuming:
            text = f"no message from the daemon at {agent.address} for {silence:.1f} s (daemon_loss_timeout)"
        else:
            text = f"could not reach the daemon at {agent.address} within {now - daemon.started:.1f} s (daemon_loss_timeout)"
        agent.break_with(DaemonLost(text))
