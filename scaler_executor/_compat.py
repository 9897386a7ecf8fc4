"""Small facts every process needs at start-up, kept free of heavy imports."""

from __future__ import annotations

import platform


def python_version() -> str:
    """'3.11': the part of the version that must match for pickles to travel."""
    return ".".join(platform.python_version_tuple()[:2])
