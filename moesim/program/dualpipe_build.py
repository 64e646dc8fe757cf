"""Op programs of DualPipe / DualPipeV and of Megatron-Core's 1F1B with all-to-all
overlap (pure: no simpy): the schedule stage for those orders, composed into
:class:`moesim.program.build.Builder` (:class:`DualPipeProgram`, :func:`a2a_program`).

DualPipe(V) (``schedule.kind: dualpipe | dualpipev``): each rank runs its items of
:func:`moesim.schedule.dualpipe.make_dual_order` (deepseek-ai/DualPipe
``dualpipe/dualpipe.py``, ``dualpipe/dualpipev.py``):

- ``F``: receive the activation from the rank :meth:`DualOrder.rank` names for the
  previous stage (none on stage 0 or when that rank is this one), the stage's layers
  forward (+ embedding on stage 0, LM head on the last stage), send to the next stage;
- ``B``: the input-gradient backward (:func:`moesim.model.costs.split_backward`'s
  ``B`` part of every kernel), then the gradient send; its weight gradients wait;
- ``W``: the deferred weight-gradient GEMMs of one (micro-batch, stage), first in
  first out as the reference's ``WeightGradStore``;
- ``BW``: both, per layer ``B`` then ``W`` (the reference's full backward);
- ``F&B``: an ``F`` and a ``BW`` of two micro-batches (``overlapped_forward_backward``);
  with ``overlap.kind: static`` and EP > 1 their EP all-to-alls go to the ``ep``
  stream and the two interleave segment by segment (:func:`pair_items`), so one
  micro-batch's dispatch and combine run under the other's compute (DeepSeek-V3
  report §3.2.1, Figure 4); with ``none`` the forward runs, then the backward.

With ``overlap.gemm_sms: left_by_ep`` the builder's timer prices every FP8 GEMM of the
step on the SMs the EP backend's kernels leave (:func:`moesim.compute.pinned_sms.
step_gemms`, as DeepSeek's profile launches them), pairs and lone chunks alike, and each
compute op carries the part of its time those GEMMs take (``Op.pinned_s``), which the
engines do not slow again while the EP kernels hold SMs.

Pipeline message keys carry (micro-batch, receiving stage, receiving rank): a
micro-batch runs each stage once, so keys never collide. A stage held by two ranks
(DualPipe's two copies of the model, rank r and P-1-r) reduces its gradients over both
copies' data-parallel groups; each stage's buckets start after its last ``W``.

``schedule.pp_comm: reference`` places the pipeline messages as the reference issues
them (deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` at 3da1bbea, ``_commit_and_wait_comm``:
``dist.batch_isend_irecv`` of the queued ``append_isend`` / ``append_irecv`` ops, then a
wait on every request): the items carry no receives or sends; at each commit of
:func:`moesim.schedule.dualpipe_comm.reference_program` (:meth:`DualPipeProgram._commit`)
the rank posts its queued messages and its compute stream waits (``bubble``) until every
one of them is delivered. A message's flow starts once both sides have posted (NCCL's
p2p rendezvous: the receiver's post is a self-send that the sender's ``pp`` stream waits
for) and the sender's previous send has been delivered (the ``pp`` stream, one message at
a time in program order), on the flow network as an eager send.

``overlap.kind: a2a-1f1b``: the per-stage steps of
:func:`moesim.schedule.a2a_overlap.a2a_1f1b_order`; a (forward, backward) step is
interleaved as in Megatron-Core's ``TransformerLayerSchedulePlan.run``: the backward's
segment first (its combine flies under the forward's attention), then the forward's
(its dispatch under the backward's experts), alternating.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

from moesim.compute.pinned_sms import step_gemms
from moesim.program import recipe
from moesim.program.ops import Op
from moesim.program.overlap import ep_stream, is_ep
from moesim.program.timer import Timer
from moesim.schedule.a2a_overlap import a2a_1f1b_order, flatten
from moesim.schedule.dualpipe import inflight_activations
from moesim.schedule.dualpipe_comm import reference_program
from moesim.schedule.pipeline import inflight_microbatches


class PartTimer:
    """A :class:`moesim.program.build.Timer` view that times only the ``B`` or ``W``
    part of backward kernel lists (forward kernels pass through for ``B``)."""

    def __init__(self, base, part: str) -> None:
        self.base = base
        self.model = base.model
        self.part = part

    def __call__(self, key: tuple, make) -> tuple[float, float]:
        part = self.part
        return self.base(key + (part,), lambda: recipe.backward_part(make(), part))

    def kernels_for(self, key: tuple) -> tuple:
        return self.base.kernels_for(key + (self.part,))


def pair_items(prog: list[Op], a: int, b: int, last: dict[int, int],
               interleave: bool = True, split_dense: bool = False) -> None:
    """Run two items, ``prog[a:b]`` and ``prog[b:]``, as one pair, as the reference
    does: both pipeline receives first, then the compute (``interleave``: segment by
    segment, a segment ending at each EP all-to-all, the second item's first; else the
    first item, then the second), then both pipeline sends, each after the pair's last
    op (``_send_forward`` / ``_send_backward`` follow ``overlapped_forward_backward``).
    ``split_dense``: an item without all-to-alls (a chunk of dense layers, as DeepSeek-V3's
    first three) paired with one that has them is cut into as many runs of its compute
    ops as the other has segments, so each all-to-all flies under a share of the dense
    chunk's components (report §3.2.1: a chunk's attention and MLP are rearranged around
    the other's dispatch and combine) instead of the whole dense chunk running first.
    Remaps deps and ``last`` (layer -> op index)."""
    def segments(lo: int, hi: int) -> list[list[int]]:
        out, cur = [], []
        for i in range(lo, hi):
            if prog[i].recv_from >= 0 or prog[i].send_to >= 0:
                continue
            cur.append(i)
            if interleave and is_ep(prog[i]):
                out.append(cur)
                cur = []
        return out + ([cur] if cur else [])

    order = [i for i in range(a, len(prog)) if prog[i].recv_from >= 0]
    sa, sb = segments(a, b), segments(b, len(prog))
    if interleave and split_dense:
        sa, sb = _spread(sa, sb, prog), _spread(sb, sa, prog)
    if interleave:
        sa, sb = sb, sa
    for k in range(max(len(sa), len(sb))):
        order += sa[k] if k < len(sa) else []
        order += sb[k] if k < len(sb) else []
    sends = [i for i in range(a, len(prog)) if prog[i].send_to >= 0]
    body = len(order)
    order += sends
    where = {old: a + pos for pos, old in enumerate(order)}
    tail = a + body - 1                    # the pair's last op before the sends
    prog[a:] = [replace(prog[old], deps=(tuple(where.get(d, d) for d in prog[old].deps)
                                         if pos < body else (tail,)))
                for pos, old in enumerate(order)]
    for layer, idx in last.items():
        if idx >= a:
            last[layer] = where[idx]


def _spread(mine: list[list[int]], other: list[list[int]], prog: list[Op]) -> list[list[int]]:
    """``mine`` cut into ``len(other)`` runs of near-equal op counts when it holds no
    all-to-all and ``other`` does (see :func:`pair_items`); else unchanged."""
    ops = [i for seg in mine for i in seg]
    if not other or any(is_ep(prog[i]) for i in ops) or \
            not any(is_ep(prog[i]) for seg in other for i in seg):
        return mine
    n = min(len(other), len(ops))
    cuts = [len(ops) * k // n for k in range(n + 1)]
    return [ops[cuts[k]:cuts[k + 1]] for k in range(n)]


class DualPipeProgram:
    """The schedule stage of DualPipe(V): each rank's program from its items of the dual
    order. Inputs: the order ``dual`` (:class:`moesim.schedule.dualpipe.DualOrder`),
    ``fb_overlap`` (an F&B pair interleaves its EP all-to-alls) and the builder ``b`` that
    writes the ops through its public interface: its layers (``layer_ops``, ``layer_plan``,
    ``kernels``), compute, pipeline and gradient ops (``compute_op``, ``recv_op``,
    ``send_op``, ``gradient_ops``), model chunks, routing, timer and
    FLOP count. With ``overlap.gemm_sms: left_by_ep`` it gives the builder a timer whose
    FP8 GEMMs run on the SMs the EP kernels leave (``pinned``, for the whole step)."""

    def __init__(self, b, dual, fb_overlap: bool) -> None:
        self.b = b
        self.dual = dual
        self.fb_overlap = fb_overlap
        # schedule.pp_comm: reference: messages at the commits, none inside the items
        self.ref = b.scn.schedule.pp_comm == "reference"
        self.pinned = step_gemms(b.res, b.timer.model)
        if self.pinned is not None:
            b.timer = Timer(self.pinned)

    @contextmanager
    def _part(self, part: str):
        b = self.b
        base = b.timer
        b.timer = PartTimer(base, part)
        try:
            yield
        finally:
            b.timer = base

    # ---------------------------------------------------------------- DualPipe(V)
    def program(self, rank: int) -> list[Op]:
        b = self.b
        d = self.dual
        pos = int(b.lay.coords["pp"][rank])
        pp_group = b.lay.group_of(rank, "pp")
        prog: list[Op] = []
        b.layer_starts = []
        last_w: dict[int, int] = {}     # layer -> index of its last weight-gradient op
        events = (reference_program(d, pos) if self.ref
                  else [("compute", it) for it in d.items[pos]])
        batch: list = []
        for ev in events:
            if ev[0] != "compute":
                if ev[0] == "wait":
                    self._commit(prog, rank, pp_group, batch)
                    batch = []
                else:
                    batch.append(ev)
                continue
            it = ev[1]
            start = len(prog)
            if it.kind == "F":
                self._dual_f(prog, rank, pp_group, it.mb, it.stage)
            elif it.kind in ("B", "BW"):
                self._dual_b(prog, rank, pp_group, it.mb, it.stage, last_w, it.kind == "BW")
            elif it.kind == "W":
                self._dual_w(prog, rank, it.mb, it.stage, last_w)
            else:   # F&B
                self._dual_f(prog, rank, pp_group, it.mb, it.stage)
                mid = len(prog)
                self._dual_b(prog, rank, pp_group, it.bmb, it.bstage, last_w, True)
                if self.fb_overlap:
                    ep_stream(prog, start)
                pair_items(prog, start, mid, last_w, self.fb_overlap, split_dense=True)
        b.gradient_ops(prog, rank, pos, last_w, parts=self._dual_parts(rank, pos, last_w))
        if self.pinned is not None:
            self._pin(prog)
        return prog

    def _commit(self, prog: list[Op], rank: int, pp_group, batch: list) -> None:
        """One ``_commit_and_wait_comm`` of ``batch`` (``("recv" | "send", Transfer)``,
        in queue order), after the rank's last op so far: each receive posts itself (a
        self-send of key ``("post", key)``, delivered at once); each send waits on the
        ``pp`` stream for its receiver's post, then flows; the compute stream waits for
        every message's delivery, one ``bubble`` per message naming its peer."""
        if not batch:
            return
        b = self.b
        after = (len(prog) - 1,) if prog else ()
        waits = []
        for role, m in batch:
            src, dst = pp_group[m.src], pp_group[m.dst]
            key = (m.what, m.mb, m.stage, dst)
            phase = "fwd" if m.what == "act" else "bwd"
            layers = b.chunks[m.stage if role == "recv" else
                              m.stage - 1 if m.what == "act" else m.stage + 1]
            first = m.what == ("act" if role == "recv" else "grad")
            layer = (layers[0] if first else layers[-1]) if layers else -1
            if role == "recv":
                prog.append(Op(stream="pp.post", kind="pp", name=f"{phase}.post",
                               send_to=rank, key=("post", *key), microbatch=m.mb,
                               phase=phase, layer=layer, deps=after))
            else:
                prog.append(Op(stream="pp", kind="pp", name=f"{phase}.post", recv_from=dst,
                               key=("post", *key), microbatch=m.mb, phase=phase,
                               layer=layer, deps=after))
                prog.append(b.send_op(prog, dst, key, m.mb, phase, layer))
            waits.append(Op(stream="compute", kind="pp", name=f"{phase}.{role}",
                            recv_from=src if role == "recv" else dst, key=key,
                            microbatch=m.mb, phase=phase, layer=layer))
        prog += waits

    def _pin(self, prog: list[Op]) -> None:
        """Each compute op's pinned seconds (``Op.pinned_s``: its FP8 GEMMs' share)."""
        pin = self.pinned
        for i, op in enumerate(prog):
            if op.kernels and op.is_compute:
                p = pin.pinned_s(op.kernels)
                if p > 0:
                    prog[i] = replace(op, pinned_s=p)

    def _dual_parts(self, rank: int, pos: int, last_w: dict[int, int]) -> list[tuple]:
        """Gradient parts per held stage, highest stage first on every rank (the copies'
        comm streams issue them in one order): layers last to first; the groups of both
        copies when another rank holds the stage too (DualPipe)."""
        b = self.b
        d, lay = self.dual, b.lay
        pp_group = lay.group_of(rank, "pp")
        held = sorted({st for it in d.items[pos] for _, _, st in it.parts()}, reverse=True)
        parts = []
        for s in held:
            copies = sorted({d.rank_of[k][s] for k in range(len(d.rank_of))})
            dg: set[int] = set()
            eg: set[int] = set()
            for c in copies:
                peer = pp_group[c]
                dg |= set(lay.group_of(peer, "dp"))
                eg |= set(b.expert_dp_group(peer))
            layers = [x for x in reversed(b.chunks[s]) if x in last_w]
            parts.append((layers, s == 0, s == d.stages - 1, tuple(sorted(dg)),
                          tuple(sorted(eg)), f"s{s}."))
        return parts

    def _dual_f(self, prog: list[Op], rank: int, pp_group, mb: int, s: int) -> None:
        b = self.b
        d = self.dual
        layers = list(b.chunks[s])
        if s > 0:
            src = pp_group[d.rank(mb, s - 1)]
            if src != rank and not self.ref:
                prog.append(b.recv_op(src, ("act", mb, s, rank), mb, "fwd",
                                       layers[0] if layers else -1))
        else:
            b.compute_op(prog, "fwd.embedding", -1, mb, "fwd", ("emb", "fwd"),
                          lambda: recipe.embedding(b.spec, b.tokens, b.tp, "fwd"))
        for layer in layers:
            b.layer_ops(prog, rank, layer, mb, "fwd")
        if s == d.stages - 1:
            b.compute_op(prog, "fwd.lm_head", -1, mb, "fwd", ("lm", "fwd"),
                          lambda: recipe.lm_head(b.spec, b.tokens, b.tp, "fwd", b.sp))
            return
        dst = pp_group[d.rank(mb, s + 1)]
        if dst != rank and not self.ref:
            prog.append(b.send_op(prog, dst, ("act", mb, s + 1, dst), mb, "fwd",
                                   layers[-1] if layers else -1))

    def _lm_head_bwd(self, prog: list[Op], mb: int, part: str) -> None:
        b = self.b
        name = {"B": "bwd.lm_head", "W": "bwd.w_lm_head"}[part]
        b.compute_op(prog, name, -1, mb, "bwd", ("lm", "bwd", part), lambda: recipe.backward_part(
            recipe.lm_head(b.spec, b.tokens, b.tp, "bwd", b.sp), part))

    def _dual_b(self, prog: list[Op], rank: int, pp_group, mb: int, s: int,
                last_w: dict[int, int], full: bool) -> None:
        b = self.b
        d = self.dual
        layers = list(b.chunks[s])
        if s < d.stages - 1:
            src = pp_group[d.rank(mb, s + 1)]
            if src != rank and not self.ref:
                prog.append(b.recv_op(src, ("grad", mb, s, rank), mb, "bwd",
                                       layers[-1] if layers else -1))
        else:
            self._lm_head_bwd(prog, mb, "B")
            if full:
                self._lm_head_bwd(prog, mb, "W")
        for layer in reversed(layers):
            with self._part("B"):
                b.layer_ops(prog, rank, layer, mb, "bwd")
            if full:
                self._w_layer(prog, rank, layer, mb, last_w)
        if s > 0:
            dst = pp_group[d.rank(mb, s - 1)]
            if dst != rank and not self.ref:
                prog.append(b.send_op(prog, dst, ("grad", mb, s - 1, dst), mb, "bwd",
                                       layers[0] if layers else -1))

    def _dual_w(self, prog: list[Op], rank: int, mb: int, s: int,
                last_w: dict[int, int]) -> None:
        b = self.b
        if s == self.dual.stages - 1:
            self._lm_head_bwd(prog, mb, "W")
        for layer in reversed(b.chunks[s]):
            self._w_layer(prog, rank, layer, mb, last_w)

    def _w_layer(self, prog: list[Op], rank: int, layer: int, mb: int,
                 last_w: dict[int, int]) -> None:
        """Weight-gradient GEMMs of one layer, in its template's ``W`` order
        (:func:`moesim.program.layer_plan.weight_steps`): the routed experts' with the
        tokens each received."""
        b = self.b
        for st in b.layer_plan.steps(layer, "W"):
            if st.kind == "experts":
                self._w_experts(prog, rank, layer, mb, st.name)
            else:
                b.compute_op(prog, st.name, layer, mb, "bwd", *b.kernels.op(st, layer))
        last_w[layer] = len(prog) - 1

    def _w_experts(self, prog: list[Op], rank: int, layer: int, mb: int, name: str) -> None:
        b = self.b
        group = b.lay.group_of(rank, "ep")
        local = b.routes.route(group[0], group, layer, mb).rank_expert_tokens[group.index(rank)]
        experts = tuple(int(e) for e in local.nonzero()[0])
        t_exp = f_exp = 0.0
        ks: list = []
        for i, e in enumerate(experts):   # grouped: later experts share the 1st's launches
            key, make = b.kernels.expert(int(local[e]), "bwd", b.grouped and i > 0, "W")
            t, f = b.timer(key, make)
            t_exp += t
            f_exp += f
            ks += b.timer.kernels_for(key)
        b.flops += f_exp
        prog.append(Op(stream="compute", kind="compute", name=name, duration_s=t_exp,
                       flops=f_exp, layer=layer, microbatch=mb, kernels=tuple(ks),
                       phase="bwd", experts=experts,
                       expert_tokens=tuple(int(local[e]) for e in experts)))


