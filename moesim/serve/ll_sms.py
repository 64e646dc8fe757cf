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

one rule per kernel (dispatch send, dispatch receive, combine send, combine receive) and
per device family, its two constants fitted on that family's logs (:mod:`moesim.serve.ll_logs`
writes down the split: which logs set each family's rates and which are held out; the
test's FP8 dispatch messages are 7,408 B and its BF16 combine messages 14,336 B). A
kernel's constants are fitted by least squares over the fit logs that time it at two or
more message counts. Where a family's logs time a kernel at one message count only (the
Hopper combine), its fixed part is the fitted fixed part of the dispatch kernel of the
same phase on that family: both send kernels launch with a grid sync, count and signal per
expert and clean the other kernel's buffer; both receive kernels wait for and read per
expert flags and counts; what differs is the work per message. The per-message part then
passes through the logged time. The held-out logs' errors, per family, are printed by
``benchmarks/ll_sms_logs.py``.

A device is priced with its own family's rates only: Hopper (H100, H800, H200, H200-NVL,
H20) or Blackwell (B200, GB200). Any other device is refused with ``ll_sms: compute``
(there are no hook-mode logs for it; an A100 does not run DeepEP's low-latency kernels as
released). The Hopper dispatch rows reached half their peers over RDMA, where the NIC moves
the data and the send kernels only post; the Hopper combine and the Blackwell rows reached
theirs over NVLink, where the send kernels copy the messages themselves. The rule is
applied to every peer alike.

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
from moesim.errors import InputError
from moesim.serve.ll_logs import FAMILIES, LOGS, fit_logs

#: DeepEP's low-latency test case (deepseek-ai/DeepEP ``tests/test_low_latency.py``:
#: ``num_tokens, hidden, num_topk = 128, 7168, 8``), FP8 dispatch, BF16 combine messages
TEST_TOKENS, TEST_HIDDEN, TEST_TOPK = 128, 7168, 8
TEST_MESSAGE_BYTES = {False: ll_bytes_per_message("fp8", TEST_HIDDEN, combine=False),
                      True: ll_bytes_per_message("bf16", TEST_HIDDEN, combine=True)}
PARTS = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
#: the LMSYS blog's dispatch time "occupying SMs" in DeepEP's unit test on H100 (held out:
#: LMSYS blog, 2025-05-05, "Dispatch Optimization Potential": "a potential of 0.06ms
#: occupying SMs")
DISPATCH_SM_S = next(g.dispatch_total_us for g in LOGS if g.source.startswith("LMSYS")) * 1e-6
#: device catalog name -> family whose logs price it (moesim.compute.devices: H100, H800,
#: H200 and H20 are GH100 parts, B200 and GB200 Blackwell)
DEVICE_FAMILY = {"H100": "hopper", "H800": "hopper", "H200": "hopper", "H200-NVL": "hopper",
                 "H20": "hopper", "B200": "blackwell", "GB200": "blackwell"}


def family_of(device: str, source: str = "<scenario>") -> str:
    """The family whose logs price ``device``; else an InputError on ``cluster.device``."""
    fam = DEVICE_FAMILY.get(device)
    if fam is None:
        raise InputError(source, "cluster.device", "a device with DeepEP hook-mode logs for "
                         "serve.ll_sms: compute (Hopper: H100, H800, H200, H200-NVL, H20; "
                         "Blackwell: B200, GB200)", device)
    return fam


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ``(messages, seconds)`` points."""
    n = len(points)
    mx = sum(m for m, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = (sum((m - mx) * (t - my) for m, t in points)
             / sum((m - mx) ** 2 for m, _ in points))
    return my - slope * mx, slope


def fit_parts(logs) -> dict[str, tuple[float, float]]:
    """{part: (fixed seconds, seconds per message of the test's size)} from ``logs``: least
    squares where a part is timed at two or more message counts; at one count, the fixed
    part of the dispatch kernel of the same phase and a per-message part through the
    (mean) logged time."""
    out = {}
    for part in PARTS:
        pts = [(g.messages, getattr(g, part + "_us") * 1e-6) for g in logs
               if getattr(g, part + "_us") is not None]
        counts = {m for m, _ in pts}
        if len(counts) >= 2:
            out[part] = _line(pts)
        elif counts and part.startswith("combine"):
            fixed = out["dispatch" + part[len("combine"):]][0]
            (m,) = counts
            mean = sum(t for _, t in pts) / len(pts)
            out[part] = (fixed, (mean - fixed) / m)
        else:
            raise ValueError(f"no logs time {part} at two message counts")
    return out


#: the fitted rules, {family: {part: (fixed s, s per test-sized message)}}
RATES = {fam: fit_parts(fit_logs(fam)) for fam in FAMILIES}
#: the kernels' kind (priced by :func:`price` through the kernel catalog)
KIND = "deepep_ll_sms"
DISPATCH, COMBINE = "deepep_ll_dispatch_sms", "deepep_ll_combine_sms"


def part_seconds(part: str, messages: float, message_bytes: float, family: str) -> float:
    """SM seconds of one of :data:`PARTS` for ``messages`` messages of ``message_bytes``
    on a ``family`` device."""
    fixed, per = RATES[family][part]
    scale = message_bytes / TEST_MESSAGE_BYTES[part.startswith("combine")]
    return fixed + per * messages * scale


def price(model, kernel: Kernel) -> tuple[float, str]:
    """Seconds of SM time of one of :func:`kernels` (its send and its receive launch) on
    ``model.device``, and what priced it. ``kernel.seq`` carries its messages,
    ``kernel.bytes`` their bytes."""
    fam = family_of(model.device.name, "compute model")
    side = "combine" if kernel.name == COMBINE else "dispatch"
    per_msg = kernel.bytes / kernel.seq if kernel.seq else 0.0
    t = sum(part_seconds(f"{side}_{ph}", kernel.seq, per_msg, fam) for ph in ("send", "recv"))
    return t, (f"DeepEP low-latency {side} send + receive: fixed + per message, from "
               f"DeepEP's {fam.capitalize()} hook-mode logs (moesim.serve.ll_logs)")


if get_kind(KIND) is None:
    register_kind(KIND, price, "DeepEP low-latency send and receive kernels: a fixed part "
                  "and a part per message, from DeepEP's published hook-mode logs of the "
                  "device's family")


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
