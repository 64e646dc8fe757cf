"""Published hook-mode logs of DeepEP's low-latency kernels, the device family each ran
on, and which of them set the rates of :mod:`moesim.serve.ll_sms` per family (the split,
written down before the fit).

DeepEP's unit test (deepseek-ai/DeepEP ``tests/test_low_latency.py``, ``bench_kineto`` with
``return_recv_hook=True``) launches the send kernel, runs a large matrix product on the
host, then the receive hook, and prints each kernel's own GPU time from the Kineto
profiler: ``Dispatch send/recv time: S + R us | Combine send/recv time: S + R us`` (since
commit 85793dd, PR 239; before it one sum). The data have arrived before the receive
kernel starts, so S and R are the SM time of the send and the receive work.

Defaults of that test: 128 tokens per rank, hidden 7168, top-8, 288 experts, FP8 dispatch,
BF16 combine (zero-copy in the split profiling), 10 of the top-k slots masked. A rank
sends and receives ``tokens x top-k`` messages (less the <= 10 masked, < 1 %, not counted
here).

Devices. A calibrated rate is used only on the device family its rows ran on: Hopper
(H100, H800, H200, H20: one SM design, GH100) or Blackwell (B200, GB200). Where a log does
not name its GPU, the family is inferred only from what the thread itself shows, and said:

- PR 385: Blackwell. Its author's case is "768 tok 48 rank nvfp4 pure nvlink", and NVFP4
  is a Blackwell format; 48 ranks over NVLink alone is 12 trays of a GB200 NVL72.
- PR 425: Hopper, probably H200. PR 500, the same author's merged version of the same
  change ("opt ll dispatch layered algo"), was benchmarked on "one/two/four 8*H200"; PR
  425's own ``nvidia-smi topo -m`` shows 18 NVLinks per GPU and a NIC per GPU.
- PR 248 (4 ranks) and the Tencent fork's notes: not identified. They are printed against
  both families' rules and counted in neither family's errors.

The split (by what each source can separate, before any rate was computed):

- **Blackwell, fit**: the two "baseline" rows of PR 385 at 48 ranks (128 and 768 tokens):
  one machine, one rank count, one kernel version, two token counts, every kernel timed.
  The PR gives ranges; the midpoints are taken. **Held out**: PR 385's 4-rank row; a B200
  node's run (yangwhale/gpu-tpu-pedia).
- **Hopper, fit**: (a) the dispatch's send and receive: Ant Group's H20 EP16 table (native
  DeepEP, 7 token counts from 1 to 128 per rank, one machine): the only Hopper source
  with more than one message count, least squares over all 7 rows; (b) the combine's send
  and receive: PR 425's 8-rank rows, the only Hopper log that times the combine's two
  kernels apart. They are at one message count (1,024), so the combine kernels' fixed
  parts are taken equal to the Hopper dispatch kernels' of the same phase (send, receive;
  :mod:`moesim.serve.ll_sms` gives the kernels' shared fixed work), and the per-message
  parts pass through PR 425's figures. **Held out**: PR 425's dispatch (same rows), Ant
  Group's 16-rank sums after its cuBLAS upgrade (H20, dispatch and combine), the LMSYS
  blog's dispatch figure (H100: 0.06 ms of SM time in the unit test, send and receive).
- **Not identified, shown only**: PR 248's "before" rows (4 ranks, 768 tokens); a 16-rank
  run of a Tencent fork over RDMA only (IBGDA also inside the node), printed as sums.
- **Left out**: issue 28's sums (16 H800 over RoCE; the maintainers attribute the 2.7 ms
  dispatch to ranks launching late, i.e. the receive kernel waiting, not working); issue
  208's rows (ranks run with different ``num_max_dispatch_tokens_per_rank``, which the
  thread says the kernels do not support); PR 385's "pr" rows (the PR's own kernel);
  uccl-project/uccl PR 745's p5en rows (H200 over EFA, but UCCL's port of the kernels with
  a CPU proxy, not DeepEP's); issue 576 (H100 against B200 in hook mode, 2 nodes: its
  figures are in an HTML table that the stored thread text does not carry).

The Blackwell fit logs reached their peers over NVLink (the send kernels copy the
messages themselves); the H20 rows reached half of them over RDMA (the NIC moves the
data; the send kernels post work requests), PR 425 all over NVLink.
"""


