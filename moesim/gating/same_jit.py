"""When :func:`moesim.gating.sampling._same_rows` hands its draws to the compiled loop
(:mod:`moesim.gating.same_kernel`, numba) instead of numpy: after ``SAME_JIT_AFTER``
calls (importing numba costs about a second of CPU, more than a small run's routing),
where numba is wanted (``MOESIM_NUMBA`` not ``0``; :func:`use_same_kernel`) and
importable. Both give the same counts, bit for bit. No moesim imports."""

from __future__ import annotations

import os

#: calls of ``_same_rows`` on numpy before the compiled loop takes over
SAME_JIT_AFTER = 256



def _env_want() -> bool:
    return os.environ.get("MOESIM_NUMBA", "1").strip().lower() not in ("0", "false", "no",
                                                                      "off")


_STATE: dict = {"calls": 0, "kernel": None, "want": _env_want()}


def same_kernel():
    """The compiled loop, or None (numpy) before ``SAME_JIT_AFTER`` calls or without
    numba."""
    if not _STATE["want"]:
        return None
    if _STATE["kernel"] is None:
        _STATE["calls"] += 1
        if _STATE["calls"] <= SAME_JIT_AFTER:
            return None
        try:
            from moesim.gating.same_kernel import same_counts
        except ImportError:     # numba missing (platforms without its wheels): numpy
            _STATE["want"] = False
            return None
        _STATE["kernel"] = same_counts
    return _STATE["kernel"]


def use_same_kernel(on: bool | None) -> None:
    """Tests: ``True`` uses the compiled loop from the next call, ``False`` keeps numpy,
    ``None`` restores the default (``MOESIM_NUMBA``; numpy for ``SAME_JIT_AFTER`` calls)."""
    _STATE["kernel"] = None
    _STATE["want"] = _env_want() if on is None else on
    _STATE["calls"] = SAME_JIT_AFTER if on else 0
