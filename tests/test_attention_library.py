"""``compute.attention_library: cudnn``: attention at Transformer Engine's fused (cuDNN)
attention rates, the backend it prefers on Hopper (FlashAttention-3 paper Figures 5 and
6, cuDNN bars). Hand figures at seq 8192, head dim 128, causal, one sequence of 32 heads
(Qwen3-30B-A3B's attention): forward FLOPs 0.5 · 4 · 8192² · 128 · 32 = 549.76 GFLOP.

- cuDNN forward, causal, 8k: 529 TFLOP/s → 549 755 813 888 / 529e12 = 1.03924 ms
  (FlashAttention-3: 602 → 0.91322 ms);
- cuDNN backward: 2.5× the FLOPs at the non-causal backward rate 518 times the forward's
  causal / non-causal ratio 529 / 600: 518 · 529 / 600 = 456.703 TFLOP/s → 3.00937 ms.
"""

from __future__ import annotations

import pytest

from moesim.compute.base import Kernel
from moesim.compute.devices import get_device
from moesim.compute.select import compute_model, parse
from moesim.errors import InputError

H800 = get_device("H800")
FLOPS = 0.5 * 4 * 8192 ** 2 * 128 * 32


def attention(kind, flops):
    return Kernel("attention", flops, 0.0, kind=kind, dtype="bf16", seq=8192, head_dim=128,
                  causal=True)


def model(**extra):
    return compute_model({"launch_overhead_us": 0.0, **extra}, "<t>", H800)


def test_cudnn_forward_and_causal_backward_by_hand():
    m = model(attention_library="cudnn")
    fwd = m.price(attention("attn_fwd", FLOPS))
    assert fwd.time_s == pytest.approx(FLOPS / 529e12, rel=1e-12)
    assert "cudnn-fwd-d128-causal" in fwd.detail
    bwd = m.price(attention("attn_bwd", 2.5 * FLOPS))
    assert bwd.time_s == pytest.approx(2.5 * FLOPS / (518e12 * 529 / 600), rel=1e-12)
    assert bwd.time_s * 1e3 == pytest.approx(3.00937, abs=1e-5)
    assert "attn=cudnn" in m.name


def test_default_stays_flashattention3():
    m = model()
    assert m.time_s(attention("attn_fwd", FLOPS)) == pytest.approx(FLOPS / 602e12, rel=1e-12)
    assert "attn=" not in m.name


def test_unknown_library_is_one_line():
    with pytest.raises(InputError, match="attention_library.*cudnn"):
        model(attention_library="flashinfer")
    with pytest.raises(InputError, match="compute.attention_library"):
        parse({"attention_library": 3}, "<t>")


def test_an_empty_value_on_the_command_line_means_the_default():
    # --set compute.attention_library= reads as None: the FlashAttention tables again
    m = model(attention_library=None)
    assert m.time_s(attention("attn_fwd", FLOPS)) == pytest.approx(FLOPS / 602e12, rel=1e-12)
    assert parse({"attention_library": None}, "<t>").attention_library == ""
