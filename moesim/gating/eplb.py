"""Expert-parallel load balancing (EPLB): redundant experts and their placement on GPUs
from measured per-expert loads (pure numpy, no simpy).

Written from the description and reference code of DeepSeek's EPLB
(github.com/deepseek-ai/EPLB, README.md and eplb.py at commit
d52c72d5b2f2fb4c41afbf8eb21366820239913d): the same three steps and choices, in this
module's own code.

* **balanced packing** (:func:`balanced_packing`): n weighted items into m packs of
  exactly n/m items each; items in decreasing weight, each into the lightest pack that
  still has room (ties: the lowest pack index);
* **replication** (:func:`replicate_experts`): from E logical experts to P >= E
  physical slots, one redundant slot at a time, each given to the expert whose load per
  replica (load / replicas) is the highest (ties: the lowest expert id);
* **hierarchical** mode (:func:`rebalance`, ``mode="hierarchical"``; EPLB's choice when
  the node count divides the expert groups): pack the expert groups onto nodes
  (balanced packing of the groups' loads), replicate the experts within each node to the
  node's P/nodes slots, pack each node's replicas onto its GPUs (balanced packing of the
  replicas' loads, load / replicas each);
* **global** mode: the same with one group and one node (replicate over all experts,
  pack the replicas onto all GPUs).

A replica takes an equal share of its expert's tokens (load / replicas). The plan's
figure of merit is the per-GPU load (the sum of its replicas' shares): max / mean per
layer (:attr:`EplbPlan.max_over_mean`; 1 = balanced). Loads are tokens (token, expert
assignments) per layer, any non-negative numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("hierarchical", "global", "auto")


@dataclass(frozen=True)
class EplbPlan:
    """An EPLB plan for L layers, E logical experts, P physical slots on G GPUs.

    phy2log      (L, P) logical expert of each physical slot; GPU g holds slots
                 g*P/G .. (g+1)*P/G - 1
    replica      (L, P) which replica of its expert a slot is (0 .. logcnt - 1)
    logcnt       (L, E) replicas of each logical expert (>= 1)
    gpu_load     (L, G) tokens each GPU computes: the sum over its slots of load / logcnt
    mode         "hierarchical" or "global" (the policy that ran)
    """

    phy2log: np.ndarray
    replica: np.ndarray
    logcnt: np.ndarray
    gpu_load: np.ndarray
    mode: str

    @property
    def gpus(self) -> int:
        return int(self.gpu_load.shape[1])

    @property
    def slots_per_gpu(self) -> int:
        return int(self.phy2log.shape[1]) // self.gpus

    @property
    def max_over_mean(self) -> np.ndarray:
        """(L,) max GPU load / mean GPU load per layer (1 = balanced; 0 for an idle layer)."""
        mean = self.gpu_load.mean(axis=1)
        return np.divide(self.gpu_load.max(axis=1), mean, out=np.zeros_like(mean),
                         where=mean > 0)

    def holders(self, layer: int) -> tuple[tuple[int, ...], ...]:
        """GPUs holding each logical expert in ``layer`` (one entry per replica, in slot
        order: an expert with two replicas on one GPU lists it twice)."""
        s = self.slots_per_gpu
        out: list[list[int]] = [[] for _ in range(self.logcnt.shape[1])]
        for slot, e in enumerate(self.phy2log[layer].tolist()):
            out[e].append(slot // s)
        return tuple(tuple(h) for h in out)


def balanced_packing(weight: np.ndarray, packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Items (L, n) into ``packs`` packs of n/packs items per row: returns (pack of each
    item, its position in the pack), both (L, n) int64. Heaviest item first, each into
    the lightest pack with room (lowest index on ties)."""
    w = np.asarray(weight, dtype=float)
    rows, n = w.shape
    per = n // packs
    if per * packs != n:
        raise ValueError(f"{n} items do not split into {packs} packs evenly")
    if per == 1:
        idx = np.broadcast_to(np.arange(n, dtype=np.int64), (rows, n)).copy()
        return idx, np.zeros((rows, n), dtype=np.int64)
    pack = np.full((rows, n), -1, dtype=np.int64)
    pos = np.full((rows, n), -1, dtype=np.int64)
    for i in range(rows):
        load = np.zeros(packs)
        count = np.zeros(packs, dtype=np.int64)
        for item in np.argsort(-w[i], kind="stable"):
            p = int(np.argmin(np.where(count < per, load, np.inf)))
            pack[i, item] = p
            pos[i, item] = count[p]
            load[p] += w[i, item]
            count[p] += 1
    return pack, pos


