"""Benchmarks for scaler-executor: ``compare.py`` (executors side by side) and ``test_micro.py``.

A package so that the tasks the benchmarks run (``bench.workloads.noop``) have a
module path every worker process can import, whichever way it is started.
"""
