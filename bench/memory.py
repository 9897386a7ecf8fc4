"""Peak client memory for a large argument or result: how many copies beyond the user's own.

    python bench/memory.py                      # 256 MiB and 1 GiB, bytes and ndarray
    python bench/memory.py --sizes 64M --kinds bytes --directions argument

Each case runs in a fresh interpreter with a fresh embedded cluster (one processor), so
nothing an earlier case left behind (heap, committed store pages) hides a copy. A second
process samples, every few milliseconds, two figures at the same instant:

* the client's private memory: the Private_Clean + Private_Dirty pages of every mapping
  in ``/proc/PID/smaps`` except the object store's ``/dev/shm`` region (psutil's USS
  counts those too, and they are already in the next figure);
* the store's bytes in use (``ObjectStore.stats().in_use``, attached by name).

A separate process samples because the copies happen in C code holding the GIL: a
sampler thread in the client would sleep through the very peak it looks for.

The figure reported is the peak of (private + store) above the client's baseline just
before the case, against the size of the user's own object: ``copies`` is how many more
of it there were at the peak (the user's object itself is not counted; for an array
result the object is the store's bytes, a zero-copy view).

    argument: the client builds the object, ``ex.submit(size_of, obj).result()``
    result:   ``r = ex.submit(make, n).result()`` (the worker builds it), r kept

The worker's own memory is not the client's and is not counted (except what it puts in
the store). The times include the sampler's load and are no speed measure. Keep sizes at or below 1 GiB on a shared machine: a case with three copies
takes four times its size.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# ---------------------------------------------------------------- tasks (run in the worker)


def size_of(value: Any) -> int:
    return int(getattr(value, "nbytes", None) or len(value))


def make_bytes(n: int) -> bytes:
    return b"\x01" * n


def make_array(n: int) -> Any:
    import numpy as np

    return np.full(n, 1, dtype=np.uint8)


def warm_up() -> int:
    import numpy  # noqa: F401 - imported before the case, so the case measures only itself

    return os.getpid()


# ---------------------------------------------------------------- the sampler process


def private_bytes(pid: int) -> int:
    """Private pages of ``pid`` outside /dev/shm mappings (the object store)."""
    total = 0
    skip = False
    with open(f"/proc/{pid}/smaps", "rb") as smaps:
        for line in smaps:
            first = line.split(None, 1)[0]
            if not first.endswith(b":"):  # a mapping's header line: "addr-addr perms off dev inode path"
                fields = line.split()
                skip = len(fields) >= 6 and fields[5].startswith(b"/dev/shm/")
            elif not skip and first in (b"Private_Clean:", b"Private_Dirty:"):
                total += int(line.split()[1]) * 1024
    return total


def sample(pid: int, store_name: str) -> None:
    """Sample until stdin closes; print the baseline and the peaks as JSON."""
    import select

    from scaler_executor.objstore import ObjectStore

    store = ObjectStore.attach(store_name)
    try:
        base_private, base_store = private_bytes(pid), store.stats().in_use
        peak = (0, 0, 0)  # (private + store, private, store) above the baseline
        print("ready", flush=True)
        while True:
            began = time.perf_counter()
            private = private_bytes(pid) - base_private
            in_store = store.stats().in_use - base_store
            if private + in_store > peak[0]:
                peak = (private + in_store, private, in_store)
            # Reading smaps walks the client's page tables (milliseconds for a GiB) under
            # its mmap lock: pause twice as long as a read took, so that the sampler takes
            # at most a third of a core and slows the client's page faults little.
            pause = max(0.001, 2 * (time.perf_counter() - began))
            if select.select([sys.stdin], [], [], pause)[0]:
                break
    finally:
        store.close()
    print(json.dumps({"peak": peak[0], "private": peak[1], "store": peak[2]}), flush=True)


# ---------------------------------------------------------------- one case (fresh interpreter)


def run_case(kind: str, size: int, direction: str) -> dict[str, Any]:
    import numpy as np
    import psutil

    from scaler_executor import ScalerExecutor

    with ScalerExecutor(max_workers=1) as ex:
        ex.submit(warm_up).result()
        # The embedded daemon names its region scaler-PID-...; other clusters may be running.
        ours = {str(child.pid) for child in psutil.Process().children(recursive=True)}
        regions = [path for path in glob.glob("/dev/shm/scaler-*") if path.split("-")[1] in ours]
        if len(regions) != 1:
            raise RuntimeError(f"expected one store region of this cluster in /dev/shm, found {regions}")
        sampler = subprocess.Popen(
            [sys.executable, __file__, "--sample", str(os.getpid()), os.path.basename(regions[0])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sampler.stdin is not None and sampler.stdout is not None
        if sampler.stdout.readline().strip() != "ready":
            raise RuntimeError("the sampler did not start")
        start = time.perf_counter()
        if direction == "argument":
            obj: Any = b"\x01" * size if kind == "bytes" else np.full(size, 1, dtype=np.uint8)
            got = ex.submit(size_of, obj).result()
        else:
            obj = ex.submit(make_bytes if kind == "bytes" else make_array, size).result()
            got = size_of(obj)
        seconds = time.perf_counter() - start
        sampler.stdin.close()
        figures = json.loads(sampler.stdout.readline())
        sampler.wait()
        if got != size:
            raise RuntimeError(f"the task saw {got} bytes, not {size}")
        del obj
    return {"kind": kind, "size": size, "direction": direction, "seconds": seconds, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256M,1G", help="comma-separated sizes (default 256M,1G)")
    parser.add_argument("--kinds", default="bytes,ndarray")
    parser.add_argument("--directions", default="argument,result")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each case (the highest peak is shown: a sample can only miss one)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line per case instead of a table")
    parser.add_argument("--sample", nargs=2, metavar=("PID", "STORE"), help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample:
        sample(int(args.sample[0]), args.sample[1])
        return
    if args.case:
        kind, size, direction = args.case.split(":")
        print(json.dumps(run_case(kind, int(size), direction)))
        return
    if not args.json:
        print(f"{'case':<28} {'object':>9} {'private':>9} {'store':>9} {'peak':>9} {'copies':>7} {'time':>7}")
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        for kind in args.kinds.split(","):
            for direction in args.directions.split(","):
                runs = []
                for _ in range(args.repeat):
                    out = subprocess.run(
                        [sys.executable, __file__, "--case", f"{kind}:{size}:{direction}"],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                    runs.append(json.loads(out.strip().splitlines()[-1]))
                best = max(runs, key=lambda r: r["peak"])
                best["copies"] = round(best["peak"] / size - 1, 2)
                if args.json:
                    print(json.dumps(best), flush=True)
                    continue
                mib = lambda n: f"{n / MIB:.0f}M"  # noqa: E731 - a local formatter
                print(
                    f"{kind + ' ' + direction:<28} {mib(size):>9} {mib(best['private']):>9} "
                    f"{mib(best['store']):>9} {mib(best['peak']):>9} {best['copies']:>7.2f} "
                    f"{best['seconds']:>6.2f}s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
