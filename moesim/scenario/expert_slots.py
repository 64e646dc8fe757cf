"""EPLB's expert slots per EP group, read from a scenario before its routing is built:
a serving step whose ``routing.placement`` is EPLB with ``redundant`` > 0 may run an EP
size that divides the routed experts plus their redundant copies (the slots) even where
it does not divide the experts (SGLang's EP72 decode: 256 + 32 = 288 slots, 4 per GPU,
LMSYS blog 2025-05-05; DeepSeek's EP144 decode: 288 slots, 2 per GPU,
deepseek-ai/open-infra-index day 6). Training keeps an EP that divides the experts: its
program, gradients and replica all-reduces count E / ep home experts per rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def serving_redundant(scn: Any) -> int:
    """``routing.placement.redundant`` of a serving scenario (one with a ``serve``
    section) whose placement is EPLB; 0 otherwise (training, no placement, or a value
    the routing's own check refuses later)."""
    if getattr(scn, "serve", None) is None:
        return 0
    pl = (scn.routing.policy or {}).get("placement")
    if not isinstance(pl, Mapping) or pl.get("kind") != "eplb":
        return 0
    r = pl.get("redundant", 0)
    return r if isinstance(r, int) and not isinstance(r, bool) and r > 0 else 0
