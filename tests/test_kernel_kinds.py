"""The kernel-kind registry (moesim.compute.kinds): the catalog prices a kernel by the
pricer registered for its kind; a kind not registered goes to the roofline.

Hand figures: H800 HBM 3.35 TB/s (moesim/compute/devices.py), the roofline streams at
0.8 of it (HBM_EFFICIENCY): 2.68e12 B/s.
"""

from __future__ import annotations

import pytest

from moesim.compute import catalog_pricing, kinds
from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import shipped_catalog
from moesim.errors import InputError

H800 = get_device("H800")
BUILT_IN = ("gemm", "grouped_gemm", "kgrouped_gemm", "attn_fwd", "attn_bwd", "memory",
            "mla_decode")


def catalog(overhead=1e-6) -> CatalogModel:
    return CatalogModel(RooflineModel(H800, precision="fp8", launch_overhead_s=overhead),
                        shipped_catalog())


def toy(count=1, nbytes=0.0) -> Kernel:
    return Kernel("toy_op", 0.0, nbytes, count=count, kind="toy")


def test_built_in_kinds_and_their_pricers():
    assert kinds.names()[:len(BUILT_IN)] == BUILT_IN
    assert kinds.get_kind("grouped_gemm").price is catalog_pricing.gemm
    assert kinds.get_kind("attn_bwd").price is catalog_pricing.attention
    assert kinds.get_kind("mla_decode").price is catalog_pricing.rate
    assert kinds.get_kind("toy") is None and kinds.get_kind("") is None


def test_unknown_kind_named_by_a_user_is_one_line_with_the_allowed_names():
    with pytest.raises(InputError) as ei:
        kinds.require_kind("gemmm", "cat.yaml", "tables[0].kind")
    line = str(ei.value)
    assert line == ("cat.yaml: tables[0].kind: expected a kernel kind: one of "
                    + ", ".join(kinds.names()) + ", got 'gemmm'")
    assert "\n" not in line
    assert kinds.require_kind("memory", "cat.yaml").name == "memory"


def test_fixed_price_kind_priced_then_gone():
    model = catalog(overhead=1e-6)
    k = toy(count=3)
    with kinds.registered_kind("toy", kinds.fixed_price(2e-6)):
        assert "toy" in kinds.names()
        p = model.price(k)
        # 3 launches x (1 µs launch + 2 µs fixed work) = 9 µs
        assert p.source == "catalog" and p.time_s == pytest.approx(9e-6, rel=1e-12)
    assert "toy" not in kinds.names() and kinds.get_kind("toy") is None
    p = model.price(k)   # the same model and kernel: not the remembered catalog price
    # roofline: no FLOPs, no bytes: 3 launches x 1 µs
    assert p.source == "roofline" and p.detail == "kind 'toy' not in the catalog"
    assert p.time_s == pytest.approx(3e-6, rel=1e-12)


def test_memory_bound_kind_priced_by_its_rate_not_the_roofline():
    model = catalog(overhead=0.0)
    k = toy(nbytes=1e9)
    assert model.price(k).time_s == pytest.approx(1e9 / 2.68e12, rel=1e-12)   # roofline
    kinds.register_kind("toy", kinds.memory_bound(500.0))
    try:
        p = model.price(k)
        assert p.source == "catalog" and p.detail == "500 GB/s"
        assert p.time_s == pytest.approx(2e-3, rel=1e-12)      # 1 GB at 500 GB/s
    finally:
        kinds.unregister_kind("toy")
    assert model.price(k).source == "roofline"


def test_a_pricer_that_declines_sends_the_kernel_to_the_roofline():
    model = catalog(overhead=0.0)
    with kinds.registered_kind("toy", lambda m, kern: "no toy table"):
        p = model.price(toy(nbytes=2.68e9))
    assert (p.source, p.detail) == ("roofline", "no toy table")
    assert p.time_s == pytest.approx(1e-3, rel=1e-12)       # 2.68 GB at 2.68e12 B/s


def test_registering_twice_or_forgetting_an_unknown_kind_is_refused():
    before = kinds.names()      # the built-in kinds and any a module registered on import
    with kinds.registered_kind("toy", kinds.fixed_price(1.0)):
        with pytest.raises(ValueError, match="already registered"):
            kinds.register_kind("toy", kinds.fixed_price(2.0))
    with pytest.raises(KeyError, match="not registered"):
        kinds.unregister_kind("toy")
    with pytest.raises(ValueError):
        kinds.register_kind("", kinds.fixed_price(1.0))
    assert kinds.names() == before and before[:len(BUILT_IN)] == BUILT_IN
