"""Remote tracebacks that name the real file, line and source, printed once.

* cloudpickle pickles the code of functions it sends by value (``__main__``'s, lambdas,
  closures) with ``co_filename = "<dynamic-code>"``, to make payloads deterministic; a
  traceback through them then has no file and no source.  The client's picklers keep
  the real file name instead (``reduce_code``): a processor whose host has the file shows
  its lines, and file and line numbers are right everywhere.
* What the processor could not show, the client fills in from its own ``linecache``
  (``fill_sources``): a frame of a file the worker's host does not have (a script on
  the client's host, a Jupyter cell, which lives only in the client's linecache).
  Shipping the source with every by-value function instead would cost every
  registration bytes for a failure path, and could never show a notebook cell's text
  that the kernel keeps in memory, so the source is looked up where it is: on the client.
  Only frames the worker printed without a source line are filled, so a line the
  worker did show (its installed library) is never replaced by the client's version.
"""

from __future__ import annotations

import linecache
import re
import types
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

_CODE = types.CodeType
_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[_CODE]


def reduce_code(obj: Any) -> Any:
    """For a picklers' ``reducer_override``: a code object as cloudpickle reduces it, with its
    file name kept; NotImplemented for anything else."""
    if type(obj) is not _CODE:
        return NotImplemented
    _ctor, args = _cloudpickle_code_reduce(obj)
    return _code_in_file, (args, obj.co_filename)


def _code_in_file(args: tuple[Any, ...], filename: str) -> types.CodeType:
    return _CODE(*args).replace(co_filename=filename)


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in ')


def fill_sources(text: str) -> str:
    """``text`` (a formatted traceback) with the source line added under each frame that
    has none, where this process's linecache has the file."""
    lines = text.split("\n")
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        match = _FRAME.match(line)
        if match is None:
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith("    "):
            continue  # the worker showed this frame's source
        filename = match.group("file")
        if filename.startswith("<") and filename.endswith(">") and not linecache.getlines(filename):
            continue
        source = linecache.getline(filename, int(match.group("line"))).strip()
        if source:
            out.append("    " + source)
    return "\n".join(out)
