"""Sizes in settings ('4G', '512MiB') and the machine's RAM: for the config, the daemon's
object store and the workers' memory limits alike, so it sits below all of them."""

from __future__ import annotations

import os
import re

# Binary multiples whatever the spelling: 4G, 4GB and 4GiB are all 4 * 2**30 bytes.
_UNITS = {"": 1, "B": 1}
for _power, _letter in enumerate("KMGT", start=1):
    for _suffix in ("", "B", "IB"):
        _UNITS[_letter + _suffix] = 1 << (10 * _power)
_SIZE_HELP = "write bytes or a number with K, M, G or T (KB/KiB... alike), e.g. 4G or 512MiB"


def total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_size(text: str) -> int:
    """'4G', '512MB', '1.5e9' -> bytes; ValueError naming the format otherwise."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Z]*)\s*", text.upper())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: {_SIZE_HELP}")
    try:
        value = float(match.group(1)) * _UNITS[match.group(2)]
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a size: {_SIZE_HELP}") from None
    if value <= 0:
        raise ValueError(f"a memory limit must be positive, got {text!r}")
    return int(value)
