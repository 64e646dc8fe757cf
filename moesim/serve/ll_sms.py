"""DeepEP's low-latency send and receive kernels on the compute stream
(``serve.ll_sms: compute``).

By default (``none``) a decode step's low-latency all-to-alls hold no SMs: the data move
while compute runs at its full rate, and the kernels that issue the sends and copy the
received tokens out are not priced (:mod:`moesim.serve.five_stage`). SGLang runs them
with DeepEP's receive hook on the compute stream (sgl-project/sglang
``python/sglang/srt/layers/moe/ep_moe/token_dispatcher.py``: ``low_latency_dispatch(...,
async_finish=not return_recv_hook, return_recv_hook=...)``, then ``hook()`` on the same
stream; ``low_latency_combine`` likewise), and its blog measured what that costs: "decode
communication kernels either fully utilize SMs (during send/receive) or none (during
inflight waiting)", and for the dispatch "unit tests with DeepEP reveal a potential of
0.06ms occupying SMs" (LMSYS blog "Deploying DeepSeek with PD Disaggregation and
Large-scale Expert Parallelism on 96 H100 GPUs", 2025-05-05, "Profile Results", "Detail
Breakdown" and "Ablation Study: Two-batch Overlap"). Those SMs are the whole GPU, so the
send and receive kernels run in series with the compute kernels.

With ``compute``, every MoE layer of a decode step over ``deepep-ll`` adds, per
micro-batch, two kernels to the compute stream (each two launches, send and receive):

- the dispatch's, at the blog's unit-test rate: 0.06 ms for DeepEP's low-latency test
  case (128 tokens per rank, top-8, hidden 7168, FP8 messages of 7,408 B:
  deepseek-ai/DeepEP ``tests/test_low_latency.py`` defaults, ``internode_ll.cu``
  ``num_bytes_per_msg``), scaled by the rank's message bytes (tokens x top-k x bytes per
  message) against that case's;
- the combine's at the same bytes per second over its BF16 messages (2 x hidden = 14,336
  B): no SM time is published for the combine, so it is taken as the dispatch's rate
  per byte of message, an assumption (each kernel copies its messages in and out of the
  RDMA buffers).

Where they go: the combine's with the layer's attention, first (the last layer's combine
is received before the attention), the dispatch's after it (sent once the attention and
the gate are done); so the dispatch starts when it does in SGLang, and the receive and
send around the experts are priced before the attention rather than beside the experts.
The fast and the exact engine take them from the same attention kernels; with
``decode_overlap: five_stage`` the combine's go to ATTN-0 and the dispatch's to ATTN-1.
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.compute.kinds import get_kind, register_kind
from moesim.ep.messages import ll_bytes_per_message

#: the blog's dispatch time "occupying SMs" in DeepEP's unit test (LMSYS blog,
#: 2025-05-05, "Dispatch Optimization Potential": "a potential of 0.06ms occupying SMs")
DISPATCH_SM_S = 0.06e-3
#: DeepEP's low-latency test case (deepseek-ai/DeepEP ``tests/test_low_latency.py``:
#: ``num_tokens, hidden, num_topk = 128, 7168, 8``), FP8 dispatch messages
TEST_TOKENS, TEST_HIDDEN, TEST_TOPK = 128, 7168, 8
#: message bytes per second the send and receive kernels handle while holding the GPU
SM_BYTES_PER_S = (TEST_TOKENS * TEST_TOPK
                  * ll_bytes_per_message("fp8", TEST_HIDDEN, combine=False) / DISPATCH_SM_S)
#: the kernels' kind (priced at :data:`SM_BYTES_PER_S` by the kernel catalog)
KIND = "deepep_ll_sms"
DISPATCH, COMBINE = "deepep_ll_dispatch_sms", "deepep_ll_combine_sms"


def price(model, kernel: Kernel) -> tuple[float, str]:
    """Seconds of SM time of one of :func:`kernels` (both its launches' work), and what
    priced it."""
    return kernel.bytes / SM_BYTES_PER_S, (f"DeepEP low-latency send + receive at "
                                           f"{SM_BYTES_PER_S / 1e9:.1f} GB/s of messages")


if get_kind(KIND) is None:
    register_kind(KIND, price, "DeepEP low-latency send and receive kernels: message "
                  "bytes at the SM rate the LMSYS blog's unit test gives")


def kernels(tokens: int, top_k: int, hidden: int, dispatch_dtype: str,
            combine_dtype: str) -> tuple[Kernel, Kernel]:
    """(the combine's, the dispatch's) send + receive kernels of one micro-batch of
    ``tokens`` tokens on one rank, each carrying its messages' bytes (two launches)."""
    msgs = tokens * top_k
    return tuple(Kernel(name, 0.0, float(msgs * ll_bytes_per_message(dt, hidden,
                                                                    combine=comb)),
                        count=2, kind=KIND, kclass="other")
                 for name, dt, comb in ((COMBINE, combine_dtype, True),
                                        (DISPATCH, dispatch_dtype, False)))
