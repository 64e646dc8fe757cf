"""The eager torch ops of NeMo RL v0.3's colocated refit and the garbage collection of its
offloads, counted from the code and priced per call (``rl.weight_sync.calls:
nemo-v03-ops``: everything ``nemo-v03`` prices, plus this; with ``per_gpu: true``).

What NVIDIA-NeMo/RL v0.3.0 (b1c86a816) runs, on every policy worker, besides the
collective calls (:mod:`moesim.rl.refit_calls`) and the Ray calls through the driver
(:mod:`moesim.rl.refit_host`):

1. **The gather** (``nemo_rl/models/megatron/refit_utils.py`` ``gather_params``, lines
   98-157), for every Megatron key of the bucket, all stages, in order: on the key's own
   stage a TP-sharded key (``get_tp_dim`` not None: every ``.weight``/``.bias`` of a
   column- or row-parallel layer, experts' grouped linears included) allocates one
   ``torch.empty_like`` per rank of its TP (experts: expert-TP) group, all-gathers into
   them and ``torch.cat``s them (113-115); on the other stages the key is a fresh
   ``torch.empty`` (119-121) the PP broadcast fills. An expert key is then stacked
   (``torch.stack``, 132), gets one ``torch.empty`` per EP rank (134-141), is all-gathered
   and each of the ``ep`` gathered tensors ``torch.unbind``-ed (145-147). An all-gather over a group of one rank (TP1, EP1)
   is still called: :mod:`moesim.rl.refit_calls` counts collectives over groups of two or
   more, so such a call is one op here.
2. **The Megatron-to-HF conversion** (``megatron_policy_worker.py``
   ``get_weights_ipc_handles`` 1437-1439; ``nemo_rl/models/megatron/converters/common.py``
   ``convert`` 469-, the transforms 128-221): of every gathered tensor, on every rank.
   A GQA layer's ``linear_qkv`` (``split_qkv_gpu``): a reshape, one CPU ``torch.arange``
   per query group, their ``torch.cat`` and two more aranges, then three gathers by index
   (q, k, v), each reshaped. A ``linear_fc1`` (dense, shared or each expert's;
   ``split_fc1_tp`` / ``split_fc1_etp``): ``einops.rearrange`` (a reshape, a permute and
   a reshape that copies when the (E)TP size is above one) and two indexings. The
   embedding and an untied output layer: one slice each (``prune_padding``). DeepSeek's
   MLA has no attention transform (converters/deepseek.py). Names only otherwise.
3. **The pack** (``get_weights_ipc_handles`` 1457-1497): one ``torch.empty`` per dtype
   per bucket, then per HF tensor a slice of the packed buffer, ``detach()``, ``view(-1)``
   and ``copy_``.
4. **The unpack** on each vLLM executor (``nemo_rl/models/generation/vllm_backend.py``
   161-175): per HF tensor a slice of the rebuilt buffer and a ``view(*shape)``.
5. **The offloads' collection** (``megatron_policy_worker.py``): ``gc.collect()`` and
   ``torch.cuda.empty_cache()`` once in ``offload_before_refit`` (1574-1575), and twice
   in ``offload_after_refit``, which reruns ``offload_before_refit`` (1592) and then calls
   both again (1598-1599): :data:`OFFLOAD_GC_CALLS` per refit on every worker, the driver
   waiting for all (``ray.get``, lm_policy.py).

Prices (docs/sources.md):

- an op that launches work :data:`~moesim.program.host_dispatch.EAGER_OP_S` (16.1 us) and
  a view or metadata op :data:`~moesim.program.host_dispatch.VIEW_OP_S` (3.3 us), PyTorch's
  operator benchmark (pytorch/pytorch PRs 38421 and 32194); the CPU aranges and their cat
  (tiny CPU tensors, no GPU work) are priced as view ops, a gather by a CPU index as one
  op (its index copy to the GPU not counted): lower bounds;
- ``gc.collect()`` :data:`GC_COLLECT_S` and ``torch.cuda.empty_cache()`` :data:`EMPTY_CACHE_S`:
  ultralytics/ultralytics PR 25610, review comment of 2026-08-01 (RTX PRO 6000, torch
  2.11): a full collection takes 66 ms with 179k live objects ("torch + CUDA only") and
  grows with them (135 ms at 342k, 372 ms at 851k); ``empty_cache()`` 4 ms mean over a
  training run's calls. A Megatron worker also holds Megatron-Core, Transformer Engine,
  transformers, NeMo and Ray objects, so 66 ms is a lower bound.

The copy of the pack is already in :func:`moesim.rl.refit_calls.pack_s` with one launch
per tensor; priced here as an op, its launch is taken out there (:func:`moesim.rl.sync.refit_phases`).

Not priced (no published per-item cost): the Python of the loops (``sorted(keys)``,
``get_tp_dim``'s regex, the converter's ``_match_keys`` and ``StateDictTransform`` over
the bucket's keys), ``model.state_dict()`` and ``named_modules()`` per bucket, the
memory the caching allocator takes fresh after each ``empty_cache``, ``reduce_tensor``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S
from moesim.rl.refit_calls import megatron_keys

#: seconds of one full ``gc.collect()`` in a process holding torch and CUDA (179k live
#: objects): ultralytics/ultralytics PR 25610, review comment of 2026-08-01
GC_COLLECT_S = 66e-3
#: seconds of one ``torch.cuda.empty_cache()``: 4 ms mean, the same comment
EMPTY_CACHE_S = 4e-3
#: gc.collect() + empty_cache() pairs per refit on each policy worker (module docstring)
OFFLOAD_GC_CALLS = 3


@dataclass(frozen=True)
class HostOps:
    """Ops (launching work) and views per refit on one worker's serial path, by step."""

    gather_ops: float
    gather_views: float
    convert_ops: int
    convert_views: int
    pack_ops: int
    pack_views: int
    unpack_views: int
    gc_calls: int

    @property
    def gather_s(self) -> float:
        """``gather_params`` and the conversion (the refit's gather step)."""
        return ((self.gather_ops + self.convert_ops) * EAGER_OP_S
                + (self.gather_views + self.convert_views) * VIEW_OP_S)

    @property
    def transfer_s(self) -> float:
        """The pack on the worker and the unpack on the executor (in series per bucket)."""
        return self.pack_ops * EAGER_OP_S + (self.pack_views + self.unpack_views) * VIEW_OP_S

    @property
    def offload_s(self) -> float:
        return self.gc_calls * (GC_COLLECT_S + EMPTY_CACHE_S)

    def as_dict(self) -> dict:
        return {**asdict(self), "gather_s": self.gather_s, "transfer_s": self.transfer_s,
                "offload_s": self.offload_s}


