"""One pipeline of EP groups, simulated in lockstep with numpy vectors (no simpy).

A *chain* is the EP group at every stage with the same (tp, edp) coordinates; rank
position e of stage s sends its activations to position e of stage s+1. Within a
stage every quantity is a vector over the group's members: all members run the same
attention/router kernels, then a direct all-to-all-v, then each its own experts,
then the combine. A member enters an all-to-all when its previous op ends; it starts
moving data when its latest partner (nonzero bytes either way) has arrived, which is
a ``stall`` attributed to that partner and its most loaded expert, exactly the
communicator's pairwise rule; it finishes when its flows do, each flow sharing the
links of its path by processor sharing (:mod:`moesim.engine.fast.network`).

Schedule items run in the order of :func:`moesim.schedule.pipeline.make_order`,
list-scheduled across stages: an item waits for its pipeline message (``bubble``).
With ``overlap.ep_comm_overlap`` the items the exact builder interleaves (same
:class:`~moesim.program.overlap.PairRule`) hide each all-to-all under the partner
item's compute: only ``max(0, a2a - partner compute per all-to-all)`` is exposed.

SM sharing: when the EP kernels hold a share f = s/S of the SMs, the partner's compute b
under an all-to-all of w seconds runs at 1 - f of its rate: it takes
``B = min(b / (1 - f), b + w·f)`` (the exact engine's re-rating, solved in closed form);
``B - b`` is charged as compute and ``max(0, w - B)`` is exposed, so a step grows by
``max(w - b, w·f)`` per overlapped all-to-all (``w - b`` without sharing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from moesim.model import costs
from moesim.trace.spans import Span

CATS = ("compute", "ep_dispatch", "ep_combine", "tp", "dp", "pp", "zero", "bubble", "stall")


@dataclass
class RouteRec:
    """What the lockstep model needs of one routed micro-batch on one EP group."""

    a2a: dict[str, np.ndarray]       # "fwd.dispatch", ... -> (n,) seconds (phased) or the
                                     # (n, n) byte matrix (direct: timed at arrival)
    nz: np.ndarray                   # (n, n) bool: i and j exchange bytes
    exp_t: dict[str, np.ndarray]     # phase -> (n,) expert compute seconds
    exp_f: dict[str, float]          # phase -> expert FLOP summed over the group
    hot: np.ndarray                  # (n,) most loaded local expert (-1 none)
    hot_tok: np.ndarray              # (n,) its tokens
    recv: np.ndarray                 # (n,) tokens received
    d_out: np.ndarray                # (n,) dispatch bytes sent (fwd)
    c_out: np.ndarray                # (n,) combine bytes sent (fwd)
    mats: dict[str, np.ndarray] | None = None   # "fwd.dispatch", ... -> (n, n) bytes


@dataclass
class StageOut:
    acc: dict[str, np.ndarray]
    last_bwd: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> end (n,)
    end: np.ndarray | None = None          # end of the compute stream (n,)
    send_end: np.ndarray | None = None     # end of the last pipeline send (n,)
    flops: float = 0.0
    ep_iv: list = field(default_factory=list)  # (start, end) (n,) of the last item's a2as
    grads: bool = False                    # a layer has had its last backward (buckets run)


@lru_cache(maxsize=16)
def all_pairs(n: int) -> np.ndarray:
    """(n, n) read-only mask of every ordered pair i != j, one array per n (so
    :meth:`Chain._a2a` knows it by identity: everybody waits for everybody)."""
    out = ~np.eye(n, dtype=bool)
    out.setflags(write=False)
    return out


class Chain:
    """Runs one chain. ``ctx`` is the shared :class:`moesim.engine.fast.Context`;
    ``groups[s]``: ranks of the EP group at stage s (position order); ``route(s,
    layer, mb) -> RouteRec``; ``span_pos[s]``: positions whose spans are kept."""

    def __init__(self, ctx, groups: list[tuple[int, ...]], route, span_pos) -> None:
        self.c = ctx
        self.groups = groups
        self.route = route
        self.span_pos = span_pos
        self.n = len(groups[0])
        self.out = [StageOut({k: np.zeros(self.n) for k in CATS}) for _ in groups]
        self.t = [np.zeros(self.n) for _ in groups]
        self.msgs: dict[tuple, np.ndarray] = {}
        self.spans: list[Span] = []
        self.budget = 0.0
        self._send_d: dict[tuple, np.ndarray] = {}

    # ------------------------------------------------------------ spans
    def _span(self, s: int, kind: str, name: str, a, b, layer=-1, mb=-1, phase="",
              stream="compute", **kw) -> None:
        pos = self.span_pos[s]
        if not pos:
            return
        ranks = self.groups[s]
        arrays = {k: v.tolist() for k, v in kw.items() if isinstance(v, np.ndarray)}
        al, bl = np.asarray(a, dtype=float).tolist(), np.asarray(b, dtype=float).tolist()
        waits = kind in ("stall", "bubble")
        out = self.spans
        for e in pos:
            if bl[e] > al[e] or not waits:
                extra = dict(kw)
                for k, v in arrays.items():
                    extra[k] = v[e]
                out.append(Span(rank=ranks[e], stream=stream, kind=kind, name=name,
                                start_s=al[e], end_s=bl[e], layer=layer, microbatch=mb,
                                phase=phase, **extra))

    def _compute(self, s: int, name: str, key: tuple, make, layer, mb, phase) -> None:
        t, fl = self.c.timer(key, make)
        if t <= 0 and fl <= 0:
            return
        a = self.t[s]
        b = a + t
        self.out[s].acc["compute"] += t
        self.out[s].flops += fl * self.n
        self._span(s, "compute", name, a, b, layer, mb, phase, flops=fl)
        self.t[s] = b

    def _wait(self, s: int, arr: np.ndarray, name: str, src_stage: int, layer, mb, phase):
        a = self.t[s]
        b = np.maximum(a, arr)
        self.out[s].acc["bubble"] += b - a
        if self.span_pos[s]:
            src = np.asarray(self.groups[src_stage])
            self._span(s, "bubble", name, a, b, layer, mb, phase, waited_on=src,
                       reason=f"waiting for stage {src_stage} ({name})")
        self.t[s] = b

    def _tp(self, s: int, name: str, layer, mb, phase) -> None:
        d = self.c.tp_time(self.groups[s][0])
        if d <= 0:
            return
        self.c.tp_bytes(self.groups[s])
        a = self.t[s]
        self.out[s].acc["tp"] += d
        self._span(s, "tp", name, a, a + d, layer, mb, phase)
        self.t[s] = a + d

    def _a2a(self, s: int, kind: str, name: str, rec: RouteRec, layer: int, mb: int,
             phase: str) -> None:
        a = self.t[s]
        if self.n > 1 and rec.nz is all_pairs(self.n):
            # everybody waits for everybody: the latest arrival (first of equals),
            # and for that member the latest of the others
            j1 = int(a.argmax())
            others = a.copy()
            others[j1] = -np.inf
            late = np.full(self.n, j1)
            late[j1] = int(others.argmax())
            start = np.full(self.n, a[j1])
        else:
            peers = np.where(rec.nz, a[None, :], -np.inf)
            late = peers.argmax(axis=1)
            start = np.maximum(a, peers.max(axis=1))
        x = rec.a2a[name]
        if x.ndim == 2:
            dur = np.maximum(self.c.net.a2a_finish(self.groups[s], x, a), start) - start
        else:
            dur = x
        slowed = None
        if self.budget > 0:    # overlapped: the partner item's compute hides the first
            stall = start - a  # `budget` seconds of this wait + transfer (ep stream)
            hide = self.budget
            f = self.c.ep_sm_frac
            if f > 0:          # the hiding compute runs on the SMs the kernels leave
                hide = np.minimum(self.budget / (1.0 - f), self.budget + (stall + dur) * f)
                slowed = hide - self.budget
            total = np.maximum(0.0, stall + dur - hide)
            start = a + np.maximum(0.0, stall - hide)
            dur = a + total - start
        if slowed is not None:  # the partner's compute, longer under the kernels
            self.out[s].acc["compute"] += slowed
            self._span(s, "compute", f"{name}.sm_share", a, a + slowed, layer, mb, phase)
            a, start = a + slowed, start + slowed
        end = start + dur
        if rec.mats is not None:
            self.c.links.a2a(self.groups[s], rec.mats[name], self.c.a2a_algo)
        self.after_a2a = end
        self.out[s].ep_iv.append((start, end))
        acc = self.out[s].acc
        acc["stall"] += start - a
        acc[kind] += dur
        if self.span_pos[s]:
            g = np.asarray(self.groups[s])
            hot_e, hot_t = rec.hot[late], rec.hot_tok[late]
            waited = np.where(start > a, g[late], -1)
            self._span(s, "stall", name, a, start, layer, mb, phase, waited_on=waited,
                       expert=hot_e, tokens=hot_t, peers=tuple(g.tolist()),
                       reason=f"partner arrived late at {name}")
            self._span(s, kind, name, start, end, layer, mb, phase, peers=tuple(g.tolist()))
        self.t[s] = end

    def _experts(self, s: int, rec: RouteRec, layer: int, mb: int, phase: str) -> None:
        a = self.t[s]
        d = rec.exp_t[phase]
        self.out[s].acc["compute"] += d
        self.out[s].flops += rec.exp_f[phase]
        self._span(s, "compute", f"{phase}.experts", a, a + d, layer, mb, phase,
                   tokens=rec.recv)
        self.t[s] = a + d

    # ------------------------------------------------------------ one layer
    def layer(self, s: int, layer: int, mb: int, phase: str) -> None:
        c = self.c
        spec, tok, tp = c.spec, c.tokens, c.tp
        moe = spec.is_moe_layer(layer)
        attn = lambda: [*costs.norm_kernels(spec, tok, tp, phase),  # noqa: E731
                        *costs.attention_kernels(spec, tok, c.seq, tp, phase)]
        ffn = lambda: costs.dense_ffn_kernels(spec, tok, tp, phase)  # noqa: E731
        if phase == "fwd":
            self._compute(s, "fwd.attn", ("attn", phase), attn, layer, mb, phase)
            self._tp(s, "fwd.tp_attn", layer, mb, phase)
            if moe:
                self._moe(s, layer, mb, phase)
            else:
                self._compute(s, "fwd.ffn", ("ffn", phase), ffn, layer, mb, phase)
            self._tp(s, "fwd.tp_mlp", layer, mb, phase)
        else:
            self._tp(s, "bwd.tp_mlp", layer, mb, phase)
            if moe:
                self._moe(s, layer, mb, phase)
            else:
                self._compute(s, "bwd.ffn", ("ffn", phase), ffn, layer, mb, phase)
            self._tp(s, "bwd.tp_attn", layer, mb, phase)
            self._compute(s, "bwd.attn", ("attn", phase), attn, layer, mb, phase)

    def _moe(self, s: int, layer: int, mb: int, phase: str) -> None:
        c = self.c
        spec, sent = c.spec, c.sent
        rec = self.route(s, layer, mb)
        pre = lambda: [*costs.router_kernels(spec, c.ep_tokens, phase),  # noqa: E731
                       *costs.permute_kernels(spec, sent, phase)]
        post = lambda: [*costs.unpermute_kernels(spec, sent, phase),  # noqa: E731
                        *costs.shared_expert_kernels(spec, c.tokens, c.tp, phase)]
        if phase == "fwd":
            self._compute(s, "fwd.router", ("router", phase), pre, layer, mb, phase)
            self._a2a(s, "ep_dispatch", "fwd.dispatch", rec, layer, mb, phase)
            self._experts(s, rec, layer, mb, phase)
            self._a2a(s, "ep_combine", "fwd.combine", rec, layer, mb, phase)
            self._compute(s, "fwd.unpermute", ("post", phase), post, layer, mb, phase)
        else:
            self._compute(s, "bwd.unpermute", ("post", phase), post, layer, mb, phase)
            self._a2a(s, "ep_combine", "bwd.combine", rec, layer, mb, phase)
            self._experts(s, rec, layer, mb, phase)
            self._a2a(s, "ep_dispatch", "bwd.dispatch", rec, layer, mb, phase)
            self._compute(s, "bwd.router", ("router", phase), pre, layer, mb, phase)

    # ------------------------------------------------------------ one schedule item
    def ready(self, s: int, item) -> bool:
        key = self._recv_key(s, item)
        return key is None or key in self.msgs

    def _recv_key(self, s: int, item):
        c = self.c
        vs = item.chunk * c.pp + s
        if item.kind == "F":
            return ("act", item.mb, vs) if vs > 0 else None
        return ("grad", item.mb, vs) if vs < c.pp * c.v - 1 else None

    def item(self, s: int, item, budget: float = 0.0) -> None:
        c = self.c
        p, last_v = c.pp, c.pp * c.v - 1
        vs = item.chunk * p + s
        layers = list(c.chunks[vs])
        mb = item.mb
        self.budget = budget
        if item.kind == "B":
            self.out[s].ep_iv = []
        key = self._recv_key(s, item)
        spec, tok, tp = c.spec, c.tokens, c.tp
        out = self.out[s]
        if item.kind == "F":
            if key is not None:
                self._wait(s, self.msgs.pop(key), "fwd.recv", (vs - 1) % p,
                           layers[0] if layers else -1, mb, "fwd")
            if vs == 0:
                self._compute(s, "fwd.embedding", ("emb", "fwd"),
                              lambda: costs.embedding_kernels(spec, tok, tp, "fwd"), -1, mb,
                              "fwd")
            for layer in layers:
                self.layer(s, layer, mb, "fwd")
            if vs == last_v:
                self._compute(s, "fwd.lm_head", ("lm", "fwd"),
                              lambda: costs.lm_head_kernels(spec, tok, tp, "fwd"), -1, mb,
                              "fwd")
            else:
                self._send(s, (vs + 1) % p, ("act", mb, vs + 1), mb, "fwd",
                           layers[-1] if layers else -1)
        else:
            if key is not None:
                self._wait(s, self.msgs.pop(key), "bwd.recv", (vs + 1) % p,
                           layers[-1] if layers else -1, mb, "bwd")
            else:
                self._compute(s, "bwd.lm_head", ("lm", "bwd"),
                              lambda: costs.lm_head_kernels(spec, tok, tp, "bwd"), -1, mb,
                              "bwd")
            for layer in reversed(layers):
                self.layer(s, layer, mb, "bwd")
                out.last_bwd[layer] = self.t[s].copy()
            out.grads = out.grads or (bool(layers) and mb == c.m - 1)
            if vs > 0:
                self._send(s, (vs - 1) % p, ("grad", mb, vs - 1), mb, "bwd",
                           layers[0] if layers else -1)
        self.budget = 0.0
        out.end = self.t[s].copy()

    def pair(self, s: int, x, y, budget_x: float, budget_y: float) -> None:
        """Two interleaved items run back to back; ``x``'s pipeline message leaves
        when ``x``'s last segment would end in the exact builder's interleaving."""
        self.last_send = None
        self.item(s, x, budget_y)
        sent, self.last_send = self.last_send, None
        y0 = self.t[s].copy()
        self.after_a2a = None
        self.item(s, y, budget_x)
        if sent is not None and sent[0] in self.msgs:
            # x's last segment runs after y's last but one: it leaves y's last
            # segment (the compute after y's last all-to-all) before the pair's end
            key, d = sent
            tail = self.t[s] - (y0 if self.after_a2a is None else self.after_a2a)
            self.msgs[key] = np.maximum(self.msgs[key], self.t[s] - tail + d)

    def _send(self, s: int, dst_stage: int, key: tuple, mb: int, phase: str,
              layer: int) -> None:
        c = self.c
        a = self.t[s]
        src, dst = self.groups[s], self.groups[dst_stage]
        # after a layer's last backward its gradient bucket's ring flow may share the
        # path: max-min leaves the send half of it (measured on the fidelity case)
        shared = phase == "bwd" and c.grad_share and self.out[s].grads
        skey = (src, dst, bool(shared))
        d = self._send_d.get(skey)
        if d is None:   # per (source group, destination group, sharing)
            d = self._send_d[skey] = np.array(
                [c.net.p2p_time(x, y, c.act_bytes, c.send_share(x, y) if shared else 1.0)
                 for x, y in zip(src, dst, strict=True)])
        c.links.sends(src, dst, c.act_bytes)
        self.msgs[key] = a + d
        self.last_send = (key, d)
        self.out[s].send_end = a + d
        self._span(s, "pp", f"{phase}.send", a, a + d, layer, mb, phase, stream="pp",
                   bytes=c.act_bytes)
