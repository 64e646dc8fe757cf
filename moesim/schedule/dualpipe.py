"""DualPipe and DualPipeV orders: per rank, the phases the reference issues (pure).

Sources: deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` and ``dualpipe/dualpipev.py``
(``step``: eight loops with counts from the rank's position), its README (bubble and
memory table) and the DeepSeek-V3 technical report §3.2.1.

DualPipe: ``P`` ranks (even), rank ``r`` holds pipeline stages ``r`` and ``P-1-r``
(two model chunks, hence 2x parameters); ``N`` micro-batches (even, ``N >= 2P``), the
first ``N/2`` enter at rank 0 and run stages 0..P-1 on ranks 0..P-1, the other
``N/2`` enter at rank ``P-1`` and run stages 0..P-1 on ranks P-1..0. The reference
calls the chunk with stage ``h = min(r, P-1-r)`` "phase 0" on every rank and the chunk
with stage ``P-1-h`` "phase 1". DualPipeV: ``D`` ranks hold ``2D`` stages in a V (rank
``r``: stages ``r`` and ``2D-1-r``), all ``N >= 2D`` micro-batches enter at rank 0 and
come back to it; the loops are DualPipe's with ``h`` replaced by ``r`` and ``N/2`` by
``N``.

Items (:class:`Item`) are what one rank computes, in order:

- ``F``: forward of one micro-batch on one stage;
- ``BW``: full backward (input and weight gradients together);
- ``B``: input-gradient backward only (zero bubble: its weight gradient is deferred);
- ``W``: a deferred weight gradient, taken first-in first-out (``WeightGradStore``);
- ``F&B``: one micro-batch's forward overlapped with another's full backward
  (``overlapped_forward_backward``); ``mb, stage`` name the forward, ``bmb, bstage``
  the backward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

KINDS = ("dualpipe", "dualpipev")


@dataclass(frozen=True, slots=True)
class Item:
    kind: str        # F | B | BW | W | F&B
    mb: int          # micro-batch (F&B: the forward's)
    stage: int       # pipeline stage 0..S-1 (F&B: the forward's)
    bmb: int = -1    # F&B only: the backward's micro-batch
    bstage: int = -1  # F&B only: the backward's stage

    def parts(self) -> tuple[tuple[str, int, int], ...]:
        """(F | B | W, mb, stage) pieces of work done: BW is B and W, F&B is F, B, W."""
        if self.kind == "F&B":
            return (("F", self.mb, self.stage), ("B", self.bmb, self.bstage),
                    ("W", self.bmb, self.bstage))
        if self.kind == "BW":
            return (("B", self.mb, self.stage), ("W", self.mb, self.stage))
        return ((self.kind, self.mb, self.stage),)

    def __str__(self) -> str:
        if self.kind == "F&B":
            return f"F{self.mb}.{self.stage}&B{self.bmb}.{self.bstage}"
        return f"{self.kind}{self.mb}.{self.stage}"


@dataclass(frozen=True)
class DualOrder:
    """A DualPipe(V) order: ``items[rank]`` in issue order; ``stages`` pipeline stages;
    ``rank_of[d][s]`` the rank running stage ``s`` of direction ``d`` (DualPipe: 0 enters
    at rank 0, 1 at rank P-1; DualPipeV: one direction); ``direction[mb]``."""

    kind: str
    ranks: int
    stages: int
    microbatches: int
    items: tuple[tuple[Item, ...], ...]
    rank_of: tuple[tuple[int, ...], ...]
    direction: tuple[int, ...]

    def rank(self, mb: int, stage: int) -> int:
        return self.rank_of[self.direction[mb]][stage]


def check(kind: str, ranks: int, microbatches: int) -> tuple[str, str] | None:
    """Why ``(ranks, microbatches)`` cannot run ``kind``, as (``ranks`` or
    ``microbatches``, what is expected), or None. The reference's assertions in
    ``DualPipe.step`` / ``DualPipeV.step``."""
    if kind not in KINDS:
        return "kind", f"one of {list(KINDS)}"
    for name, x in (("ranks", ranks), ("microbatches", microbatches)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            return name, "an integer >= 1"
    if kind == "dualpipe" and ranks % 2:
        return "ranks", "an even number for dualpipe (rank r holds stages r and P-1-r)"
    if kind == "dualpipe" and (microbatches % 2 or microbatches < 2 * ranks):
        return "microbatches", f"an even number >= 2 x ranks = {2 * ranks} for dualpipe"
    if microbatches < 2 * ranks:
        return "microbatches", f"a number >= 2 x ranks = {2 * ranks} for dualpipev"
    return None


def _require(kind: str, ranks: int, microbatches: int) -> None:
    why = check(kind, ranks, microbatches)
    if why:
        got = {"kind": kind, "ranks": ranks, "microbatches": microbatches}[why[0]]
        raise ValueError(f"{why[0]}: expected {why[1]}, got {got!r}")


def _steps(K: int, j: int, M: int, v: bool = False) -> list[tuple]:
    """The eight loops of ``step`` for one rank, transcribed call by call in local
    phases: K = half the ranks (DualPipe) or the ranks (DualPipeV), j = h or r,
    M = micro-batches per direction, ``v`` DualPipeV. Compute: (F, ph), (B, ph) zero
    bubble, (BW, ph) full, (W,), (F&B, ph0, ph1). Communication, as the reference
    queues it: (rF | sF | rB | sB, ph) receive/send forward/backward, (wait,) the
    ``_commit_and_wait_comm`` that issues the queue and waits for it."""
    out: list[tuple] = []
    edge = j == K - 1   # DualPipe: a middle rank; DualPipeV: the last rank

    def fwd(ph: int, recv: bool = True, send: bool = True) -> None:
        out.extend(([("rF", ph)] if recv else []) + [("wait",), ("F", ph)]
                   + ([("sF", ph)] if send else []))

    def bwd(ph: int, zb: bool = False, send: bool = True) -> None:
        out.extend([("rB", ph), ("wait",), ("B" if zb else "BW", ph)]
                   + ([("sB", ph)] if send else []))

    def fb(p0: int, p1: int, recv0: bool = True) -> None:
        out.extend(([("rF", p0)] if recv0 else []) + [("rB", p1), ("wait",),
                                                      ("F&B", p0, p1), ("sF", p0), ("sB", p1)])

    for _ in range((K - j - 1) * 2):                                   # step 1: nF0
        fwd(0)
    out.append(("rF", 0))                                               # step 2: nF0F1
    for i in range(j + 1):
        fwd(0, recv=False, send=edge and not v)
        out.append(("rF", 0))
        fwd(1, send=not edge or i < j)
        if v or not edge:
            out.append(("sF", 0))
    for _ in range(K - j - 1):                                          # step 3: nB1W1F1
        bwd(1, zb=True)
        out += [("rF", 1), ("wait",), ("W",)]
        fwd(1, recv=False)
    for i in range(M - 2 * K + j + 1):                                  # step 4: nF0B1F1B0
        if i == 0 and edge:   # not overlapped, "to further reduce bubble size"
            fwd(0, recv=False, send=False)
            out.append(("sF", 1))
            bwd(1, send=False)
            out += [("sF", 0), ("sB", 1)]
        else:
            fb(0, 1, recv0=i > 0)
        fb(1, 0)
    for _ in range(K - j - 1):                                          # step 5: nB1F1B0
        bwd(1)
        fb(1, 0)
    zb = False                                                          # step 6: nB1B0
    for i in range(j + 1):
        if i == (j + 1) // 2 and j % 2 == 1:
            zb = True
        bwd(1, zb=zb)
        if i == (j + 1) // 2 and j % 2 == 0:
            zb = True
        bwd(0, zb=zb)
    for _ in range(K - j - 1):                                          # step 7: nWB0
        out += [("wait",), ("W",)]
        bwd(0, zb=True)
    out += [("wait",), ("W",)] * (j + 1)                                # step 8: nW
    out.append(("wait",))
    return out


def _rank_items(steps: list[tuple], stage_of: tuple[int, int],
                mb_of: tuple[list[int], list[int]]) -> tuple[Item, ...]:
    """Turn local-phase steps into items: per phase a forward and a backward counter
    (the reference's ``current_f_chunk_id`` / ``current_b_chunk_id``) and a FIFO of
    deferred weight gradients."""
    f = [0, 0]
    b = [0, 0]
    wq: deque[tuple[int, int]] = deque()
    out: list[Item] = []

    def fwd(ph: int) -> tuple[int, int]:
        mb = mb_of[ph][f[ph]]
        f[ph] += 1
        return mb, stage_of[ph]

    def bwd(ph: int) -> tuple[int, int]:
        mb = mb_of[ph][b[ph]]
        b[ph] += 1
        return mb, stage_of[ph]

    for st in steps:
        k = st[0]
        if k in ("rF", "sF", "rB", "sB", "wait"):
            continue
        if k == "F":
            out.append(Item("F", *fwd(st[1])))
        elif k in ("B", "BW"):
            mb, s = bwd(st[1])
            out.append(Item(k, mb, s))
            if k == "B":
                wq.append((mb, s))
        elif k == "W":
            out.append(Item("W", *wq.popleft()))
        else:
            fm, fs = fwd(st[1])
            bm, bs = bwd(st[2])
            out.append(Item("F&B", fm, fs, bm, bs))
    if wq:
        raise RuntimeError("deferred weight gradients left over")  # the reference asserts it
    return tuple(out)


def dualpipe_order(ranks: int, microbatches: int) -> DualOrder:
    """DualPipe on ``ranks`` ranks (= stages), ``microbatches`` in all."""
    _require("dualpipe", ranks, microbatches)
    P, N = ranks, microbatches
    half = N // 2
    dir_mbs = (list(range(half)), list(range(half, N)))
    items = []
    for r in range(P):
        h = min(r, P - 1 - r)
        second = int(r >= P // 2)
        # local phase 0 is direction `second` (stage h), phase 1 the other (stage P-1-h)
        mb_of = (dir_mbs[second], dir_mbs[1 - second])
        items.append(_rank_items(_steps(P // 2, h, half), (h, P - 1 - h), mb_of))
    rank_of = (tuple(range(P)), tuple(range(P - 1, -1, -1)))
    return DualOrder("dualpipe", P, P, N, tuple(items), rank_of,
                     tuple([0] * half + [1] * half))


def dualpipev_order(ranks: int, microbatches: int) -> DualOrder:
    """DualPipeV on ``ranks`` devices (``2 ranks`` stages), ``microbatches`` in all."""
    _require("dualpipev", ranks, microbatches)
    D, N = ranks, microbatches
    mbs = list(range(N))
    items = [_rank_items(_steps(D, r, N, v=True), (r, 2 * D - 1 - r), (mbs, mbs))
             for r in range(D)]
    rank_of = (tuple(list(range(D)) + list(range(D - 1, -1, -1))),)
    return DualOrder("dualpipev", D, 2 * D, N, tuple(items), rank_of, tuple([0] * N))


def make_dual_order(kind: str, ranks: int, microbatches: int) -> DualOrder:
    if kind == "dualpipe":
        return dualpipe_order(ranks, microbatches)
    if kind == "dualpipev":
        return dualpipev_order(ranks, microbatches)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


# ---------------------------------------------------------------- communication

@dataclass(frozen=True, slots=True)
class Transfer:
    """One pipeline message an item sends after it computes: ``what`` is ``act``
    (forward output, to the next stage) or ``grad`` (input gradient, to the previous
    stage); ``stage`` is the receiving stage; ``src == dst`` never occurs (DualPipeV's
    turn at the last rank stays on the device and is not listed)."""

    what: str
    mb: int
    stage: int
    src: int
    dst: int


def sends(order: DualOrder, rank: int, item: Item) -> list[Transfer]:
    """Messages ``item`` on ``rank`` sends (the reference's ``_send_forward`` /
    ``_send_backward`` after the compute; the last stage's forward and stage 0's
    backward send nothing)."""
    out = []
    for kind, mb, s in item.parts():
        if kind == "F" and s < order.stages - 1:
            dst, what, to = order.rank(mb, s + 1), "act", s + 1
        elif kind == "B" and s > 0:
            dst, what, to = order.rank(mb, s - 1), "grad", s - 1
        else:
            continue
        if dst != rank:
            out.append(Transfer(what, mb, to, rank, dst))
    return out


def recvs(order: DualOrder, rank: int, item: Item) -> list[Transfer]:
    """Messages ``item`` needs before it computes (mirror of :func:`sends`)."""
    out = []
    for kind, mb, s in item.parts():
        if kind == "F" and s > 0:
            src, what = order.rank(mb, s - 1), "act"
        elif kind == "B" and s < order.stages - 1:
            src, what = order.rank(mb, s + 1), "grad"
        else:
            continue
        if src != rank:
            out.append(Transfer(what, mb, s, src, rank))
    return out


# ---------------------------------------------------------------- memory

def inflight_activations(order: DualOrder) -> list[int]:
    """Per rank, the most (micro-batch, stage) activation sets alive at once, both
    chunks together: alive from the forward until the weight gradient (``W``, or the
    full backward ``BW``, or the backward half of ``F&B``), since the deferred weight
    gradient still reads the layer inputs. Within an ``F&B`` item the forward's set is
    counted before the backward's is freed (both are resident while they overlap)."""
    out = []
    for items in order.items:
        alive = peak = 0
        for it in items:
            for kind, _, _ in it.parts():
                if kind == "F":
                    alive += 1
                    peak = max(peak, alive)
                elif kind == "W":
                    alive -= 1
        out.append(peak)
    return out


def peak_alive(order: DualOrder, rank: int) -> tuple[int, dict[int, int]]:
    """(activation sets alive at ``rank``'s peak, {stage: sets of that stage then}),
    counted as in :func:`inflight_activations`; for the memory report, which charges
    each stage's sets with that stage's layers."""
    alive: dict[int, int] = {}
    total, best, at_best = 0, -1, {}
    for it in order.items[rank]:
        for kind, _, s in it.parts():
            if kind == "F":
                alive[s] = alive.get(s, 0) + 1
                total += 1
                if total > best:
                    best, at_best = total, dict(alive)
            elif kind == "W":
                alive[s] -= 1
                total -= 1
    return best, at_best


def reference_steps(order: DualOrder, rank: int) -> tuple[list[tuple], tuple[int, int]]:
    """(the rank's transcribed ``step`` calls, see :func:`_steps`; (stage of local
    phase 0, stage of local phase 1)), for :mod:`moesim.schedule.dualpipe_comm`."""
    if order.kind == "dualpipe":
        P = order.ranks
        h = min(rank, P - 1 - rank)
        return _steps(P // 2, h, order.microbatches // 2), (h, P - 1 - h)
    D = order.ranks
    return _steps(D, rank, order.microbatches, v=True), (rank, 2 * D - 1 - rank)
