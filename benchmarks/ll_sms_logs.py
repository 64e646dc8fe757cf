"""DeepEP's low-latency send and receive SM time (``serve.ll_sms: compute``) against the
published hook-mode logs, per device family: each family's rates, the logs that set them,
and each held-out log's error per kernel.

The split, written down before the rates were computed (``moesim/serve/ll_logs.py`` gives
the reasons and the sources):

- Hopper (H100, H800, H200, H20) rates: the dispatch's send and receive from Ant Group's
  H20 EP16 table (7 token counts, least squares); the combine's from PR 425's 8-rank rows
  (probably H200; one message count, so the combine's fixed parts are the Hopper
  dispatch's of the same phase). Held out: PR 425's dispatch, Ant Group's H20 16-rank
  sums, the LMSYS blog's H100 dispatch figure.
- Blackwell (B200, GB200) rates: PR 385's two 48-rank rows (GB200). Held out: PR 385's
  4-rank row, a B200 node.
- Device not identified (PR 248, a Tencent fork's RDMA-only run): printed against both
  rules, counted in neither.

Any other device is refused with ``ll_sms: compute``.

Usage: ``python benchmarks/ll_sms_logs.py [--write-docs=ll-sms-logs]`` (a few seconds:
the GB200 decode rows with ``serve.ll_sms=compute`` run at the end).
"""

from __future__ import annotations

import sys
import time

from results_page import error_pct  # this folder

from moesim.serve import ll_logs, ll_sms

#: output tokens/s per GPU, 2000-token inputs, 48 decode ranks (LMSYS blog "Deploying DeepSeek
#: on GB200 NVL72 with PD and Large Scale EP (Part II)", 2025-09-25: BF16 attention and FP8
#: MoE 9,087; FP8 KV cache and NVFP4 MoE 13,386)
GB200_ROWS = (("deepseek-v3-decode-gb200", 9087), ("deepseek-v3-decode-gb200-nvfp4", 13386))
NAMES = {"hopper": "Hopper (H100, H800, H200, H20)", "blackwell": "Blackwell (B200, GB200)"}


def _pred(log: ll_logs.HookLog, family: str) -> dict[str, float]:
    """The rule's microseconds for each part of ``log``'s configuration (test messages)."""
    out = {}
    for part in ll_sms.PARTS:
        size = ll_sms.TEST_MESSAGE_BYTES[part.startswith("combine")]
        out[part] = ll_sms.part_seconds(part, log.messages, size, family) * 1e6
    return out


def _rows(log: ll_logs.HookLog, family: str) -> list[tuple[str, float, float, bool]]:
    """(label, rule µs, published µs, is a send + receive sum) for what ``log`` gives."""
    pred = _pred(log, family)
    rows = [(part.replace("_", " "), pred[part], getattr(log, part + "_us"), False)
            for part in ll_sms.PARTS]
    rows += [(f"**{side} both**", pred[side + "_send"] + pred[side + "_recv"],
              log.total_us(side), True) for side in ("dispatch", "combine")]
    return [r for r in rows if r[2] is not None]


