"""An expert-parallel MoE layer written *independently* of moesim, and its recorder.

It exists to check that ``moesim ingest`` reads torch.profiler traces of MoE code
written by others: it imports nothing of moesim's layer, puts no ``record_function``
labels anywhere, and differs from ``moesim/validation/recorder/moe_layer.py`` on purpose:

- ``a2a="single"``: dispatch/combine with ``torch.distributed.nn.functional.
  all_to_all_single`` (torch's own autograd wrapper; trace op ``c10d::alltoall_base_``);
  ``a2a="list"``: the list form ``dist.all_to_all(out_list, in_list)`` in a hand-written
  autograd Function (trace op ``c10d::alltoall_``, ``TensorList`` inputs). gloo's list
  form needs every tensor of the exchange to have the same shape, so with
  ``experts="linear"`` each (source, destination) chunk is zero-padded to the largest
  one over all pairs (the full count matrix is exchanged first, also in list form);
- ``experts="linear"``: per expert a GELU FFN of two ``nn.Linear`` with bias
  (``aten::addmm``), on exactly the tokens routed to it (uneven splits);
  ``experts="bmm"``: GShard/Switch style: a capacity ``C = ceil(cf * T * k / E)``,
  tokens dispatched into ``[E, C, H]`` buckets with an ``einsum`` (overflow dropped),
  equal splits, and all local experts run as one ``torch.baddbmm`` per matrix;
- top-1 (Switch: the gate probability is not renormalised) or top-k;
- a pre-``LayerNorm``, the router ``nn.Linear`` *with* bias (the skew lives in that
  bias), a Switch load-balancing auxiliary loss, Adam;
- ``schedule=True``: ``torch.profiler.schedule`` + ``tensorboard_trace_handler``
  (``worker{r}.<ts>.pt.trace.json``, ``ProfilerStep#N`` spans; the rank comes from
  ``distributedInfo``); ``schedule=False``: warm-up steps unprofiled, then one plain
  ``with profile(...)`` around the traced steps, exported as ``rank{r}.json`` (no
  ``ProfilerStep`` spans at all).

gloo, ``torch.multiprocessing.spawn``, ``record_shapes=True``. Ground truth is written
to ``ground_truth.json`` next to the traces (see :func:`main`).

CLI: ``python tests/foreign_moe.py OUTDIR --skew hot --a2a list --experts linear ...``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

TRUTH = "ground_truth.json"


@dataclass(frozen=True)
class Variant:
    outdir: str
    skew: str = "uniform"          # uniform | hot | zipf
    a2a: str = "single"            # single | list
    experts: str = "linear"        # linear | bmm
    top_k: int = 1
    schedule: bool = True          # ProfilerStep spans (else one plain profile, none)
    hidden: int = 32
    ffn: int = 48
    n_experts: int = 4
    tokens: int = 40               # per rank per step
    steps: int = 3                 # traced steps
    warmup: int = 1                # untraced steps before them
    seed: int = 0
    capacity_factor: float = 1.0   # bmm only
    hot_fraction: float = 0.6
    zipf_s: float = 1.2


# ----------------------------------------------------------------------------- layer
def _build(torch, v: Variant, world: int, rank: int):  # noqa: C901 - one closure-style module
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn
    import torch.nn.functional as F
    from torch import nn

    n_local = v.n_experts // world

    class ListAllToAll(torch.autograd.Function):
        """``dist.all_to_all`` of per-destination chunks, each zero-padded to ``pad``
        rows (gloo's list form wants equal shapes); padding stripped on arrival."""

        @staticmethod
        def forward(ctx, x, send, recv, pad):
            ctx.args = (recv, send, pad)
            return ListAllToAll.exchange(x, send, recv, pad)

        @staticmethod
        def backward(ctx, g):
            recv, send, pad = ctx.args
            return ListAllToAll.exchange(g.contiguous(), recv, send, pad), None, None, None

        @staticmethod
        def exchange(x, send, recv, pad):
            ins = []
            for c in torch.split(x, send):
                if c.shape[0] < pad:
                    c = torch.cat([c, c.new_zeros(pad - c.shape[0], *c.shape[1:])])
                ins.append(c.contiguous())
            outs = [x.new_empty(pad, *x.shape[1:]) for _ in recv]
            dist.all_to_all(outs, ins)
            return torch.cat([o[:n] for o, n in zip(outs, recv, strict=True)])

    class Exchange(nn.Module):
        def forward(self, x, send, recv, pad):
            if v.a2a == "list":
                return ListAllToAll.apply(x, send, recv, pad)
            out = x.new_empty(sum(recv), *x.shape[1:])
            return dnn.all_to_all_single(out, x, recv, send)

    class BucketExchange(nn.Module):
        """Equal chunks [world, rows, H] -> [world, rows, H] (row blocks per source)."""

        def forward(self, x):
            if v.a2a == "list":
                n = x.shape[1]
                return ListAllToAll.apply(x.reshape(-1, x.shape[-1]), [n] * world,
                                          [n] * world, n).view_as(x)
            return dnn.all_to_all_single(torch.empty_like(x), x.contiguous())

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(v.hidden)
            self.gate = nn.Linear(v.hidden, v.n_experts, bias=True)
            with torch.no_grad():
                # logits of O(1) spread, so an argmax router follows the bias softly
                self.gate.weight.normal_(0.0, 1.5 / math.sqrt(v.hidden))
                self.gate.bias.copy_(_skew_bias(torch, v))
            if v.experts == "linear":
                self.fc1 = nn.ModuleList(nn.Linear(v.hidden, v.ffn) for _ in range(n_local))
                self.fc2 = nn.ModuleList(nn.Linear(v.ffn, v.hidden) for _ in range(n_local))
            else:
                s1, s2 = 1 / math.sqrt(v.hidden), 1 / math.sqrt(v.ffn)
                self.w1 = nn.Parameter(torch.randn(n_local, v.hidden, v.ffn) * s1)
                self.b1 = nn.Parameter(torch.zeros(n_local, 1, v.ffn))
                self.w2 = nn.Parameter(torch.randn(n_local, v.ffn, v.hidden) * s2)
                self.b2 = nn.Parameter(torch.zeros(n_local, 1, v.hidden))
            self.xchg = Exchange()
            self.bucket_xchg = BucketExchange()
            self.truth: dict = {}

        def route(self, h):
            probs = F.softmax(self.gate(h), dim=-1)
            w, idx = probs.topk(v.top_k, dim=-1)
            if v.top_k > 1:
                w = w / w.sum(-1, keepdim=True)
            # Switch auxiliary load-balancing loss: E * sum_e f_e * P_e
            frac = F.one_hot(idx[:, 0], v.n_experts).float().mean(0)
            aux = v.n_experts * (frac * probs.mean(0)).sum()
            return w, idx, aux

        def forward(self, x):
            h = self.norm(x)
            w, idx, aux = self.route(h)
            routed = F.one_hot(idx.reshape(-1), v.n_experts).sum(0)
            self.truth = {"routed": routed.tolist()}
            y = self.linear_path(h, w, idx) if v.experts == "linear" else \
                self.bucket_path(h, w, idx)
            return x + y, aux

        # -- uneven: every routed token, nn.Linear experts
        def linear_path(self, h, w, idx):
            t = h.shape[0]
            flat = idx.reshape(-1)
            _, perm = torch.sort(flat, stable=True)
            counts = torch.bincount(flat, minlength=v.n_experts)
            tok = perm // v.top_k
            xs = h[tok]                                          # aten::index
            if v.a2a == "list":   # everyone gets everyone's counts: the full matrix
                full = [torch.empty_like(counts) for _ in range(world)]
                dist.all_to_all(full, [counts.clone() for _ in range(world)])
                mat = torch.stack(full).view(world, world, n_local)    # [src, dst, local]
                recv_local = mat[:, rank]                              # [src, local]
                pair = mat.sum(-1)
                pad = int(pair.max())
                wire = [pad] * world                                   # rows on the wire
            else:
                got = torch.empty_like(counts)
                dist.all_to_all_single(got, counts)
                recv_local = got.view(world, n_local)
                pad, wire = 0, None
            send = counts.view(world, n_local).sum(-1).tolist()
            recv = recv_local.sum(-1).tolist()
            arrived = self.xchg(xs, send, recv, pad)
            # arrived rows: source-major, expert-minor; group them per local expert
            owner = torch.arange(world * n_local) % n_local
            which = torch.repeat_interleave(owner, recv_local.reshape(-1))
            order = torch.argsort(which, stable=True)
            grouped = arrived[order]
            per_expert = recv_local.sum(0).tolist()
            outs = [self.fc2[e](F.gelu(self.fc1[e](c)))
                    for e, c in enumerate(grouped.split(per_expert))]
            done = torch.empty_like(grouped)
            done[order] = torch.cat(outs)
            back = self.xchg(done, recv, send, pad)
            unsorted = torch.empty_like(back)
            unsorted[perm] = back
            y = (unsorted.view(t, v.top_k, -1) * w.unsqueeze(-1)).sum(1)
            self.truth.update(kept=self.truth["routed"], rows_per_local_expert=per_expert,
                              wire_rows=wire or send)
            return y

        # -- GShard/Switch: capacity-padded buckets, einsum dispatch, baddbmm experts
        def bucket_path(self, h, w, idx):
            t = h.shape[0]
            cap = math.ceil(v.capacity_factor * t * v.top_k / v.n_experts)
            mask = F.one_hot(idx, v.n_experts).transpose(0, 1).reshape(-1, v.n_experts)
            pos = torch.cumsum(mask, 0) * mask - 1                  # slot-major priority
            keep = (pos >= 0) & (pos < cap)
            kept = keep.sum(0)
            pos = pos.clamp(0, cap - 1).view(v.top_k, t, v.n_experts)
            keep = keep.view(v.top_k, t, v.n_experts)
            slot = F.one_hot(pos, cap) * keep.unsqueeze(-1)          # [k, T, E, C]
            combine = (slot * w.t().reshape(v.top_k, t, 1, 1)).sum(0)   # [T, E, C]
            dispatch = slot.sum(0).to(h.dtype)
            buckets = torch.einsum("tec,th->ech", dispatch, h)      # [E, C, H]
            arrived = self.bucket_xchg(buckets.reshape(world, n_local * cap, -1))
            xe = arrived.view(world, n_local, cap, -1).transpose(0, 1).reshape(
                n_local, world * cap, -1)
            a = F.gelu(torch.baddbmm(self.b1, xe, self.w1))
            ye = torch.baddbmm(self.b2, a, self.w2)
            ye = ye.view(n_local, world, cap, -1).transpose(0, 1).reshape(world, -1, v.hidden)
            back = self.bucket_xchg(ye).reshape(v.n_experts, cap, -1)
            y = torch.einsum("tec,ech->th", combine, back)
            self.truth.update(kept=kept.tolist(), rows_per_local_expert=[world * cap] * n_local,
                              wire_rows=[n_local * cap] * world, capacity=cap)
            return y

    return MoE()


def _skew_bias(torch, v: Variant):
    e = v.n_experts
    if v.skew == "uniform":
        p = [1.0 / e] * e
    elif v.skew == "hot":
        p = [v.hot_fraction] + [(1 - v.hot_fraction) / (e - 1)] * (e - 1)
    elif v.skew == "zipf":
        p = [1.0 / (i + 1) ** v.zipf_s for i in range(e)]
    else:
        raise ValueError(f"skew: expected uniform, hot or zipf, got {v.skew!r}")
    s = sum(p)
    return torch.tensor([math.log(x / s) for x in p])


# ----------------------------------------------------------------------------- recording
def _run_variant(torch, v: Variant, world: int, rank: int) -> list[dict]:
    from torch.profiler import (
        ProfilerActivity,
        profile,
        schedule,
        tensorboard_trace_handler,
    )

    torch.manual_seed(v.seed)                       # same weights on every rank
    model = _build(torch, v, world, rank)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(v.seed * 7919 + rank + 1)
    out = Path(v.outdir)
    truth: list[dict] = []

    def one_step(i: int, trace_step: int | None) -> None:
        x = torch.randn(v.tokens, v.hidden, generator=gen).requires_grad_()
        y, aux = model(x)
        loss = y.pow(2).mean() + 0.01 * aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        truth.append({"step": i, "trace_step": trace_step, **model.truth})

    total = v.warmup + v.steps
    if v.schedule:
        sched = schedule(wait=0, warmup=v.warmup, active=v.steps, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched,
                     on_trace_ready=tensorboard_trace_handler(str(out),
                                                              worker_name=f"worker{rank}")
                     ) as prof:
            for i in range(total):
                one_step(i, i if i >= v.warmup else None)   # ProfilerStep#i
                prof.step()
    else:
        for i in range(v.warmup):
            one_step(i, None)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for i in range(v.steps):
                one_step(v.warmup + i, i)   # no ProfilerStep: steps in trace order
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    return truth


def _worker(rank: int, variants: list[Variant], world: int, port: int, pin: bool,
            threads: int, nice: int = 0) -> None:
    import torch
    import torch.distributed as dist

    if nice:   # as moesim record --nice: own session, its autogroup and the process
        os.setsid()
        Path("/proc/self/autogroup").write_text(str(nice))
        os.nice(nice)
    if pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    for v in variants:
        truth = _run_variant(torch, v, world, rank)
        dist.barrier()
        (Path(v.outdir) / f".truth{rank}.json").write_text(json.dumps(truth))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record_variants(variants: list[Variant], world: int = 2, pin: bool = False,
                    threads: int = 1, env: dict[str, str] | None = None,
                    nice: int = 0) -> list[dict]:
    """Record several variants in one spawn (one process group; saves start-up time).
    ``env``: variables set for the spawned ranks (e.g. glibc malloc tunables)."""
    import torch
    import torch.multiprocessing as mp

    for v in variants:
        if v.n_experts % world:
            raise ValueError(f"n_experts {v.n_experts} must divide by world {world}")
        Path(v.outdir).mkdir(parents=True, exist_ok=True)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    load_before = list(os.getloadavg())
    try:
        mp.spawn(_worker, args=(variants, world, _free_port(), pin, threads, nice), nprocs=world,
                 join=True)
    finally:
        for k, val in old.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val
    docs = []
    for v in variants:
        per_rank = []
        for r in range(world):
            part = Path(v.outdir) / f".truth{r}.json"
            per_rank.append(json.loads(part.read_text()))
            part.unlink()
        steps = []
        for i in range(v.warmup + v.steps):
            rows = [per_rank[r][i] for r in range(world)]
            steps.append({
                "step": i, "trace_step": rows[0]["trace_step"],
                # tokens the router sent to each global expert, [rank][expert]
                "routed_tokens_per_expert_by_rank": [x["routed"] for x in rows],
                # after capacity drop (= routed for linear experts)
                "kept_tokens_per_expert_by_rank": [x["kept"] for x in rows],
                # rows each local expert's GEMMs processed, [rank][local expert]
                "rows_per_local_expert_by_rank": [x["rows_per_local_expert"] for x in rows],
                # rows on the wire in the dispatch, [src][dst] (padding included)
                "dispatch_rows_by_rank": [x["wire_rows"] for x in rows],
            })
        doc = {"format": "foreign-moe-truth/1", "variant": asdict(v), "world": world,
               "torch_version": torch.__version__, "pin": pin, "nice": nice, "threads": threads,
               "env": dict(env or {}), "loadavg_before_1_5_15min": load_before,
               "loadavg_after_1_5_15min": list(os.getloadavg()), "steps": steps}
        (Path(v.outdir) / TRUTH).write_text(json.dumps(doc, indent=1) + "\n")
        docs.append(doc)
    return docs


def main(outdir: str, skew: str = "uniform", *, world: int = 2, pin: bool = False,
         threads: int = 1, env: dict[str, str] | None = None, **kw) -> dict:
    """Record one variant into ``outdir``: one Kineto trace per rank and
    ``ground_truth.json`` (``steps[i]``: ``trace_step`` = N of ``ProfilerStep#N`` with a
    schedule, else the step's index in the trace, null for warm-up;
    ``routed_tokens_per_expert_by_rank``, ``kept_tokens_per_expert_by_rank``,
    ``rows_per_local_expert_by_rank``, ``dispatch_rows_by_rank``). ``kw``: the other
    :class:`Variant` fields."""
    return record_variants([Variant(outdir, skew, **kw)], world, pin, threads, env)[0]


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--skew", default="uniform", choices=["uniform", "hot", "zipf"])
    p.add_argument("--a2a", default="single", choices=["single", "list"])
    p.add_argument("--experts", default="linear", choices=["linear", "bmm"])
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--no-schedule", action="store_true")
    for name, typ in (("hidden", int), ("ffn", int), ("n-experts", int), ("tokens", int),
                      ("steps", int), ("warmup", int), ("seed", int),
                      ("capacity-factor", float), ("hot-fraction", float), ("zipf-s", float)):
        p.add_argument(f"--{name}", type=typ, default=getattr(Variant, name.replace("-", "_")))
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=0,
                   help="niceness of each rank, also for its own session's autogroup (root)")
    p.add_argument("--keep-memory", action="store_true",
                   help="start the ranks with moesim's KEEP_MEMORY_ENV glibc tunables")
    a = p.parse_args(argv)
    env = None
    if a.keep_memory:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from moesim.validation.recorder.record import KEEP_MEMORY_ENV
        env = dict(KEEP_MEMORY_ENV)
    v = Variant(a.outdir, a.skew, a.a2a, a.experts, a.top_k, not a.no_schedule, a.hidden,
                a.ffn, a.n_experts, a.tokens, a.steps, a.warmup, a.seed, a.capacity_factor,
                a.hot_fraction, a.zipf_s)
    doc = record_variants([v], a.world, a.pin, a.threads, env, a.nice)[0]
    print(f"foreign_moe: wrote {a.outdir} (load average before "
          f"{[round(x, 2) for x in doc['loadavg_before_1_5_15min']]}, after "
          f"{[round(x, 2) for x in doc['loadavg_after_1_5_15min']]})", file=sys.stderr)
    return 0


__all__ = ["Variant", "main", "record_variants", "replace"]

if __name__ == "__main__":
    sys.exit(_cli())
