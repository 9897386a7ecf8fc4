"""The embedded cluster's initializer, as the client pickles it and a processor runs it.

A ``multiprocessing.Manager()`` proxy in ``initargs`` (the usual way to hand every
processor a queue) connects to its manager while it is unpickled, with
``multiprocessing.current_process().authkey``: the client's key must be set before
``(initializer, initargs)`` is unpickled, so the client pickles them apart, inside a call
of ``run_initializer`` with its key.  The key travels only inside the initializer's file,
in the embedded cluster's 0700 directory, to that cluster's local workers (the
initializer of a running cluster's workers is theirs: ``scaler-worker --initializer``).
"""

from __future__ import annotations

import multiprocessing
import pickle


def run_initializer(key: bytes, initializer: bytes) -> None:
    """Unpickle ``(fn, initargs)`` and run ``fn(*initargs)`` with authkey ``key``; the
    processor's own key is back afterwards."""
    process = multiprocessing.current_process()
    saved = process.authkey
    process.authkey = key
    try:
        fn, initargs = pickle.loads(initializer)
        fn(*initargs)
    finally:
        process.authkey = saved