def _table(logs, family: str) -> tuple[list[float], list[float], dict[str, list[str]]]:
    """Print ``logs`` against ``family``'s rule; the held-out errors (all, sums) and the
    held-out sums' signed errors by device."""
    print("| log | device | role | peers over | messages | part | rule | published | "
          "error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs, both, by_device = [], [], {}
    for log in logs:
        head = (f"| {log.source} | {log.device} | {log.role} | {log.transport} | "
                f"{log.messages:,}")
        for label, sim, pub, is_sum in _rows(log, family):
            print(f"{head} | {label} | {sim:.1f} | {pub:.1f} | {error_pct(sim, pub)} |")
            if log.role == "held_out":
                errs.append(abs(sim / pub - 1))
                if is_sum:
                    both.append(abs(sim / pub - 1))
                    by_device.setdefault(log.device, []).append(
                        f"{label.strip('*')} {error_pct(sim, pub)}")
    print()
    return errs, both, by_device


def _summary(name: str, errs: list[float], both: list[float]) -> None:
    for what, e in (("every held-out figure", errs), ("send + receive sums only", both)):
        e = sorted(e)
        print(f"{name}: held-out errors, {what} ({len(e)}): median "
              f"{e[len(e) // 2] * 100:.1f} %, largest {e[-1] * 100:.1f} %.")
        print()


def _gb200() -> None:
    """The GB200 decode rows (which keep ``ll_sms: none``) with the Blackwell rule on."""
    from moesim.serve.run import resolve_serve, simulate_serve
    print("## The GB200 decode rows with `serve.ll_sms=compute` (Blackwell rates)")
    print()
    print("The shipped scenarios keep `ll_sms: none`; one routing step each.")
    print()
    print("| scenario | `ll_sms` | step | tokens/s per GPU | published | error |")
    print("|---|---|---|---|---|---|")
    for name, pub in GB200_ROWS:
        for ll in ("none", "compute"):
            s = simulate_serve(*resolve_serve(name, [f"serve.ll_sms={ll}"])).summary
            tps = s["tokens_per_s_per_gpu"]
            print(f"| {name} | {ll} | {s['step_time_s'] * 1e3:.2f} ms | {tps:,.0f} | "
                  f"{pub:,} | {error_pct(tps, pub)} |")
    print()


def main() -> int:
    t0 = time.perf_counter()
    msgs = ll_sms.TEST_TOKENS * ll_sms.TEST_TOPK
    for fam in ll_logs.FAMILIES:
        print(f"## {NAMES[fam]}: the rule, fixed + per message, per kernel")
        print()
        print("Fitted on the logs marked `fit` below (the split and the reasons for each "
              "log's role and device are written in `moesim/serve/ll_logs.py`). Per message "
              "is for the test's messages (FP8 dispatch 7,408 B, BF16 combine 14,336 B); "
              "other sizes scale it by their bytes.")
        print()
        print("| kernel | fixed (µs) | per message (ns) | at 1,024 messages (µs) |")
        print("|---|---|---|---|")
        for part in ll_sms.PARTS:
            fixed, per = ll_sms.RATES[fam][part]
            at = ll_sms.part_seconds(part, msgs, ll_sms.TEST_MESSAGE_BYTES[
                part.startswith("combine")], fam) * 1e6
            print(f"| {part.replace('_', ' ')} | {fixed * 1e6:.2f} | {per * 1e9:.3f} | "
                  f"{at:.1f} |")
        print()
        print(f"### {NAMES[fam]}: each log against the rule (µs per rank)")
        print()
        logs = ll_logs.fit_logs(fam) + ll_logs.held_out_logs(fam)
        errs, both, by_device = _table(logs, fam)
        _summary(NAMES[fam], errs, both)
        print(f"{NAMES[fam]}: held-out send + receive sums by device: " + "; ".join(
            f"{dev}: {', '.join(e)}" for dev, e in by_device.items()) + ".")
        print()
    print("## Logs whose device is not identified, against each family's rule")
    print()
    print("Counted in neither family's errors.")
    print()
    for fam in ll_logs.FAMILIES:
        print(f"### Against the {NAMES[fam]} rule")
        print()
        _table(ll_logs.shown_logs(), fam)
    disp = {f: sum(ll_sms.part_seconds(p, msgs, ll_sms.TEST_MESSAGE_BYTES[False], f)
                   for p in ll_sms.PARTS[:2]) * 1e6 for f in ll_logs.FAMILIES}
    comb = {f: sum(ll_sms.part_seconds(p, msgs, ll_sms.TEST_MESSAGE_BYTES[True], f)
                   for p in ll_sms.PARTS[2:]) * 1e6 for f in ll_logs.FAMILIES}
    for fam in ll_logs.FAMILIES:
        print(f"{NAMES[fam]}, DeepEP's test case (128 tokens x top-8): dispatch "
              f"{disp[fam]:.1f} µs, combine {comb[fam]:.1f} µs, combine / dispatch "
              f"{comb[fam] / disp[fam]:.2f}.")
        print()
    print("Any other device is refused with `serve.ll_sms: compute` (no hook-mode logs).")
    print()
    _gb200()
    print(f"Wall time {time.perf_counter() - t0:.2f} s.")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "ll-sms-logs",
                           "DeepEP's low-latency send and receive SM time against its "
                           "published hook-mode logs, per device family"))
