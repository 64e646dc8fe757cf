"""DeepSeek's 5-stage decode pipeline on the lockstep model (``serve.decode_overlap:
five_stage``).

Source: deepseek-ai/open-infra-index (56d8685),
202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md,
"Computation-Communication Overlapping": "During the decoding phase, the execution
durations of different stages are unbalanced. Hence, we subdivide the attention layer into
two steps and use a 5-stage pipeline to achieve a seamless communication-computation
overlapping"; the figure of deepseek-ai/profile-data (4496024) ``assets/decode.jpg`` and
its README, "Decoding": "the all-to-all communication during decoding does not occupy GPU
SMs: after RDMA messages are issued, all GPU SMs are freed, and the system waits for the
all-to-all communication to complete after the computation has finished". The all-to-alls
are DeepEP's low-latency kernels called with ``return_recv_hook=True`` (deepseek-ai/DeepEP
dd758ca, ``deep_ep/buffers/legacy.py`` ``low_latency_dispatch`` / ``low_latency_combine``:
"the kernel will just do the RDMA request issues, but without actually receiving the
data. You must call the received hook"; README at 567632d, "two-micro-batch
overlapping": "the RDMA network traffic is happening in the background, without costing
any GPU SMs from the computation part").

One MoE layer of a micro-batch is five stages, as the figure names them: ``ATTN-0`` (the
ops after the combine and before core attention: norms, MLA down/up projections, RoPE;
moesim's unpermute opens it), ``ATTN-1`` (core attention, output projection, MoE routing
gate), ``DISPATCH`` (with ``SHARED``, the shared experts, on the compute stream beside it),
``MLP`` (the routed experts) and ``COMBINE``. The compute stream runs, per layer::

    compute: SHARED(x) ATTN-0(y) MLP(x) ATTN-1(y) | SHARED(y) ATTN-0(x) MLP(y) ATTN-1(x)
    comm:    DISPATCH(x)         COMBINE(x)       | DISPATCH(y)         COMBINE(y)

so each micro-batch's block list ``ATTN-0 | ATTN-1, DISPATCH issued, SHARED | MLP, COMBINE
issued |`` alternates with the other's, the second one block behind: a dispatch hides
under its own shared experts and the other micro-batch's ``ATTN-0``, a combine under the
other's ``ATTN-1``. The all-to-alls keep moesim's single ``ep`` stream (each starts when
its issuing block and the previous all-to-all are done, and at the late partner: the
fast engine's rule, :meth:`ForwardChain._issue`); a block that reads an all-to-all's data
waits for it (the receive hook), and that wait is the exposed communication. The hook's
own kernels (a copy of the received tokens) are not priced. Dense layers (DeepSeek-V3's
first three) have no all-to-all and run whole.

The fast engine runs it with :class:`FiveStageChain`; the exact engine runs the same
stages as reordered op programs (:class:`moesim.serve.program.ServeBuilder`,
:func:`moesim.program.overlap.interleave_stages`), with the same step.
"""

from __future__ import annotations

import numpy as np

from moesim.engine.fast.forward import ForwardChain
from moesim.program import recipe

#: stages the second micro-batch starts behind the first (sgl-project/sglang,
#: python/sglang/srt/operations_strategy.py ``_compute_moe_deepseek_blog_decode``:
#: ``tbo_delta_stages=2``)
DELTA_STAGES = 2
#: names of the two halves of a MoE layer's attention
ATTN_PARTS = ("fwd.attn0", "fwd.attn1")
#: the core attention kernel over the KV cache (moesim.serve.costs.decode_core_kernel)
CORE = "attention_decode"


def split_attention(kernels: list) -> tuple[list, list]:
    """(``ATTN-0``, ``ATTN-1``) of one layer's decode attention kernels: everything
    before the core attention over the KV cache, then the core attention and what follows
    it (output projection, KV write); without a core kernel, all of it is ``ATTN-1``."""
    at = next((i for i, k in enumerate(kernels) if k.name == CORE), 0)
    return list(kernels[:at]), list(kernels[at:])


class FiveStageChain(ForwardChain):
    """A forward chain whose two micro-batches run DeepSeek's 5-stage decode pipeline
    (the module doc); one micro-batch runs as :class:`ForwardChain` does."""

    def run_pair(self, s: int, items) -> None:
        """The micro-batches' stages alternately on one compute stream, the second
        :data:`DELTA_STAGES` stages behind."""
        self.ep_free = np.zeros(self.n)
        self.pairing = True
        gens = [self._stages(s, it, lag=DELTA_STAGES * (i > 0)) for i, it in enumerate(items)]
        alive = [True] * len(gens)
        while any(alive):
            for i, g in enumerate(gens):
                if alive[i]:
                    try:
                        next(g)
                    except StopIteration:
                        alive[i] = False
        self.pairing = False
        self.out[s].end = self.t[s].copy()

    def _attn_half(self, s: int, half: int, layer: int, mb: int) -> None:
        sb = self.sb
        key = (*sb.attn_key(layer), ATTN_PARTS[half])
        self._compute(s, ATTN_PARTS[half], key,
                      lambda: split_attention(sb.attn_kernels(layer))[half], layer, mb, "fwd")

    def _stages(self, s: int, item, lag: int):
        """One micro-batch's ops; yields at the end of each stage (the other micro-batch's
        stage runs next)."""
        for _ in range(lag):
            yield
        c, mb = self.c, item.mb
        self._compute(s, "fwd.embedding", ("emb", "fwd"),
                      lambda: recipe.embedding(c.spec, c.tokens, c.tp, "fwd"), -1, mb, "fwd")
        for layer in range(c.spec.layers):
            steps = self.plan.steps(layer, "fwd")
            moe = any(st.kind == "moe" for st in steps)
            for st in steps:
                if st.kind == "attn" and moe:
                    self._attn_half(s, 0, layer, mb)           # ATTN-0 (stage 0's end)
                    yield
                    self._attn_half(s, 1, layer, mb)           # ATTN-1, then the gate
                elif st.kind == "moe":
                    yield from self._moe_stages(s, st, layer, mb)
                else:
                    self._do[st.kind](s, st, layer, mb)
        self._head(s, mb)

    def _moe_stages(self, s: int, st, layer: int, mb: int):
        """The MoE block from the gate (stage 1's end) to the combine's receive (stage 4);
        the unpermute opens the next stage 0."""
        rec = self.route(s, layer, mb)
        for x in st.block:
            if x.kind == "a2a" and x.arg == "ep_dispatch":
                yield                                          # stage 2: send, SHARED
                issued = self._issue(s, x.arg, x.name, rec, layer, mb)
                for part in (0, 1):
                    side, op = self.kern.shared("fwd", part)
                    self._compute(s, side.name, *op, layer, mb, "fwd")
                yield                                          # stage 3: receive, MLP
                self._wait_ep(s, *issued)
            elif x.kind == "a2a":                              # combine: send
                issued = self._issue(s, x.arg, x.name, rec, layer, mb)
                yield                                          # stage 4: receive
                self._wait_ep(s, *issued)
                yield
            elif x.kind == "experts":
                self._experts(s, rec, layer, mb, "fwd", x.name)
            else:       # router, unpermute
                self._compute(s, x.name, *self.kern.op(x, layer), layer, mb, "fwd")
