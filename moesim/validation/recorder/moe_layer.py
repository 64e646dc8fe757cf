"""An expert-parallel mixture-of-experts layer in torch (imported only by ``record``).

One layer, ``world`` ranks, ``experts / world`` SwiGLU experts per rank. Forward:

1. router linear → + skew bias → softmax → top-k (probabilities renormalised);
2. permute: token copies sorted by expert (stable), so each destination rank's
   tokens are contiguous;
3. split-size exchange: ``all_to_all_single`` of the per-expert counts (int64);
4. dispatch: ``all_to_all_single`` of the permuted tokens with uneven
   ``input_split_sizes``/``output_split_sizes``;
5. experts: received rows regrouped by local expert, SwiGLU ``w2(silu(w1 x) * w3 x)``;
6. combine: the reverse ``all_to_all_single``;
7. un-permute: weighted ``index_add_`` back to token order.

Backward runs the transposed all-to-alls (autograd of :class:`_AllToAll`), so a
training step has four token all-to-alls: dispatch, combine (forward) and
combine-grad, dispatch-grad (backward), plus one count exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward is the transposed exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, in_splits: list[int], out_splits: list[int],
                label: str) -> torch.Tensor:  # type: ignore[override]
        ctx.in_splits, ctx.out_splits, ctx.label = in_splits, out_splits, label
        out = x.new_empty((sum(out_splits), x.shape[1]))
        with record_function(label):
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out = grad.new_empty((sum(ctx.in_splits), grad.shape[1]))
        with record_function(ctx.label + "_grad"):
            dist.all_to_all_single(out, grad.contiguous(), ctx.in_splits, ctx.out_splits)
        return out, None, None, None


@dataclass(frozen=True)
class SkewSpec:
    """Router skew: ``uniform``, ``zipf`` (exponent ``zipf_s``) or ``hot`` (expert 0
    targeted to get ``hot_fraction`` of the routed assignments)."""

    kind: str = "uniform"
    zipf_s: float = 1.2
    hot_fraction: float = 0.5


def router_bias(spec: SkewSpec, n_experts: int) -> torch.Tensor:
    """Per-expert logit bias log(p_e) for a target share p_e (uniform → zeros).

    Added to the router logits before softmax/top-k, like DeepSeek-V3's balance bias
    (DeepSeek-V3 report §2.1.2). The realised shares also depend on the router weights,
    so ``record`` logs the counts it actually saw.
    """
    if spec.kind == "uniform":
        p = torch.full((n_experts,), 1.0 / n_experts)
    elif spec.kind == "zipf":
        p = torch.tensor([1.0 / (e + 1) ** spec.zipf_s for e in range(n_experts)])
    elif spec.kind == "hot":
        rest = (1.0 - spec.hot_fraction) / max(n_experts - 1, 1)
        p = torch.tensor([spec.hot_fraction] + [rest] * (n_experts - 1))
    else:
        raise ValueError(f"skew must be uniform, zipf or hot, got {spec.kind!r}")
    p = p / p.sum()
    return torch.log(p) - math.log(1.0 / n_experts)


class SwiGLUExperts(nn.Module):
    """``n_local`` SwiGLU experts (three matrices each, as Mixtral, arXiv:2401.04088)."""

    def __init__(self, n_local: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.ModuleList(nn.Linear(hidden, ffn, bias=False) for _ in range(n_local))
        self.w3 = nn.ModuleList(nn.Linear(hidden, ffn, bias=False) for _ in range(n_local))
        self.w2 = nn.ModuleList(nn.Linear(ffn, hidden, bias=False) for _ in range(n_local))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        outs = []
        for e, chunk in enumerate(torch.split(x, counts)):
            outs.append(self.w2[e](F.silu(self.w1[e](chunk)) * self.w3[e](chunk)))
        return torch.cat(outs) if outs else x


def local_experts(experts: SwiGLUExperts, received: torch.Tensor,
                  recv_mat: torch.Tensor) -> torch.Tensor:
    """The rank's expert computation on the rows it received: ``recv_mat[s, e]`` rows
    from source rank ``s`` for local expert ``e`` arrive source-major; they are regrouped
    expert-major for the GEMMs and the outputs put back in arrival order (also what
    ``moesim record --shape-sweep`` times, :mod:`moesim.validation.recorder.sweep_record`)."""
    world, n_local = recv_mat.shape
    dev = received.device          # recv_mat lives there too (CPU, or the rank's GPU)
    src_of = torch.repeat_interleave(torch.arange(world * n_local, device=dev) % n_local,
                                     recv_mat.reshape(-1))
    by_expert = torch.argsort(src_of, stable=True)
    y = experts(received.index_select(0, by_expert), recv_mat.sum(0).tolist())
    back = torch.empty_like(by_expert)
    back[by_expert] = torch.arange(by_expert.numel(), device=dev)
    return y.index_select(0, back)


class ExpertParallelMoE(nn.Module):
    """One MoE layer sharded over ``world`` ranks of the default process group."""

    def __init__(self, hidden: int, ffn: int, n_experts: int, top_k: int, world: int,
                 rank: int, skew: SkewSpec) -> None:
        super().__init__()
        if n_experts % world:
            raise ValueError(f"experts ({n_experts}) must divide by world ({world})")
        self.hidden, self.n_experts, self.top_k = hidden, n_experts, top_k
        self.world, self.rank, self.n_local = world, rank, n_experts // world
        self.router = nn.Linear(hidden, n_experts, bias=False)
        self.register_buffer("skew_bias", router_bias(skew, n_experts))
        self.experts = SwiGLUExperts(self.n_local, hidden, ffn)
        self.last_counts: torch.Tensor | None = None  # tokens per expert routed by this rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        with record_function("moe/router"):
            logits = self.router(x) + self.skew_bias
            probs = torch.softmax(logits, dim=-1)
            weights, experts = torch.topk(probs, self.top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        with record_function("moe/permute"):
            flat_expert = experts.reshape(-1)
            order = torch.argsort(flat_expert, stable=True)
            token_of = torch.arange(t, device=x.device).repeat_interleave(self.top_k)[order]
            counts = torch.bincount(flat_expert, minlength=self.n_experts)
            permuted = x.index_select(0, token_of)
        self.last_counts = counts.detach().clone()
        with record_function("moe/count_exchange"):
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)
        send = counts.view(self.world, self.n_local).sum(1).tolist()
        recv_mat = recv_counts.view(self.world, self.n_local)  # [source rank, local expert]
        recv = recv_mat.sum(1).tolist()
        received = _AllToAll.apply(permuted, send, recv, "moe/dispatch")
        with record_function("moe/experts"):
            y = local_experts(self.experts, received, recv_mat)
        returned = _AllToAll.apply(y, recv, send, "moe/combine")
        with record_function("moe/unpermute"):
            w = weights.reshape(-1)[order].unsqueeze(1)
            out = torch.zeros_like(x).index_add(0, token_of, returned * w)
        return out
