"""GPU trace ingest on synthetic Kineto traces (tests/gpu_trace_gen.py) with known
kernels, streams, overlaps, launch links and annotations. Times in the traces are µs."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.validation.gpu.kernel_names import classify, gemm_dtype
from moesim.validation.gpu.summary import length, overlap, summarize, union
from moesim.validation.gpu.trace import gpu_trace_from_doc, load_gpu_trace
from tests.gpu_trace_gen import (
    DEEPEP_COMBINE,
    DEEPEP_DISPATCH,
    ELEMENTWISE,
    FLASH,
    GEMM_BF16,
    GEMM_FP8,
    NCCL_A2A,
    NCCL_AR,
    UNKNOWN,
    GpuTraceBuilder,
)

US = 1e-6


def overlap_trace(comm_a: str, comm_b: str) -> GpuTraceBuilder:
    """Stream 7: GEMM [0, 100], elementwise [150, 200]; stream 23: GEMM [160, 260];
    stream 27: comm A [50, 180] on 20 blocks, comm B [300, 350] on 24 blocks.
    By hand: compute ∪ = [0,100] ∪ [150,260] = 210; comm ∪ = 130 + 50 = 180;
    overlap = [50,100] + [150,180] = 80; exposed = 100; span = 350."""
    b = GpuTraceBuilder()
    b.kernel(GEMM_BF16, 7, 0, 100, launch=-10)
    b.kernel(ELEMENTWISE, 7, 150, 50)
    b.kernel(GEMM_FP8, 23, 160, 100)
    b.kernel(comm_a, 27, 50, 130, grid=(20, 1, 1))
    b.kernel(comm_b, 27, 300, 50, grid=(24, 1, 1))
    return b


@pytest.mark.parametrize("names,kinds", [
    ((DEEPEP_DISPATCH, DEEPEP_COMBINE), ("dispatch", "combine")),
    ((NCCL_A2A, NCCL_AR), ("nccl:SendRecv", "nccl:AllReduce")),
])
def test_busy_overlap_exposed_exact(names, kinds):
    g = summarize(gpu_trace_from_doc(overlap_trace(*names).doc(), "synthetic"))
    assert g["span_s"] == pytest.approx(350 * US)   # the launch at -10 µs is CPU time
    by = {s["stream"]: s for s in g["streams"]}
    assert {k: by[k]["kernels"] for k in by} == {7: 2, 23: 1, 27: 2}
    assert by[7]["busy_s"] == pytest.approx(150 * US)
    assert by[23]["busy_s"] == pytest.approx(100 * US)
    assert by[27]["busy_s"] == pytest.approx(180 * US)
    assert by[7]["classes"] == pytest.approx({"gemm": 100 * US, "elementwise": 50 * US})
    assert g["compute_busy_s"] == pytest.approx(210 * US)
    assert g["comm_busy_s"] == pytest.approx(180 * US)
    assert g["compute_comm_overlap_s"] == pytest.approx(80 * US)
    assert g["exposed_comm_s"] == pytest.approx(100 * US)
    a, b = (g["comm"][k] for k in kinds)
    assert (a["count"], b["count"], a["sms"], b["sms"]) == (1, 1, 20, 24)
    assert a["total_s"] == pytest.approx(130 * US)
    assert a["exposed_s"] == pytest.approx(50 * US)     # [100, 150]: 130 - 80
    assert b["exposed_s"] == pytest.approx(50 * US)     # nothing computes in [300, 350]


def test_interval_helpers():
    iv = union([(5, 7), (0, 2), (1, 3), (6, 9)])
    assert iv == [(0, 3), (5, 9)]
    assert length(iv) == 7
    assert overlap(iv, union([(2, 6), (8, 20)])) == 1 + 1 + 1


def test_sms_capped_at_device():
    b = GpuTraceBuilder(num_sms=16)
    b.kernel(NCCL_AR, 1, 0, 10, grid=(32, 1, 1))
    g = summarize(gpu_trace_from_doc(b.doc(), "x"))
    assert g["comm"]["nccl:AllReduce"]["sms"] == 16


def test_launching_op_shapes_by_correlation_and_by_flow():
    b = GpuTraceBuilder()
    b.op("aten::linear", 0, 50, dims=[[64, 32], [16, 32]], types=["c10::BFloat16"] * 2)
    b.op("aten::matmul", 2, 40)
    b.op("aten::mm", 4, 30, dims=[[64, 32], [32, 16]], types=["c10::BFloat16"] * 2)
    b.kernel(GEMM_BF16, 7, 100, 10, launch=10)                 # runtime event + flow
    b.op("aten::add", 60, 20, dims=[[64, 16], [64, 16]], types=["float", "float"])
    b.kernel(ELEMENTWISE, 7, 120, 5, launch=65, link="flow")   # the flow only
    b.kernel(UNKNOWN, 7, 130, 5, launch=90, link="runtime")    # outside any op
    b.kernel(UNKNOWN, 7, 140, 5, link="none")                  # no link at all
    tr = gpu_trace_from_doc(b.doc(), "x")
    gemm, add, out, nolink = tr.kernels
    assert gemm.op.name == "aten::mm" and gemm.op.dims == [[64, 32], [32, 16]]
    assert gemm.dtype == "bf16"
    assert add.op.name == "aten::add" and add.launch_s is not None
    assert out.op is None and out.launch_s is not None
    assert nolink.op is None and nolink.launch_s is None
    g = summarize(tr)
    assert (g["unlinked_kernels"], g["kernels_outside_ops"]) == (1, 1)
    assert g["other_kernels"] == {UNKNOWN: 2}


def test_phases_per_layer_from_annotations_across_threads():
    """Two layers of attn(F) and dispatch(F); the backward thread (tid 200) launches a
    kernel while attn(B) is open on the main thread."""
    b = GpuTraceBuilder()
    b.annotation("ProfilerStep#3", 0, 1000)
    for layer, t in enumerate((0, 400)):
        b.annotation("attn(F)", t, 100)
        b.kernel(FLASH, 7, t + 200, 30, launch=t + 10)
        b.kernel(GEMM_BF16, 7, t + 220, 20, launch=t + 20)    # overlaps the flash: +10
        b.annotation("dispatch(F)", t + 100, 100)
        b.kernel(DEEPEP_DISPATCH, 27, t + 250, 40 + layer * 10, launch=t + 110,
                 grid=(20, 1, 1))
    b.annotation("attn(B)", 900, 50)
    b.kernel(FLASH, 7, 960, 25, launch=910, tid=200)
    g = summarize(gpu_trace_from_doc(b.doc(), "x"))
    cell = {(p["phase"], p["layer"]): p for p in g["phases"]}
    assert set(cell) == {("attn(F)", 0), ("attn(F)", 1), ("dispatch(F)", 0),
                         ("dispatch(F)", 1), ("attn(B)", 0)}
    assert cell[("attn(F)", 0)]["gpu_busy_s"] == pytest.approx(40 * US)
    assert cell[("attn(F)", 1)]["gpu_span_s"] == pytest.approx(40 * US)
    assert cell[("attn(F)", 0)]["classes"] == pytest.approx({"gemm": 20 * US,
                                                             "attention": 30 * US})
    assert cell[("dispatch(F)", 1)]["comm"] == pytest.approx({"dispatch": 50 * US})
    assert cell[("dispatch(F)", 0)]["cpu_s"] == pytest.approx(100 * US)
    assert cell[("attn(B)", 0)]["kernels"] == 1


def test_memcpy_memset_and_classes():
    b = GpuTraceBuilder()
    b.kernel("Memcpy DtoD (Device -> Device)", 7, 0, 4, cat="gpu_memcpy", nbytes=4096)
    b.kernel("Memset (Device)", 7, 10, 1, cat="gpu_memset", nbytes=64)
    tr = gpu_trace_from_doc(b.doc(), "x")
    assert [(k.cls, k.nbytes) for k in tr.kernels] == [("memcpy", 4096.0), ("memset", 64.0)]


@pytest.mark.parametrize("name,cls,kind", [
    (GEMM_BF16, "gemm", ""), (GEMM_FP8, "gemm", ""), (FLASH, "attention", ""),
    (DEEPEP_DISPATCH, "comm", "dispatch"), (DEEPEP_COMBINE, "comm", "combine"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*)", "comm", "notify"),
    ("void deep_ep::internode::cached_notify<false>(int, int)", "comm", "notify"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", "comm", "layout"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)", "comm", "dispatch_ll"),
    ("void deep_ep::internode_ll::combine<3, 7168>(void*)", "comm", "combine_ll"),
    ("void deep_ep::legacy::internode::dispatch<false, 8>(void*)", "comm", "dispatch"),
    ("void deep_ep::legacy::internode_ll::dispatch<false, 3>(void*)", "comm", "dispatch_ll"),
    ("void deep_ep::legacy::internode_ll::clean_low_latency_buffer<32>(int*)", "comm",
     "clean_ll"),
    ("void deep_ep::legacy::intranode::notify_dispatch<8>(int const*)", "comm", "notify"),
    (NCCL_A2A, "comm", "nccl:SendRecv"), (NCCL_AR, "comm", "nccl:AllReduce"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "comm", "nccl:AllGather"),
    ("void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128>(int)", "cast", ""),
    ("void layer_norm::ln_fwd_kernel<layer_norm::Kernel_traits<__nv_bfloat16>>(int)", "norm",
     ""),
    (ELEMENTWISE, "elementwise", ""),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, "
     "at::native::memory::LoadWithCast<2> >(int)", "elementwise", ""),
    ("void dpsk::grouped_gemm::cuda::utils::transpose<512, 128, 4, 4>(unsigned char const*)",
     "elementwise", ""),
    ("triton_poi_fused_add_mul_0", "elementwise", ""),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "elementwise", ""),
    ("triton_tem_fused_mm_3", "gemm", ""),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "gemm", ""),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
     "attention", ""),
    (UNKNOWN, "other", ""),
])
def test_classify(name, cls, kind):
    assert classify(name) == (cls, kind)


def test_gemm_dtype_from_name():
    assert (gemm_dtype(GEMM_BF16), gemm_dtype(GEMM_FP8)) == ("bf16", "fp8")
    assert gemm_dtype("ampere_sgemm_128x64_tn") == "fp32"
    assert gemm_dtype("some_gemm") == ""


def test_cli_ingest_gpu_text_and_json(tmp_path, capsys):
    b = overlap_trace(DEEPEP_DISPATCH, DEEPEP_COMBINE)
    b.kernel(UNKNOWN, 7, 400, 5)
    p = b.write(tmp_path / "gpu.json.gz", gz=True)
    assert main(["ingest", str(p)]) == 0
    out = capsys.readouterr().out
    assert "busy_ms" in out and "exposed comm 0.100 ms" in out
    assert "compute-comm overlap 0.080 ms" in out
    assert UNKNOWN in out and "'other'" in out
    assert main(["ingest", str(p), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["gpu"]
    assert g["exposed_comm_s"] == pytest.approx(100 * US)
    assert g["comm"]["dispatch"]["sms"] == 20
    assert {s["stream"] for s in g["streams"]} == {7, 23, 27}
    assert g["other_kernels"] == {UNKNOWN: 1}
    assert load_gpu_trace(p).rank == 0
    assert [k["class"] for k in g["kernel_list"]] == ["gemm", "comm", "elementwise", "gemm",
                                                      "comm", "other"]
    assert g["kernel_list"][1]["kind"] == "dispatch" and g["kernel_list"][1]["blocks"] == 20
    assert main(["ingest", str(p), "--json", "--no-ops"]) == 0
    assert "kernel_list" not in json.loads(capsys.readouterr().out)["gpu"]


def test_json_kernel_list_carries_op_shapes(tmp_path, capsys):
    b = GpuTraceBuilder()
    b.annotation("mlp(F)", 0, 100)
    b.op("aten::mm", 0, 50, dims=[[64, 32], [32, 16]], types=["c10::BFloat16"] * 2)
    b.kernel(GEMM_BF16, 7, 100, 10, launch=10)
    p = b.write(tmp_path / "t.json")
    assert main(["ingest", str(p), "--json"]) == 0
    k = json.loads(capsys.readouterr().out)["gpu"]["kernel_list"][0]
    assert k == {"name": GEMM_BF16, "class": "gemm", "stream": 7, "start_s": pytest.approx(1e-4),
                 "dur_s": pytest.approx(1e-5), "blocks": 1, "dtype": "bf16", "op": "aten::mm",
                 "input_dims": [[64, 32], [32, 16]], "input_types": ["c10::BFloat16"] * 2,
                 "phase": "mlp(F)", "layer": 0}


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for n in needles:
        assert n in err


def test_bad_gpu_traces_one_line(tmp_path, capsys):
    p = overlap_trace(DEEPEP_DISPATCH, DEEPEP_COMBINE).write(tmp_path / "t.json")
    cut = tmp_path / "cut.json"
    cut.write_bytes(p.read_bytes()[:300])                      # truncated JSON
    _one_line_error(capsys, ["ingest", str(cut)], str(cut), "JSON")
    b = GpuTraceBuilder()
    b.op("aten::mm", 0, 10)
    cpu = b.write(tmp_path / "cpu.json")                       # only CPU events
    with pytest.raises(InputError, match="only CPU events"):
        gpu_trace_from_doc(b.doc(), str(cpu))
    b = overlap_trace(DEEPEP_DISPATCH, DEEPEP_COMBINE)
    b.events[0]["dur"] = float("nan")
    nan = b.write(tmp_path / "nan.json")
    _one_line_error(capsys, ["ingest", str(nan)], str(nan), "dur")


def test_deepseek_profile_script_on_a_synthetic_trace(tmp_path, capsys):
    """benchmarks/deepseek_profile.py runs on any GPU trace (tests never read the real one)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "deepseek_profile.py"
    spec = importlib.util.spec_from_file_location("deepseek_profile", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    b = overlap_trace(DEEPEP_DISPATCH, DEEPEP_COMBINE)
    b.annotation("dispatch(F)", 40, 10)          # holds the dispatch's launch at 45 µs
    p = b.write(tmp_path / "train.json")
    assert bench.main([str(p), "--no-validate"]) == 0   # the simulation: test_gpu_validate_pair
    out = capsys.readouterr().out
    assert "measured 24, published 20" in out and "error +20%" in out   # combine: 24
    assert "dispatch(F)" in out and "exposed 0.100 ms" in out
    assert bench.main([str(tmp_path / "missing.json")]) == 2


def test_nested_annotations_innermost_wins():
    b = GpuTraceBuilder()
    b.annotation("1F1B", 0, 500)
    b.annotation("mlp(F)", 100, 50)
    b.annotation("mlp(F)", 300, 50)
    b.kernel(GEMM_BF16, 7, 200, 10, launch=120)    # in mlp(F) #0
    b.kernel(GEMM_BF16, 7, 250, 10, launch=200)    # between them: in 1F1B only
    b.kernel(GEMM_BF16, 7, 400, 10, launch=349)    # in mlp(F) #1
    b.kernel(GEMM_BF16, 7, 600, 10, launch=550)    # outside every annotation
    tr = gpu_trace_from_doc(b.doc(), "x")
    got = [(k.phase.name, k.phase.index) if k.phase else None for k in tr.kernels]
    assert got == [("mlp(F)", 0), ("1F1B", 0), ("mlp(F)", 1), None]


@pytest.mark.parametrize("field, value, expected", [
    ("ts", "12.5", "a number (µs)"),            # non-numeric: was dropped silently
    ("ts", float("nan"), "a finite time"),       # NaN start: was blamed on dur
    ("ts", None, "a number (µs)"),
    ("ts", True, "a number (µs)"),
    ("dur", "7", "a number (µs)"),
    ("dur", -1.0, "a finite duration >= 0"),
])
def test_malformed_event_times_name_the_event_and_field(tmp_path, capsys, field, value,
                                                        expected):
    """Issue 20 item 15: a complete event whose ts or dur is not a finite number is
    one line naming the file, traceEvents[i] and that field (never dropped)."""
    b = overlap_trace(DEEPEP_DISPATCH, DEEPEP_COMBINE)
    i = next(j for j, e in enumerate(b.events) if e.get("ph") == "X" and e.get("cat") == "kernel")
    b.events[i][field] = value
    p = b.write(tmp_path / "bad.json")
    _one_line_error(capsys, ["ingest", str(p)], str(p), f"traceEvents[{i}].{field}",
                    expected)
    del b.events[i][field]                       # missing altogether: the same
    p = b.write(tmp_path / "missing.json")
    _one_line_error(capsys, ["ingest", str(p)], f"traceEvents[{i}].{field}")