from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HookLog:
    """One published hook-mode log: per-rank SM time of the four kernels, microseconds
    (None where the log does not give it; ``*_total_us`` where it gives only the sum, the
    format before DeepEP commit 85793dd)."""

    source: str          # repository, issue / PR, rows
    config: str          # what the log says of the run
    tokens: int          # tokens per rank
    top_k: int
    ranks: int
    dispatch_send_us: float | None
    dispatch_recv_us: float | None
    combine_send_us: float | None
    combine_recv_us: float | None
    role: str            # "fit" | "held_out" | "shown" (device not identified)
    transport: str = "nvlink"      # how the peers were reached: nvlink | rdma | mixed
    dispatch_total_us: float | None = None
    combine_total_us: float | None = None
    device: str = ""               # the GPU, as the source names or shows it
    family: str | None = None      # "hopper" | "blackwell"; None: not identified

    def total_us(self, side: str) -> float | None:
        """Send + receive of ``side`` ("dispatch" | "combine"), or None."""
        given = getattr(self, side + "_total_us")
        if given is not None:
            return given
        a, b = getattr(self, side + "_send_us"), getattr(self, side + "_recv_us")
        return None if a is None or b is None else a + b

    @property
    def messages(self) -> int:
        """Messages a rank sends (and receives) per kernel pair: tokens x top-k."""
        return self.tokens * self.top_k


def _mean(*xs: float) -> float:
    return sum(xs) / len(xs)


