"""Expert tensor parallelism: expert GEMMs split over the ETP group (pure).

Megatron-Core shards every routed expert's matrices over the ETP group (up/gate
column-parallel, down row-parallel: ``megatron/core/transformer/moe/experts.py``).
After the EP all-to-all, the token dispatcher all-gathers the received tokens over the
ETP group and, after the experts, reduce-scatters their outputs back
(``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``:
``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_parallel_region``
with the expert tensor group). So each ETP rank computes every token its peers received
for their common experts, at width ``expert_ffn / etp``; the backward repeats the pair
(all-gather of output gradients, reduce-scatter of input gradients).
"""

from __future__ import annotations

from moesim.collectives.communicator import CollectiveSpec
from moesim.model.spec import ModelSpec

ACT_BYTES = 2  # bf16 tokens on the wire


def gather_bytes(spec: ModelSpec, group_tokens: int) -> float:
    """Buffer of the ETP all-gather / reduce-scatter (nccl-tests sense): every token
    received by the group, hidden wide."""
    return float(group_tokens * spec.hidden * ACT_BYTES)


def etp_specs(group: tuple[int, ...], spec: ModelSpec,
              group_tokens: int) -> tuple[CollectiveSpec, CollectiveSpec]:
    """(all-gather before the experts, reduce-scatter after them)."""
    nbytes = gather_bytes(spec, group_tokens)
    return (CollectiveSpec("all_gather", group, nbytes),
            CollectiveSpec("reduce_scatter", group, nbytes))
