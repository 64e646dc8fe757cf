"""The campaign file: failure rates, recovery costs, checkpoints, spares and the failure
domain of a training run over days. Its own small schema (not a scenario section); every
field is optional and defaults to :mod:`moesim.campaign.defaults` (the Llama 3 405B
table). A bad value is one :class:`~moesim.errors.InputError` line naming the file, the
field and what was expected.

.. code-block:: yaml

    name: llama3-405b
    cluster: {gpus: 16384, gpus_per_node: 8, dp: 128}   # else the scenario's
    step: {seconds: 5.9, tokens: 16777216}              # else simulated (--step-s wins)
    failures:
      observed: {days: 54, gpus: 16384, gpus_per_node: 8}  # the counts' denominators
      causes: {faulty_gpu: {count: 148, per: gpu}, ...}    # or {rate_per_day: R, per: gpu}
      planned: {count: 47}
    recovery: {detect_hang_s: 600, detect_crash_s: 10, relaunch_s: 120, nccl_init_s: 30,
               replace_s: 600}
    checkpoint: {interval_s: 1800, mode: sync, target: storage, bytes: 5.67TB}
    storage: {write_GBps: 2000, read_GBps: 2000, capacity: 240PB}
    spares: {nodes: 0, swap_s: 30, repair_days: 3}
    stragglers: {rate_per_day: 0.001, slowdown: 1.5, duration_s: 3600}   # per node; none
    domain: job                 # job | replica (a node failure restarts its DP replica)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.campaign import defaults as D
from moesim.errors import InputError
from moesim.units import parse_bytes

DAY = 86400.0
MODES = ("sync", "async")
TARGETS = ("storage", "memory")
DOMAINS = ("job", "replica")
PER = ("gpu", "node", "job")
DETECT = ("crash", "hang")
SCOPES = ("node", "job")
#: the shipped campaign files (``--campaign llama3-405b`` names one)
CAMPAIGN_DIR = Path(__file__).resolve().parents[2] / "campaigns"
SECTIONS = ("name", "cluster", "step", "failures", "recovery", "checkpoint", "storage",
            "spares", "domain", "stragglers")


@dataclass(frozen=True)
class Cause:
    """One root cause: ``rate`` interruptions per unit (``per``) per second."""

    name: str
    rate: float
    per: str
    detect: str = "crash"
    scope: str = "node"
    planned: bool = False
    slow_s: float = 0.0     # a straggler: training seconds it costs (0: an interruption)


@dataclass(frozen=True)
class Campaign:
    name: str = "llama3-rates"      # the defaults: Llama 3 405B's rates
    source: str = "<defaults>"
    gpus: int | None = None
    gpus_per_node: int | None = None
    dp: int | None = None
    step_s: float | None = None
    step_tokens: float | None = None
    causes: tuple[Cause, ...] = ()
    detect_hang_s: float = D.DETECT_HANG_S
    detect_crash_s: float = D.DETECT_CRASH_S
    relaunch_s: float = D.RELAUNCH_S
    nccl_init_s: float = D.NCCL_INIT_S
    replace_s: float = D.REPLACE_S
    interval_s: float = D.INTERVAL_S
    mode: str = "sync"
    target: str = "storage"
    ckpt_bytes: float | None = None
    host_copy_Bps: float = D.HOST_COPY_BPS
    peer_Bps: float = D.PEER_BPS
    write_Bps: float = D.STORAGE_BPS
    read_Bps: float = D.STORAGE_BPS
    capacity_B: float = D.STORAGE_CAPACITY_B
    spare_nodes: int = 0
    swap_s: float = D.SPARE_SWAP_S
    repair_s: float = D.REPAIR_DAYS * DAY
    domain: str = "job"
    notes: dict = field(default_factory=dict)

    def with_(self, **kw: Any) -> Campaign:
        from dataclasses import replace
        return replace(self, **kw)


def _mapping(src: str, where: str, v: Any, keys: tuple[str, ...]) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(src, where, f"a mapping with keys {', '.join(keys)}", v)
    for k in v:
        if k not in keys:
            raise InputError(src, f"{where}.{k}" if where else str(k),
                             f"one of the keys {', '.join(keys)}", k)
    return v


def positive(src: str, where: str, v: Any, *, zero_ok: bool = False,
             integer: bool = False, upto: float = math.inf) -> float:
    """A finite number > 0 (>= 0 with ``zero_ok``), at most ``upto``; else InputError."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        and (v >= 0 if zero_ok else v > 0) and v <= upto and (not integer or v == int(v))
    if not ok:
        what = "an integer" if integer else "a number"
        bound = ">= 0" if zero_ok else "> 0"
        extra = f" and <= {upto:g}" if math.isfinite(upto) else ""
        raise InputError(src, where, f"{what} {bound}{extra}", v)
    return int(v) if integer else float(v)


