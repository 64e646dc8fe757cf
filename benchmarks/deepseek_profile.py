"""DeepSeek's published GPU profile of one DualPipe forward+backward chunk pair, read by
moesim's GPU ingest.

    python benchmarks/deepseek_profile.py PATH/train.json
    python benchmarks/deepseek_profile.py PATH/train.json --json

The trace (``train.json`` of github.com/deepseek-ai/profile-data; its README: H800,
EP64, TP1, sequence 4096, 4 MoE layers per chunk, balanced routing, PP communication
left out) is not shipped with moesim (it has no licence): give its path.

Prints the streams (events, busy time, time per kernel class), compute–communication
overlap and exposed communication, the DeepEP kernels by kind with the SMs they hold,
the GPU time of the kernels launched under each annotation per layer (``attn(F)``,
``dispatch(F)``, ``mlp(F)``, ``combine(F)``, ``attn(B)``, ``attn(W)``, ``mlp(B)``,
``mlp(W)``, ``dispatch(B)``, ``combine(B)``), and the SMs the DeepEP dispatch/combine
kernels hold against the figure the DeepSeek-V3 report publishes.
"""

from __future__ import annotations

import argparse
import json
import sys

from moesim.errors import InputError
from moesim.validation.gpu_report import phase_table, text_report
from moesim.validation.gpu_summary import summarize
from moesim.validation.gpu_trace import load_gpu_trace

# DeepSeek-V3 Technical Report (arXiv:2412.19437) §3.2.2: "only 20 SMs are sufficient
# to fully utilize the bandwidths of IB and NVLink" for the all-to-all kernels.
PUBLISHED_COMM_SMS = 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="DeepSeek's train.json (github.com/deepseek-ai/profile-data)")
    ap.add_argument("--json", action="store_true", help="print the gpu summary as JSON")
    args = ap.parse_args(argv)
    try:
        g = summarize(load_gpu_trace(args.path))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(g, indent=1))
        return 0
    print(text_report(g))
    print("\nGPU span (first start to last end) of the kernels launched under each "
          "annotation, ms:")
    print("\n".join(phase_table(g, "gpu_span_s")))
    print("\nCPU time of each annotation (the record_function span), ms:")
    print("\n".join(phase_table(g, "cpu_s")))
    sms = max((d["sms"] for k, d in g["comm"].items() if k in ("dispatch", "combine")),
              default=0)
    if sms:
        err = (sms - PUBLISHED_COMM_SMS) / PUBLISHED_COMM_SMS
        print(f"\nSMs held by DeepEP dispatch/combine: measured {sms}, published "
              f"{PUBLISHED_COMM_SMS} (DeepSeek-V3 report §3.2.2), error {err:+.0%}")
    comm = g["comm_busy_s"]
    if comm > 0:
        print(f"communication hidden behind computation: "
              f"{g['compute_comm_overlap_s'] / comm:.1%} of {comm * 1e3:.3f} ms of "
              f"communication kernels; exposed {g['exposed_comm_s'] * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
