"""A client on its own host, driven by a test through one JSON line per command (stdin) and
one JSON answer per line (stdout).  Run by ``multihost_net.Hosts.spawn`` inside the client's
namespace; logs go to stderr.

Commands (``op``): ``open`` (address, config: ClusterConfig keys, executor: further
ScalerExecutor keyword arguments such as credentials), ``submit`` (fn, args: a list of
argument lists) -> batch, ``done`` (batch) -> how many finished, ``running`` (batch) -> how many run now, ``wait`` (batch, timeout)
-> results and errors, ``put_fetch`` (size) -> timings of a put, a remote task reading it, the
client reading it back, and a large result (also from the task's end), ``noop`` (count, trips) -> throughput and round trip,
``put_keep`` (size) -> a kept ref and its digest, ``submit_ref`` (ref) -> a batch reading it, ``drop_ref`` (ref), ``read_while_task`` (ref),
``put_read`` (sizes) -> digests of arrays put, read on another host and read back,
``bytes_read`` (sizes) -> the same for bytes, and for bytes a remote task returns,
``result_twice`` (size, seed) -> digests of a large result read back and read again by a task,
``submit_result`` (size, seed) -> a batch making a large result, ``wait_digest`` (batch,
timeout) -> its digest or error, ``stats``, ``close``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import statistics
import sys
import time
import traceback
from typing import Any

import multihost_tasks as tasks

from scaler_executor import ClusterConfig, ScalerExecutor, task_info

state: dict[str, Any] = {"ex": None, "batches": []}


def _ex() -> ScalerExecutor:
    ex = state["ex"]
    assert ex is not None, "open first"
    return ex


def op_open(address: str, config: dict[str, Any], executor: dict[str, Any] | None = None) -> dict[str, Any]:
    state["ex"] = ScalerExecutor(address=address, config=ClusterConfig(**config), **(executor or {}))
    return {"ok": True}


def op_submit(fn: str, args: list[list[Any]]) -> dict[str, Any]:
    ex, function = _ex(), getattr(tasks, fn)
    state["batches"].append([ex.submit(function, *a) for a in args])
    return {"batch": len(state["batches"]) - 1}


def op_done(batch: int) -> dict[str, Any]:
    return {"done": sum(f.done() for f in state["batches"][batch])}


def op_running(batch: int) -> dict[str, Any]:
    return {"running": sum(f.running() for f in state["batches"][batch])}


def op_wait(batch: int, timeout: float) -> dict[str, Any]:
    futures = state["batches"][batch]
    started = time.monotonic()
    done, _ = concurrent.futures.wait(futures, timeout)
    results, errors = [], []
    for f in futures:
        if f not in done:
            results.append(None)
            errors.append(None)
        elif f.exception() is not None:
            exc = f.exception()
            results.append(None)
            errors.append([type(exc).__name__, str(exc)])
        else:
            results.append(f.result())
            errors.append(None)
    return {"results": results, "errors": errors, "seconds": time.monotonic() - started}


def op_put_fetch(size: int) -> dict[str, Any]:
    ex = _ex()
    value = tasks.pattern(size, 1)
    started = time.monotonic()
    ref = ex.put(value)
    put = time.monotonic() - started
    started = time.monotonic()
    remote = ex.submit(tasks.sample, ref).result()
    read_remotely = time.monotonic() - started
    expect = tasks.sample(value)
    del value
    started = time.monotonic()
    got = ref.result()
    get = time.monotonic() - started
    ok_get = tasks.sample(got) == expect
    del got
    started = time.monotonic()
    future = ex.submit(tasks.make_bytes, size, 2)
    back = future.result()
    fetch, done_at = time.monotonic() - started, time.time()
    # From the task's end (its result pickled, on the worker's clock: the hosts share this
    # machine's) to the value here: the transfer and the unpickling alone.
    info = task_info(future)
    from_end = done_at - info.finished if info is not None and info.finished else None
    ok_back = tasks.sample(back) == tasks.sample(tasks.pattern(size, 2))
    return {"put": put, "read_remotely": read_remotely, "get": get, "fetch": fetch, "fetch_from_end": from_end,
            "remote_ok": tuple(remote) == expect, "get_ok": ok_get, "back_ok": ok_back, "size": size}


def op_put_read(sizes: list[int]) -> dict[str, Any]:
    """Per size: a NumPy array put from this host, its digest as a task on another host
    reads it and as this client reads it back (both fetched through the daemon)."""
    ex = _ex()
    out = []
    for size in sizes:
        value = tasks.array_of(size)
        expect = list(tasks.array_digest(value))
        ref = ex.put(value)
        remote = list(ex.submit(tasks.array_digest, ref).result())
        back = list(tasks.array_digest(ref.result()))
        out.append({"size": size, "objects": len(ref.object_ids), "expect": expect, "remote": remote, "back": back})
        del ref, value
    return {"objects": out}


def op_bytes_read(sizes: list[int]) -> dict[str, Any]:
    """Per size: bytes (a pickle stream in one store object) put from this host, hashed by a
    task on another host and as this client reads them back, and bytes made by a task on
    another host (a result streamed to the daemon's store) hashed here: digests to compare."""
    ex = _ex()
    out = []
    for seed, size in enumerate(sizes):
        value = tasks.random_bytes(size, seed)
        expect = tasks.digest(value)
        ref = ex.put(value)
        del value
        remote = ex.submit(tasks.digest, ref).result()
        back = tasks.digest(ref.result())
        result = tasks.digest(ex.submit(tasks.random_bytes, size, seed + 1000).result())
        out.append({"size": size, "expect": expect, "remote": remote, "back": back,
                    "result": result, "expect_result": tasks.digest(tasks.random_bytes(size, seed + 1000))})
        del ref
    return {"objects": out}


def op_result_twice(size: int, seed: int) -> dict[str, Any]:
    """A task on another host makes ``size`` random bytes (a large result, forwarded to this
    client as it reaches the daemon's store); a second task reads the same result from the
    store (the first future as its argument): both digests, and the one expected."""
    ex = _ex()
    made = ex.submit(tasks.random_bytes, size, seed)
    again = ex.submit(tasks.digest, made)
    return {"back": tasks.digest(made.result()), "again": again.result(),
            "expect": tasks.digest(tasks.random_bytes(size, seed))}


def op_submit_result(size: int, seed: int) -> dict[str, Any]:
    """A task that makes ``size`` random bytes, as a batch of one (``wait_digest``)."""
    state["batches"].append([_ex().submit(tasks.random_bytes, size, seed)])
    return {"batch": len(state["batches"]) - 1, "expect": tasks.digest(tasks.random_bytes(size, seed))}


def op_wait_digest(batch: int, timeout: float) -> dict[str, Any]:
    """The digest of a batch of one's result (or its error), once done."""
    (future,) = state["batches"][batch]
    try:
        return {"digest": tasks.digest(future.result(timeout)), "error": None}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"digest": None, "error": [type(exc).__name__, str(exc)]}
    finally:
        state["batches"][batch] = []


