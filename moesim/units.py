"""Unit constants and parsing. SI inside: seconds, bytes, bytes/s, FLOP.

YAML and CLI take GB/s (10^9 bytes/s, as nccl-tests reports), µs and sizes such as
``1GiB`` or ``64MB``; reports print ms and GB/s.
"""

from __future__ import annotations

import math
import re

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024.0
MiB = 1024.0**2
GiB = 1024.0**3
TiB = 1024.0**4

US = 1e-6  # seconds per microsecond
MS = 1e-3  # seconds per millisecond

_SIZE_UNITS = {
    "": 1.0, "b": 1.0,
    "k": KB, "kb": KB, "m": MB, "mb": MB, "g": GB, "gb": GB, "t": TB, "tb": TB,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([+-]?)([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
SIZE_EXPECTED = ("a finite size >= 0 like 4096, 64MB, 1GiB (units B, KB, MB, GB, TB, KiB, MiB, "
                 "GiB, TiB)")


def parse_bytes(text: str | int | float) -> float:
    """Parse a size such as ``1GiB``, ``64MB``, ``4096`` (bytes) into bytes.

    Raises ValueError whose message is what was expected (no "got": callers add
    the value): a finite size >= 0 in one of the accepted units.
    """
    if isinstance(text, bool):
        raise ValueError(SIZE_EXPECTED)
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _SIZE_RE.match(str(text))
        if not m or m.group(3).lower() not in _SIZE_UNITS:
            raise ValueError(SIZE_EXPECTED)
        value = float(m.group(2)) * _SIZE_UNITS[m.group(3).lower()]
        if m.group(1) == "-" and value != 0:
            value = -value
    if not math.isfinite(value) or value < 0:
        raise ValueError(SIZE_EXPECTED)
    return value


def gbps_to_Bps(gbps: float) -> float:
    """GB/s (10^9 bytes per second) to bytes per second."""
    return float(gbps) * GB


def Bps_to_gbps(bps: float) -> float:
    return float(bps) / GB


def us_to_s(us: float) -> float:
    return float(us) * US


def s_to_us(s: float) -> float:
    return float(s) / US


def s_to_ms(s: float) -> float:
    return float(s) / MS