def _size(src: str, where: str, v: Any) -> float:
    try:
        b = parse_bytes(v)
    except (InputError, ValueError, TypeError):
        raise InputError(src, where, "a size > 0 like 5.67TB or 4GiB", v) from None
    if not b > 0:
        raise InputError(src, where, "a size > 0 like 5.67TB or 4GiB", v)
    return b


def _choice(src: str, where: str, v: Any, allowed: tuple[str, ...]) -> str:
    if v not in allowed:
        raise InputError(src, where, f"one of {', '.join(allowed)}", v)
    return v


def default_causes(observed: dict | None = None) -> tuple[Cause, ...]:
    """The Llama 3 table as rates per unit per second."""
    obs = dict(D.OBSERVED, **(observed or {}))
    out = [Cause(n, c / (obs["days"] * DAY * _units(per, obs["gpus"], obs["gpus_per_node"])),
                 per, det, scope) for n, (c, per, det, scope) in D.LLAMA3_CAUSES.items()]
    out.append(Cause("planned_maintenance", D.LLAMA3_PLANNED / (obs["days"] * DAY), "job",
                     "crash", "job", planned=True))
    return tuple(out)


def _units(per: str, gpus: float, gpus_per_node: float) -> float:
    return {"gpu": gpus, "node": gpus / gpus_per_node, "job": 1.0}[per]


def _causes(src: str, fail: dict) -> tuple[Cause, ...]:
    obs_in = _mapping(src, "failures.observed", fail.get("observed"),
                      ("days", "gpus", "gpus_per_node"))
    obs = dict(D.OBSERVED)
    for k, v in obs_in.items():
        obs[k] = positive(src, f"failures.observed.{k}", v, integer=k != "days")
    if "causes" not in fail and "planned" not in fail:
        return default_causes(obs)
    found = []
    items = fail.get("causes") or {}
    if not isinstance(items, dict):
        raise InputError(src, "failures.causes", "a mapping of cause name -> {count or "
                         "rate_per_day, per}", items)
    keys = ("count", "rate_per_day", "per", "detect", "scope")
    for name, c in items.items():
        where = f"failures.causes.{name}"
        c = _mapping(src, where, c, keys)
        per = _choice(src, f"{where}.per", c.get("per", "gpu"), PER)
        found.append(_one(src, where, str(name), c, per, obs, planned=False))
    if fail.get("planned") is not None:
        c = _mapping(src, "failures.planned", fail["planned"], keys)
        per = _choice(src, "failures.planned.per", c.get("per", "job"), PER)
        found.append(_one(src, "failures.planned", "planned_maintenance", c, per, obs,
                          planned=True))
    if not found:
        raise InputError(src, "failures.causes", "at least one cause", items)
    return tuple(found)


def _one(src: str, where: str, name: str, c: dict, per: str, obs: dict, *,
         planned: bool) -> Cause:
    if ("count" in c) == ("rate_per_day" in c):
        raise InputError(src, where, "either count (interruptions in failures.observed.days "
                         "on the observed cluster) or rate_per_day (per unit), one of them",
                         sorted(c))
    if "count" in c:
        n = positive(src, f"{where}.count", c["count"])
        rate = n / (obs["days"] * DAY * _units(per, obs["gpus"], obs["gpus_per_node"]))
    else:
        rate = positive(src, f"{where}.rate_per_day", c["rate_per_day"]) / DAY
    return Cause(name, rate, per, _choice(src, f"{where}.detect", c.get("detect", "crash"),
                                          DETECT),
                 _choice(src, f"{where}.scope", c.get("scope", "job" if planned else "node"),
                         SCOPES), planned)


def find_campaign(path: str | Path) -> Path:
    """A campaign file, or a shipped campaign's name (``campaigns/<name>.yaml``)."""
    from moesim.paths import shown

    p = Path(path)
    if p.is_file():
        return p
    preset = CAMPAIGN_DIR / f"{p.name}.yaml"
    if p.suffix == "" and p.parent == Path(".") and preset.is_file():
        return shown(preset)
    shipped = sorted(q.stem for q in CAMPAIGN_DIR.glob("*.yaml"))
    raise InputError(str(path), "--campaign", f"an existing campaign file or one of {shipped}",
                     "a directory" if p.is_dir() else "no such file")


