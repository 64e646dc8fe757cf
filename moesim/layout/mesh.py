"""The parallel layout: which global rank holds which coordinate, Megatron-Core's way.

Megatron-Core (NVIDIA/Megatron-LM ``megatron/core/parallel_state.py``,
``initialize_model_parallel`` with ``order="tp-cp-ep-dp-pp"``) builds two
``RankGenerator`` s over the same ranks, one per kind of layer (MoE parallel folding,
``megatron/core/transformer/moe/README.md``):

- attention and dense layers: sizes ``tp, cp, ep=1, dp, pp`` with
  ``world = tp * cp * dp * pp``;
- MoE layers: sizes ``tp=etp, cp=1, ep, dp=edp, pp`` with
  ``edp = world / (etp * ep * pp)``, so ``etp * ep * edp = tp * cp * dp`` and an EP
  group may span TP and CP ranks.

Both use the same order string, innermost first; a group of kind ``k`` is every rank
that differs only along ``k`` (``generate_masked_orthogonal_rank_groups``), groups
enumerated with the innermost remaining dimension fastest. Megatron asserts both
generators give the same pipeline groups. Here ``order`` names the four dimensions
``tp, ep, dp, pp`` (optionally also ``cp``; without it cp sits right after tp, as in
Megatron's default ``tp-cp-ep-dp-pp``). With ``tp = 1``, ``cp = 1``, ``etp = 1`` this is
the old carve-EP-out-of-DP layout: ``rank = tp_r + tp*(ep_r + ep*(edp_r + edp*pp_r))``,
dense dp index ``ep_r + ep*edp_r`` (DeepSeek-V3: 2048 GPUs, PP16 -> DP128, EP64 -> EDP2).

Pure: numpy only; building every group of a 2048-rank layout takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from moesim.errors import InputError

DEFAULT_ORDER: tuple[str, ...] = ("tp", "ep", "dp", "pp")  # Megatron-Core, innermost first
_DIMS = frozenset(DEFAULT_ORDER)
#: group kinds -> (generator, dimensions that vary inside the group), Megatron-Core names:
#: dense tp, cp, dp, dp-cp ("DATA_PARALLEL_GROUP_WITH_CP"), pp; expert ep, tp (ETP), dp (EDP)
GROUP_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)), "cp": ("dense", ("cp",)), "dp": ("dense", ("dp",)),
    "dp_cp": ("dense", ("dp", "cp")), "pp": ("dense", ("pp",)),
    "ep": ("expert", ("ep",)), "etp": ("expert", ("tp",)), "edp": ("expert", ("dp",)),
}

Group = tuple[int, ...]


def full_order(order: tuple[str, ...]) -> tuple[str, ...]:
    """The five-name order: ``cp`` right after ``tp`` unless the order places it."""
    if "cp" in order:
        return tuple(order)
    i = order.index("tp") + 1
    return (*order[:i], "cp", *order[i:])


def masked_groups(world: int, order: tuple[str, ...], sizes: dict[str, int],
                  dims: tuple[str, ...]) -> np.ndarray:
    """Megatron-Core's ``generate_masked_orthogonal_rank_groups``: one row per group of
    the ranks differing only along ``dims``; rows enumerate the other dimensions with the
    innermost fastest, members vary ``dims`` with the innermost fastest."""
    outer_first = list(reversed(order))
    grid = np.arange(world, dtype=np.int64).reshape([sizes[d] for d in outer_first])
    keep = [i for i, d in enumerate(outer_first) if d not in dims]
    vary = [i for i, d in enumerate(outer_first) if d in dims]
    size = int(np.prod([sizes[outer_first[i]] for i in vary]))
    return grid.transpose(keep + vary).reshape(-1, size)


@dataclass(frozen=True)
class Coord:
    """Coordinates of one rank. ``dp`` is the dense data-parallel index, ``edp`` the
    expert-data-parallel index, ``cp`` the context-parallel index, ``etp`` the expert
    tensor-parallel index."""

    rank: int
    tp: int
    ep: int
    edp: int
    dp: int
    pp: int
    cp: int = 0
    etp: int = 0


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout over ``world`` ranks.

    ``source`` and ``field_prefix`` only shape error messages (the file and the
    YAML section the numbers came from).
    """

    world: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER
    source: str = "<layout>"
    field_prefix: str = "parallel"
    cp: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        f = self.field_prefix
        for name in ("world", "tp", "pp", "dp", "ep", "cp", "etp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise InputError(self.source, f"{f}.{name}", "a positive integer", v)
        names = sorted(self.order)
        if names != sorted(_DIMS) and names != sorted(_DIMS | {"cp"}):
            raise InputError(self.source, f"{f}.order",
                             f"a permutation of {list(DEFAULT_ORDER)} or of "
                             "[tp, cp, ep, dp, pp] (innermost first)", list(self.order))
        if self.tp * self.cp * self.pp * self.dp != self.world:
            raise InputError(self.source, f"{f}.dp",
                             f"tp*cp*pp*dp = world size {self.world} "
                             f"(tp={self.tp}, cp={self.cp}, pp={self.pp})", self.dp)
        stage = self.tp * self.cp * self.dp
        if stage % (self.etp * self.ep):
            field, got = (f"{f}.etp", self.etp) if self.etp > 1 else (f"{f}.ep", self.ep)
            raise InputError(self.source, field,
                             f"etp*ep (etp={self.etp}, ep={self.ep}) to divide tp*cp*dp = "
                             f"{stage}, the ranks of a pipeline stage (Megatron-Core parallel "
                             "folding: etp*ep*edp = tp*cp*dp)", got)
        if not np.array_equal(self._groups("dense", ("pp",)), self._groups("expert", ("pp",))):
            raise InputError(self.source, f"{f}.order",
                             "an order whose attention and expert pipeline groups agree "
                             "(Megatron-Core asserts it; put pp last)", list(self.order))

    # ---- sizes ------------------------------------------------------------
    @property
    def edp(self) -> int:
        """Expert-data-parallel size: replicas of each expert shard."""
        return self.world // (self.etp * self.ep * self.pp)

    @property
    def megatron_order(self) -> str:
        """The order as Megatron-Core's ``--order``-style string, e.g. tp-cp-ep-dp-pp."""
        return "-".join(full_order(self.order))

    def _sizes(self, gen: str) -> dict[str, int]:
        if gen == "dense":
            return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        return {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}

    def _groups(self, gen: str, dims: tuple[str, ...]) -> np.ndarray:
        return masked_groups(self.world, full_order(self.order), self._sizes(gen), dims)

    # ---- coordinates ------------------------------------------------------
    @cached_property
    def coords(self) -> dict[str, np.ndarray]:
        """Per-rank coordinate arrays (length ``world``): tp, cp, dp, pp of the attention
        generator; etp, ep, edp of the expert generator."""
        ranks = np.arange(self.world, dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for gen, rename in (("dense", {}), ("expert", {"tp": "etp", "dp": "edp"})):
            sizes, stride = self._sizes(gen), 1
            for d in full_order(self.order):
                name = rename.get(d, d)
                if (gen == "dense" and d != "ep") or (gen == "expert" and d not in ("cp", "pp")):
                    out[name] = (ranks // stride) % sizes[d]
                stride *= sizes[d]
        return out

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world:
            raise IndexError(f"rank {rank} outside world of {self.world}")
        c = {k: int(v[rank]) for k, v in self.coords.items()}
        return Coord(rank, c["tp"], c["ep"], c["edp"], c["dp"], c["pp"], c["cp"], c["etp"])

    @property
    def stage_of_rank(self) -> np.ndarray:
        """Pipeline stage of every rank (array of length ``world``)."""
        return self.coords["pp"]

    # ---- groups -----------------------------------------------------------
    @cached_property
    def _all_groups(self) -> dict[str, tuple[Group, ...]]:
        return {kind: tuple(tuple(int(x) for x in row) for row in self._groups(gen, dims))
                for kind, (gen, dims) in GROUP_KINDS.items()}

    @property
    def tp_groups(self) -> tuple[Group, ...]:
        return self._all_groups["tp"]

    @property
    def cp_groups(self) -> tuple[Group, ...]:
        """Context-parallel groups: ranks holding chunks of one sequence (ring attention)."""
        return self._all_groups["cp"]

    @property
    def ep_groups(self) -> tuple[Group, ...]:
        """Expert-parallel groups: ranks that exchange tokens in the all-to-all."""
        return self._all_groups["ep"]

    @property
    def etp_groups(self) -> tuple[Group, ...]:
        """Expert tensor-parallel groups: ranks sharing the same experts' matrices."""
        return self._all_groups["etp"]

    @property
    def dp_groups(self) -> tuple[Group, ...]:
        """Dense data-parallel groups (size dp)."""
        return self._all_groups["dp"]

    @property
    def dp_cp_groups(self) -> tuple[Group, ...]:
        """Data-parallel groups with CP (size dp*cp): gradient reduction of dense params."""
        return self._all_groups["dp_cp"]

    @property
    def edp_groups(self) -> tuple[Group, ...]:
        """Expert-data-parallel groups (size edp): gradient reduction of expert params."""
        return self._all_groups["edp"]

    @property
    def pp_groups(self) -> tuple[Group, ...]:
        """Pipeline groups, each ordered by stage 0..pp-1."""
        return self._all_groups["pp"]

    def _groups_of(self, kind: str) -> tuple[Group, ...]:
        if kind not in GROUP_KINDS:
            raise KeyError(f"group kind {kind!r}; one of {sorted(GROUP_KINDS)}")
        return self._all_groups[kind]

    @cached_property
    def _group_index(self) -> dict[str, np.ndarray]:
        out = {}
        for kind in GROUP_KINDS:
            g = np.asarray(self._groups_of(kind))
            idx = np.empty(self.world, dtype=np.int64)
            idx[g] = np.arange(len(g))[:, None]
            out[kind] = idx
        return out

    def group_of(self, rank: int, kind: str) -> Group:
        """The group of ``kind`` (tp, cp, dp, dp_cp, pp, ep, etp, edp) holding ``rank``."""
        if not 0 <= rank < self.world:
            raise IndexError(f"rank {rank} outside world of {self.world}")
        return self._groups_of(kind)[int(self._group_index[kind][rank])]

    def pipeline_neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """(previous-stage rank, next-stage rank) of ``rank``; None at the ends."""
        g = self.group_of(rank, "pp")
        s = g.index(rank)
        return (g[s - 1] if s > 0 else None, g[s + 1] if s + 1 < len(g) else None)

    # ---- checks -----------------------------------------------------------
    def check_experts(self, n_experts: int, redundant: int = 0) -> None:
        """Raise InputError unless the routed experts split evenly over ep, or (a serving
        step whose ``routing.placement`` is EPLB with ``redundant`` > 0 copies) the
        experts plus their redundant copies do: EPLB's slots, ``(E + redundant) / ep`` on
        every GPU (SGLang's EP72 decode: 256 + 32 = 288 slots, 4 per GPU)."""
        if n_experts % self.ep == 0:
            return
        if redundant > 0 and (n_experts + redundant) % self.ep == 0:
            return
        here = f" ({n_experts} + {redundant} = {n_experts + redundant} here)" if redundant else ""
        raise InputError(self.source, f"{self.field_prefix}.ep",
                         f"a divisor of the model's {n_experts} routed experts, or (serving "
                         f"with routing.placement EPLB) of {n_experts} + its redundant "
                         f"experts{here}", self.ep)

    def warnings(self, gpus_per_node: int | None) -> list[str]:
        """Human-readable warnings, e.g. a TP group crossing a node boundary
        (rank r is assumed to sit on GPU r, node r // gpus_per_node)."""
        out: list[str] = []
        if not gpus_per_node:
            return out
        for kind, size, what in (("tp", self.tp, "tensor-parallel"),
                                 ("etp", self.etp, "expert tensor-parallel")):
            if size == 1:
                continue
            groups = self._groups_of(kind)
            nodes = np.asarray(groups) // gpus_per_node
            crossing = int(np.sum(nodes.min(axis=1) != nodes.max(axis=1)))
            if crossing:
                out.append(f"{crossing} of {len(groups)} {what} groups ({kind}="
                           f"{size}) span more than one node of {gpus_per_node} GPUs; "
                           f"{kind.upper()} traffic will cross the inter-node network")
        return out

    def describe(self) -> dict:
        """JSON-able summary of sizes (cp and etp only when they are not 1)."""
        out = {"world": self.world, "tp": self.tp, "pp": self.pp, "dp": self.dp,
               "ep": self.ep, "edp": self.edp, "order": list(self.order)}
        if self.cp > 1 or self.etp > 1:
            out.update(cp=self.cp, etp=self.etp)
        return out
