"""The host calls of one part of a Python loop in NeMo RL's trainer, priced (pure):
:class:`Loop`, shared by :mod:`moesim.rl.seq_host` and :mod:`moesim.rl.cp_loops`.

Each call is priced at the host costs :mod:`moesim.program.host_dispatch` takes from
published measurements: an op that launches work 16.1 us (PyTorch's operator benchmark),
a view 3.3 us; a device-to-host read as one such op.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S


@dataclass(frozen=True)
class Loop:
    """Host calls of one part: ``ops`` Python-level calls that launch work, ``reads``
    device-to-host reads the host waits on, ``views`` view / metadata calls;
    ``padded_only``: run only when sequences are padded (TP > 1, CP > 1 or PP > 1)."""

    name: str
    ops: int = 0
    reads: int = 0
    views: int = 0
    padded_only: bool = False
    source: str = ""

    @property
    def seconds(self) -> float:
        return (self.ops + self.reads) * EAGER_OP_S + self.views * VIEW_OP_S
