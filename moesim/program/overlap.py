"""EP all-to-all overlap in a rank's op program (pure: no simpy).

With ``overlap.ep_comm_overlap`` the builder moves each item's EP all-to-alls to
their own ``ep`` stream and interleaves two schedule items (different micro-batches)
segment by segment, a segment ending at each all-to-all, so the compute of one
micro-batch runs while the other's tokens are on the wire (DeepSeek-V3's overlap of
computation and all-to-all, report §3.2.1). :class:`PairRule` says which pairs of
items may be interleaved without a pipeline deadlock.
"""

from __future__ import annotations

from dataclasses import replace

from moesim.program.ops import Op
from moesim.program.shared_overlap import is_side


def is_ep(op: Op) -> bool:
    return op.coll is not None and op.kind in ("ep_dispatch", "ep_combine")


def ep_stream(prog: list[Op], start: int) -> None:
    """Move the EP all-to-alls of ``prog[start:]`` to their own stream, with the
    data dependencies the compute stream's order used to give them."""
    for i in range(start, len(prog)):
        if is_ep(prog[i]):
            prog[i] = replace(prog[i], stream="ep", deps=prog[i].deps + (i - 1,))
            j = i + 1   # the next op that needs the exchange (shared parts run beside it)
            while j < len(prog) - 1 and is_side(prog[j].name):
                j += 1
            if j < len(prog):
                prog[j] = replace(prog[j], deps=prog[j].deps + (i,))


def interleave(prog: list[Op], a: int, b: int, last_bwd: dict[int, int]) -> None:
    """Interleave two schedule items (``prog[a:b]`` and ``prog[b:]``) segment by
    segment; remaps deps and ``last_bwd`` (layer -> index of its last backward op)."""
    def segments(lo: int, hi: int) -> list[list[int]]:
        out, cur = [], []
        for i in range(lo, hi):
            cur.append(i)
            if is_ep(prog[i]):
                out.append(cur)
                cur = []
        return out + ([cur] if cur else [])

    sa, sb = segments(a, b), segments(b, len(prog))
    order: list[int] = []
    for k in range(max(len(sa), len(sb))):
        order += sa[k] if k < len(sa) else []
        order += sb[k] if k < len(sb) else []
    where = {old: a + pos for pos, old in enumerate(order)}
    prog[a:] = [replace(prog[old], deps=tuple(where.get(d, d) for d in prog[old].deps))
                for old in order]
    for layer, idx in last_bwd.items():
        if idx >= a:
            last_bwd[layer] = where[idx]


class PairRule:
    """Which schedule items may be interleaved, from the whole pipeline order
    (``order[stage]``: list of ``PipeOp(kind, mb, chunk)``, ``p`` stages, ``v`` chunks)."""

    def __init__(self, order, p: int, v: int) -> None:
        self.order = order
        self.p = p
        self.v = v
        self._pos: dict[int, dict[tuple[str, int, int], int]] = {}

    def position(self, stage: int) -> dict[tuple[str, int, int], int]:
        hit = self._pos.get(stage)
        if hit is None:
            hit = self._pos[stage] = {(it.kind, it.mb, it.chunk): i
                                      for i, it in enumerate(self.order[stage])}
        return hit

    def can_pair(self, stage: int, x, y) -> bool:
        """Whether items ``x`` then ``y`` of ``stage`` may be interleaved.

        Interleaving puts ``y``'s pipeline receive before ``x``'s pipeline send. When
        both go to the same neighbour rank and that rank receives ``x``'s message
        before it sends ``y``'s (e.g. GPipe's F(k), B(j) on adjacent stages), each
        stage would wait for the other: such pairs stay sequential. A forward after a
        backward is never paired (its receive would precede the gradient the upstream
        stage needs before it sends that activation; found by the deadlock sweep,
        tests/test_engine_overlap.py)."""
        if x.mb == y.mb or (x.kind, y.kind) == ("B", "F"):
            return False
        p, last_v = self.p, self.p * self.v - 1
        vx, vy = x.chunk * p + stage, y.chunk * p + stage
        nx = vx + 1 if x.kind == "F" else vx - 1          # where x sends
        ny = vy - 1 if y.kind == "F" else vy + 1          # where y receives from
        if not (0 <= nx <= last_v and 0 <= ny <= last_v) or nx % p != ny % p:
            return True
        pos = self.position(nx % p)                      # the neighbour rank's order
        got_x = pos.get((x.kind, x.mb, nx // p))         # it receives x's message
        sent_y = pos.get((y.kind, y.mb, ny // p))        # it sends y's message
        if got_x is None or sent_y is None or sent_y < got_x - 1:
            return True
        # sent_y right before got_x: safe only if the neighbour never interleaves those
        # two items there (else its receive would come first); a backward followed by a
        # forward (1F1B's steady state) is never interleaved
        return sent_y == got_x - 1 and (y.kind, x.kind) == ("B", "F")


def insert_op(prog: list[Op], at: int, op: Op) -> None:
    """Insert ``op`` at index ``at``, renumbering the deps of the ops after it."""
    prog.insert(at, op)
    for i in range(at + 1, len(prog)):
        d = prog[i].deps
        if any(x >= at for x in d):
            prog[i] = replace(prog[i], deps=tuple(x + 1 if x >= at else x for x in d))


def move_op(prog: list[Op], src: int, dst: int) -> None:
    """Move the op at ``src`` to just after ``dst`` (``dst < src``), renumbering deps; the
    moved op keeps only deps before its new place."""
    order = list(range(len(prog)))
    order.remove(src)
    order.insert(dst + 1, src)
    where = {old: new for new, old in enumerate(order)}
    new = [replace(prog[old], deps=tuple(where[d] for d in prog[old].deps)) for old in order]
    moved = new[dst + 1]
    new[dst + 1] = replace(moved, deps=tuple(d for d in moved.deps if d <= dst))
    prog[:] = new


def interleave_stages(prog: list[Op], a: int, stages: tuple[list, list],
                      delta: int) -> None:
    """Interleave two schedule items' stages (``stages[i]``: item i's stages in order, each
    ``(op indices, wait)``; the items' ops are ``prog[a:]``): the first item's first
    ``delta`` stages, then one stage of each in turn, the second item ``delta`` stages
    behind. A stage's ``wait`` (an op index, or None) is an all-to-all the compute stream
    waits for once the stage is reached: the next compute op placed after it depends on
    it (DeepSeek's decode pipeline, :mod:`moesim.serve.five_stage`)."""
    sa, sb = stages
    seq = list(sa[:delta])
    for k in range(delta, max(len(sa), len(sb) + delta)):
        seq += sa[k:k + 1] + sb[k - delta:k - delta + 1]
    order: list[int] = []
    extra: dict[int, int] = {}
    pending = None
    for idx, wait in seq:
        for i in idx:
            if pending is not None and prog[i].stream == "compute":
                extra[i] = pending
                pending = None
            order.append(i)
        if wait is not None:
            pending = wait
    where = {old: a + pos for pos, old in enumerate(order)}
    prog[a:] = [replace(prog[old], deps=tuple(where.get(d, d) for d in prog[old].deps)
                        + ((where[extra[old]],) if old in extra else ()))
                for old in order]
