"""The client's side of tasks that no worker can run (the daemon decides: scheduler/no_worker.py).

The daemon sends ``TasksWithoutWorker`` once per episode; the client turns it into a
:class:`~scaler_executor.exceptions.NoWorkerWarning` (``warnings.warn``: shown once to a
program that configured nothing, filterable, and what ``pytest.warns`` sees) and, when the
program configured logging, a WARNING record of the ``scaler_executor.client`` logger
(without handlers, logging's last-resort handler would print the same line twice).
"""

from __future__ import annotations

import logging
import warnings

from scaler_executor.exceptions import NoWorkerWarning
from scaler_executor.protocol import messages as m

log = logging.getLogger("scaler_executor.client")


def warn_no_worker(message: m.TasksWithoutWorker, address: str, embedded: bool) -> None:
    if embedded:
        fix = "the embedded cluster's workers did not start or keep dying: see the log above"
    else:
        fix = f"start workers that can run them (scaler-worker {address} --resources/--tags ...) or change the tasks' options"
    text = (
        f"{message.tasks} task(s) have waited {message.waited:.1f} s for a worker at {address}: "
        f"{message.reason}; {fix} (no_worker_warning)"
    )
    if log.hasHandlers():
        log.warning(text)
    warnings.warn(text, NoWorkerWarning, stacklevel=2)
