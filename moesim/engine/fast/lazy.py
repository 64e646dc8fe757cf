"""When the fast path's compiled loops (:mod:`moesim.engine.fast.jit_loops`, numba) take
over from numpy: one loader for the link bound (:mod:`moesim.engine.fast.network`) and
the compute slowed under a running EP kernel (:mod:`moesim.engine.fast.pairs`).

Each caller keeps its own state (``{"calls": int, "kernel": module or None}``) and
threshold: the module loads once more than ``after`` calls have run on numpy (importing
numba costs about a second of CPU, more than a small run's work), or at once with
``eager`` when numba is imported already (its import is paid), where
:func:`moesim.network.jit.kernels` says numba is wanted and importable
(``MOESIM_NUMBA=0`` or ``use_numba(False)``: numpy; both paths give the same bits)."""

from __future__ import annotations

import sys
from types import ModuleType

from moesim.network import jit


def fast_kernels(state: dict, after: int, eager: bool = False) -> ModuleType | None:
    """The compiled kernels module, or None (numpy) before ``after`` calls (unless
    ``eager`` and numba is imported) or when the switch says numpy."""
    if state["kernel"] is not None:      # loaded: only the switch turns it off
        return state["kernel"] if jit.kernels(load=False) is not None else None
    state["calls"] = int(state["calls"]) + 1
    if state["calls"] <= after and not (eager and "numba" in sys.modules):
        return None
    if jit.kernels() is None:
        return None
    from moesim.engine.fast import jit_loops as kernels

    state["kernel"] = kernels
    return kernels
