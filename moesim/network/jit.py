"""Which implementation runs the flow model's inner loops: numba-compiled or numpy.

The max-min solve, the affected-flow closure and the per-event bookkeeping of
:class:`moesim.network.flow.FlowNetwork` have two implementations: compiled loops
(:mod:`moesim.network.jit_loops`, numba; max-min by bottleneck levels) and vectorized
numpy (:mod:`moesim.network.incremental`, :mod:`moesim.network.maxmin`; max-min by
rounds). They compute the same max-min rates up to rounding: delivery times agree
within 1e-12 relative (tests; 1e-14 measured on skewed all-to-alls up to 128 GPUs).
:func:`moesim.network.maxmin.maxmin_pairs` gives the same bits on both. numba is used
when it can be imported, unless the environment variable ``MOESIM_NUMBA=0`` is set;
:func:`use_numba` switches at run time (tests run both paths).

numba is imported, and its kernels loaded, only when a run is large enough to gain
from it (a flow network past ``slots.JIT_AFTER_EVENTS`` events or
``slots.JIT_AFTER_PAIRS`` pairs, a max-min problem over ``maxmin.JIT_PAIRS`` pairs):
importing numba and loading the cached code costs about 0.9 s of CPU, more than a small
run's whole network. A run may switch at any event (both paths are exact max-min).
Compiled code is cached on disk (``cache=True``: next to the module, or numba's
per-user cache directory when that is not writable), so the compile cost (a few
seconds, docs/network.md) is paid once per machine and numba version.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from moesim.jitenv import numba_wanted

_state: dict[str, object] = {"want": numba_wanted(), "kernels": None}


def numba_available() -> bool:
    """Whether numba can be imported here (without importing it)."""
    return importlib.util.find_spec("numba") is not None


def use_numba(on: bool) -> bool:
    """Turn the compiled path on or off (off: numpy); returns the previous setting."""
    old = bool(_state["want"])
    _state["want"] = bool(on)
    return old


def kernels(load: bool = True) -> ModuleType | None:
    """The compiled kernels module, or None when the numpy path is to run (or, with
    ``load=False``, when numba has not been imported yet)."""
    if not _state["want"]:
        return None
    mod = _state["kernels"]
    if mod is None:
        if not load:
            return None
        if not numba_available():
            _state["want"] = False
            return None
        from moesim.network import jit_loops as mod  # imports numba; compiles lazily
        _state["kernels"] = mod
    return mod   # type: ignore[return-value]


def backend() -> str:
    """'numba' or 'numpy': the implementation the next call will use."""
    return "numba" if kernels() is not None else "numpy"
