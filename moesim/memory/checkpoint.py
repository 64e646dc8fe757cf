"""Bytes per stored weight element of a quantised or 2:4-sparse checkpoint.

``compute.weights`` stores every weight at its format's bits plus scales
(:data:`moesim.compute.quant.FORMATS`: INT4 with FP16 group-128 scales 0.5156 bytes,
NVFP4 0.5625, FP8 1, ...); ``compute.sparsity: 2:4`` keeps half the values plus 2 bits
of metadata per kept value (:func:`moesim.compute.sparsity.sparse_weight_bytes`). The
memory models (training's :class:`moesim.memory.report.StageMemory`, serving's
``moesim.serve.memory``) read the model's ``weight_bytes`` from :func:`checkpoint_spec`.
Every parameter is counted at the format (embedding, LM head, router and norms, which
checkpoints often keep in BF16, included): a slight overstatement of the saving (under
0.3 % of DeepSeek-V3's parameters are its embedding and head).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.compute.quant import FORMATS
from moesim.compute.sparsity import sparse_weight_bytes


def weight_element_bytes(spec: Any, compute: Any) -> float:
    """Bytes per weight element under the ``compute`` section's weights and sparsity."""
    w = getattr(compute, "weights", None)
    b = float(FORMATS[w].weight_bytes()) if w is not None else float(spec.weight_bytes)
    if getattr(compute, "sparsity", "none") != "none":
        b = sparse_weight_bytes(b)
    return b


def checkpoint_spec(spec: Any, compute: Any) -> Any:
    """``spec`` with ``weight_bytes`` at the checkpoint's bytes per element; ``spec``
    itself when the section sets neither weights nor sparsity."""
    if spec is None or (getattr(compute, "weights", None) is None
                        and getattr(compute, "sparsity", "none") == "none"):
        return spec
    return dataclasses.replace(spec, weight_bytes=weight_element_bytes(spec, compute))
