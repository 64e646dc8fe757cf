"""Ops: the per-rank program the schedule builds and the executor runs.

Pure data. Each rank has a list of ops; an op runs on one *stream* of its rank
(``compute``, ``comm``, ``pp``); ops on one stream run in list order, and an op
also waits for its explicit ``deps`` (indices into the same rank's list).
A collective op names its group and a rendezvous ``key`` shared by every member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Op:
    stream: str                 # "compute" | "comm" | "pp"
    kind: str                   # span kind (moesim.trace.spans.KINDS)
    name: str                   # e.g. "fwd.attn", "fwd.dispatch"
    deps: tuple[int, ...] = ()  # indices of ops of the same rank that must finish first
    duration_s: float = 0.0     # compute ops: seconds on the compute stream
    coll: Any = None            # collective ops: moesim.collectives CollectiveSpec
    key: tuple = ()             # collective rendezvous key / p2p message key
    send_to: int = -1           # p2p: destination rank of an eager send
    recv_from: int = -1         # p2p: source rank of a receive
    nbytes: float = 0.0         # p2p bytes; collectives: bytes this rank sends
    layer: int = -1
    microbatch: int = -1
    phase: str = ""             # "fwd" | "bwd" | "opt"
    tokens: int = 0
    experts: tuple[int, ...] = ()
    expert_tokens: tuple[int, ...] = ()  # tokens computed per expert in ``experts``
    flops: float = 0.0
    hot_expert: int = -1        # expert ops: the most-loaded local expert (for stall attribution)
    hot_tokens: int = 0         # its token count
    sms: int = 0                # communication ops: SMs the kernel holds from issue to end
    # compute ops: the kernels priced into duration_s (moesim.compute.base.Kernel; shared
    # with the builder's cache, so identical ops hold one tuple): `moesim kernels`
    kernels: tuple = ()
    # compute ops: seconds of duration_s on SMs no communication kernel takes (GEMMs
    # pinned to the SMs the EP kernels leave, moesim.compute.pinned_sms): not slowed
    pinned_s: float = 0.0

    @property
    def is_compute(self) -> bool:
        return self.coll is None and self.send_to < 0 and self.recv_from < 0
