"""Capacity adapters: how the daemon grows and shrinks its pool of workers.

``local.LocalWorkerManager`` (worker processes on the daemon's host) is the one that
ships. The contract an adapter implements is ``scheduler.capacity.CapacityAdapter``,
defined beside the daemon loop that drives it: the scheduler does not import this package.
"""
