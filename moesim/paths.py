"""How a path moesim found by itself (a shipped scenario or topology) is shown.

A shipped file is found by its absolute location in the installation; shown in
messages and outputs like that, it names the build machine's folders. :func:`shown`
gives it relative to the working directory when it lies below it (the usual case in a
checkout: ``scenarios/hot-expert.yaml``), else as it is.
"""

from __future__ import annotations

import os
from pathlib import Path


def shown(path: str | Path) -> Path:
    """``path`` relative to the working directory if it lies below it, else unchanged."""
    p = Path(path)
    if not p.is_absolute():
        return p
    try:
        return p.relative_to(Path(os.getcwd()).resolve())
    except (ValueError, OSError):
        return p
