"""The scenario: frozen dataclasses, one per YAML section, with defaults and units.

YAML keys are the field names below. Sizes at the edge are in MB (10^6 bytes,
``dp_bucket_MB``); properties give SI values. ``model`` and ``compute`` are the lower
packages' typed sections (:class:`moesim.model.read.ModelSection`,
:class:`moesim.compute.select.ComputeSection`), ``serve``, ``rl`` and ``load`` this
package's (:mod:`moesim.scenario.sections`), each checked when the scenario is read;
``routing`` (apart from the dtypes) and ``cluster.params`` are passed as plain dicts to
the loaders that own them (``moesim.gating``, ``moesim.topology``), which validate them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from moesim.compute.pinned_sms import GEMM_SMS
from moesim.compute.select import ComputeSection
from moesim.layout.mesh import DEFAULT_ORDER
from moesim.model.read import ModelSection
from moesim.scenario.sections import written
from moesim.scenario.sections.distill import DistillSection
from moesim.scenario.sections.load import LoadSection
from moesim.scenario.sections.rl import RLConfig
from moesim.scenario.sections.serve import ServeConfig
from moesim.schedule.dualpipe import KINDS as DUALPIPE_KINDS
from moesim.schedule.dualpipe_comm import PP_COMMS as DUALPIPE_PP_COMMS
from moesim.schedule.pipeline import KINDS as PIPELINE_KINDS
from moesim.units import MB

NETWORK_MODELS = ("flow", "analytical")
DTYPES = ("bf16", "fp8", "fp16", "fp32")
#: schedule.kind: the pipeline schedules moesim.schedule builds (its own lists)
SCHEDULE_KINDS = PIPELINE_KINDS + DUALPIPE_KINDS
#: schedule.pp_comm: how DualPipe(V)'s pipeline messages are issued
PP_COMMS = DUALPIPE_PP_COMMS
#: none | static (moesim's pairing of adjacent schedule items, moesim.program.overlap;
#: also spelled ep_comm_overlap: true) | a2a-1f1b (Megatron-Core's 1F1B with EP
#: all-to-all overlap, moesim.schedule.a2a_overlap)
OVERLAP_KINDS = ("none", "static", "a2a-1f1b")
#: overlap.gemm_sms: all | left_by_ep (moesim.compute.pinned_sms; DualPipe(V) steps)
OVERLAP_GEMM_SMS = GEMM_SMS
RECOMPUTE = ("none", "selective", "full")
#: memory.attention: fused (FlashAttention/TE: no score matrix) | materialized
ATTENTION_KERNELS = ("fused", "materialized")
#: memory.recompute_modules: Megatron-Core's recompute_modules names (moesim.memory.activations)
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe",
                     "shared_experts")
#: overlap.cuda_graphs: Megatron-Core's cuda_graph_modules (moesim.program.cuda_graphs)
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe_router", "moe_preprocess")
#: ``overlap.cuda_graphs`` entry set by a serving decode step with ``serve.cuda_graphs``
#: (:func:`moesim.serve.config.serving_scenario`), not a scenario's own: every kernel of
#: the step is replayed from one CUDA graph, so none pays a host launch (the compute
#: model's launch overhead is the device's graph floor, ``DeviceSpec.graph_kernel_s``; a
#: calibration's measured op gaps are kept)
WHOLE_STEP_GRAPH = "step"


def _frozen(d: dict | None) -> MappingProxyType:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class ClusterConfig:
    topology: str = "dgx-h100"        # preset name in topologies/ or a path to a YAML file
    nodes: int | None = None          # nodes, passed to the topology (None: its default)
    device: str | None = None         # device catalog name (None: the topology's device)
    network: str = "flow"             # flow (max-min sharing) | analytical (no contention)
    params: Any = field(default_factory=dict)  # other topology parameters

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))

    def topology_params(self) -> dict:
        out = dict(self.params)
        if self.nodes is not None:
            out["nodes"] = self.nodes
        return out

    def pool(self, gpus: int, gpus_per_node: int) -> ClusterConfig:
        """The same topology with ``gpus`` GPUs: whole nodes of ``gpus_per_node``, or
        part of one node (a pool of RL's trainer or rollout, a distillation teacher)."""
        if gpus < gpus_per_node:
            return dataclasses.replace(self, nodes=1,
                                       params={**self.params, "gpus_per_node": gpus})
        return dataclasses.replace(self, nodes=-(-gpus // gpus_per_node))


EP_BACKENDS = ("nccl", "deepep", "deepep-ll", "hybridep")
#: SMs a DeepEP normal kernel uses unless told: ``Buffer.num_sms = 20`` (deepseek-ai/DeepEP,
#: deep_ep/buffer.py), the 20 of 132 H800 SMs of DeepSeek-V3's training (report §3.2.2)
DEEPEP_DEFAULT_SMS = 20
#: SMs HybridEP uses unless told: Megatron-Core's ``moe_hybridep_num_sms: int = 16``
#: (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py)
HYBRIDEP_DEFAULT_SMS = 16


@dataclass(frozen=True)
class EPBackendConfig:
    """How expert-parallel dispatch and combine run (docs/deepep.md).

    ``nccl``: pairwise all-to-all-v, one copy per (token, expert), holding
    ``overlap.nccl_sms`` SMs; ``deepep``: DeepEP's normal kernels (one RDMA copy per
    (token, node), NVLink forwarding, ``sms`` SMs held, default 20); ``deepep-ll``: the
    low-latency kernels (one RDMA message per (token, expert), no SMs held in flight);
    ``hybridep``: HybridEP's kernels, DeepEP's copies at HybridEP's published H100 rates
    (:mod:`moesim.ep.hybridep`), ``sms`` SMs held, default 16."""

    kind: str = "nccl"
    sms: int | None = None            # SMs the kernels hold (None: the kind's default)

    def held_sms(self, nccl_sms: int) -> int:
        if self.kind == "deepep":
            return DEEPEP_DEFAULT_SMS if self.sms is None else int(self.sms)
        if self.kind == "deepep-ll":
            return 0
        if self.kind == "hybridep":
            return HYBRIDEP_DEFAULT_SMS if self.sms is None else int(self.sms)
        return int(nccl_sms) if self.sms is None else int(self.sms)


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1                       # tensor parallel size
    pp: int = 1                       # pipeline stages
    dp: int | None = None             # data parallel size (None: world / (tp*cp*pp))
    ep: int = 1                       # expert parallel size, folded over tp*cp*dp
    zero: int = 0                     # ZeRO stage 0..3 over the data-parallel group
    vpp: int = 1                      # virtual pipeline chunks per rank (interleaved)
    order: tuple[str, ...] = DEFAULT_ORDER  # Megatron-Core rank order, innermost first
    ep_backend: EPBackendConfig = field(default_factory=EPBackendConfig)
    # Megatron-Core parallel folding (megatron/core/parallel_state.py): context parallel
    # size, expert tensor parallel size (edp = world / (etp*ep*pp)), and sequence
    # parallelism (TP all-reduce -> reduce-scatter + all-gather). Omitted from to_dict()
    # while at their defaults (PARALLEL_OMIT_DEFAULTS).
    cp: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    # Megatron-Core's pipeline_model_parallel_layout (e.g. "Et*3|(tt|)*29m|L") and
    # decoder_first/last_pipeline_num_layers (moesim.schedule.layout_string); None: the
    # even split
    pipeline_layout: str | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None


#: ParallelConfig fields that Scenario.to_dict() leaves out while at their defaults, so a
#: scenario not using them echoes byte for byte as before they existed
PARALLEL_OMIT_DEFAULTS = {"cp": 1, "etp": 1, "sequence_parallel": False,
                          "pipeline_layout": None, "decoder_first_pipeline_num_layers": None,
                          "decoder_last_pipeline_num_layers": None}


@dataclass(frozen=True)
class ScheduleConfig:
    kind: str = "1f1b"                # gpipe | 1f1b | interleaved | dualpipe | dualpipev
    microbatches: int = 1             # micro-batches per step per data-parallel replica
    micro_batch_size: int = 1         # sequences per micro-batch
    seq_len: int = 2048               # tokens per sequence
    step: int = 0                     # index of the training step simulated (routing drift)
    dp_bucket_MB: float = 25.0        # gradient bucket; 25 MB is torch DDP's bucket_cap_mb default
    zero3_prefetch: int = 1           # ZeRO-3: layers gathered ahead of the one computing (>= 1)
    # DualPipe(V)'s pipeline messages (PP_COMMS): eager (each send leaves when its chunk
    # ends) | reference (queued, issued and waited for at the rank's next commit, as
    # deepseek-ai/DualPipe's _commit_and_wait_comm: moesim.schedule.dualpipe_comm)
    pp_comm: str = "eager"

    @property
    def dp_bucket_bytes(self) -> float:
        return self.dp_bucket_MB * MB

    @property
    def tokens_per_microbatch(self) -> int:
        return self.micro_batch_size * self.seq_len


@dataclass(frozen=True)
class OverlapConfig:
    ep_comm_overlap: bool = False     # EP all-to-all of one micro-batch overlaps compute of another
    dp_overlap: bool = True           # gradient buckets reduce while backward continues
    # SMs an NCCL kernel holds while in flight (its channels, one block per SM); compute
    # overlapping it runs at (S - held)/S of its rate. NCCL picks the channel count at run
    # time (src/graph/search.cc, up to MAXCHANNELS in src/include/device.h): read it from
    # NCCL_DEBUG=INFO ("N coll channels"). 0 (default): compute is not slowed.
    nccl_sms: int = 0
    kind: str = "none"                # EP overlap: none | static | a2a-1f1b (OVERLAP_KINDS)
    # Megatron-Core cuda_graph_modules captured in CUDA graphs (kernels launched from the
    # GPU: moesim.program.cuda_graphs): attn, mlp, moe_router, moe_preprocess; () none
    cuda_graphs: tuple[str, ...] = ()
    # Megatron-Core moe_shared_expert_overlap: the shared experts' fc1+activation run on
    # their own stream under the dispatch all-to-all, fc2 under the combine (backward:
    # mirrored) (moesim.program.shared_overlap)
    shared_expert: bool = False
    # Transformer Engine userbuffers (Megatron --tp-comm-overlap): the sequence-parallel
    # all-gathers and reduce-scatters beside the TP GEMMs, chunked (moesim.program.tp_overlap)
    tp_comm: bool = False
    # ring collectives priced as NCCL runs them: its protocol/algorithm choice and latency
    # term, the flow network carrying the bytes (moesim.collectives.nccl.choice); false:
    # the flow network's ring phases with every link's latency per step
    nccl_tuning: bool = True
    # with nccl_tuning: each NCCL collective call also pays its launch and host time,
    # eagerly or from a whole-step CUDA graph (moesim.collectives.nccl.launch)
    collective_launch: bool = False
    # DualPipe(V): ``left_by_ep`` launches every FP8 GEMM of the step on the SMs the EP
    # backend's kernels leave (DeepGEMM's num_sms, as DeepSeek's training profile runs
    # them: moesim.compute.pinned_sms), priced by wave quantisation there and not slowed
    # again while those kernels hold SMs; ``all``: every kernel on the whole GPU
    gemm_sms: str = "all"


def step_graph_floor_s(scn: Any, device: Any) -> float | None:
    """Seconds a kernel costs when the whole step is replayed from one CUDA graph
    (:data:`WHOLE_STEP_GRAPH` in ``overlap.cuda_graphs``): the device's graph floor
    (``DeviceSpec.graph_kernel_s``, 0 where unknown); None when the step runs eagerly.
    The one test, for the compute model's launches and DeepEP's."""
    if WHOLE_STEP_GRAPH not in scn.overlap.cuda_graphs:
        return None
    return float(getattr(device, "graph_kernel_s", 0.0))


#: OverlapConfig fields that Scenario.to_dict() leaves out while at their defaults
OVERLAP_OMIT_DEFAULTS = {"cuda_graphs": [], "shared_expert": False, "tp_comm": False,
                         "nccl_tuning": True, "collective_launch": False,
                         "gemm_sms": "all"}


PARAM_DTYPES = ("bf16", "fp8")
ACTIVATION_DTYPES = ("bf16", "fp8")   # memory.activation_dtype (moesim.memory.activations)
GRAD_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class MemoryConfig:
    """Activation recomputation and how parameters, gradients and attention are stored
    (moesim.memory.model; docs/model.md)."""

    recompute: str = "none"           # activation recomputation: none | selective | full
    attention: str = "fused"          # fused (FlashAttention/TE: no score matrix) | materialized
    grad_dtype: str = "bf16"          # stored gradients; Megatron's bf16 recipes keep fp32
    param_dtype: str = "bf16"         # stored weights; fp8 = TE fp8 primary weights
    # Megatron-Core's recompute_modules (selective; None: its default [core_attn]),
    # recompute_method and recompute_num_layers (full): moesim.memory.activations
    recompute_modules: tuple[str, ...] | None = None
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # Linear inputs saved for backward: bf16 | fp8 (DeepSeek-V3 §3.3.2, with its E5M6 and
    # SwiGLU exceptions; moesim.memory.activations)
    activation_dtype: str = "bf16"


#: MemoryConfig fields that Scenario.to_dict() leaves out while at their defaults
MEMORY_OMIT_DEFAULTS = {"attention": "fused", "grad_dtype": "bf16", "param_dtype": "bf16",
                        "recompute_modules": None, "recompute_method": "uniform",
                        "recompute_num_layers": 1, "activation_dtype": "bf16"}


ENGINE_MODES = ("exact", "fast")
REPLICA_MODES = ("independent", "identical", "sampled")


@dataclass(frozen=True)
class EngineConfig:
    """How the step is simulated (docs/scale.md, docs/fast-path.md)."""

    mode: str = "exact"               # exact (simpy + flow network) | fast (analytical lockstep)
    replicas: str = "independent"     # identical: DP replicas share token samples; one is simulated
    sampled_replicas: int | None = None  # sampled: DP replicas simulated (None: automatic rule)
    coalesce_rtol: float = 0.0        # flow finishes within this fraction of their age coalesce (0 = exact)
    workers: int | None = None        # fast path: processes for its chains (None: auto; docs/fast-path.md)


@dataclass(frozen=True)
class RoutingSection:
    """Routing policy (dict for ``moesim.gating.routing_from_dict``) plus wire dtypes."""

    policy: Any = field(default_factory=dict)
    dispatch_dtype: str = "bf16"      # tokens sent to experts (fp8 adds one scale per 128 values)
    combine_dtype: str = "bf16"       # expert outputs sent back
    # the backward's dispatch (the gradient of the combine's output, to the experts):
    # bf16, or fp8 as DeepSeek-V3 sends it (report §3.3.3); echoed only when fp8
    grad_dispatch_dtype: str = "bf16"
    a2a_algo: str = "direct"          # direct (pairwise) | hierarchical (network, then NVLink)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", _frozen(self.policy))


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int = 0
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelSection = field(default_factory=ModelSection)  # preset, config.json or dims
    routing: RoutingSection = field(default_factory=RoutingSection)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    compute: ComputeSection = field(default_factory=ComputeSection)  # what prices kernels
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    serve: ServeConfig | None = None             # a serving step (None: no serve section)
    rl: RLConfig | None = None                   # RL post-training (None: no rl section)
    load: LoadSection | None = None              # serving traffic (None: no load section)
    distill: DistillSection | None = None        # distillation (None: no distill section)
    source: str = "<scenario>"                   # file it came from (for error messages)
    world: int | None = None                     # GPUs in the cluster, once resolved
    gpus_per_node: int | None = None             # from the topology, once resolved
    overrides: tuple[str, ...] = ()              # --set key=value items applied (for errors)

    def to_dict(self) -> dict:
        """The full configuration, JSON-able (lists, dicts, scalars)."""
        out = _plain(self)
        out.pop("overrides")
        for k, default in PARALLEL_OMIT_DEFAULTS.items():
            if out["parallel"].get(k) == default:
                del out["parallel"][k]
        for k, default in OVERLAP_OMIT_DEFAULTS.items():
            if out["overlap"].get(k) == default:
                del out["overlap"][k]
        for k, default in MEMORY_OMIT_DEFAULTS.items():
            if out["memory"].get(k) == default:
                del out["memory"][k]
        if out["schedule"].get("pp_comm") == "eager":   # echoed only when set
            del out["schedule"]["pp_comm"]
        # processes change how fast, not what (moesim.engine.fast.workers): not echoed
        out["engine"].pop("workers")
        if out["engine"].get("sampled_replicas") is None:   # echoed only when set
            out["engine"].pop("sampled_replicas")
        r = out["routing"]
        out["routing"] = {**r["policy"], "dispatch_dtype": r["dispatch_dtype"],
                          "combine_dtype": r["combine_dtype"], "a2a_algo": r["a2a_algo"]}
        if r["grad_dispatch_dtype"] != "bf16":
            out["routing"]["grad_dispatch_dtype"] = r["grad_dispatch_dtype"]
        for k in TYPED_SECTIONS:      # each echoed as written
            sec = getattr(self, k)
            out[k] = _plain(written(sec)) if sec is not None else {}
        for k in ("serve", "rl", "load", "distill"):  # training scenarios echo as before
            if not out[k]:
                del out[k]
        return out


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict | MappingProxyType):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


#: section name -> dataclass, for the sections with a fixed set of keys
SECTIONS: dict[str, type] = {
    "cluster": ClusterConfig,
    "parallel": ParallelConfig,
    "schedule": ScheduleConfig,
    "overlap": OverlapConfig,
    "memory": MemoryConfig,
    "engine": EngineConfig,
}
#: sections with keys of their own, parsed into typed sections (moesim.scenario.read)
DICT_SECTIONS = ("model", "compute", "serve", "rl", "load", "distill")
#: the sections Scenario.to_dict echoes as written
TYPED_SECTIONS = DICT_SECTIONS
TOP_LEVEL = ("name", "seed", "cluster", "model", "routing", "parallel", "schedule", "compute",
             "overlap", "memory", "engine", "serve", "rl", "load", "distill")