def a2a_program(b, rank: int) -> list[Op]:
    """``rank``'s program under ``overlap.kind: a2a-1f1b`` (the schedule stage of
    Megatron-Core's 1F1B with EP all-to-all overlap), written by the builder ``b``: its
    schedule items (``item_ops``), layer starts and gradient stage (``gradient_ops``)."""
    stage = int(b.lay.coords["pp"][rank])
    pp_group = b.lay.group_of(rank, "pp")
    prog: list[Op] = []
    b.layer_starts = []
    last_bwd: dict[int, int] = {}
    for step in a2a_1f1b_order(b.pp, b.m, b.v)[stage]:
        start = len(prog)
        b.item_ops(prog, rank, stage, pp_group, step[0], last_bwd)
        if len(step) == 1:
            continue
        mid = len(prog)
        b.item_ops(prog, rank, stage, pp_group, step[1], last_bwd)
        ep_stream(prog, start)
        pair_items(prog, start, mid, last_bwd)
        b.layer_starts = []
    b.gradient_ops(prog, rank, stage, last_bwd)
    return prog


def inflight(b) -> list[int]:
    """Activations alive per pipeline stage (micro-batches) under ``b``'s schedule."""
    if b.dual is not None:
        return inflight_activations(b.dual)
    if b.scn.overlap.kind == "a2a-1f1b":
        return inflight_microbatches(flatten(a2a_1f1b_order(b.pp, b.m, b.v)))
    return inflight_microbatches(b.order)
