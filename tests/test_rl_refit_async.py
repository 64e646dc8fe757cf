"""NeMo RL's non-colocated refit chunk by chunk (rl.weight_sync.calls: nemo-async,
moesim.rl.refit_async): chunk size, chunk count, the pipeline and a tiny refit by hand."""

from __future__ import annotations

import pytest

from moesim.collectives.nccl.graphs import facts_from_params
from moesim.collectives.nccl.model import estimate
from moesim.rl import refit_async, refit_calls
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
    # pack: 41 x 2 views at 3.3 us, one torch.cat at 16.1 us, 2 x 198,272 B at 3.35 TB/s
    assert a["pack_s"] == pytest.approx(41 * 2 * 3.3 * US + 16.1 * US + 2 * 198272 / 3.35e12)
    # unpack: torch.empty 16.1 us + split_with_sizes 3.3 us, 41 x 2 views at 3.3 us
    assert a["unpack_s"] == pytest.approx(19.4 * US + 270.6 * US)
    # load: 41 x 40 us, the engine GPU's 1/8 share read and written
    assert a["load_s"] == pytest.approx(1640 * US + 2 * 198272 / 8 / 3.35e12)
    # Ray: 8 policy workers + 1 engine from the driver, 8 executors from the engine
    assert a["ray_calls"] == 17
    assert a["ray_s"] == pytest.approx(17 * RAY_CALL_S)
    # gather: the colocated one's bytes through the groups + 35 eager calls at 14.57 us
    g = refit_calls.group_gather(topo, SPEC, train, tp=2, pp=1, ep=2, etp=1,
                                 param_bytes=2, path_Bps=path_Bps).time_s
    assert a["gather_s"] == pytest.approx(g + 35 * 14.57 * US)
    # the broadcast: NCCL's estimate for the one chunk on 2 nodes x 8 ranks
    facts = facts_from_params(topo.params, topo.device, 2, 8)
    assert a["broadcast_s"] == pytest.approx(estimate("broadcast", 198272, 8, 2, facts)[0])
    assert a["broadcast_s"] > 0
    # one chunk: everything in series after the Ray calls
    total = (a["ray_s"] + a["gather_s"] + a["pack_s"] + a["broadcast_s"] + a["unpack_s"]
             + a["load_s"])
    assert r.time_s == pytest.approx(total)
    # the printed steps: gather (with the pack), transfer (the broadcast), load (with unpack)
    assert r.phases["gather_s"] == pytest.approx(a["gather_s"] + a["pack_s"])
    assert r.phases["transfer_s"] == pytest.approx(a["broadcast_s"])
    assert r.phases["load_s"] == pytest.approx(a["unpack_s"] + a["load_s"])


def test_off_by_default_and_not_for_sharded():
    _, _, base = _tiny("none")
    assert "async_refit" not in base.phases
    _, _, sh = _tiny("nemo-async", method_sharded=True)
    _, _, sh0 = _tiny("none", method_sharded=True)
    assert "async_refit" not in sh.phases
    assert sh.time_s == sh0.time_s


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
    p, c = a.gather_s + a.pack_s, a.unpack_s + a.load_s
    assert a.time_s == pytest.approx(a.ray_s + pipeline_s(199, p, a.broadcast_s, c))
