"""The campaign's shipped defaults, each with its source.

Failure causes: the Llama 3 405B pre-training table (Llama Team, "The Llama 3 Herd of
Models", arXiv 2407.21783, §3.3.4, Table 5): 466 job interruptions in a 54-day snapshot on
16,384 H100 GPUs (2,048 nodes of 8), 47 planned and 419 unexpected, by root cause. Each
count becomes a rate per unit (GPU, node or job) per day: count / (54 · units observed),
so a cluster of another size scales it. ``per``: a GPU-side cause scales with GPUs, a
host or network cause and a collective timeout with nodes (any node's rank may hang),
a software bug, a dependency and planned maintenance with the job (one per job).
``detect``: ``crash`` when the process dies (the launcher sees it at once), ``hang``
when only the collective watchdog notices (NCCL watchdog timeouts, a switch or cable).
``scope``: ``node`` when a smaller failure domain could recover from it alone (the
faulty GPU's DP replica), ``job`` when it stops the whole job.
"""

from __future__ import annotations

#: the table's denominators (arXiv 2407.21783 §3.3.4: 54 days, 16,384 GPUs, 8 per server)
OBSERVED = {"days": 54.0, "gpus": 16384, "gpus_per_node": 8}

#: cause -> (count in 54 days, per, detect, scope); Table 5 of arXiv 2407.21783
LLAMA3_CAUSES: dict[str, tuple[int, str, str, str]] = {
    "faulty_gpu": (148, "gpu", "crash", "node"),
    "gpu_hbm3": (72, "gpu", "crash", "node"),
    "software_bug": (54, "job", "crash", "job"),
    "network_switch_cable": (35, "node", "hang", "job"),
    "host_maintenance": (32, "node", "crash", "node"),
    "gpu_sram": (19, "gpu", "crash", "node"),
    "gpu_system_processor": (17, "gpu", "crash", "node"),
    "nic": (7, "node", "hang", "node"),
    "nccl_watchdog_timeout": (7, "node", "hang", "job"),
    "silent_data_corruption": (6, "gpu", "crash", "node"),
    "gpu_thermal_interface_sensor": (6, "gpu", "crash", "node"),
    "ssd": (3, "node", "crash", "node"),
    "power_supply": (3, "node", "crash", "node"),
    "server_chassis": (2, "node", "crash", "node"),
    "io_expansion_board": (2, "node", "crash", "node"),
    "dependency": (2, "job", "crash", "job"),
    "cpu": (2, "node", "crash", "node"),
    "system_memory": (2, "node", "crash", "node"),
}
#: planned interruptions (automated maintenance, firmware, configuration): 47 in 54 days
LLAMA3_PLANNED = 47
#: Meta's figure for the run: "more than 90% effective training time" (§3.3.4)
LLAMA3_ETTR = 0.90

# ------------------------------------------------------------------ costs (seconds, B/s)
#: PyTorch's default collective timeout of ProcessGroupNCCL, 10 minutes
#: (pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp,
#: kProcessGroupNCCLDefaultTimeout = 10 * 60 * 1000 ms, which torch/distributed/constants.py
#: exposes as default_pg_nccl_timeout): a hang is seen after it
DETECT_HANG_S = 600.0
#: a crashed process is seen by the launcher within seconds: an assumption
DETECT_CRASH_S = 10.0
#: scheduler relaunch, container start, imports, data loader: an assumption
RELAUNCH_S = 120.0
#: NCCL communicator set-up at more than 10,000 GPUs "under 30 s" after MegaScale's
#: optimisations (Jiang et al., NSDI'24, arXiv 2402.15627, §3.5)
NCCL_INIT_S = 30.0
#: a cold replacement node (allocated, health-checked, image pulled): an assumption
REPLACE_S = 600.0
#: a hot spare node (booted, checked, waiting) joins: an assumption
SPARE_SWAP_S = 30.0
#: days until a failed node returns to the spare pool: an assumption
REPAIR_DAYS = 3.0
#: Tectonic, Meta's storage for Llama 3: 240 PB, 2 TB/s sustained, 7 TB/s peak
#: (arXiv 2407.21783 §3.3.1); the sustained rate for writes and reads
STORAGE_BPS = 2e12
STORAGE_CAPACITY_B = 240e15
#: device-to-host copy of a GPU's shard: PCIe Gen5 x16, 64 GB/s per direction
#: (NVIDIA H100 datasheet: PCIe Gen5 128 GB/s bidirectional)
HOST_COPY_BPS = 64e9
#: a GPU's share of the inter-node network for in-memory replicas (Gemini): one
#: 400 Gb/s NIC per GPU (arXiv 2407.21783 §3.3.1: 400 Gbps between GPUs) = 50 GB/s
PEER_BPS = 50e9
#: checkpoint interval when the campaign file gives none: 30 minutes, an assumption
INTERVAL_S = 1800.0
