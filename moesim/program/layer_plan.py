"""One layer's op order, written once: the template every writer of a layer walks (pure).

:meth:`LayerPlan.steps` returns, for a (layer kind, phase), the ordered abstract steps of
one transformer layer on one rank: ZeRO-3's weight gathers, recompute, attention (CP's
KV ring beside it), the TP all-reduces (SP's reduce-scatter / all-gather), the dense FFN
or the MoE block (router, EP dispatch, ETP gather, experts, ETP scatter, combine,
unpermute; the shared experts beside the all-to-alls), an MTP depth's head, and, for
DualPipe's deferred weight gradients (phase ``"W"``), the weight-gradient GEMMs. The
exact builder (:mod:`moesim.program.build`, :mod:`moesim.program.dualpipe_build`) emits
its ops by walking it and the fast engine's chains (``engine/fast/pipeline.py``,
``forward.py``, ``dual.py``) price the same steps, each kind by their own rule (compute,
tp, a2a ...); so a step added or moved here reaches both engines.

:class:`LayerKernels` gives a compute step its (timer key, kernel maker) from
:mod:`moesim.program.recipe`: the writers above take a layer op's kernels from here, not
from the recipe.

A :class:`LayerPlan` makes each template once per (layer kind, phase); walking it costs a
loop over a dozen steps per layer and micro-batch, nothing per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moesim.program import recipe, shared_overlap
from moesim.program.shared_overlap import NAMES

__all__ = ["LayerKernels", "LayerPlan", "Step", "dense_block", "is_recompute",
           "layer_steps", "moe_block", "weight_steps", "zero3_gathers"]


def is_recompute(name: str) -> bool:
    """An op that runs forward kernels again inside the backward (``bwd.recompute``,
    ``bwd.recompute_experts``): step time, not model FLOPs."""
    return name.startswith("bwd.recompute")


@dataclass(frozen=True)
class Step:
    """One abstract step of a layer: ``kind`` says what a writer does (``zero3``,
    ``recompute``, ``attn``, ``tp``, ``ffn``, ``mtp``, ``moe``; inside ``moe``'s
    ``block``: ``router``, ``a2a``, ``etp``, ``recompute_experts``, ``experts``,
    ``post``; phase ``W``: ``mtp``, ``mlp_w``, ``ffn``, ``experts``, ``attn``),
    ``name`` the op's name, ``phase`` the op's phase (``fwd``/``bwd``), ``part``
    ``"W"`` for a deferred weight gradient. ``arg``: ``tp``: ``"attn"``/``"mlp"``;
    ``a2a``: ``"ep_dispatch"``/``"ep_combine"``; ``etp`` / ``shared``: 0 (before) or 1
    (after). ``beside``: an ``a2a``'s shared-experts part run beside it (-1: none);
    ``cp``: an ``attn`` step's CP ring beside it."""

    kind: str
    name: str
    phase: str
    part: str = ""
    arg: Any = None
    beside: int = -1
    cp: bool = False
    block: tuple[Step, ...] = field(default=())


def moe_block(phase: str, *, side: bool = False, etp: bool = False,
              recompute: bool = True) -> tuple[Step, ...]:
    """The MoE block of ``phase``: router, dispatch, (ETP gather,) experts, (ETP
    scatter,) combine, unpermute; the backward in reverse with the experts' recompute
    before them. ``side``: the shared experts' parts beside the two all-to-alls."""
    p = phase

    def a2a(kind: str, part: int) -> Step:
        verb = "dispatch" if kind == "ep_dispatch" else "combine"
        return Step("a2a", f"{p}.{verb}", p, arg=kind, beside=part if side else -1)

    def experts() -> list[Step]:
        core = [Step("experts", f"{p}.experts", p)]
        if etp:
            return [Step("etp", f"{p}.etp_gather", p, arg=0), *core,
                    Step("etp", f"{p}.etp_scatter", p, arg=1)]
        return core

    if p == "fwd":
        return (Step("router", "fwd.router", p), a2a("ep_dispatch", 0), *experts(),
                a2a("ep_combine", 1), Step("post", "fwd.unpermute", p))
    rc = [Step("recompute_experts", "bwd.recompute_experts", p)] if recompute else []
    ex = experts()
    if etp:
        ex = [ex[0], *rc, *ex[1:]]
    else:
        ex = [*rc, *ex]
    return (Step("post", "bwd.unpermute", p), a2a("ep_combine", 0), *ex,
            a2a("ep_dispatch", 1), Step("router", "bwd.router", p))


