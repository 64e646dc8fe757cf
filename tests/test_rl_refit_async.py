"""NeMo RL's non-colocated refit chunk by chunk (rl.weight_sync.calls: nemo-async,
moesim.rl.refit_async): chunk size, chunk count, the pipeline and a tiny refit by hand."""

from __future__ import annotations

import pytest

from moesim.collectives.nccl.graphs import facts_from_params
from moesim.collectives.nccl.model import estimate
from moesim.errors import InputError
from moesim.rl import refit_async
from moesim.rl.refit_async import chunk_bytes, chunks, pipeline_s
from moesim.rl.refit_host import RAY_CALL_S
from moesim.rl.sync import path_Bps, weight_sync
from moesim.topology import load_topology
from tests._refit import SPEC

US = 1e-6


def test_chunk_size_and_count():
    # 0.02 x 100 GB = 2 GB; 0.02 x 1 TB = 20 GB, capped at 5 GiB
    assert chunk_bytes(100e9) == 2_000_000_000
    assert chunk_bytes(1e12) == 5 * 1024**3
    assert chunks(5e9, 2e9) == 3
    assert chunks(4e9, 2e9) == 2
    assert chunks(1.0, 2e9) == 1


def test_pipeline_by_hand():
    # 4 chunks, stage totals 4, 8, 2 s: the first chunk through all (1 + 2 + 0.5), then
    # three more at the broadcast's 2 s each = 9.5 s
    assert pipeline_s(4, 4.0, 8.0, 2.0) == pytest.approx(9.5)
    # one chunk: the stages in series
    assert pipeline_s(1, 4.0, 8.0, 2.0) == pytest.approx(14.0)


def test_bridge_counts_by_hand():
    """SPEC at EP2: 21 keys per EP rank (test_rl_refit_calls.py), 6 TP-sharded, 8 of
    experts (2 layers x 2 local experts x fc1, fc2)."""
    # TP2 PP1 EP2: 6 TP all-gathers (2 + 1 + 1 empty_like each: 3 ops), no PP broadcast;
    # 8 expert keys, 4 of them fc1 gathered twice: 12 EP all-gathers of 2 empty_like;
    # the 4 expert fc1 chunked into 2 views
    assert refit_async.bridge_counts(SPEC, tp=2, pp=1, ep=2) == refit_async.BridgeCounts(
        18, 42, 8)
    # TP1 PP2 EP1: 29 keys (4 local experts a layer), a PP broadcast each and a
    # torch.empty on the stage not owning it, half of them on a mean rank (14.5); no TP
    # or EP gathers; 8 expert fc1 chunked into 2 views
    assert refit_async.bridge_counts(SPEC, tp=1, pp=2, ep=1) == refit_async.BridgeCounts(
        29, 14.5, 16)


def _tiny(calls: str, method_sharded: bool = False):
    """SPEC (41 HF tensors, 198,272 bytes) from a TP2 EP2 trainer on DGX H100 node 0 to
    one engine of the 8 GPUs of node 1, 1 GB of total memory (a 20 MB chunk: one)."""
    topo = load_topology("dgx-h100", nodes=2)
    train, roll = topo.gpus[:8], topo.gpus[8:16]
    r = weight_sync(topo, SPEC, train, roll, tp=2, pp=1, ep=2, replica_gpus=8,
                    per_tensor_s=40e-6, ipc=False, hbm_Bps=3.35e12, per_gpu=True,
                    calls=calls, hbm_bytes=1e9, launch_s=4e-6, sharded=method_sharded)
    return topo, train, r