def read_campaign(path: str | Path | None) -> Campaign:
    """The campaign file at ``path`` (None: the defaults), checked."""
    if path is None:
        return Campaign(causes=default_causes())
    from moesim.yamlio import read_yaml

    path = find_campaign(path)

    src = str(path)
    data = _mapping(src, "", read_yaml(path, f"a mapping of sections ({', '.join(SECTIONS)})"),
                    SECTIONS)
    kw: dict[str, Any] = {"source": src, "name": str(data.get("name", Path(src).stem))}
    cl = _mapping(src, "cluster", data.get("cluster"), ("gpus", "gpus_per_node", "dp"))
    for k in ("gpus", "gpus_per_node", "dp"):
        if k in cl:
            kw[k] = positive(src, f"cluster.{k}", cl[k], integer=True)
    st = _mapping(src, "step", data.get("step"), ("seconds", "tokens"))
    if "seconds" in st:
        kw["step_s"] = positive(src, "step.seconds", st["seconds"])
    if "tokens" in st:
        kw["step_tokens"] = positive(src, "step.tokens", st["tokens"])
    kw["causes"] = _causes(src, _mapping(src, "failures", data.get("failures"),
                                         ("observed", "causes", "planned")))
    rec = _mapping(src, "recovery", data.get("recovery"),
                   ("detect_hang_s", "detect_crash_s", "relaunch_s", "nccl_init_s",
                    "replace_s"))
    for k, v in rec.items():
        kw[k] = positive(src, f"recovery.{k}", v, zero_ok=True)
    ck = _mapping(src, "checkpoint", data.get("checkpoint"),
                  ("interval_s", "mode", "target", "bytes", "host_copy_GBps", "peer_GBps"))
    if "interval_s" in ck:
        kw["interval_s"] = positive(src, "checkpoint.interval_s", ck["interval_s"])
    if "mode" in ck:
        kw["mode"] = _choice(src, "checkpoint.mode", ck["mode"], MODES)
    if "target" in ck:
        kw["target"] = _choice(src, "checkpoint.target", ck["target"], TARGETS)
    if "bytes" in ck:
        kw["ckpt_bytes"] = _size(src, "checkpoint.bytes", ck["bytes"])
    for k, name in (("host_copy_GBps", "host_copy_Bps"), ("peer_GBps", "peer_Bps")):
        if k in ck:
            kw[name] = positive(src, f"checkpoint.{k}", ck[k]) * 1e9
    sto = _mapping(src, "storage", data.get("storage"), ("write_GBps", "read_GBps", "capacity"))
    for k, name in (("write_GBps", "write_Bps"), ("read_GBps", "read_Bps")):
        if k in sto:
            kw[name] = positive(src, f"storage.{k}", sto[k]) * 1e9
    if "capacity" in sto:
        kw["capacity_B"] = _size(src, "storage.capacity", sto["capacity"])
    sp = _mapping(src, "spares", data.get("spares"), ("nodes", "swap_s", "repair_days"))
    if "nodes" in sp:
        kw["spare_nodes"] = positive(src, "spares.nodes", sp["nodes"], zero_ok=True,
                                     integer=True)
    if "swap_s" in sp:
        kw["swap_s"] = positive(src, "spares.swap_s", sp["swap_s"], zero_ok=True)
    if "repair_days" in sp:
        kw["repair_s"] = positive(src, "spares.repair_days", sp["repair_days"]) * DAY
    if "domain" in data:
        kw["domain"] = _choice(src, "domain", data["domain"], DOMAINS)
    if data.get("stragglers") is not None:
        kw["causes"] = (*kw["causes"], _straggler(src, data["stragglers"]))
    return Campaign(**kw)


def _straggler(src: str, v: Any) -> Cause:
    """A slow node: the synchronous job runs at 1/slowdown for duration_s (no restart),
    i.e. it loses duration_s·(1 − 1/slowdown) of training."""
    st = _mapping(src, "stragglers", v, ("rate_per_day", "slowdown", "duration_s"))
    for k in ("rate_per_day", "slowdown", "duration_s"):
        if k not in st:
            raise InputError(src, f"stragglers.{k}", "a number > 0 (rate_per_day per node, "
                             "slowdown > 1, duration_s)", None)
    rate = positive(src, "stragglers.rate_per_day", st["rate_per_day"]) / DAY
    slow = positive(src, "stragglers.slowdown", st["slowdown"])
    if slow <= 1:
        raise InputError(src, "stragglers.slowdown", "a factor > 1 (the step takes that "
                         "many times longer)", slow)
    dur = positive(src, "stragglers.duration_s", st["duration_s"])
    return Cause("straggler", rate, "node", "crash", "job", slow_s=dur * (1 - 1 / slow))