def replicate_experts(weight: np.ndarray, slots: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logical experts (L, E) onto ``slots`` >= E physical slots: slot e < E is expert e;
    each further slot goes to the expert with the highest load per replica. Returns
    (phy2log (L, slots), replica index of each slot, logcnt (L, E))."""
    w = np.asarray(weight, dtype=float)
    rows, n = w.shape
    if slots < n:
        raise ValueError(f"{slots} slots cannot hold {n} experts")
    phy2log = np.zeros((rows, slots), dtype=np.int64)
    phy2log[:, :n] = np.arange(n)
    replica = np.zeros((rows, slots), dtype=np.int64)
    logcnt = np.ones((rows, n), dtype=np.int64)
    r = np.arange(rows)
    for s in range(n, slots):
        best = np.argmax(w / logcnt, axis=1)
        phy2log[:, s] = best
        replica[:, s] = logcnt[r, best]
        logcnt[r, best] += 1
    return phy2log, replica, logcnt


def _hierarchical(w: np.ndarray, slots: int, groups: int, nodes: int, gpus: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer (E,) → (phy2log (slots,), replica (slots,), logcnt (E,))."""
    e_ = w.shape[0]
    size = e_ // groups                     # experts per group
    per_node_groups = groups // nodes
    per_node_slots = slots // nodes
    per_gpu = slots // gpus
    gpus_per_node = gpus // nodes
    # step 1: groups onto nodes, balancing the groups' summed loads
    gpack, gpos = balanced_packing(w.reshape(groups, size).sum(axis=1)[None, :], nodes)
    # the experts of each node, in (position of their group in the node, id) order
    node_experts = np.zeros((nodes, per_node_groups * size), dtype=np.int64)
    for g in range(groups):
        n, p = int(gpack[0, g]), int(gpos[0, g])
        node_experts[n, p * size:(p + 1) * size] = np.arange(g * size, (g + 1) * size)
    phy2log = np.zeros(slots, dtype=np.int64)
    replica = np.zeros(slots, dtype=np.int64)
    logcnt = np.zeros(e_, dtype=np.int64)
    for n in range(nodes):
        local = w[node_experts[n]][None, :]
        # step 2: replicate within the node, onto its slots
        p2l, rep, cnt = replicate_experts(local, per_node_slots)
        # step 3: the node's replicas onto its GPUs, balancing load / replicas
        share = (local[0] / cnt[0])[p2l[0]]
        ppack, ppos = balanced_packing(share[None, :], gpus_per_node)
        where = n * per_node_slots + ppack[0] * per_gpu + ppos[0]
        phy2log[where] = node_experts[n][p2l[0]]
        replica[where] = rep[0]
        logcnt[node_experts[n]] = cnt[0]
    return phy2log, replica, logcnt


def choose_mode(mode: str, groups: int, nodes: int) -> str:
    """``auto``: hierarchical when the node count divides the expert groups, else global
    (EPLB's rebalance_experts)."""
    if mode == "auto":
        return "hierarchical" if groups % nodes == 0 else "global"
    return mode


def rebalance(loads: np.ndarray, *, slots: int, gpus: int, nodes: int = 1,
              groups: int = 1, mode: str = "auto") -> EplbPlan:
    """The EPLB plan of ``loads`` (L, E) on ``slots`` physical slots (a multiple of
    ``gpus``), ``gpus`` GPUs on ``nodes`` nodes (equally many each), the experts in
    ``groups`` equal groups. ``mode``: hierarchical (needs nodes | groups and groups | E),
    global, or auto (EPLB's choice). Shapes and divisibility are the caller's to check
    (:func:`moesim.gating.eplb_placement.check_plan_inputs` says which field is wrong)."""
    w = np.asarray(loads, dtype=float)
    if w.ndim != 2 or slots % gpus or gpus % nodes or slots < w.shape[1]:
        raise ValueError("loads (L, E), slots a multiple of gpus >= E, nodes dividing gpus")
    mode = choose_mode(mode, groups, nodes)
    g, n = (groups, nodes) if mode == "hierarchical" else (1, 1)
    if w.shape[1] % g or g % n or (slots // n) % (gpus // n):
        raise ValueError(f"hierarchical EPLB needs nodes | groups | experts, got {n}, {g}, "
                         f"{w.shape[1]}")
    rows = [_hierarchical(w[i], slots, g, n, gpus) for i in range(w.shape[0])]
    phy2log = np.stack([r[0] for r in rows])
    replica = np.stack([r[1] for r in rows])
    logcnt = np.stack([r[2] for r in rows])
    share = np.take_along_axis(w / logcnt, phy2log, axis=1)
    gpu_load = share.reshape(w.shape[0], gpus, slots // gpus).sum(axis=2)
    return EplbPlan(phy2log=phy2log, replica=replica, logcnt=logcnt, gpu_load=gpu_load,
                    mode=mode)
