"""Size limits: the largest scenario one machine can simulate, checked before anything
is built, each refused with one line that says the limit and why.

Measured on a shared 2-core machine (docs/scenarios.md, "Size limits"):

* the exact engine keeps every rank's op program and every flow: ``mixtral-8x7b-64gpu``
  (64 GPUs x 32 layers x 16 micro-batches = 32,768 rank-layer-micro-batches) takes
  25.6 s CPU and 165 MB (docs/results/scale.md), about 0.8 ms and 5 kB per unit;
* the fast path (docs/fast-path.md) runs ``deepseek-v3-2048`` (2,048 x 61 x 120 =
  15.0 M units) in about 30 s of CPU; it counts only the ranks it runs (one chain per
  class of identical or sampled replicas, engine/fast/sampled.py), so DeepSeek-V3 on
  16,384 GPUs took 27-39 s and 1.2-1.5 GB and on 98,304 GPUs 108-122 s and 4.8 GB
  (docs/results/scale-any.md, docs/results/topology-scale.md); the GPU count itself is
  bounded by what the topology can be built and routed for
  (moesim.topology.bounds.MAX_GPUS).

So a step over ``MAX_WORK[mode]`` units would take more than about ten minutes (and,
on the exact engine, several GB); the per-field limits keep single numbers (a typo
such as ``microbatches: 1e12``) from hanging the schedule or memory table before the
work check is reached.
"""

from __future__ import annotations

from typing import Any

from moesim.errors import InputError

#: micro-batches per step per replica (deepseek-v3-2048 ships with 120)
MAX_MICROBATCHES = 65536
#: tokens per sequence: 2^20, above any context a training run uses; attention cost
#: grows with its square
MAX_SEQ_LEN = 2**20
#: sequences per micro-batch
MAX_MICRO_BATCH_SIZE = 65536
#: tokens per micro-batch (micro_batch_size x seq_len): token routing keeps a few
#: int64 arrays of tokens x top_k per micro-batch; 2^22 tokens x top-8 x 8 bytes is
#: 268 MB per array
MAX_TOKENS_PER_MICROBATCH = 2**22
#: GPUs x layers x micro-batches per engine mode (see the module doc)
MAX_WORK = {"exact": 2**19, "fast": 2**26}

#: routed experts one EP rank holds (model.n_experts / parallel.ep): every expert is its
#: own kernels and rows. The toy at 131,072 experts over EP2 (65,536 per rank) runs a step
#: in 13.7 s, 246 MB, and `moesim kernels` in 2.8 s; 16.7 M experts took a minute to list
#: one layer's kernels and would take about half an hour to run
MAX_LOCAL_EXPERTS = 65536

#: scenario field -> its largest value and why
FIELD_LIMITS: dict[str, tuple[int, str]] = {
    "schedule.microbatches": (MAX_MICROBATCHES, "micro-batches per step"),
    "schedule.seq_len": (MAX_SEQ_LEN, "tokens per sequence"),
    "schedule.micro_batch_size": (MAX_MICRO_BATCH_SIZE, "sequences per micro-batch"),
    "schedule.zero3_prefetch": (1024, "layers gathered ahead"),
    "schedule.step": (2**31, "the training step index"),
    "parallel.tp": (2**16, "GPUs per tensor-parallel group"),
    "parallel.pp": (2**16, "pipeline stages"),
    "parallel.dp": (2**16, "data-parallel replicas"),
    "parallel.ep": (2**16, "GPUs per expert-parallel group"),
    "parallel.vpp": (1024, "chunks per rank"),
    "cluster.nodes": (2**16, "nodes"),
}


def check_field(src: str, key: str, v: Any) -> None:
    """InputError when an integer scenario field is over its limit."""
    limit = FIELD_LIMITS.get(key)
    if limit is not None and isinstance(v, int) and not isinstance(v, bool) and v > limit[0]:
        raise InputError(src, key, f"at most {limit[0]:,} {limit[1]} (the most this simulator "
                         "runs on one machine; docs/scenarios.md, Size limits)", v)


