"""The span: one interval of one rank's stream in the simulated timeline.

This is the contract between the engine (which emits spans) and everything that
reads a timeline (Chrome trace export, plots, stall attribution, summaries).
Times are seconds from the start of the step.

``kind`` is one of :data:`KINDS`; the breakdown of a step is keyed by these.
A ``stall`` span is time a rank waited inside a collective for a peer that was
still busy: ``waited_on`` names that peer, ``expert`` the expert (and ``tokens``
its token count on the peer) that made it late, ``reason`` says it in words.
A ``bubble`` span is time a pipeline stage waited for its neighbour stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: kinds of span; the keys of ``breakdown_s`` (plus ``idle``, derived)
KINDS = (
    "compute",      # any kernel on the compute stream (attention, experts, router, optimizer)
    "ep_dispatch",  # expert-parallel all-to-all carrying tokens to experts
    "ep_combine",   # expert-parallel all-to-all carrying expert outputs back
    "tp",           # tensor-parallel all-reduce / reduce-scatter / all-gather
    "dp",           # data-parallel gradient all-reduce (or reduce-scatter for ZeRO>=1)
    "pp",           # pipeline send/recv of activations or gradients
    "zero",         # ZeRO-3/FSDP weight all-gather, ZeRO parameter all-gather
    "bubble",       # pipeline stage waiting for its neighbour
    "stall",        # waiting in a collective for a late peer (hot expert)
)
COMM_KINDS = ("ep_dispatch", "ep_combine", "tp", "dp", "pp", "zero")
#: the serving engine's CPU work per step, on a rank's ``host`` track
#: (moesim.serve.host); not a breakdown category: a serving summary reports it apart
HOST_KIND = "host"
#: every kind a span may have
SPAN_KINDS = (*KINDS, HOST_KIND)


@dataclass(frozen=True, slots=True)
class Span:
    rank: int
    stream: str          # "compute" or "comm" (or "comm.<group>" for extra comm streams)
    kind: str            # one of KINDS
    name: str            # op name, e.g. "fwd.experts", "dispatch", "dp.bucket3"
    start_s: float
    end_s: float
    layer: int = -1      # model layer index, -1 if none
    microbatch: int = -1  # micro-batch index, -1 if none
    phase: str = ""      # "fwd", "bwd", "opt" or ""
    bytes: float = 0.0   # bytes this rank sent (comm) or moved to/from HBM (compute)
    tokens: int = 0      # tokens processed (compute) or carried (comm)
    experts: tuple[int, ...] = ()  # expert ids computed on this rank (expert compute spans)
    peers: tuple[int, ...] = ()    # global ranks of the collective group
    waited_on: int = -1  # stall/bubble: the rank whose late arrival caused the wait
    expert: int = -1     # stall: the expert on waited_on that made it late
    reason: str = ""     # stall: human-readable cause
    flops: float = 0.0   # compute spans: FLOPs executed
    args: dict = field(default_factory=dict, compare=False, hash=False)  # extra, JSON-able

    @property
    def dur_s(self) -> float:
        return self.end_s - self.start_s


#: all-to-alls that follow the expert computation of their (layer, micro-batch, phase):
#: a wait there is on the late rank's experts
AFTER_EXPERTS = ("fwd.combine", "bwd.dispatch")


def wait_reason(blocking: int, op_name: str, expert: int = -1, tokens: int = 0) -> str:
    """A stall's cause in words, the same in both engines: the late rank's hot expert
    where it is known (``expert`` >= 0), else the op the late rank arrived late at."""
    if expert >= 0:
        return f"rank {blocking} still computing hot expert {expert} ({tokens} tokens)"
    return f"rank {blocking} arrived late at {op_name}"
