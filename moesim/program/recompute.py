"""What activation recomputation re-runs inside the backward (pure; docs/model.md,
"Recompute costs time").

Megatron-Core (NVIDIA/Megatron-LM d98e8a6) checkpoints a module by saving its inputs and
running its forward again just before its backward (megatron/core/tensor_parallel/
random.py ``CheckpointFunction``; output-discarding modules through
``CheckpointWithoutOutput``). So each recomputed module adds its forward kernels to the
layer's backward:

* selective (``recompute_modules``, transformer_config.py): ``core_attn`` the core
  attention kernel; ``layernorm`` the two RMSNorms; ``mla_up_proj`` MLA's query and
  key-value up-projection GEMMs and the RoPE application after them; ``mlp`` a dense
  layer's FFN; ``shared_experts`` the shared experts' FFN; ``moe_act`` the routed
  experts' activation function; ``moe`` the router, permutation, routed experts,
  unpermutation and shared experts;
* full (transformer_block.py ``_checkpointed_forward``): the whole layer's forward
  (norms, attention, then the FFN or the MoE block as ``moe``), for every layer
  (uniform) or the first ``recompute_num_layers`` layers of each stage chunk (block).

Communication a recomputed forward repeats (TP all-gather/reduce-scatter, the MoE
dispatch and combine under ``moe`` or full) is not added: only compute. The kernels
re-run: :func:`moesim.program.recipe.recompute_layer`.
"""

from __future__ import annotations

from collections.abc import Callable

from moesim.compute.base import Kernel
from moesim.memory.activations import modules_of
from moesim.model.spec import ModelSpec


def recomputes(recompute: str, modules, method: str, num_layers: int, position: int) -> \
        frozenset[str]:
    """The modules re-run for the layer at ``position`` in its stage chunk: selective's
    modules, or for full recompute every module ("full") when the layer is recomputed."""
    if recompute == "selective":
        return modules_of(recompute, modules)
    if recompute == "full" and (method == "uniform" or position < max(1, num_layers)):
        return frozenset({"full"})
    return frozenset()


def expert_recompute(spec: ModelSpec, layer: int, mods: frozenset[str],
                     expert_tokens: list[int],
                     price: Callable[[int, Callable[[], list[Kernel]], bool],
                                     tuple[float, float]],
                     forward: Callable[[int], list[Kernel]]) -> tuple[float, float]:
    """(seconds, FLOPs) of the routed experts' forward re-run in the backward: the whole
    expert FFN for ``moe`` or full recompute, only its activation for ``moe_act``.
    ``forward(n)``: one expert's forward kernels for n tokens; ``price(n, make, later)``:
    time and FLOPs of ``make()`` (the step's kernel timer), ``later`` for every expert
    with tokens after the rank's first (grouped launches share the first's)."""
    if not spec.is_moe_layer(layer) or not mods:
        return 0.0, 0.0
    whole = "full" in mods or "moe" in mods
    if not whole and "moe_act" not in mods:
        return 0.0, 0.0
    t_all = f_all = 0.0
    later = False
    for n in expert_tokens:
        if n <= 0:
            continue
        t, f = price(n, (lambda n=n: forward(n)) if whole else
                     (lambda n=n: act_kernels(forward(n))), later)
        later = True
        t_all += t
        f_all += f
    return t_all, f_all


class RecomputeRule:
    """Which modules each layer re-runs in its backward, for a scenario's ``memory:``
    section and its stage chunks (positions within a chunk decide ``block``)."""

    def __init__(self, mem, chunks, spec: ModelSpec) -> None:
        self.spec = spec
        self._of: dict[int, frozenset[str]] = {}
        if mem.recompute == "none":
            return
        for chunk in chunks:
            for pos, layer in enumerate(chunk):
                mods = recomputes(mem.recompute, mem.recompute_modules, mem.recompute_method,
                                  mem.recompute_num_layers, pos)
                if mods:
                    self._of[layer] = mods

    def mods(self, layer: int) -> frozenset[str]:
        return self._of.get(layer, frozenset())

    def expert_phase(self, layer: int) -> str | None:
        """How the routed experts are re-run: "fwd" (the whole forward: ``moe``, full),
        "act" (only the activation: ``moe_act``) or None."""
        mods = self.mods(layer)
        if not self.spec.is_moe_layer(layer) or not mods:
            return None
        if "full" in mods or "moe" in mods:
            return "fwd"
        return "act" if "moe_act" in mods else None

    @property
    def any_act(self) -> bool:
        return any("moe_act" in m and "moe" not in m for m in self._of.values())


def act_kernels(kernels: list[Kernel]) -> list[Kernel]:
    """The activation-function kernels of an expert's forward (``moe_act``)."""
    return [k for k in kernels if k.name.endswith("_act")]
