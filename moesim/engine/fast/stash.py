"""Route records of the fast path's chains, kept from a chain's first run for its
rerun (pure: no simpy).

A chain runs a second time only for the spans of the ranks chosen after every rank's
stall is known (:mod:`moesim.engine.fast.spans`). Its route records are deterministic
(same seed, same routing, same plans), so the rerun may take the first run's records
instead of routing and planning every micro-batch again: the same numbers, less work.

Units: bytes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from moesim.engine.fast.pipeline import RouteRec

#: bytes of a record's dicts and object headers beyond its arrays (an estimate that
#: only bounds the stash's memory)
RECORD_OVERHEAD = 2048


class RecordStash:
    """Records kept without their byte matrices (those only count link bytes, which a
    rerun does not count), up to ``max_bytes`` in all. Records that keep (n, n)
    matrices for their timing (direct all-to-alls) are not kept: a rerun builds those
    again."""

    def __init__(self, max_bytes: float = 5e8) -> None:
        self.recs: dict[tuple, RouteRec] = {}
        self.left = float(max_bytes)

    def put(self, key: tuple, rec: RouteRec) -> None:
        if any(np.ndim(v) != 1 for v in rec.a2a.values()):
            return
        slim = replace(rec, mats=None)
        size = RECORD_OVERHEAD + sum(
            v.nbytes for d in (slim.a2a, slim.exp_t) for v in d.values()) + sum(
            v.nbytes for v in (slim.hot, slim.hot_tok, slim.recv, slim.d_out, slim.c_out))
        if size <= self.left:
            self.left -= size
            self.recs[key] = slim

    def take(self, key: tuple) -> RouteRec | None:
        """The record kept under ``key`` (removed), or None."""
        return self.recs.pop(key, None)