def test_tiny_refit_by_hand():
    topo, train, r = _tiny("nemo-async")
    a = r.phases["async_refit"]
    assert (a["chunks"], a["chunk_bytes"], a["group_nodes"]) == (1, 20_000_000, 2)
    # pack: 41 x 2 views at 3.3 us and one torch.cat at 16.1 us on the host; the cat's
    # read and write of 198,272 B at 3.35 TB/s on the GPU
    assert a["pack_host_s"] == pytest.approx(41 * 2 * 3.3 * US + 16.1 * US)
    assert a["pack_copy_s"] == pytest.approx(2 * 198272 / 3.35e12)
    # unpack: torch.empty 16.1 us + split_with_sizes 3.3 us, 41 x 2 views at 3.3 us
    assert a["unpack_s"] == pytest.approx(19.4 * US + 270.6 * US)
    # load: 41 x 40 us, the engine GPU's 1/8 share read and written
    assert a["load_s"] == pytest.approx(1640 * US + 2 * 198272 / 8 / 3.35e12)
    # Ray: 8 policy workers + 1 engine from the driver, 8 executors from the engine
    assert a["ray_calls"] == 17
    assert a["ray_s"] == pytest.approx(17 * RAY_CALL_S)
    # the gather on the host: Megatron-Bridge's 18 calls at 14.57 us, 42 allocations at
    # 16.1 us, 8 views at 3.3 us (test_bridge_counts_by_hand)
    assert (a["bridge_calls"], a["bridge_ops"], a["bridge_views"]) == (18, 42, 8)
    assert a["bridge_s"] == pytest.approx((18 * 14.57 + 42 * 16.1 + 8 * 3.3) * US)
    # on the GPU: 6 TP all-gathers of a non-expert key's mean bytes (99,968 B over 13
    # keys) and 12 EP all-gathers of 2 x 4,096 B (an expert matrix, 64 x 32 bf16), each
    # group two GPUs of node 0 (TP: GPUs 0, 1; EP: GPUs 0, 2)
    facts1 = facts_from_params(topo.params, topo.device, 1, 2)
    nccl = (6 * estimate("all_gather", 99968 / 13, 2, 1, facts1)[0]
            + 12 * estimate("all_gather", 2 * 4096, 2, 1, facts1)[0])
    assert a["gather_nccl_s"] == pytest.approx(nccl)
    # the list all-gathers' copies: every expert's bytes (98,304) and the 6 TP keys whole
    assert a["gather_copy_s"] == pytest.approx(2 * (98304 + 6 * 99968 / 13) / 3.35e12)
    host = a["bridge_s"] + a["pack_host_s"]
    gpu = a["gather_nccl_s"] + a["gather_copy_s"] + a["pack_copy_s"]
    assert a["producer_s"] == pytest.approx(max(host, gpu))
    # the broadcast: NCCL's estimate for the one chunk on 2 nodes x 8 ranks
    facts = facts_from_params(topo.params, topo.device, 2, 8)
    assert a["broadcast_s"] == pytest.approx(estimate("broadcast", 198272, 8, 2, facts)[0])
    assert a["broadcast_s"] > 0
    # the NIC: no gather bytes (the groups sit on node 0), 1/8 of the model at 47.5 GB/s
    assert a["nic_bytes"] == pytest.approx(198272 / 8)
    assert a["nic_s"] == pytest.approx(198272 / 8 / 47.5e9)
    # one chunk: everything in series after the Ray calls
    total = (a["ray_s"] + a["producer_s"] + a["broadcast_s"] + a["unpack_s"]
             + a["load_s"])
    assert r.time_s == pytest.approx(total)
    # the printed steps: gather (with the pack), transfer (the broadcast), load (with unpack)
    assert r.phases["gather_s"] == pytest.approx(a["producer_s"])
    assert r.phases["transfer_s"] == pytest.approx(a["broadcast_s"])
    assert r.phases["load_s"] == pytest.approx(a["unpack_s"] + a["load_s"])


