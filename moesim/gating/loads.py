"""Per-layer, per-expert token counts a user recorded, read from a file (pure).

The shapes the tools write:

* SGLang's expert-distribution recorder, CSV ``layer_id,expert_id,count`` with a
  header line, one line per (layer, expert) seen (sgl-project/sglang
  python/sglang/srt/managers/expert_distribution.py, ``dump_record``, commit
  001c034f915dfd41fade2553f36245f5169d6f3d); ``layer_id`` is the model's layer index;
* SGLang's current recorder in ``stat`` mode dumps a torch file whose
  ``logical_count`` is (buffered steps, layers, logical experts)
  (python/sglang/srt/eplb/expert_distribution.py, ``_StatAccumulator.dump``, commit
  02295fe5ac5ccff3e8829800d50450351c56fb53): as JSON ``{"logical_count": [...]}``
  (2-D, or 3-D summed over its first axis);
* Megatron-Core's router counts ``local_tokens_per_expert`` ([num_experts]) per MoE
  layer when ``moe_router_enable_expert_bias`` is set (megatron/core/transformer/moe/
  router.py, ``TopKRouter``, commit 005742ff1f002035922b88a648fa615aec22eeff): one row
  per layer, as CSV rows (no header), a JSON list of lists or ``{"counts": ...}``, or NPY;
* a moesim ``summary.json``: its ``experts.tokens_per_expert`` (MoE layers x experts).

:func:`read_loads` returns the table and whether it came from the sparse (long) form,
whose missing (layer, expert) pairs are zeros. Every problem is one
``InputError(file, field, expected, got)``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from moesim.errors import InputError

LONG_HEADER = ("layer_id", "expert_id", "count")


def _json_table(raw) -> np.ndarray:
    if isinstance(raw, dict):
        for key in ("logical_count", "counts"):
            if key in raw:
                raw = raw[key]
                break
        else:
            experts = raw.get("experts")
            raw = experts.get("tokens_per_expert") if isinstance(experts, dict) else None
    arr = np.asarray(raw, dtype=float)
    if arr.ndim == 3:      # SGLang's buffered steps: summed over the window
        arr = arr.sum(axis=0)
    return arr


def _long_table(rows: list[list[str]], where: str, field: str) -> np.ndarray:
    vals = []
    for i, r in enumerate(rows, start=2):
        if len(r) != 3:
            raise InputError(where, field, "3 columns layer_id,expert_id,count", f"line {i}: {r}")
        layer, expert, count = (float(c) for c in r)
        if layer != int(layer) or expert != int(expert) or layer < 0 or expert < 0:
            raise InputError(where, field, "integer layer_id, expert_id >= 0", f"line {i}: {r}")
        vals.append((int(layer), int(expert), count))
    if not vals:
        raise InputError(where, field, "at least one layer_id,expert_id,count line", "none")
    arr = np.zeros((max(v[0] for v in vals) + 1, max(v[1] for v in vals) + 1))
    for layer, expert, count in vals:
        arr[layer, expert] += count
    return arr


def read_loads(path: Path, source: str, field: str = "routing.placement.loads"
               ) -> tuple[np.ndarray, bool]:
    """(counts (layers, experts) float, sparse) from ``path`` (.csv, .json or .npy)."""
    where = str(path)
    sparse = False
    try:
        suffix = path.suffix.lower()
        if suffix == ".json":
            arr = _json_table(json.loads(path.read_text()))
        elif suffix == ".csv":
            with path.open(newline="") as fh:
                rows = [[c.strip() for c in r] for r in csv.reader(fh)
                        if r and any(c.strip() for c in r)]
            if rows and tuple(c.lower() for c in rows[0]) == LONG_HEADER:
                arr, sparse = _long_table(rows[1:], where, field), True
            else:
                arr = np.asarray([[float(c) for c in r] for r in rows], dtype=float)
        elif suffix == ".npy":
            arr = np.load(path, allow_pickle=False).astype(float)
        else:
            raise InputError(source, field, "policy, trace, or a .csv, .json or .npy counts "
                             "file", str(path))
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(source, field, "policy, trace, or an existing counts file",
                         where) from None
    except (OSError, ValueError, TypeError) as err:
        raise InputError(where, field, "a numeric layers x experts table",
                         str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or 0 in arr.shape:
        raise InputError(where, field, "a 2-D layers x experts table", list(arr.shape))
    if not np.all(np.isfinite(arr)):
        raise InputError(where, field, "finite counts", "NaN or infinite")
    if np.any(arr < 0):
        raise InputError(where, field, "counts >= 0", float(arr.min()))
    return arr, sparse


def layer_table(counts: np.ndarray, sparse: bool, *, n_experts: int, blocks: int,
                moe_layers: list[int], where: str,
                field: str = "routing.placement.loads") -> np.ndarray:
    """The (MoE layers, experts) loads from a file's table: one row (every layer), one row
    per MoE layer, or one row per layer of the model (the MoE layers' rows are taken). A
    sparse table's rows are the model's layer indices, its missing entries zeros."""
    arr = np.asarray(counts, dtype=float)
    n_moe = len(moe_layers)
    if sparse:
        if arr.shape[0] > blocks or arr.shape[1] > n_experts:
            raise InputError(where, field, f"layer_id < {blocks} layers and expert_id < "
                             f"{n_experts} experts", f"up to layer {arr.shape[0] - 1}, "
                             f"expert {arr.shape[1] - 1}")
        full = np.zeros((blocks, n_experts))
        full[:arr.shape[0], :arr.shape[1]] = arr
        return full[moe_layers]
    if arr.shape[1] != n_experts or arr.shape[0] not in {1, n_moe, blocks}:
        rows = " or ".join(str(r) for r in dict.fromkeys((1, n_moe, blocks)))
        raise InputError(where, field, f"{rows} rows x {n_experts} experts (the model's "
                         "MoE layers x experts)", f"{arr.shape[0]} x {arr.shape[1]}")
    if arr.shape[0] == 1:
        return np.repeat(arr, n_moe, axis=0)
    if arr.shape[0] == n_moe:
        return arr
    return arr[moe_layers]
