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
micro-batch, two kernels to the compute stream (each two launches, send and receive),
priced from DeepEP's own hook-mode logs (:mod:`moesim.serve.ll_logs`: the unit test times
each of the four kernels alone, the data having arrived before the receive starts).

What the time scales with, from the kernels (deepseek-ai/DeepEP
``csrc/kernels/internode_ll.cu`` @85793dd): the dispatch's send casts each token to FP8
and, per top-k destination, copies the message to the peer (a warp's NVLink stores) or
posts an RDMA write; its receive copies each received message out of the RDMA buffer into
the experts' layout. The combine's send copies each expert output back (NVLink stores, or
a staging copy and an RDMA write); its receive waits for the flags and reduces each token's
top-k rows. A kernel's time is therefore a fixed part (launch with a grid sync, the per
expert counts, flags and buffer cleaning, all per expert, 288 in the test) and a part per
message (``tokens x top-k`` of them per rank, sent and received alike under balanced
routing), the message work growing with its bytes:

    t = fixed + per_message x messages x (message bytes / the test's message bytes)

one rule per kernel (dispatch send, dispatch receive, combine send, combine receive), its
two constants from the two logs :mod:`moesim.serve.ll_logs` marks ``fit`` (same machine,
ranks and code, 128 and 768 tokens; the test's FP8 dispatch messages of 7,408 B and BF16
combine messages of 14,336 B). The held-out logs' errors are printed by
``benchmarks/ll_sms_logs.py``. The fitted logs reached their peers over NVLink, where the
send kernels copy the messages themselves; over RDMA the NIC moves them and the send
kernels only post. The held-out runs with half or all of their peers over RDMA (H20
EP16; a 16-rank run over IBGDA only) come within 7 % of the rule in their sums at 1,024
messages, so it is applied to every peer alike.

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
from moesim.serve.ll_logs import BLOG_DISPATCH_US, fit_logs

#: the LMSYS blog's dispatch time "occupying SMs" in DeepEP's unit test (held out: LMSYS
#: blog, 2025-05-05, "Dispatch Optimization Potential": "a potential of 0.06ms occupying
#: SMs")
DISPATCH_SM_S = BLOG_DISPATCH_US * 1e-6
#: DeepEP's low-latency test case (deepseek-ai/DeepEP ``tests/test_low_latency.py``:
#: ``num_tokens, hidden, num_topk = 128, 7168, 8``), FP8 dispatch, BF16 combine messages
TEST_TOKENS, TEST_HIDDEN, TEST_TOPK = 128, 7168, 8
TEST_MESSAGE_BYTES = {False: ll_bytes_per_message("fp8", TEST_HIDDEN, combine=False),
                      True: ll_bytes_per_message("bf16", TEST_HIDDEN, combine=True)}
PARTS = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")


def fit_parts(logs=None) -> dict[str, tuple[float, float]]:
    """{part: (fixed seconds, seconds per message of the test's size)} from two logs at
    different message counts (by default the ``fit`` logs of :mod:`moesim.serve.ll_logs`)."""
    a, b = logs if logs is not None else fit_logs()
    out = {}
    for part in PARTS:
        ta, tb = getattr(a, part + "_us") * 1e-6, getattr(b, part + "_us") * 1e-6
        per = (tb - ta) / (b.messages - a.messages)
        out[part] = (ta - per * a.messages, per)
    return out


#: the fitted rules, {part: (fixed s, s per test-sized message)}
RATES = fit_parts()
#: the kernels' kind (priced by :func:`price` through the kernel catalog)
KIND = "deepep_ll_sms"
DISPATCH, COMBINE = "deepep_ll_dispatch_sms", "deepep_ll_combine_sms"


def part_seconds(part: str, messages: float, message_bytes: float) -> float:
    """SM seconds of one of :data:`PARTS` for ``messages`` messages of ``message_bytes``."""
    fixed, per = RATES[part]
    scale = message_bytes / TEST_MESSAGE_BYTES[part.startswith("combine")]
    return fixed + per * messages * scale


def price(model, kernel: Kernel) -> tuple[float, str]:
    """Seconds of SM time of one of :func:`kernels` (its send and its receive launch), and
    what priced it. ``kernel.seq`` carries its messages, ``kernel.bytes`` their bytes."""
    side = "combine" if kernel.name == COMBINE else "dispatch"
    per_msg = kernel.bytes / kernel.seq if kernel.seq else 0.0
    t = sum(part_seconds(f"{side}_{ph}", kernel.seq, per_msg) for ph in ("send", "recv"))
    return t, (f"DeepEP low-latency {side} send + receive: fixed + per message, from "
               "DeepEP's hook-mode logs (moesim.serve.ll_logs)")


if get_kind(KIND) is None:
    register_kind(KIND, price, "DeepEP low-latency send and receive kernels: a fixed part "
                  "and a part per message, from DeepEP's published hook-mode logs")


def kernels(tokens: int, top_k: int, hidden: int, dispatch_dtype: str,
            combine_dtype: str) -> tuple[Kernel, Kernel]:
    """(the combine's, the dispatch's) send + receive kernels of one micro-batch of
    ``tokens`` tokens on one rank: ``tokens x top_k`` messages each (``seq``), their
    bytes (``bytes``), two launches."""
    msgs = tokens * top_k
    return tuple(Kernel(name, 0.0, float(msgs * ll_bytes_per_message(dt, hidden,
                                                                    combine=comb)),
                        count=2, kind=KIND, kclass="other", seq=msgs)
                 for name, dt, comb in ((COMBINE, combine_dtype, True),
                                        (DISPATCH, dispatch_dtype, False)))
