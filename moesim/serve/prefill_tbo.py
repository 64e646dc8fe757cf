"""SGLang's prefill two-batch overlap as it orders the work (``serve.prefill_overlap:
sglang``).

moesim's default (``segments``) interleaves the two micro-batches segment by segment,
a segment ending at each all-to-all (:func:`moesim.program.overlap.interleave`), so one
micro-batch's next layer can start while the other's combine is in flight. SGLang's prefill
runs each MoE layer as three stages per micro-batch, the two micro-batches taking turns
with no offset (sgl-project/sglang ``python/sglang/srt/operations_strategy.py``
``_compute_moe_deepseek_blog_prefill`` at commit 1e90555b, ``tbo_delta_stages=0``):

1. attention, the gate, expert selection, ``dispatch_a`` (the FP8 cast);
2. ``dispatch_b`` (DeepEP's dispatch launched, the compute stream waits for it), the routed
   experts, ``combine_a`` (the local weighted sum);
3. the shared experts, ``combine_b`` (DeepEP's combine launched, the compute stream waits
   for it), the output.

In the normal-mode dispatcher (``python/sglang/srt/layers/moe/ep_moe/token_dispatcher.py``
``_DeepEPDispatcherImplNormal`` at commit 00114aef) the all-to-alls are launched in
``dispatch_b`` and ``combine_b`` and end in ``event.current_stream_wait()``; both
micro-batches' exchanges go through the one DeepEP buffer, one communication stream, in
launch order (moesim's single ``ep`` stream). The compute stream is in order, so the second
micro-batch's wait for its combine holds back the first micro-batch's next layer: each
layer ends when both combines are done, and the second combine overlaps only the shared
experts and the first micro-batch's output.

Here, per micro-batch and MoE layer: stage 1 is the attention and router ops, stage 2 the
dispatch and the routed experts, stage 3 the combine, the shared experts (moved from beside
the dispatch, ``overlap.shared_expert``) and the unpermute, and the next compute op placed
after stage 3 waits for the combine (:func:`moesim.program.overlap.interleave_stages`).
moesim's unpermute (the local weighted sum) follows the combine where SGLang's
``combine_a`` precedes it; its time is the same. Dense layers, the embedding and the head
stay in the stage they fall in. The exact engine runs the reordered programs; the fast
engine's lockstep chain does not, so a step with ``prefill_overlap: sglang`` runs on the
exact engine (``moesim.serve.run`` refuses the fast one in one line).
"""

from __future__ import annotations

from moesim.program.ops import Op
from moesim.program.shared_overlap import is_side

DISPATCH = "fwd.dispatch"
COMBINE = "fwd.combine"
ATTN = "fwd.attn"


def sglang_prefill_stages(prog: list[Op], lo: int, hi: int
                          ) -> list[tuple[list[int], int | None]]:
    """One micro-batch's ops ``prog[lo:hi]`` as SGLang's prefill stages, each ``(op
    indices, wait)`` (:func:`moesim.program.overlap.interleave_stages`): a new stage at
    each dispatch and at each combine, which heads the layer's last stage with the shared
    experts (wherever the builder placed them) before the rest, and is that stage's
    wait; the attention that follows a combine starts the next stage."""
    stages: list[tuple[list[int], int | None]] = []
    cur: list[int] = []
    side: list[int] = []      # the layer's shared experts, to run after its combine
    wait: int | None = None   # the combine heading the current stage

    def close() -> None:
        stages.append(([wait, *side, *cur] if wait is not None else cur, wait))

    for i in range(lo, hi):
        name = prog[i].name
        if is_side(name):
            side.append(i)
        elif name == DISPATCH or (name == ATTN and wait is not None):
            close()
            cur, side, wait = [i], side if wait is None else [], None
        elif name == COMBINE:
            stages.append((cur, None))
            cur, wait = [], i
        else:
            cur.append(i)
    close()
    return stages
