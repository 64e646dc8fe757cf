"""Memory-bound kernels by kind, size and implementation (``compute.memory_kernels``).

Hand figures. A two-row table, 2 bytes per element: 1000 x 1000 in 0.001 ms is 2 MB at
2000 GB/s; 1000 x 4000 in 0.002 ms is 8 MB at 4000 GB/s. A 4 MB kernel lies halfway in
log bytes, so its rate is 2000 · (4000/2000)^0.5 = 2828.43 GB/s and its time
4e6 / 2828.43e9 = 1.41421 µs; a 1 MB kernel holds the smallest row's 2000 GB/s (0.5 µs),
a 16 MB one the largest's 4000 GB/s (4 µs). Liger's RMSNorm 4096 x 16384 forward row,
0.095 ms, is the inventory's norm of that shape priced under ``liger`` (exactly, at the
row).
"""

from __future__ import annotations

import math
from dataclasses import replace
from importlib import resources

import pytest
import yaml

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.catalog_data import load_catalog, load_file
from moesim.compute.devices import get_device
from moesim.compute.memory_kernels import DEFAULT_IMPL, op_of
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import compute_model, parse, shipped_catalog
from moesim.errors import InputError
from moesim.model.costs import memory_op
from moesim.model.kernels.make import mem, rmsnorm
from moesim.model.kernels.moe import activation

H100 = get_device("H100")
TWO_ROWS = """
tables:
  - id: stream
    kind: memory
    dtype: any
    passes: [fwd, dgrad]
    devices: [H100]
    gbps: 1000
    source: a test
  - id: two-rows
    kind: memory_op
    op: rmsnorm
    impls: [eager]
    dtype: any
    passes: [fwd]
    devices: [H100]
    bytes_per_element: 2
    source: a test
    columns: [rows, cols, ms]
    rows:
      - [1000, 1000, 0.001]
      - [1000, 4000, 0.002]
"""


def model(tables, impl, device=H100) -> CatalogModel:
    return CatalogModel(RooflineModel(device, precision="bf16", launch_overhead_s=0.0),
                        tuple(tables), memory_kernels=impl)


def norm(nbytes: float, pass_: str = "fwd") -> Kernel:
    return Kernel("norm" if pass_ == "fwd" else "norm_bwd", 0.0, nbytes, kind="memory",
                  pass_=pass_, kclass="norm")


@pytest.fixture
def two_rows(tmp_path):
    p = tmp_path / "two.yaml"
    p.write_text(TWO_ROWS)
    return load_file(p)


# ------------------------------------------------------------------ by hand
def test_two_row_table_by_hand(two_rows):
    m = model(two_rows, "eager")
    p = m.price(norm(4e6))
    assert p.source == "catalog" and "interpolated" in p.detail
    assert math.isclose(p.time_s, 4e6 / (2000 * math.sqrt(2) * 1e9), rel_tol=1e-12)
    assert math.isclose(p.time_s, 1.41421356e-6, rel_tol=1e-8)
    assert math.isclose(m.price(norm(2e6)).time_s, 1e-6, rel_tol=1e-12)       # a row: exact
    assert math.isclose(m.price(norm(8e6)).time_s, 2e-6, rel_tol=1e-12)
    assert math.isclose(m.price(norm(1e6)).time_s, 0.5e-6, rel_tol=1e-12)     # held below
    assert math.isclose(m.price(norm(16e6)).time_s, 4e-6, rel_tol=1e-12)      # held above
    assert "held above" in m.price(norm(16e6)).detail


def test_stream_knob_and_uncovered_kernels_keep_the_streaming_rate(two_rows):
    # stream: the table is not read; a pass or op without a table: the stream rate
    assert model(two_rows, "stream").price(norm(4e6)).time_s == 4e6 / 1000e9
    for impl, k in (("eager", norm(4e6, "dgrad")),
                    ("eager", Kernel("residual_add", 0.0, 4e6, kind="memory", pass_="fwd"))):
        p = model(two_rows, impl).price(k)
        assert p.time_s == 4e6 / 1000e9 and p.detail.endswith(": stream)")


def test_a_missing_implementation_takes_the_next_fused_ones_rows_never_eagers(two_rows):
    # liger -> fused; fused alone: only eager rows here, so both keep the stream rate
    # (a fused implementation does not run the eager ops), 2e6 B at 1000 GB/s
    for impl in ("liger", "fused"):
        p = model(two_rows, impl).price(norm(2e6))
        assert p.time_s == 2e6 / 1000e9 and p.detail.endswith(": stream)")
    fused_rows = [replace(t, impls=("fused",)) for t in two_rows]
    p = model(fused_rows, "liger").price(norm(2e6))
    assert p.time_s == 1e-6 and "no liger table: fused's" in p.detail


def test_launch_cost_is_added_per_launch(two_rows):
    m = CatalogModel(RooflineModel(H100, precision="bf16", launch_overhead_s=4e-6),
                     tuple(two_rows), memory_kernels="eager")
    assert math.isclose(m.price(norm(2e6)).time_s, 1e-6 + 4e-6, rel_tol=1e-12)


