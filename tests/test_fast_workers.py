"""The fast path's chains in parallel processes (moesim.engine.fast.workers): the same
summary, spans and link bytes as the serial loop, byte for byte; blocks that cannot be
merged exactly, and processes that fail, are run again here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moesim.engine.fast import workers
from moesim.engine.fast.links import LinkBytes
from moesim.engine.fast.workers import blocks, workers_for
from moesim.errors import InputError
from moesim.topology import load_topology
from moesim.wiring import resolve_path

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="forked workers are used on Linux only")

#: deepseek-v3-2048 cut to 64 GPUs: DualPipe + DeepEP within a node (its all-to-alls
#: are pure functions of their bytes, not timed on the flow network's clock), tp 1,
#: 4 chains (edp 4)
DS_CUT = [*NO_MTP, "cluster.nodes=8", "parallel.pp=2", "parallel.ep=8", "model.layers=4",
          "model.first_dense_layers=0", "schedule.microbatches=4", "routing.max_nodes=null"]
#: mixtral-8x7b-64gpu cut: 1F1B-interleaved + NCCL all-to-alls, 2 chains
MIX_CUT = ["model.layers=8", "schedule.microbatches=4"]


#: run in a fresh interpreter: the suite's process may hold threads (dask, executors)
#: and the engine does not fork a threaded process
CHILD = r"""
import json, os, sys
import moesim.engine.fast.engine as fe
from moesim.wiring import resolve_path
from moesim.engine.fast.workers import ChainPool
from moesim.trace.report import jsonable

def run(name, overrides, workers):
    pools, items, built = [], [], []
    class Seen(ChainPool):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            pools.append(self)
    fe.ChainPool = Seen
    def progress(kind, n):
        (items if kind == "items" else built).append(n)
    r = fe.simulate_fast(resolve_path(name, [*overrides, f"engine.workers={workers}"]),
                         progress=progress)
    s = {k: v for k, v in r.summary.items() if k != "sim_wall_s"}
    return (json.dumps(jsonable(s), sort_keys=True), r.spans, r.links.bytes.tobytes(),
            pools[0], sum(items), built[-1])

out, real = [], fe._run_chain
for name, overrides, workers, flaky in json.loads(sys.argv[1]):
    serial = run(name, overrides, 1)
    if flaky:      # every forked process fails
        parent = os.getpid()
        def chain(*a, **k):
            if os.getpid() != parent:
                raise RuntimeError("worker lost")
            return real(*a, **k)
        fe._run_chain = chain
    par = run(name, overrides, workers)
    fe._run_chain = real
    out.append({"summary": par[0] == serial[0], "spans": par[1] == serial[1],
                "n_spans": len(serial[1]), "links": par[2] == serial[2],
                "serial_children": len(serial[3].children), "children": len(par[3].children),
                "merged": par[3].merged, "items": [serial[4], par[4], serial[5]]})
print(json.dumps(out))
"""

CASES = [
    ("deepseek-v3-2048", DS_CUT, 2, False),
    ("deepseek-v3-2048", DS_CUT, 3, False),    # two forked processes: blocks [0, 1] [2] [3]
    ("mixtral-8x7b-64gpu", MIX_CUT, 2, False),
    ("deepseek-v3-2048", [*DS_CUT, "schedule.kind=1f1b", "parallel.ep_backend.kind=nccl",
                          "overlap.ep_comm_overlap=true"], 2, False),
    # TP 2: the TP all-reduces count fractional bytes, so link counts must be added in
    # the serial order: the forked block is dropped and run again in this process
    ("mixtral-8x7b-64gpu", [*MIX_CUT, "parallel.tp=2", "parallel.ep=4"], 2, False),
    ("deepseek-v3-2048", DS_CUT, 2, True),      # the forked process fails
]


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], capture_output=True,
                       text=True, env=env, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("case", range(4))
def test_parallel_chains_give_the_serial_bytes(runs, case):
    r = runs[case]
    assert r["serial_children"] == 0 and r["children"] >= 1
    assert r["merged"], "no chain was run in another process"
    assert r["summary"] and r["spans"] and r["links"] and r["n_spans"] > 0
    assert r["items"][0] == r["items"][1] == r["items"][2]   # every item counted once


def test_blocks_that_cannot_merge_exactly_run_here(runs):
    r = runs[4]
    assert r["children"] == 1 and r["merged"] == []
    assert r["summary"] and r["spans"] and r["links"]
    assert r["items"][0] == r["items"][1] == r["items"][2]


def test_a_failed_process_is_replaced_by_a_serial_run(runs):
    r = runs[5]
    assert r["children"] == 1 and r["merged"] == []
    assert r["summary"] and r["spans"] and r["links"]
    assert r["items"][0] == r["items"][1]


def test_blocks_and_worker_counts(monkeypatch):
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    assert blocks(5, 2) == [[0, 1, 2], [3, 4]]
    assert blocks(4, 3) == [[0, 1], [2], [3]]
    assert blocks(2, 4) == [[0], [1]]
    assert workers_for(4, 2, 10, True) == 2            # at most one per chain
    assert workers_for(2, 1, 10**6, True) == 1         # one chain
    assert workers_for(2, 8, 10**6, False) == 1        # the flow network's clock is shared
    assert workers_for(None, 8, 10, True) == 1         # auto: too small to gain
    assert workers_for(None, 8, 10**6, True) == min(2, len(os.sched_getaffinity(0)))
    assert workers_for(1, 8, 10**6, True) == 1


def _links():
    topo = load_topology("dgx-h100", nodes=2)
    gpus = list(topo.gpus)
    return LinkBytes(topo, gpus, [topo.host_of(g) for g in gpus])


def test_link_counts_merge_as_if_added_here():
    # whole bytes: one counter fed every call equals two, the second merged into the first
    rng = np.random.default_rng(3)
    g1, g2 = tuple(range(0, 16, 2)), tuple(range(1, 16, 2))
    calls = [(g1 if i % 3 else g2, rng.integers(0, 10**9, (8, 8)).astype(float))
             for i in range(12)]
    whole = _links()
    for g, m in calls:
        whole.a2a(g, m)
    whole.sends([0, 1], [8, 9], 4096.0)
    first, second = _links(), _links()
    for g, m in calls[:5]:
        first.a2a(g, m)
    second.restart()
    for g, m in calls[5:]:
        second.a2a(g, m)
    second.sends([0, 1], [8, 9], 4096.0)
    assert first.merge(second.export())
    assert np.array_equal(first.bytes, whole.bytes) and whole.bytes.sum() > 0
    # a fractional count cannot be merged exactly: nothing is added
    frac = _links()
    frac.a2a(g1, calls[0][1] + 0.5)
    assert frac.export() is None and not first.merge(frac.export())
    before = first.bytes.copy()
    frac.restart()
    frac.a2a(g1, calls[0][1])
    frac._whole_total = 2.0 ** 53     # the exact-sum bound would be crossed
    assert not first.merge(frac.export())
    assert np.array_equal(first.bytes, before)


def test_workers_setting_is_checked():
    with pytest.raises(InputError, match="engine.workers"):
        resolve_path("toy-cpu", ["engine.workers=0"])


def test_no_fork_from_a_threaded_process(monkeypatch):
    # forking while another thread may hold a lock can deadlock the child: serial
    monkeypatch.setattr(workers.threading, "active_count", lambda: 2)
    assert workers_for(2, 8, 10**6, True) == 1
    assert workers_for(None, 8, 10**6, True) == 1
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    assert workers_for(2, 8, 10**6, True) == 2