def dense_block(phase: str) -> tuple[Step, ...]:
    """A dense layer's FFN."""
    return (Step("ffn", f"{phase}.ffn", phase),)


def weight_steps(moe: bool, mtp: bool) -> tuple[Step, ...]:
    """The deferred weight-gradient GEMMs of one layer (DualPipe's ``W``): an MTP
    depth's head, the MLP's (router and shared experts, then the routed experts; or the
    dense FFN), then attention's."""
    out = [Step("mtp", "bwd.w_mtp", "bwd", "W")] if mtp else []
    if moe:
        out += [Step("mlp_w", "bwd.w_mlp", "bwd", "W"),
                Step("experts", "bwd.w_experts", "bwd", "W")]
    else:
        out += [Step("ffn", "bwd.w_mlp", "bwd", "W")]
    return (*out, Step("attn", "bwd.w_attn", "bwd", "W"))


def layer_steps(moe: bool, mtp: bool, phase: str, *, zero3: bool = False, cp: bool = False,
                side: bool = False, etp: bool = False) -> tuple[Step, ...]:
    """One layer's steps in ``phase`` (``fwd``, ``bwd`` or ``W``)."""
    if phase == "W":
        return weight_steps(moe, mtp)
    p = phase
    z = [Step("zero3", f"{p}.zero3_gather", p)] if zero3 else []
    attn = Step("attn", f"{p}.attn", p, cp=cp)
    mlp = (Step("moe", f"{p}.moe", p, block=moe_block(p, side=side, etp=etp)) if moe
           else dense_block(p)[0])
    tp_attn, tp_mlp = Step("tp", f"{p}.tp_attn", p, arg="attn"), Step("tp", f"{p}.tp_mlp", p,
                                                                      arg="mlp")
    head = [Step("mtp", f"{p}.mtp", p)] if mtp else []
    if p == "fwd":
        return (*z, attn, tp_attn, mlp, tp_mlp, *head)
    return (*z, Step("recompute", "bwd.recompute", p), *head, tp_mlp, mlp, tp_attn, attn)


def zero3_gathers(zero: int, lay) -> bool:
    """Whether ZeRO stage ``zero`` on layout ``lay`` gathers each layer's weights: stage 3
    with a group to gather over (the dense weights shard over DP x CP, Megatron-Core's
    data-parallel group with context parallelism)."""
    return zero == 3 and lay.dp * lay.cp > 1


class LayerPlan:
    """The templates of one scenario's layers: ``spec`` the model (which layers are MoE,
    which are MTP depths), and the resolved facts that fold into the order: ``zero3``
    (weight gathers before each layer), ``cp`` (the KV ring beside attention), ``side``
    (shared experts beside the all-to-alls), ``etp`` (expert tensor parallelism).
    Templates are made once per (layer kind, phase)."""

    def __init__(self, spec, *, zero3: bool = False, cp: bool = False, side: bool = False,
                 etp: bool = False) -> None:
        self.spec = spec
        self.facts = dict(zero3=zero3, cp=cp, side=side, etp=etp)
        self._cache: dict[tuple, tuple[Step, ...]] = {}
        self._kind: dict[int, tuple[bool, bool]] = {}

    @classmethod
    def of(cls, res, spec=None) -> LayerPlan:
        """The templates of a resolved scenario: the one reading of its facts that both
        engines use (ZeRO-3 gathers over DP x CP, CP's ring, the shared experts beside
        the all-to-alls, ETP)."""
        scn, lay = res.scenario, res.layout
        spec = res.model if spec is None else spec
        return cls(spec, zero3=zero3_gathers(scn.parallel.zero, lay),
                   cp=lay.cp > 1, side=shared_overlap.enabled(scn, spec), etp=lay.etp > 1)

    def kind(self, layer: int) -> tuple[bool, bool]:
        """(MoE, MTP depth) of ``layer``."""
        k = self._kind.get(layer)
        if k is None:
            k = self._kind[layer] = (bool(self.spec.is_moe_layer(layer)),
                                     layer >= self.spec.layers)
        return k

    def steps(self, layer: int, phase: str) -> tuple[Step, ...]:
        """Layer ``layer``'s steps in ``phase`` (``fwd``, ``bwd``, ``W``)."""
        key = (*self.kind(layer), phase)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = layer_steps(*key, **self.facts)
        return hit

    def moe(self, phase: str) -> tuple[Step, ...]:
        """The MoE block's steps in ``phase``."""
        key = ("moe", phase)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = moe_block(phase, side=self.facts["side"],
                                               etp=self.facts["etp"])
        return hit


