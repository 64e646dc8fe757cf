"""DualPipe(V)'s pipeline messages on the fast path as the reference issues them
(``schedule.pp_comm: reference``): every position walks its events of
:func:`moesim.schedule.dualpipe_comm.reference_program` (deepseek-ai/DualPipe
``dualpipe/dualpipe.py`` at 3da1bbea: ``append_isend`` / ``append_irecv`` queue the
messages, ``_commit_and_wait_comm`` issues them with ``dist.batch_isend_irecv`` and waits
for every request, sends included), as the exact builder lays them out
(:meth:`moesim.program.dualpipe_build.DualPipeProgram._commit`):

- a ``compute`` event runs the item with no receive or send of its own
  (:class:`moesim.engine.fast.dual.DualChain` with ``ref``);
- a ``wait`` posts the queued messages at the position's time; a message's transfer
  starts once both sides have posted it (NCCL's p2p rendezvous) and its sender's
  previous transfer is delivered (the ``pp`` stream sends one message at a time, in
  program order), and takes the eager send's price (``net.p2p_time``, alone on its
  path, or the half share beside a gradient bucket's ring). It is not held for the
  all-to-alls of :mod:`moesim.engine.fast.flow_a2a` as an eager send is: both positions
  wait in their commits from their post to its delivery and a chunk ends after its
  last all-to-all, so none of either group's runs beside it (the exact engine's flow
  network gives it its time alone too, ``tests/test_dualpipe_pp_comm.py``);
- the position then waits for every message of the batch in queue order, each wait a
  ``bubble`` naming the peer position, so the whole commit counts as bubble.
"""

from __future__ import annotations

import numpy as np

from moesim.schedule.dualpipe_comm import reference_program


def schedule_commits(ch, progress):
    """Run every position's reference events on the chain ``ch`` (a ``DualChain`` with
    ``ref``); returns ``ch``. Raises RuntimeError on a deadlock."""
    d = ch.d
    progs = [reference_program(d, s) for s in range(d.ranks)]
    posted: dict[tuple, np.ndarray] = {}
    done: dict = {}                               # Transfer -> delivery per lane
    pending: list[list] = [[] for _ in progs]     # sends not yet timed, in program order
    nic = [np.zeros(ch.n) for _ in progs]          # delivery of the position's last send
    pc = [0] * len(progs)
    queue: list[list[tuple]] = [[] for _ in progs]
    issued = [False] * len(progs)

    def resolve(r: int) -> None:
        q = pending[r]
        while q and ("recv", q[0]) in posted:
            m = q.pop(0)
            a = np.maximum(np.maximum(posted[("send", m)], posted[("recv", m)]), nic[r])
            nic[r] = done[m] = _send(ch, r, m, a)

    left = sum(len(p) for p in progs)
    while left:
        moved = False
        for s, prog in enumerate(progs):
            while pc[s] < len(prog):
                ev = prog[pc[s]]
                if ev[0] == "compute":
                    ch.run(s, ev[1])
                    if progress is not None:
                        progress("items", 1)
                elif ev[0] != "wait":
                    queue[s].append(ev)
                else:
                    if not issued[s]:
                        for role, m in queue[s]:
                            posted[(role, m)] = ch.t[s].copy()
                            if role == "send":
                                pending[s].append(m)
                        issued[s] = True
                        resolve(s)
                        for role, m in queue[s]:
                            if role == "recv" and ("send", m) in posted:
                                resolve(m.src)
                    if any(m not in done for _, m in queue[s]):
                        break
                    _commit(ch, s, queue[s], done)
                    queue[s], issued[s] = [], False
                pc[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError(f"fast path: DualPipe deadlock at reference events {pc}")
    return ch


def _layer(ch, role: str, m) -> int:
    """The layer a message's spans carry, as the eager receive and send."""
    st = m.stage if role == "recv" else m.stage - 1 if m.what == "act" else m.stage + 1
    layers = list(ch.c.chunks[st])
    first = m.what == ("act" if role == "recv" else "grad")
    return (layers[0] if first else layers[-1]) if layers else -1


def _commit(ch, s: int, batch: list[tuple], done: dict) -> None:
    """Position ``s`` waits for each message of its batch, in queue order."""
    for role, m in batch:
        phase = "fwd" if m.what == "act" else "bwd"
        ch._wait(s, done[m], f"{phase}.{role}", m.src if role == "recv" else m.dst,
                 _layer(ch, role, m), m.mb, phase)
    ch.out[s].end = ch.t[s].copy()


def _send(ch, s: int, m, a: np.ndarray) -> np.ndarray:
    """Time message ``m`` from position ``s`` starting at ``a``; its delivery."""
    c = ch.c
    phase = "fwd" if m.what == "act" else "bwd"
    src, dst = ch.groups[s], ch.groups[m.dst]
    # as the eager send (Chain._send): a backward send beside the gradient buckets'
    # ring flows gets its max-min share
    shared = phase == "bwd" and c.grad_share and ch.out[s].grads
    skey = (src, dst, bool(shared))
    dur = ch._send_d.get(skey)
    if dur is None:
        dur = ch._send_d[skey] = np.array(
            [c.net.p2p_time(x, y, c.act_bytes, c.send_share(x, y) if shared else 1.0)
             for x, y in zip(src, dst, strict=True)])
    c.links.sends(src, dst, c.act_bytes)
    end = a + dur
    ch.out[s].send_end = end
    ch._span(s, "pp", f"{phase}.send", a, end, _layer(ch, "send", m), m.mb, phase,
             stream="pp", bytes=c.act_bytes)
    return end