def check_tokens(src: str, micro_batch_size: int, seq_len: int) -> None:
    tokens = micro_batch_size * seq_len
    if tokens > MAX_TOKENS_PER_MICROBATCH:
        raise InputError(src, "schedule.seq_len", f"micro_batch_size x seq_len <= "
                         f"{MAX_TOKENS_PER_MICROBATCH:,} tokens per micro-batch (routing keeps "
                         f"arrays of tokens x top_k per micro-batch; micro_batch_size="
                         f"{micro_batch_size})", seq_len)


def check_work(src: str, mode: str, world: int, layers: int, microbatches: int) -> None:
    """Refuse a step whose GPUs x layers x micro-batches is over ``MAX_WORK[mode]``."""
    work = world * layers * microbatches
    limit = MAX_WORK.get(mode)
    if limit is not None and work > limit:
        hint = " (engine.mode: fast runs up to " f"{MAX_WORK['fast']:,})" if mode == "exact" else ""
        raise InputError(src, "schedule.microbatches", f"GPUs x layers x micro-batches <= "
                         f"{limit:,} on the {mode} engine{hint}: {world} x {layers} x "
                         f"{microbatches} = {work:,} would take more than about ten minutes "
                         "and GBs of memory (docs/scenarios.md, Size limits)", microbatches)


#: ``moesim collective --op ep_dispatch|ep_combine``: ranks x tokens per rank x (experts +
#: top_k), the per-token routing the exchange samples (each token's row over the
#: experts, its top-k picks). The DeepSeek-V3 EP64 exchange (64 x 4096 x 264) is 2^26.1
#: and takes 7.4 s CPU, 171 MB on the shared 2-core machine; 10^8 tokens per rank
#: asked for 191 GiB in one array
MAX_EP_ROUTED = 2**27


def check_ep_exchange(ranks: int, tokens: int, experts: int, top_k: int,
                      src: str = "command line") -> None:
    """Refuse an EP exchange too large to route per token (:data:`MAX_EP_ROUTED`)."""
    work = ranks * max(tokens, 0) * (max(experts, 0) + max(top_k, 0))
    if work > MAX_EP_ROUTED:
        raise InputError(src, "--tokens/--experts/--top-k", f"EP ranks x tokens x (experts "
                         f"+ top_k) <= {MAX_EP_ROUTED:,} (every token is routed on its own; "
                         f"{work:,} would take minutes and GBs; docs/scenarios.md, Size "
                         "limits)", f"{ranks} x {tokens} x ({experts} + {top_k})")


#: ``moesim schedule``: pipeline ranks x micro-batches. 256 x 1024 (2^18) takes 10.5 s
#: CPU and 334 MB on the shared 2-core machine, growing linearly
MAX_SCHEDULE_ITEMS = 2**19


def check_schedule(pp: int, microbatches: int, src: str = "command line") -> None:
    """Refuse a pipeline schedule too large to lay out (:data:`MAX_SCHEDULE_ITEMS`)."""
    items = pp * microbatches
    if items > MAX_SCHEDULE_ITEMS:
        raise InputError(src, "--pp/--microbatches", f"--pp x --microbatches <= "
                         f"{MAX_SCHEDULE_ITEMS:,} ({items:,} items would take minutes; "
                         "docs/scenarios.md, Size limits)", f"{pp} x {microbatches}")


def check_local_experts(src: str, n_experts: int, ep: int) -> None:
    """Refuse more than :data:`MAX_LOCAL_EXPERTS` routed experts per EP rank."""
    local = -(-n_experts // max(ep, 1))
    if local > MAX_LOCAL_EXPERTS:
        raise InputError(src, "model.n_experts", f"at most {MAX_LOCAL_EXPERTS:,} routed experts "
                         f"per EP rank (n_experts / ep = {n_experts} / {ep}: every expert is "
                         "its own kernels; docs/scenarios.md, Size limits)", n_experts)
