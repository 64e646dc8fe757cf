"""The pipeline communication of DualPipe(V) as the reference issues it, and a
stage-time run that honours it (pure).

deepseek-ai/DualPipe (``dualpipe/dualpipe.py`` at 3da1bbea; ``dualpipe/comm.py``
``append_isend`` / ``append_irecv``) queues receives and sends (``_recv_forward``, ``_send_forward``,
``_recv_backward``, ``_send_backward``) and issues the queue with
``dist.batch_isend_irecv`` in ``_commit_and_wait_comm``, then waits for all of it,
before every compute chunk and every weight chunk. A receive is often queued one
chunk early (step 2 queues the next F0's input before running F1; step 3 the F1
input before its W), and a send leaves at the rank's next commit, not when its
chunk ends. :func:`reference_program` lists, per rank, these events with each
message resolved to a :class:`~moesim.schedule.dualpipe.Transfer`;
:func:`run_reference` runs them (each message taking a fixed time, or free), a
batch completing when every message in it has been delivered, a message leaving
once both sides have posted it (or, with ``eager_sends``, once its sender has).
``schedule.pp_comm: reference`` runs the same events in both engines
(:mod:`moesim.program.dualpipe_build`, :mod:`moesim.engine.fast.dual_ref`).
"""

from __future__ import annotations

from moesim.schedule.dualpipe import DualOrder, Item, Transfer, recvs, reference_steps, sends
from moesim.schedule.evaluate import Durations, Timeline

Event = tuple  # ("recv" | "send", Transfer) | ("wait",) | ("compute", Item)

#: schedule.pp_comm: ``eager`` (each send leaves when its chunk ends, asynchronously) |
#: ``reference`` (this module's program: queued, posted at the next commit, waited for)
PP_COMMS = ("eager", "reference")


def reference_program(order: DualOrder, rank: int) -> list[Event]:
    """The rank's events in issue order. Receives and sends the reference skips (the
    first stage's input, the last stage's output, DualPipeV's turn on the last rank)
    are left out; each message is matched to its chunk first-in first-out per phase,
    as the reference's ``current_*_chunk_id`` counters do."""
    steps, stage_of = reference_steps(order, rank)
    items = iter(order.items[rank])
    fwd: tuple[list, list] = ([], [])      # per local phase: forwards and backwards run
    bwd: tuple[list, list] = ([], [])
    for it in order.items[rank]:
        for kind, mb, s in it.parts():
            if kind in "FB":
                (fwd if kind == "F" else bwd)[stage_of.index(s)].append((mb, s))
    ptr = {(k, ph): 0 for k in ("rF", "sF", "rB", "sB") for ph in (0, 1)}
    out: list[Event] = []
    for st in steps:
        k = st[0]
        if k == "wait":
            out.append(("wait",))
            continue
        if k not in ("rF", "sF", "rB", "sB"):
            out.append(("compute", next(items)))
            continue
        ph = st[1]
        i = ptr[(k, ph)]
        ptr[(k, ph)] += 1
        mb, s = (fwd if k[1] == "F" else bwd)[ph][i]
        probe = Item("F" if k[1] == "F" else "B", mb, s)
        msgs = (recvs if k[0] == "r" else sends)(order, rank, probe)
        out += [("recv" if k[0] == "r" else "send", m) for m in msgs]
    return out


def run_reference(order: DualOrder, t: Durations, eager_sends: bool = False,
                  transfer: float = 0.0) -> Timeline:
    """Run every rank's :func:`reference_program`, each message taking ``transfer``
    (0: communication free). A rank's ``wait`` posts its queued messages at its current
    time; a message's transfer starts once both sides have posted it (NCCL's p2p
    rendezvous; with ``eager_sends`` once its sender has) and once the sender's previous
    transfer has ended (one message at a time per sender, in program order, as the
    engines' ``pp`` stream); the wait completes when every message it posted is
    delivered (with ``eager_sends``, its receives only); a compute item then runs for
    its duration. Raises ValueError on a deadlock or a message without a partner."""
    progs = [reference_program(order, r) for r in range(order.ranks)]
    posted: dict[tuple[str, Transfer], float] = {}
    done: dict[Transfer, float] = {}                 # delivery of each resolved message
    pending: list[list[Transfer]] = [[] for _ in progs]   # sends not yet resolved, in order
    nic = [0.0] * len(progs)                         # end of the rank's last transfer
    pc = [0] * len(progs)
    now = [0.0] * len(progs)
    queue: list[list[tuple[str, Transfer]]] = [[] for _ in progs]
    issued = [False] * len(progs)
    busy: list[list] = [[] for _ in progs]
    left = sum(len(p) for p in progs)

    def resolve(r: int) -> None:
        q = pending[r]
        while q:
            m = q[0]
            a = max(posted[("send", m)], nic[r])
            if not eager_sends:
                if ("recv", m) not in posted:
                    return
                a = max(a, posted[("recv", m)])
            nic[r] = done[m] = a + transfer
            q.pop(0)

    while left:
        moved = False
        for r, prog in enumerate(progs):
            while pc[r] < len(prog):
                ev = prog[pc[r]]
                if ev[0] in ("recv", "send"):
                    queue[r].append((ev[0], ev[1]))
                elif ev[0] == "compute":
                    end = now[r] + t.of(ev[1].kind)
                    busy[r].append((now[r], end, ev[1]))
                    now[r] = end
                else:
                    if not issued[r]:
                        for key in queue[r]:
                            if key in posted:
                                raise ValueError(f"rank {r} posts {key} twice")
                            posted[key] = now[r]
                            if key[0] == "send":
                                pending[r].append(key[1])
                        issued[r] = True
                        resolve(r)
                        for role, m in queue[r]:
                            if role == "recv" and ("send", m) in posted:
                                resolve(m.src)
                    need = [m for role, m in queue[r] if role == "recv" or not eager_sends]
                    if any(m not in done for m in need):
                        break
                    now[r] = max([now[r]] + [done[m] for m in need])
                    queue[r], issued[r] = [], False
                pc[r] += 1
                left -= 1
                moved = True
        if not moved:
            stuck = {r: str(progs[r][pc[r]]) for r in range(len(progs)) if pc[r] < len(progs[r])}
            raise ValueError(f"reference program deadlocks; ranks wait at {stuck}")
    unmatched = [k for k in posted if (("send" if k[0] == "recv" else "recv"), k[1]) not in posted]
    if unmatched:
        raise ValueError(f"messages without a partner: {unmatched[:3]}")
    return Timeline(tuple(tuple(b) for b in busy), max(now, default=0.0))