def op_put_keep(size: int) -> dict[str, Any]:
    """Put an array of ``size`` bytes and keep its ref (``submit_ref``, ``drop_ref``)."""
    value = tasks.array_of(size)
    state.setdefault("refs", []).append(_ex().put(value))
    return {"ref": len(state["refs"]) - 1, "expect": list(tasks.array_digest(value))}


def op_submit_ref(ref: int) -> dict[str, Any]:
    """A task that reads a kept ref (its digest), as a batch of one (``wait``)."""
    state["batches"].append([_ex().submit(tasks.array_digest, state["refs"][ref])])
    return {"batch": len(state["batches"]) - 1}


def op_drop_ref(ref: int) -> dict[str, Any]:
    state["refs"][ref] = None
    return {"ok": True}


def op_read_while_task(ref: int) -> dict[str, Any]:
    """Read a kept ref back (``ref.result()``, fetched through the daemon) on a thread, and
    meanwhile run a no-op task: whether its result came while the read was still going."""
    import threading

    ex, kept = _ex(), state["refs"][ref]
    got: list[Any] = []
    read = threading.Event()

    def read_back() -> None:
        value = kept.result()
        read.set()  # before the hash: "still going" must mean the bytes had not all come
        got.append(tasks.array_digest(value))

    reader = threading.Thread(target=read_back)
    reader.start()
    ex.submit(tasks.noop, 1).result(timeout=120)
    read_still_going = not read.is_set()
    reader.join(300)
    return {"read_still_going": read_still_going, "digest": list(got[0]) if got else None}


def op_noop(count: int, trips: int) -> dict[str, Any]:
    ex = _ex()
    list(ex.map(tasks.noop, range(100)))  # warm
    started = time.monotonic()
    list(ex.map(tasks.noop, range(count)))
    throughput = count / (time.monotonic() - started)
    times = []
    for i in range(trips):
        t0 = time.perf_counter()
        ex.submit(tasks.noop, i).result()
        times.append(time.perf_counter() - t0)
    return {"throughput": throughput, "round_trip_median": statistics.median(times)}


def op_stats() -> dict[str, Any]:
    stats = _ex().statistics()
    return {"stats": dict(stats), "store": dict(stats.store)}  # the Mapping of counters (JSON has no dataclasses)


def op_close() -> dict[str, Any]:
    ex = state["ex"]
    if ex is not None:
        ex.shutdown(wait=True, cancel_futures=True)
    state["ex"] = None
    return {"ok": True}


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="client %(asctime)s %(name)s %(message)s")
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            answer = globals()[f"op_{op}"](**command)
        except Exception:  # noqa: BLE001  (the test sees it as a failure, with the traceback)
            answer = {"bug": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer, default=repr) + "\n")
        sys.stdout.flush()
        if op == "close":
            break
    op_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