# ------------------------------------------------------------------ refused tables
BAD = {
    "time falls": ("rows:\n      - [1000, 1000, 0.002]\n      - [1000, 2000, 0.001]",
                   "tables[0].rows"),
    "unknown op": ("op: nope", "tables[0].op"),
    "unknown impl": ("impls: [stream]", "tables[0].impls"),
    "no traffic model": ("bytes_per_element: 0", "tables[0].bytes_per_element"),
    "a row of two": ("rows:\n      - [1000, 0.002]", "tables[0].rows[0]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_memory_op_table_is_refused_naming_the_field(tmp_path, case):
    body = {"op": "op: rmsnorm", "impls": "impls: [eager]",
            "bytes_per_element": "bytes_per_element: 2",
            "rows": "rows:\n      - [1000, 1000, 0.001]"}
    change, field = BAD[case]
    body[change.split(":")[0]] = change
    text = ("tables:\n  - id: t\n    kind: memory_op\n    dtype: any\n    passes: [fwd]\n"
            "    devices: [H100]\n    source: a test\n    columns: [rows, cols, ms]\n"
            + "".join(f"    {v}\n" for v in body.values()))
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_file(p)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_memory_op_fields_on_another_kind_of_table_are_refused(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("tables:\n  - id: t\n    kind: memory\n    dtype: any\n    passes: [fwd]\n"
                 "    devices: [H100]\n    source: s\n    gbps: 1000\n    op: rmsnorm\n")
    with pytest.raises(InputError, match=r"tables\[0\]\.op"):
        load_file(p)


# ------------------------------------------------------------------ the shipped tables
INVENTORY = {  # op, pass -> the inventory's kernel of that shape
    ("rmsnorm", "fwd"): lambda r, c: rmsnorm(r, c, "fwd"),
    ("rmsnorm", "dgrad"): lambda r, c: rmsnorm(r, c, "bwd"),
    ("swiglu", "fwd"): lambda r, c: activation("expert", r, c, True, "fwd")[0],
    ("swiglu", "dgrad"): lambda r, c: activation("expert", r, c, True, "bwd")[0],
    ("cross_entropy", "fwd"): lambda r, c: memory_op("loss", r * c * 6, 0, "fwd"),
    ("cross_entropy", "dgrad"): lambda r, c: memory_op("loss", r * c * 6, 0, "bwd"),
    # attention's rotary_kernel: q and k (c = heads x head dim) read and written, bf16
    ("rope", "fwd"): lambda r, c: mem("rotary_kernel", 2 * 2 * r * c, "fwd", "elementwise"),
}
SHIPPED = [t for t in load_catalog() if t.kind == "memory_op"]


@pytest.mark.parametrize("t", SHIPPED, ids=lambda t: t.id)
def test_every_shipped_row_is_the_inventory_kernel_at_its_published_time(t):
    """The table's traffic model is the inventory's bytes, so the kernel the inventory
    writes for a row's shape is priced at the row's published time."""
    raw = yaml.safe_load((resources.files("moesim") / "data" / "kernels" / "liger.yaml")
                         .read_text())
    rows = next(d for d in raw["tables"] if d["id"] == t.id)["rows"]
    m = model(shipped_catalog(), t.impls[0])
    for r, c, ms in rows:
        k = INVENTORY[(t.op, t.passes[0])](r, c)
        assert op_of(k) == t.op
        p = m.price(k)
        assert t.id in p.detail and "exact" in p.detail
        assert math.isclose(p.time_s, ms * 1e-3, rel_tol=1e-9)


def test_liger_rmsnorm_row_by_hand():
    p = model(shipped_catalog(), "liger").price(rmsnorm(4096, 16384, "fwd"))
    assert math.isclose(p.time_s, 0.095e-3, rel_tol=1e-9)
    # stream: today's 3000 GB/s for the same 4·4096·16384 + 4·4096 bytes
    s = model(shipped_catalog(), "stream").price(rmsnorm(4096, 16384, "fwd"))
    assert s.time_s == (4 * 4096 * 16384 + 4 * 4096) / 3000e9


# ------------------------------------------------------------------ the scenario's knob
def test_the_knob_is_checked_and_named():
    assert parse({}, "s").memory_kernels == DEFAULT_IMPL
    assert parse({"memory_kernels": "liger"}, "s").memory_kernels == "liger"
    with pytest.raises(InputError, match=r"compute\.memory_kernels"):
        parse({"memory_kernels": "fast"}, "s")
    with pytest.raises(InputError, match=r"compute\.memory_kernels"):
        parse({"kind": "calibration", "file": "x.json", "memory_kernels": "liger"}, "s")
    m = compute_model({"memory_kernels": "fused"}, "s", get_device("H800"))
    assert m.memory_kernels == "fused" and m.name == "catalog(H800,bf16,memory=fused)"
    stream = compute_model({"memory_kernels": "stream"}, "s", get_device("H800"))
    assert stream.name == "catalog(H800,bf16)"


def test_moesim_kernels_prices_by_the_knob(capsys):
    args = ["kernels", "deepseek-v3-fb-pair", "--pass", "fwd"]
    assert main([*args, "--set", "compute.memory_kernels=liger"]) == 0
    out = capsys.readouterr().out
    assert "liger-bench-rmsnorm-fwd-liger" in out and "liger-bench-swiglu-fwd-liger" in out
    assert main([*args, "--set", "compute.memory_kernels=stream"]) == 0
    assert "liger-bench" not in capsys.readouterr().out


def test_a_one_rate_table_prices_every_size_of_its_op(tmp_path):
    p = tmp_path / "one.yaml"
    p.write_text("tables:\n  - id: one\n    kind: memory_op\n    op: cast\n"
                 "    impls: [fused]\n    dtype: any\n    passes: [fwd]\n"
                 "    devices: [H100]\n    source: s\n    gbps: 1500\n")
    cast = Kernel("per_token_cast_to_fp8", 0.0, 3e6, kind="memory", pass_="fwd",
                  kclass="cast")
    got = model(load_file(p), "liger").price(cast)      # liger -> fused's
    assert got.time_s == 3e6 / 1500e9 == 2e-6 and "one rate" in got.detail