@dataclass(frozen=True)
class LayerKernels:
    """The (timer key, kernel maker) of a layer's compute steps, from the recipe: the
    model ``spec``, ``tokens`` a rank computes per micro-batch, ``seq`` keys, ``tp``,
    ``ep_tokens`` routed per rank, ``sent`` token copies dispatched, CUDA-graph modules
    ``graphs``, ``side`` (shared experts beside the all-to-alls), ``rc`` the recompute
    rule (:class:`moesim.program.recompute.RecomputeRule`), ``etp``, and ``sp``: the
    norms and residual adds on the rank's ⌈tokens/tp⌉ sequence shard (sequence
    parallelism; False: on all ``tokens``, as every TP rank runs them without it)."""

    spec: Any
    tokens: int
    seq: int
    tp: int
    ep_tokens: int
    sent: int
    graphs: tuple = ()
    side: bool = False
    rc: Any = None
    etp: int = 1
    sp: bool = True

    def op(self, st: Step, layer: int) -> tuple | None:
        """(key, make) of compute step ``st`` in layer ``layer``; None when it runs no
        kernels there (a layer that recomputes nothing)."""
        spec, tok, tp, ph, g = self.spec, self.tokens, self.tp, st.phase, self.graphs
        k = st.kind
        if st.part == "W":
            W = recipe.backward_part
            if k == "mtp":
                return ("mtp", "bwd", "W"), lambda: W(recipe.mtp_head(spec, tok, tp, "bwd",
                                                                       self.sp), "W")
            if k == "mlp_w":
                return ("w_moe", "bwd"), lambda: recipe.mlp_w(spec, self.ep_tokens, tok, tp)
            if k == "ffn":
                return ("ffn", "bwd", "W"), lambda: W(recipe.dense_ffn(spec, tok, tp, "bwd"),
                                                      "W")
            if k == "attn":
                return ("attn", "bwd", "W"), lambda: recipe.attn_w(spec, tok, self.seq, tp,
                                                                    self.sp)
            raise ValueError(f"no kernels for weight-gradient step {k!r}")
        if k == "attn":
            return recipe.attn_op(spec, layer, tok, self.seq, tp, ph, g, self.sp)
        if k == "ffn":
            return ("ffn", ph), lambda: recipe.dense_ffn(spec, tok, tp, ph, g)
        if k == "mtp":
            return ("mtp", ph), lambda: recipe.mtp_head(spec, tok, tp, ph, self.sp)
        if k == "router":
            return ("router", ph), lambda: recipe.router(spec, self.ep_tokens, self.sent, ph, g)
        if k == "post":
            return recipe.post_op(spec, self.sent, tok, tp, ph, self.side)
        if k == "shared":
            part = st.arg
            return ("shared", ph, part), lambda: recipe.shared_part(spec, tok, tp, ph, part)
        if k == "recompute":
            mods = self.rc.mods(layer) if self.rc is not None else None
            if not mods:
                return None
            return recipe.recompute_op(spec, layer, mods, tokens=tok, seq=self.seq, tp=tp,
                                       ep_tokens=self.ep_tokens, sent=self.sent, sp=self.sp)
        raise ValueError(f"step {k!r} is not one compute op")

    def attn(self, layer: int, phase: str) -> tuple:
        """(key, make) of layer ``layer``'s norms and attention."""
        return self.op(Step("attn", f"{phase}.attn", phase), layer)

    def ffn(self, phase: str) -> tuple:
        """(key, make) of a dense layer's FFN."""
        return self.op(Step("ffn", f"{phase}.ffn", phase), -1)

    def shared(self, phase: str, part: int) -> tuple:
        """(key, make) and op name of the shared experts' part ``part`` beside an
        all-to-all."""
        st = Step("shared", NAMES[phase][part], phase, arg=part)
        return st, self.op(st, -1)

    def expert(self, n: int, phase: str, fused: bool = False, part: str = "") -> tuple:
        """(key, make) of one routed expert with ``n`` tokens (``fused``: sharing the
        rank's first expert's launches; ``part`` ``"W"``: its weight gradients, at ETP 1
        as DualPipe builds them)."""
        spec = self.spec
        tail = ("fused",) if fused else ()
        if part == "W":
            return (("expert", n, "bwd", "W") + tail,
                    lambda: recipe.backward_part(recipe.expert(spec, n, 1, "bwd", fused), "W"))
        return (("expert", n, phase, self.etp) + tail,
                lambda: recipe.expert(spec, n, self.etp, phase, fused))