def test_off_by_default_and_refused_where_it_does_not_apply():
    _, _, base = _tiny("none")
    assert "async_refit" not in base.phases
    with pytest.raises(InputError, match="nemo-async only with per_gpu"):
        _tiny("nemo-async", method_sharded=True)
    topo = load_topology("dgx-h100", nodes=1)
    with pytest.raises(InputError, match="rl.colocated: false"):
        weight_sync(topo, SPEC, topo.gpus, topo.gpus, tp=2, pp=1, ep=2, replica_gpus=8,
                    per_tensor_s=40e-6, ipc=True, hbm_Bps=3.35e12, per_gpu=True,
                    calls="nemo-async", hbm_bytes=1e9)


def test_many_chunks_pipeline():
    """The tiny refit in 1 KB chunks (50 kB of memory): the broadcast per chunk, the
    pipeline over 199 chunks."""
    topo = load_topology("dgx-h100", nodes=2)
    train, roll = topo.gpus[:8], topo.gpus[8:16]
    a = refit_async.async_refit(topo, SPEC, train, roll, tp=2, pp=1, ep=2, etp=1,
                                replica_gpus=8, per_tensor_s=40e-6, hbm_Bps=3.35e12,
                                hbm_bytes=50_000.0, nbytes=198272.0, tensors=41,
                                path_Bps=path_Bps)
    # chunk 0.02 x 50,000 = 1,000 bytes: 199 chunks (198 full, one of 272 bytes)
    assert (a.chunk_bytes, a.chunks) == (1000, 199)
    facts = facts_from_params(topo.params, topo.device, 2, 8)
    one = estimate("broadcast", 1000, 8, 2, facts)[0]
    assert a.broadcast_s == pytest.approx(198 * one + estimate("broadcast", 272, 8, 2,
                                                                facts)[0])
    c = a.unpack_s + a.load_s
    assert a.time_s == pytest.approx(a.ray_s + pipeline_s(199, a.producer_s, a.broadcast_s, c))
    # without the overlap: gather, pack and broadcast of a chunk in series, then the load
    assert a.no_overlap_s == pytest.approx(
        a.ray_s + pipeline_s(199, a.producer_s + a.broadcast_s, c))
    assert a.no_overlap_s >= a.time_s


def test_gather_nic_bytes_by_hand():
    """SPEC (198,272 B, no shared experts) on 2 DGX H100 nodes, 16 trainer GPUs."""
    topo = load_topology("dgx-h100", nodes=2)
    gpus = topo.gpus[:16]
    # PP2: the other stage (GPU 8, node 1) sends its half through GPU 0's own NIC
    assert refit_async.gather_nic_bytes(topo, SPEC, gpus, tp=1, pp=2, ep=1) == (
        pytest.approx(198272 / 2))
    # EP16 over both nodes: the experts' bytes E, 15/16 of them from 15 peers, 8 of them
    # remote, entering through the 8 NICs of node 0's members: E x 15/16 / 15 x 8 / 8
    from moesim.model.params import count_params
    e = count_params(SPEC).routed_experts * 2
    assert refit_async.gather_nic_bytes(topo, SPEC, gpus, tp=1, pp=1, ep=16) == (
        pytest.approx(e * 15 / 16 / 15))
    # TP2 EP2 inside node 0: nothing through the NIC
    assert refit_async.gather_nic_bytes(topo, SPEC, gpus[:8], tp=2, pp=1, ep=2) == 0.0


def test_shared_nic_pipeline_when_it_is_the_larger():
    """PP2 over 2 nodes, engine on node 2, 1 KB chunks: the NIC pipeline (the gather's
    remote half and 1/8 of every chunk at 47.5 GB/s, then the consumer) against the
    three-stage one; the refit takes the larger after the Ray calls."""
    topo = load_topology("dgx-h100", nodes=3)
    train, roll = topo.gpus[:16], topo.gpus[16:24]
    a = refit_async.async_refit(topo, SPEC, train, roll, tp=1, pp=2, ep=1, etp=1,
                                replica_gpus=8, per_tensor_s=40e-6, hbm_Bps=3.35e12,
                                hbm_bytes=50_000.0, nbytes=198272.0, tensors=41,
                                path_Bps=path_Bps)
    assert a.nic_bytes == pytest.approx(198272 / 2 + 198272 / 8)
    assert a.nic_s == pytest.approx(a.nic_bytes / 47.5e9)
    c = a.unpack_s + a.load_s
    three = pipeline_s(199, a.producer_s, a.broadcast_s, c)
    assert a.time_s == pytest.approx(a.ray_s + max(three, pipeline_s(199, a.nic_s, c)))


