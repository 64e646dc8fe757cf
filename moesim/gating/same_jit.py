"""When the routing sampler's compiled loops (numba) take over from numpy: the counting
loop of :func:`moesim.gating.pooled.pooled_counts` (:mod:`moesim.gating.pool_kernel`)
and the arithmetic after :func:`moesim.gating.sampling._same_rows`' draws
(:mod:`moesim.gating.same_kernel`). Each is loaded once enough work has run on numpy
(importing numba costs about a second of CPU, more than a small run's routing), where
numba is wanted (``MOESIM_NUMBA`` not ``0``) and importable; both paths give the same
counts, bit for bit. Imports only :mod:`moesim.jitenv`."""

from __future__ import annotations

import importlib

from moesim.jitenv import numba_wanted

#: calls of ``_same_rows`` on numpy before the compiled loop takes over
SAME_JIT_AFTER = 256
#: (token, pick) points counted on numpy before the pooled counting loop takes over
#: (numpy's search takes about as long as importing numba over ~5 million points)
POOL_JIT_AFTER = 1 << 22


class LazyKernel:
    """A compiled function loaded once more than ``after`` units of work (calls, points)
    have run on numpy; ``state``: whether it is wanted, the work so far, the function."""

    def __init__(self, module: str, name: str, after: int) -> None:
        self.module, self.name, self.after = module, name, after
        self.state: dict = {"work": 0, "kernel": None, "want": numba_wanted()}

    def get(self, work: int = 1):
        """The compiled function, or None (numpy) before enough work or without numba."""
        st = self.state
        if st["kernel"] is not None or not st["want"]:
            return st["kernel"] if st["want"] else None
        st["work"] += work
        return self._load() if st["work"] > self.after else None

    def _load(self):
        try:
            fn = getattr(importlib.import_module(self.module), self.name)
        except ImportError:     # numba missing (platforms without its wheels): numpy
            self.state["want"] = False
            return None
        self.state["kernel"] = fn
        return fn

    def use(self, on: bool | None) -> None:
        """Tests: ``True`` loads and uses it now, ``False`` keeps numpy, ``None`` restores
        the default (``MOESIM_NUMBA``; numpy until ``after``)."""
        self.state.update(work=0, kernel=None, want=numba_wanted() if on is None else bool(on))
        if on:
            self._load()


SAME = LazyKernel("moesim.gating.same_kernel", "same_counts", SAME_JIT_AFTER)
POOL = LazyKernel("moesim.gating.pool_kernel", "pooled_counts", POOL_JIT_AFTER)
_STATE = SAME.state


def same_kernel():
    """The compiled equal-rows loop, or None (numpy)."""
    return SAME.get()


def use_same_kernel(on: bool | None) -> None:
    SAME.use(on)
