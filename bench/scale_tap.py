"""A tap on what a daemon receives and sends, by message type (bench only, never in a test).

    python -m bench.scale_tap OUT.jsonl -- --address ipc://... --workers 0

runs ``scaler-daemon`` in this process with ``codec.decode`` and ``codec.encode`` wrapped
so that every transmission the daemon decodes (``in``) or encodes (``out``) is counted: per
message type, the messages, the transmissions carrying it, and per list-carrying type
(``TaskResults``, ``DispatchTasks``, ``SubmitTasks``...) the items, plus the transmissions
each way.  On ``SIGUSR1`` the counts so far are appended to OUT as one JSON line, so a
caller (bench/scale_validate.py ``--tap``) diffs two snapshots around a measured phase.
The wrapping costs the daemon CPU of its own: figures taken with the tap are for counting,
not for the CPU per task.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from typing import Any

from scaler_executor.protocol import codec

_LISTS = {"TaskResults": "results", "DispatchTasks": "tasks", "SubmitTasks": "tasks", "SubmitAck": "count"}


def _bucket(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


class Tap:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def count(self, way: str, messages: Any) -> None:
        c = self.counts
        c[f"{way}:transmissions"] += 1
        seen = set()
        for message in messages:
            name = type(message).__name__
            c[f"{way}:{name}"] += 1
            if name not in seen:
                seen.add(name)
                c[f"{way}:{name}:transmissions"] += 1
            field = _LISTS.get(name)
            if field is not None:
                items = getattr(message, field)
                c[f"{way}:{name}:items"] += items if isinstance(items, int) else len(items)
                if not isinstance(items, int):
                    c[f"{way}:{name}:size<={_bucket(len(items))}"] += 1


def install(path: str) -> Tap:
    tap = Tap()
    decode, encode = codec.decode, codec.encode

    def tapped_decode(frames: Any, limits: Any = None) -> Any:
        messages, buffers = decode(frames, limits)
        tap.count("in", messages)
        return messages, buffers

    def tapped_encode(batch: Any, buffers: Any = ()) -> Any:
        tap.count("out", batch)
        return encode(batch, buffers)

    codec.decode = tapped_decode  # type: ignore[assignment]
    codec.encode = tapped_encode  # type: ignore[assignment]

    def dump(signum: int, frame: object) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(dict(tap.counts)) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    return tap


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 2 or args[0].startswith("-") or "--" not in args:
        # (not argparse: everything after "--" is scaler-daemon's, --help included)
        print(f"usage: python -m bench.scale_tap OUT.jsonl -- SCALER-DAEMON-ARGS...\n\n{__doc__}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    out = args[0]
    rest = args[args.index("--") + 1 :]
    install(out)
    from scaler_executor.cli import daemon

    return daemon.main(rest)


if __name__ == "__main__":
    sys.exit(main())
