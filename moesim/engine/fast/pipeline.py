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
list-scheduled across stages: an item waits for its pipeline message (``bubble``);
the ``pp`` stream sends one message at a time, in order. With
``overlap.ep_comm_overlap`` the items the exact builder interleaves (same
:class:`~moesim.program.overlap.PairRule`) are recorded op by op (``rec``) and run
on two streams as the exact engine runs them, all-to-alls on the ``ep`` stream and
compute slowed by the SM share EP kernels hold (:mod:`moesim.engine.fast.pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from moesim.engine.fast import tp_ub
from moesim.engine.fast.pairs import run_pair
from moesim.engine.fast.spans import add_spans, moved_ends
from moesim.engine.fast.zero3 import Zero3Gathers
from moesim.program import recipe
from moesim.program.folding import quantised_gathers, sp_exchange
from moesim.program.layer_plan import LayerKernels, LayerPlan, is_recompute
from moesim.trace.spans import AFTER_EXPERTS, Span, wait_reason

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
    exp_p: dict[str, np.ndarray] | None = None  # phase -> (n,) seconds of exp_t pinned
                                                # (overlap.gemm_sms, fast.pinned)


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
        self.rec: list[tuple] | None = None   # while set, ops are recorded (pairs.run_pair)
        self.z3 = Zero3Gathers(ctx, groups)
        # one layer's op order (moesim.program.layer_plan), each step priced below
        scn = ctx.res.scenario
        self.plan = LayerPlan.of(ctx.res, ctx.spec)
        side = self.plan.facts["side"]
        self.kern = LayerKernels(ctx.spec, ctx.tokens, ctx.seq, ctx.tp, ctx.ep_tokens,
                                 ctx.sent, scn.overlap.cuda_graphs, side, ctx.rc, ctx.etp,
                                 ctx.sp)
        self._do = {"zero3": self._zero3, "recompute": self._op, "mtp": self._op,
                    "ffn": self._op, "attn": self._attn, "tp": self._tp_step,
                    "moe": self._moe}
        self._send_d: dict[tuple, np.ndarray] = {}
        self._peers: dict[int, tuple] = {}
        ctx.net.held.clear()    # held sends and kept all-to-alls are a chain's own (flow_a2a)

    # ------------------------------------------------------------ spans
    def _span(self, s: int, kind: str, name: str, a, b, layer=-1, mb=-1, phase="",
              stream="compute", **kw) -> None:
        pos = self.span_pos[s]
        if not pos:
            return
        add_spans(self.spans, self.groups[s], pos, kind, name, a, b, layer, mb, phase, stream,
                  kw)

    def _compute(self, s: int, name: str, key: tuple, make, layer, mb, phase) -> None:
        t, fl = self.c.timer(key, make)
        if t <= 0 and fl <= 0:
            return
        if not is_recompute(name):    # model FLOPs only
            self.out[s].flops += fl * self.n
        if self.rec is not None:
            self.rec.append(("c", t, name, layer, mb, phase, {"flops": fl}))
            return
        a = self.t[s]
        b = a + t
        self.out[s].acc["compute"] += t
        self._span(s, "compute", name, a, b, layer, mb, phase, flops=fl)
        self.t[s] = b

    def _wait(self, s: int, arr: np.ndarray, name: str, src_stage: int, layer, mb, phase):
        if self.rec is not None:
            self.rec.append(("w", arr, name, src_stage, layer, mb, phase))
            return
        a = self.t[s]
        b = np.maximum(a, arr)
        self.out[s].acc["bubble"] += b - a
        if self.span_pos[s]:
            src = np.asarray(self.groups[src_stage])
            self._span(s, "bubble", name, a, b, layer, mb, phase, waited_on=src,
                       reason=f"waiting for stage {src_stage} ({name})")
        self.t[s] = b

    def _tp(self, s: int, name: str, layer, mb, phase, share: float = 1.0,
            which: str = "") -> None:
        if self.c.tpo and tp_ub.charge(self, s, name, layer, mb, phase):
            return          # TE userbuffers: beside the GEMMs (moesim.engine.fast.tp_ub)
        d = self._sp_s(s, layer, phase, which)
        if d is None:
            d = self.c.tp_time(self.groups[s][0]) * share
        if d <= 0:
            return
        self.c.tp_bytes(self.groups[s])
        self._charge_tp(s, d, name, layer, mb, phase)

    def _sp_s(self, s: int, layer, phase, which: str) -> float | None:
        """Seconds of a sequence-parallel exchange under MLA or with FP8 all-gathers,
        collective by collective (moesim.program.folding.sp_exchange: the all-gather in
        front of attention carries the latents; under TE's tensorwise recipe every
        all-gather is FP8); None otherwise (a share of the all-reduce)."""
        c = self.c
        if not c.sp or (c.spec.attention != "mla" and not quantised_gathers(c.spec)):
            return None
        key = ("sp", self.groups[s][0], c.spec.is_moe_layer(layer), phase, which)
        if key not in c._tp:            # the context's TP cache (moesim.engine.fast.engine)
            g = tuple(c.res.layout.group_of(self.groups[s][0], "tp"))
            c._tp[key] = sum(c.rings.time(op, g, nb) for op, nb in sp_exchange(
                c.spec, c.tokens, layer, phase, which, c.tpo))
        return c._tp[key]

    def _charge_tp(self, s: int, d: float, name: str, layer, mb, phase) -> None:
        """``d`` seconds of tensor-parallel communication on rank ``s``: recorded inside
        an overlapped pair (:mod:`moesim.engine.fast.pairs`), else charged to the rank's
        clock with its span."""
        if self.rec is not None:
            self.rec.append(("tp", d, name, layer, mb, phase))
            return
        a = self.t[s]
        self.out[s].acc["tp"] += d
        self._span(s, "tp", name, a, a + d, layer, mb, phase)
        self.t[s] = a + d

    def _a2a_times(self, s: int, name: str, rec: RouteRec, a: np.ndarray):
        """(start, end, latest partner) of an all-to-all its members join at ``a``."""
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
            end = np.maximum(self.c.net.a2a_finish(self.groups[s], x, a), start)
        else:
            end = start + x
        return start, end, late

    def _a2a_spans(self, s: int, kind: str, name: str, rec: RouteRec, layer: int, mb: int,
                   phase: str, a, start, end, late, stream: str = "compute") -> None:
        if self.span_pos[s]:
            hit = self._peers.get(s)
            if hit is None:     # the group as an array and as the spans' peers, once
                g = np.asarray(self.groups[s])
                hit = self._peers[s] = (g, tuple(g.tolist()))
            g, peers = hit
            waited = np.where(start > a, g[late], -1)
            hot_e, hot_t = rec.hot[late], rec.hot_tok[late]
            if name not in AFTER_EXPERTS:   # the late rank's experts have not run yet
                hot_e, hot_t = np.full(len(g), -1), np.zeros(len(g), dtype=int)
            why = np.empty(len(g), dtype=object)   # as the exact engine says it
            for e in self.span_pos[s]:
                why[e] = wait_reason(int(waited[e]), name, int(hot_e[e]), int(hot_t[e]))
            self._span(s, "stall", name, a, start, layer, mb, phase, waited_on=waited,
                       expert=hot_e, tokens=hot_t, peers=peers, reason=why, stream=stream)
            self._span(s, kind, name, start, end, layer, mb, phase, peers=peers, stream=stream)

    def _a2a(self, s: int, kind: str, name: str, rec: RouteRec, layer: int, mb: int,
             phase: str) -> None:
        if rec.mats is not None:
            self.c.links.a2a(self.groups[s], rec.mats[name], self.c.a2a_algo)
        if self.rec is not None:
            self.rec.append(("a", kind, name, rec, layer, mb, phase))
            return
        a = self.t[s]
        start, end, late = self._a2a_times(s, name, rec, a)
        self.out[s].ep_iv.append((start, end))
        acc = self.out[s].acc
        acc["stall"] += start - a
        acc[kind] += end - start
        self._a2a_spans(s, kind, name, rec, layer, mb, phase, a, start, end, late)
        self.t[s] = end

    def _a2a_beside(self, s: int, kind: str, name: str, rec: RouteRec, layer: int, mb: int,
                    phase: str, part: int) -> None:
        """An all-to-all on its own stream with the shared experts' part ``part`` beside it
        on the compute stream (``overlap.shared_expert``, moesim.program.shared_overlap):
        the next op starts when both are done."""
        c = self.c
        side, op = self.kern.shared(phase, part)
        d, fl = c.timer(*op)
        if rec.mats is not None:
            c.links.a2a(self.groups[s], rec.mats[name], c.a2a_algo)
        self.out[s].flops += fl * self.n
        a = self.t[s]
        start, end, late = self._a2a_times(s, name, rec, a)
        self.out[s].ep_iv.append((start, end))
        busy = a + d        # the compute stream's shared part
        acc = self.out[s].acc
        acc["compute"] += d
        acc["stall"] += np.maximum(0.0, start - busy)
        acc[kind] += np.maximum(0.0, end - np.maximum(start, busy))
        self._a2a_spans(s, kind, name, rec, layer, mb, phase, a, start, end, late,
                        stream="ep")
        self._span(s, "compute", side.name, a, busy, layer, mb, phase,
                   flops=fl)
        self.t[s] = np.maximum(end, busy)

    def _experts(self, s: int, rec: RouteRec, layer: int, mb: int, phase: str,
                 name: str) -> None:
        """The routed experts' step ``name``."""
        self._expert_gemms(s, rec, layer, mb, phase, name, recompute=False)

    def _etp(self, s: int, rec: RouteRec, layer, mb, phase, name: str) -> None:
        """ETP's all-gather before or reduce-scatter after the experts (``name``)."""
        d = self.c.etp_time(self.groups[s], rec.recv)
        self._charge_tp(s, d, name, layer, mb, phase)

    def _expert_gemms(self, s: int, rec: RouteRec, layer: int, mb: int, phase: str,
                      name: str, recompute: bool = True) -> None:
        """The routed experts' kernels of ``phase`` as op ``name`` (``recompute``: the
        forward, "fwd" or "act", again inside the backward: time, not model FLOPs)."""
        d = rec.exp_t[phase]
        if not recompute:
            self.out[s].flops += rec.exp_f[phase]
        ph = "bwd" if name.startswith("bwd.") else phase
        if self.rec is not None:
            self.rec.append(("c", d, name, layer, mb, ph, {"tokens": rec.recv}))
            return
        a = self.t[s]
        self.out[s].acc["compute"] += d
        self._span(s, "compute", name, a, a + d, layer, mb, ph,
                   tokens=rec.recv)
        self.t[s] = a + d

    # ------------------------------------------------------------ one layer
    def attn_op(self, layer: int, phase: str) -> tuple:
        """(timer key, kernel maker) of layer ``layer``'s norms and attention."""
        return self.kern.attn(layer, phase)

    def ffn_op(self, phase: str) -> tuple:
        """(timer key, kernel maker) of a dense layer's FFN."""
        return self.kern.ffn(phase)

    def layer(self, s: int, layer: int, mb: int, phase: str) -> None:
        """Layer ``layer``'s steps of ``phase`` (:meth:`LayerPlan.steps`), each priced by
        the lockstep model's rule for its kind."""
        do = self._do
        for st in self.plan.steps(layer, phase):
            do[st.kind](s, st, layer, mb)

    def _op(self, s: int, st, layer: int, mb: int) -> None:
        """One compute step (recompute, dense FFN, MTP head)."""
        op = self.kern.op(st, layer)
        if op is not None:
            self._compute(s, st.name, *op, layer, mb, st.phase)

    def _attn(self, s: int, st, layer: int, mb: int) -> None:
        key, attn = self.kern.op(st, layer)
        self._compute(s, st.name, key, attn, layer, mb, st.phase)
        if st.cp:
            self._cp(s, key, attn, layer, mb, st.phase)

    def _tp_step(self, s: int, st, layer: int, mb: int) -> None:
        # sequence parallelism: an MoE layer keeps one reduce-scatter and one all-gather,
        # half the ring bytes of its two all-reduces (moesim.program.folding)
        share = 0.5 if self.c.sp and self.plan.kind(layer)[0] else 1.0
        self._tp(s, st.name, layer, mb, st.phase, share, st.arg)

    def _zero3(self, s: int, st, layer: int, mb: int) -> None:
        """ZeRO-3: wait for this layer's weight gathers (moesim.engine.fast.zero3)."""
        a = self.t[s]
        start, end = self.z3.gather(s, layer, a)
        self._span(s, "zero", st.name, start, end, layer, mb, st.phase,
                   stream="comm")
        b = np.maximum(a, end)
        self.out[s].acc["zero"] += b - a
        self.t[s] = b

    def _cp(self, s: int, key: tuple, attn, layer, mb, phase) -> None:
        """Context parallelism: the ring's KV exchange runs beside attention; what it
        takes beyond the attention kernels is exposed (as the exact engine's cp stream)."""
        kv = self.c.cp_time(self.groups[s][0], phase)
        if kv <= 0:
            return
        t, _ = self.c.timer(key, attn)
        d = max(0.0, kv - t)
        if d > 0:
            self._charge_tp(s, d, f"{phase}.cp_kv", layer, mb, phase)

    def _moe(self, s: int, st, layer: int, mb: int) -> None:
        """The MoE block's steps (``st.block``) on the routed micro-batch."""
        c = self.c
        phase = st.phase
        rec = self.route(s, layer, mb)
        for x in st.block:
            k = x.kind
            if k == "a2a":
                if x.beside >= 0:
                    self._a2a_beside(s, x.arg, x.name, rec, layer, mb, phase, x.beside)
                else:
                    self._a2a(s, x.arg, x.name, rec, layer, mb, phase)
            elif k == "experts":
                self._experts(s, rec, layer, mb, phase, x.name)
            elif k == "etp":
                self._etp(s, rec, layer, mb, phase, x.name)
            elif k == "recompute_experts":
                rc = c.rc.expert_phase(layer)
                if rc is not None:      # the experts' forward (or activation) again
                    self._expert_gemms(s, rec, layer, mb, rc, x.name)
            else:               # router, unpermute
                self._compute(s, x.name, *self.kern.op(x, layer), layer, mb, phase)

    # ------------------------------------------------------------ one schedule item
    def ready(self, s: int, item) -> bool:
        key = self._recv_key(s, item)
        if key is None:
            return True
        # a held send (fast.flow_a2a) is received once its sender's all-to-alls are past it
        src = (s - 1 if item.kind == "F" else s + 1) % self.c.pp
        return key in self.msgs and self.c.net.held.settled(self.groups[src], key)

    def _recv_key(self, s: int, item):
        c = self.c
        vs = item.chunk * c.pp + s
        if item.kind == "F":
            return ("act", item.mb, vs) if vs > 0 else None
        return ("grad", item.mb, vs) if vs < c.pp * c.v - 1 else None

    def _at(self, s: int, fn) -> None:
        """``fn(t)`` at the end of the item's previous op (recorded while ``rec``)."""
        if self.rec is not None:
            self.rec.append(("f", fn))
        else:
            fn(self.t[s])

    def _new_iv(self, s: int) -> None:
        self._at(s, lambda _t: setattr(self.out[s], "ep_iv", []))

    def _last_bwd(self, s: int, layer: int) -> None:
        out = self.out[s]
        self._at(s, lambda t: out.last_bwd.__setitem__(layer, t.copy()))

    def item(self, s: int, item) -> None:
        c = self.c
        p, last_v = c.pp, c.pp * c.v - 1
        vs = item.chunk * p + s
        layers = list(c.chunks[vs])
        mb = item.mb
        if item.kind == "B":
            self._new_iv(s)
        key = self._recv_key(s, item)
        spec, tok, tp = c.spec, c.tokens, c.tp
        out = self.out[s]
        if item.kind == "F":
            if key is not None:
                self._wait(s, self.msgs.pop(key), "fwd.recv", (vs - 1) % p,
                           layers[0] if layers else -1, mb, "fwd")
            if vs == 0:
                self._compute(s, "fwd.embedding", ("emb", "fwd"),
                              lambda: recipe.embedding(spec, tok, tp, "fwd"), -1, mb,
                              "fwd")
            for layer in layers:
                self.layer(s, layer, mb, "fwd")
            if vs == last_v:
                self._compute(s, "fwd.lm_head", ("lm", "fwd"),
                              lambda: recipe.lm_head(spec, tok, tp, "fwd", c.sp), -1, mb,
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
                              lambda: recipe.lm_head(spec, tok, tp, "bwd", c.sp), -1, mb,
                              "bwd")
            for layer in reversed(layers):
                self.layer(s, layer, mb, "bwd")
                self._last_bwd(s, layer)
            if layers and mb == c.m - 1:
                self._at(s, lambda _t: setattr(out, "grads", True))
            if vs > 0:
                self._send(s, (vs - 1) % p, ("grad", mb, vs - 1), mb, "bwd",
                           layers[0] if layers else -1)
        out.end = self.t[s].copy()

    def record(self, s: int, run) -> list[tuple]:
        """The ops ``run()`` issues on position ``s``, recorded, not run."""
        self.rec = []
        try:
            run()
        finally:
            ops, self.rec = self.rec, None
        return ops

    def pair(self, s: int, x, y) -> None:
        """Two items the exact builder interleaves (:func:`moesim.program.overlap.
        interleave`): each receive and send inside its item, ``x``'s segment first."""
        ox = self.record(s, lambda: self.item(s, x))
        oy = self.record(s, lambda: self.item(s, y))
        run_pair(self, s, ox, oy)
        self.out[s].end = self.t[s].copy()

    def _send(self, s: int, dst_stage: int, key: tuple, mb: int, phase: str,
              layer: int) -> None:
        if self.rec is not None:
            self.rec.append(("s", dst_stage, key, mb, phase, layer))
            return
        c = self.c
        o = self.out[s]
        # the pp stream sends one message at a time, in program order (the exact
        # executor's stream): a send waits for the previous one's delivery
        a = self.t[s] if o.send_end is None else np.maximum(self.t[s], o.send_end)
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
        end = self.msgs[key] = self.out[s].send_end = a + d
        n0 = len(self.spans)
        self._span(s, "pp", f"{phase}.send", a, end, layer, mb, phase, stream="pp",
                   bytes=c.act_bytes)
        # an all-to-all it meets on the flow network may move ``end`` (fast.flow_a2a)
        c.net.hold_send(key, src, dst, a, end, c.act_bytes,
                        lambda e: moved_ends(self.spans, n0, self.span_pos[s], e))