LOGS: tuple[HookLog, ...] = (
    HookLog("deepseek-ai/DeepEP PR 385, baseline, 128tok 48rank",
            "48 ranks over NVLink only (the PR's '48 rank ... pure nvlink'), test defaults "
            "but the rank count; ranges 28-31 + 7-8 | 31-35 + 9-10 us",
            128, 8, 48, _mean(28, 31), _mean(7, 8), _mean(31, 35), _mean(9, 10), "fit",
            device="GB200 (inferred)", family="blackwell"),
    HookLog("deepseek-ai/DeepEP PR 385, baseline, 768tok 48rank",
            "as above, 768 tokens; ranges 94-104 + 17-20 | 131-137 + 20-22 us",
            768, 8, 48, _mean(94, 104), _mean(17, 20), _mean(131, 137), _mean(20, 22),
            "fit", device="GB200 (inferred)", family="blackwell"),
    HookLog("deepseek-ai/DeepEP PR 385, baseline, 128tok 4rank",
            "4 ranks over NVLink, test defaults; ranges 21-24 + 7-8 | 28-29 + 9-10 us",
            128, 8, 4, _mean(21, 24), _mean(7, 8), _mean(28, 29), _mean(9, 10),
            "held_out", device="GB200 (inferred)", family="blackwell"),
    HookLog("yangwhale/gpu-tpu-pedia gpu/deepep/README.md @9247f5d, rank 7",
            "one B200 node (GKE a4-highgpu-8g), 8 ranks over NVLink, test defaults",
            128, 8, 8, 27.25, 7.71, 32.48, 9.45, "held_out", device="B200",
            family="blackwell"),
    *(HookLog(f"Ant Group Theta, 'DeepEP network optimisation' blog, H20 EP16 table, "
              f"native DeepEP, batch {t}",
              "2 x 8 H20, 4 x 400 Gb/s NICs per node, 16 ranks (8 peers over NVLink, 8 "
              "over RDMA), hidden 7168; the dispatch only", t, 8, 16, s, r, None, None,
              "fit", "mixed", device="H20", family="hopper")
      for t, s, r in ((1, 23.08, 5.41), (8, 13.50, 5.64), (16, 16.31, 5.62),
                      (32, 14.56, 6.00), (48, 18.14, 6.48), (64, 19.85, 6.74),
                      (128, 25.12, 10.59))),
    HookLog("deepseek-ai/DeepEP PR 425, 8-rank rows (ranks 0, 1, 3-7), the combine",
            "8 ranks in one node over NVLink, test defaults",
            128, 8, 8, None, None,
            _mean(38.31, 42.16, 39.19, 39.77, 40.65, 40.65, 39.66),
            _mean(10.20, 10.19, 10.22, 10.13, 10.19, 10.20, 10.14), "fit",
            device="H200 (inferred)", family="hopper"),
    HookLog("deepseek-ai/DeepEP PR 425, 8-rank rows (ranks 0, 1, 3-7), the dispatch",
            "as above (dispatch 203 GB/s)",
            128, 8, 8, _mean(37.38, 36.32, 35.30, 37.21, 36.69, 36.71, 35.38),
            _mean(29.93, 32.89, 35.37, 31.54, 29.78, 30.98, 36.78), None, None,
            "held_out", device="H200 (inferred)", family="hopper"),
    HookLog("Ant Group Theta blog, sums after the cuBLAS upgrade (ranks 0-7 printed)",
            "H20, 16 ranks on 2 nodes, test defaults; sums, the pre-85793dd format",
            128, 8, 16, None, None, None, None, "held_out", "mixed",
            _mean(39.58, 39.45, 39.95, 39.99, 39.26, 40.22, 39.60, 39.82),
            _mean(40.99, 40.79, 40.84, 40.64, 40.62, 41.06, 39.95, 40.91),
            device="H20", family="hopper"),
    #: the LMSYS blog's dispatch SM time in DeepEP's unit test, send and receive ("a
    #: potential of 0.06ms occupying SMs"; LMSYS blog, 2025-05-05, "Dispatch Optimization
    #: Potential"); the blog's cluster is 12 nodes of 8 H100 (its rank count and links for
    #: the unit test are not given)
    HookLog("LMSYS blog, \"0.06ms occupying SMs\" (DeepEP unit test)",
            "H100; DeepEP's test defaults; ranks and links not given", 128, 8, 0,
            None, None, None, None, "held_out", "not given", 60.0, None,
            device="H100", family="hopper"),
    HookLog("deepseek-ai/DeepEP PR 248, 'before', ranks 0, 1, 3",
            "4 ranks over NVLink; 768 tokens (its printed dispatch bandwidth x time: "
            "6,134 FP8 messages = 768 x 8 - 10)",
            768, 8, 4, _mean(67.97, 67.26, 69.99), _mean(19.61, 18.81, 19.07),
            _mean(103.50, 100.97, 99.63), _mean(60.02, 52.82, 47.81), "shown",
            device="not stated"),
    HookLog("public DeepEP test notes of a Tencent fork ('trmt-deepep'; repository not "
            "identified), '2 machines 16 GPUs, IBGDA inside the machine too'",
            "16 ranks on 2 nodes, every peer over RDMA, 128 tokens, hidden 7168, 144 "
            "experts (its buffer size); sums, the pre-85793dd format",
            128, 8, 16, None, None, None, None, "shown", "rdma",
            _mean(34.92, 34.61, 35.23, 34.81, 35.12, 35.65, 35.19, 34.75,
                  35.33, 35.25, 35.61, 35.18, 34.27, 35.14, 35.09, 35.03),
            _mean(42.56, 44.02, 45.39, 44.74, 44.52, 45.86, 44.39, 43.49,
                  44.52, 43.35, 43.62, 44.15, 42.30, 43.63, 43.17, 44.39),
            device="not stated"),
)

#: the device families with logs, in the order the results page prints them
FAMILIES = ("hopper", "blackwell")


def fit_logs(family: str) -> tuple[HookLog, ...]:
    """The logs that set ``family``'s rates."""
    return tuple(g for g in LOGS if g.role == "fit" and g.family == family)


def held_out_logs(family: str) -> tuple[HookLog, ...]:
    """The logs ``family``'s rates are checked on."""
    return tuple(g for g in LOGS if g.role == "held_out" and g.family == family)


def shown_logs() -> tuple[HookLog, ...]:
    """Logs whose device is not identified: printed against every family's rule."""
    return tuple(g for g in LOGS if g.family is None)