def test_deepseek_refit_nic_bytes():
    """DeepSeek-V3 PP16 EP16 on 32 nodes -> one TP32 engine on 4: the trainer NIC carries
    the PP broadcast's remote share (every PP peer on another node: its own NIC) and the
    EP group's remote half, plus 1/8 of the model; the refit takes the larger pipeline."""
    from moesim.model.presets import PRESETS
    from moesim.rl.sync import param_bytes, tensor_count
    spec = PRESETS["deepseek-v3"]
    topo = load_topology("dgx-h100", nodes=36)
    train, roll = topo.gpus[:256], topo.gpus[256:288]
    nbytes = param_bytes(spec)
    a = refit_async.async_refit(topo, spec, train, roll, tp=1, pp=16, ep=16, etp=1,
                                replica_gpus=32, per_tensor_s=40e-6, hbm_Bps=3.35e12,
                                hbm_bytes=85.52e9, nbytes=nbytes,
                                tensors=tensor_count(spec), path_Bps=path_Bps)
    assert a.nic_bytes == pytest.approx(
        refit_async.gather_nic_bytes(topo, spec, train, tp=1, pp=16, ep=16) + nbytes / 8)
    c = a.unpack_s + a.load_s
    nic = pipeline_s(a.chunks, a.nic_s, c)
    three = pipeline_s(a.chunks, a.producer_s, a.broadcast_s, c)
    assert a.time_s == pytest.approx(a.ray_s + max(nic, three))


def test_moesim_rl_prints_the_chunks():
    from moesim.rl.summary import refit_line
    ph = {"gather_s": 1.0, "transfer_s": 2.0, "load_s": 0.5, "buckets": 0,
          "load_bytes_per_gpu": 4e9, "ipc_bytes_per_gpu": 0.0,
          "async_refit": {"chunks": 36, "chunk_bytes": 1.71e9, "time_s": 2.25}}
    assert refit_line({"phases": ph}) == [
        "  refit per GPU: gather 1.00 s + transfer 2.00 s + load 0.50 s; load 4.00 GB per "
        "GPU; 36 chunks of 1.71 GB overlapped: 2.25 s"]
    del ph["async_refit"]
    assert refit_line({"phases": ph})[0].endswith("load 4.00 GB per GPU")


def test_gather_collectives_pp_by_hand():
    """SPEC at TP1 PP2 EP1 on 16 GPUs of 2 nodes: the PP group is GPUs 0 and 8, one on
    each node; 29 keys, a broadcast each: 13 non-expert keys of 99,968 / 13 B, 8 expert
    fc1 of 2 x 4,096 B, 8 fc2 of 4,096 B; no TP or EP gathers, no list copies."""
    topo = load_topology("dgx-h100", nodes=2)
    g = refit_async.gather_collectives(topo, SPEC, topo.gpus[:16], tp=1, pp=2, ep=1)
    assert (g.pp_calls, g.tp_calls, g.ep_calls) == (29, 0, 0)
    f = facts_from_params(topo.params, topo.device, 2, 1)

    def b(n):
        return estimate("broadcast", n, 1, 2, f)[0]
    assert g.pp_s == pytest.approx(13 * b(99968 / 13) + 8 * b(8192) + 8 * b(4096))
    assert g.time_s == g.pp_s
    assert refit_async.list_gather_bytes(SPEC, tp=1, ep=1) == 0.0
