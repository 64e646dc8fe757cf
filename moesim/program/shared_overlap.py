"""Shared experts overlapped with the token dispatcher (pure; docs/model.md, "Shared
experts under the all-to-all").

Megatron-Core's ``moe_shared_expert_overlap`` (megatron/core/transformer/moe/
shared_experts.py and token_dispatcher.py, NVIDIA/Megatron-LM d98e8a6): the shared
experts run on their own CUDA stream; ``linear_fc1_forward_and_act`` is launched right
after the tokens' dispatch all-to-all, ``linear_fc2_forward`` right after the combine
all-to-all (the shared stream first waits for the routed experts, so fc2 never overlaps
them), and the layer's output waits for the shared stream. In the backward the grad_fn
sequence numbers are set so each all-to-all is launched first and the shared expert's
matching backward runs under it: fc2's dgrad/wgrad under the combine's backward, the
activation's and fc1's under the dispatch's.

moesim keeps one compute resource per GPU: the shared part runs on the compute stream
while the all-to-all is on its own (``ep``) stream, and the routed work after the
all-to-all waits for both, so a layer's pass shrinks by min(shared part, all-to-all).
"""

from __future__ import annotations

#: op names of the overlapped shared parts: under the pass's first / second all-to-all
NAMES = {"fwd": ("fwd.shared_fc1", "fwd.shared_fc2"),
         "bwd": ("bwd.shared_fc2", "bwd.shared_fc1")}


def enabled(scn, spec) -> bool:
    """Whether the switch is on and the model has shared experts to overlap."""
    return bool(scn.overlap.shared_expert) and spec.n_shared_experts > 0


def is_side(name: str) -> bool:
    """An overlapped shared part: it does not depend on the all-to-all before it."""
    return name in NAMES["fwd"] or name in NAMES["bwd"]


def split(kernels: list, phase: str) -> tuple[list, list]:
    """The shared experts' kernels of ``phase`` as (under the pass's first all-to-all,
    under its second). Forward: fc1 and the activation | fc2 (the dispatch comes first);
    backward: fc2's dgrad and wgrad | the activation's backward and fc1's (the combine's
    backward comes first)."""
    acts = [i for i, k in enumerate(kernels) if "_act" in k.name]
    if not acts:
        return list(kernels), []
    i = acts[-1] + 1 if phase == "fwd" else acts[0]
    return list(kernels[:i]), list(kernels[i:])

