"""Whether the environment wants numba-compiled loops: ``MOESIM_NUMBA`` unset, or set to
anything but ``0``, ``false``, ``no``, ``off`` (any case). The one reading of the variable,
shared by the flow network's switch (:mod:`moesim.network.jit`) and the routing sampler's
loaders (:mod:`moesim.gating.same_jit`). No moesim imports."""

from __future__ import annotations

import os

#: values of ``MOESIM_NUMBA`` that keep numpy
OFF = ("0", "false", "no", "off")


def numba_wanted() -> bool:
    """True unless ``MOESIM_NUMBA`` says off."""
    return os.environ.get("MOESIM_NUMBA", "1").strip().lower() not in OFF
