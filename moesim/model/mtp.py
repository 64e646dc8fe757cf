"""Multi-token prediction (DeepSeek-V3 report arXiv:2412.19437 §2.2; Megatron-Core
megatron/core/transformer/multi_token_prediction.py, NVIDIA/Megatron-LM d98e8a6): what one
MTP depth adds beyond its transformer layer (pure; docs/model.md, "Multi-token prediction").

Each depth k takes the previous depth's hidden states and the embeddings of the tokens
shifted by k: RMSNorm of each (``hnorm``, ``enorm``), their concatenation projected from 2h
to h (``eh_proj``, a column-parallel linear), one transformer layer (MoE when the model's
last layer is: theoretical_memory_usage.py ``mtp_layer_is_moe``), then the shared output
head and a cross-entropy loss of its own. The embedding lookup runs on the MTP stage, which
holds the embedding (gpt_model.py builds it ``if self.pre_process or self.mtp_process``).
The transformer layer is priced and routed like any other layer (index layers + k); this
module adds the rest.
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model import costs
from moesim.model.spec import ModelSpec


def extra_params(spec: ModelSpec) -> int:
    """Parameters of one depth beyond its transformer layer: eh_proj (2h x h), enorm and
    hnorm (h each) and the depth's final norm (h)."""
    h = spec.hidden
    return 2 * h * h + 3 * h


def head_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                 phase: str = "fwd", sp: bool = True) -> list[Kernel]:
    """One depth's kernels beyond its transformer layer: the shifted tokens' embedding,
    enorm and hnorm, the eh_proj GEMM (tokens x 2h -> h/tp), the final norm, output head
    and loss (as the main model's, ``costs.lm_head_kernels``). With sequence parallelism
    (``sp``) enorm, hnorm and the final norm run on the rank's ⌈tokens/tp⌉ shard
    (``MultiTokenPredictionLayer._concat_embeddings`` takes both inputs on the
    sequence-parallel shard); without it on all ``tokens``."""
    if tokens <= 0:
        return []
    th = (-(-tokens // tp) if sp else tokens) * spec.hidden
    norms = costs.memory_op("mtp_norm", 2 * 4 * th, 2 * 4 * th, phase, count=2)
    proj = costs.gemm("mtp_eh_proj", tokens, spec.hidden // tp, 2 * spec.hidden, phase)
    projs = [proj] if phase == "fwd" else list(proj)   # backward: [dgrad, wgrad]
    return [*costs.embedding_kernels(spec, tokens, tp, phase), norms, *projs,
            *costs.lm_head_kernels(spec, tokens, tp, phase, sp)]