def gather_ops(spec: ModelSpec, *, tp: int, pp: int, ep: int, etp: int = 1
               ) -> tuple[float, float]:
    """(ops, views) ``gather_params`` issues on a mean rank per refit (module docstring,
    1.): a key of another stage one ``torch.empty``; a TP-sharded key of its own stage
    ``w`` ``empty_like``, a ``cat`` and, for ``w = 1``, the one-rank all-gather; an expert
    key a ``stack``, ``ep`` ``empty``, for ``ep = 1`` the one-rank all-gather, and ``ep``
    ``unbind`` (views). Its own stage holds ``1/pp`` of the keys."""
    k = megatron_keys(spec, ep)
    own = 1 / pp

    def sharded(w: int) -> int:
        return w + 1 + (1 if w == 1 else 0)

    ops = k.total * (1 - own)
    ops += k.tp_sharded * own * sharded(tp) + k.expert * own * sharded(etp)
    ops += k.expert * (1 + ep + (1 if ep == 1 else 0))
    return ops, float(k.expert * ep)


def convert_ops(spec: ModelSpec, *, tp: int, etp: int = 1) -> tuple[int, int]:
    """(ops, views) of the Megatron-to-HF conversion of the whole model on one rank
    (module docstring, 2.)."""
    def fc1(w: int) -> tuple[int, int]:
        # rearrange: reshape, permute, reshape (a copy when w > 1); two indexings
        return (1, 4) if w > 1 else (0, 5)

    ops = views = 0
    for i in range(spec.layers):
        if spec.attention != "mla":
            # reshape; kv_heads + 2 aranges and a cat (CPU); 3 gathers, 3 reshapes
            ops += 3
            views += 1 + spec.kv_heads + 3 + 3
        if spec.is_moe_layer(i):
            o, v = fc1(etp)
            ops, views = ops + spec.n_experts * o, views + spec.n_experts * v
            if spec.n_shared_experts:
                o, v = fc1(tp)
                ops, views = ops + o, views + v
        else:
            o, v = fc1(tp)
            ops, views = ops + o, views + v
    views += 1 + (0 if spec.tied_embeddings else 1)      # prune_padding
    return ops, views


def host_ops(spec: ModelSpec, *, tp: int, pp: int, ep: int, etp: int, hf_tensors: int,
             buckets: int, dtypes: int = 1) -> HostOps:
    """The refit's host ops on one worker and one executor (module docstring): gather,
    conversion, pack (``dtypes`` packed buffers per bucket, one ``copy_`` and three views
    per HF tensor), unpack (two views per HF tensor) and the offloads' collections."""
    g_ops, g_views = gather_ops(spec, tp=tp, pp=pp, ep=ep, etp=etp)
    c_ops, c_views = convert_ops(spec, tp=tp, etp=etp)
    return HostOps(g_ops, g_views, c_ops, c_views,
                   pack_ops=buckets * dtypes + hf_tensors, pack_views=3 * hf_tensors,
                   unpack_views=2 * hf_tensors, gc_calls=OFFLOAD_GC_CALLS)
