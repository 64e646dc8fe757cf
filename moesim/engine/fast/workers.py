"""The fast path's chains run in parallel processes, with the serial loop's answers
(pure: no simpy).

A step's chains (:mod:`moesim.engine.fast.pipeline`) are independent list schedules.
They share only what they count:

- the token routing's expert statistics, added per routed micro-batch in chain order
  (:meth:`moesim.program.token_routing.TokenRouting.account`; the load-balancing loss is a
  float sum, so its order matters);
- the per-link bytes (:class:`moesim.engine.fast.links.LinkBytes`);
- the route records each chain keeps for its rerun (:mod:`moesim.engine.fast.stash`).

With ``workers`` > 1 the chains are cut into contiguous blocks. The first block runs in
this process; every other one in a process forked before any chain runs. A forked
process journals its accounting calls and counts its link bytes from zero, then sends
its chains' outputs, the journal and the counts back. They are merged here in chain
order: the journal is replayed call by call and the link counts are added only while
every count is a whole number of bytes below 2**53 in all (then every sum is exact in
any order: :meth:`LinkBytes.merge`). So the summary is byte for byte the serial loop's
(tests/test_fast_workers.py). A block that cannot be merged exactly (a fractional byte
count: TP all-reduces, phased all-to-alls) or whose process failed is run again here;
nothing else changes. A forked process keeps its chains' route records and reruns
those chains for their spans (:func:`moesim.engine.fast.spans.choose_span_ranks`).

Parallel runs need ``fork`` (Linux; macOS has it but Python does not fork there by
default, so ``auto`` stays serial) and chains whose all-to-alls are timed without the
flow network's clock (:meth:`FastNetwork.stateless`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable

#: ``auto`` forks only for steps of at least this many routed micro-batch records
#: (chains × MoE layers × micro-batches; deepseek-v3-2048 has 13,920 at about 1.5 ms
#: each, docs/studies/fast-path-speed.md): the small steps of tests and what-if loops,
#: a second or less, stay in one process
MIN_RECORDS = 2000
#: processes ``auto`` uses at most (the brief's machine has two cores)
AUTO_MAX = 2


def workers_for(setting: int | None, n_chains: int, records: int, stateless: bool) -> int:
    """Processes to use: ``setting`` (``engine.workers``; None = auto: up to
    :data:`AUTO_MAX`, the CPUs this process may use, on Linux, for steps of at least
    :data:`MIN_RECORDS` records), at most one per chain; 1 where forking is not possible
    or the chains share the flow network's clock."""
    if (not stateless or n_chains < 2 or "fork" not in mp.get_all_start_methods()
            or mp.current_process().daemon       # e.g. a sweep's worker: no children
            or threading.active_count() > 1):    # forking a threaded process may deadlock
        return 1
    if setting is None:
        if not sys.platform.startswith("linux") or records < MIN_RECORDS:
            return 1
        setting = min(AUTO_MAX, len(os.sched_getaffinity(0)))
    return max(1, min(int(setting), n_chains))


def blocks(n: int, w: int) -> list[list[int]]:
    """``range(n)`` cut into ``w`` contiguous blocks, the first ones one longer."""
    q, r = divmod(n, w)
    out, i = [], 0
    for k in range(w):
        size = q + (k < r)
        out.append(list(range(i, i + size)))
        i += size
    return [x for x in out if x]


class ChainPool:
    """Runs the chains ``0 .. n-1`` with ``run(ci, progress, rerun, span_pos)`` (which
    returns the chain) in ``workers`` processes. ``b`` (the builder) and ``links`` are
    the counters the chains share; ``progress`` as the engines' protocol."""

    def __init__(self, run: Callable, n: int, workers: int, b, links, progress=None) -> None:
        self.run, self.b, self.links, self.progress = run, b, links, progress
        parts = blocks(n, workers)
        self.mine = parts[0]
        self.children: list[_Child] = []
        if len(parts) > 1:
            ctx = mp.get_context("fork")
            with warnings.catch_warnings():   # Python >= 3.12 warns on fork with threads
                warnings.simplefilter("ignore", DeprecationWarning)
                try:
                    for part in parts[1:]:
                        self.children.append(_Child(ctx, self, part))
                except (OSError, AssertionError, ValueError):    # cannot fork here: serial
                    self.close()
                    self.children, self.mine = [], list(range(n))
        self.owner: dict[int, _Child | None] = {ci: None for ci in self.mine}
        self.merged: list[int] = []    # chains run by another process and merged here

    def _pump(self) -> None:
        """Pass the forked processes' progress on."""
        if self.progress is None:
            return
        for c in self.children:
            c.pump(self.progress)

    def _prog(self, kind: str, n: int) -> None:
        self.progress(kind, n)
        self._pump()

    def first_runs(self) -> list[tuple]:
        """Per chain in order, (stage outputs, spans) of its first run; every shared
        counter as after the serial loop."""
        prog = self._prog if self.progress is not None else None
        got: dict[int, tuple] = {}
        for ci in self.mine:
            ch = self.run(ci, prog)
            got[ci] = (ch.out, ch.spans)
        for c in self.children:
            msg = c.receive(self._pump)
            if (msg is not None and msg[0] == "done" and self.links.merge(msg[4])):
                for entry in msg[2]:
                    self.b.routes.account(*entry)
                self.b.routes.counted |= msg[3]
                for ci, out, spans in msg[1]:
                    got[ci] = (out, spans)
                    self.owner[ci] = c
                    self.merged.append(ci)
            else:                      # run here, after the blocks before it
                if msg is None or msg[0] == "error":    # merge refusals are expected: quiet
                    why = "ended" if msg is None else msg[1].strip().splitlines()[-1]
                    print(f"moesim: a chain worker failed ({why}); its chains run here "
                          "instead (same results)", file=sys.stderr)
                c.close()
                redo = _Skip(prog, c.seen) if prog is not None else None
                for ci in c.block:
                    ch = self.run(ci, redo)
                    got[ci] = (ch.out, ch.spans)
                    self.owner[ci] = None
        return [got[ci] for ci in sorted(got)]

    def reruns(self, todo: list[tuple[int, list]]) -> list[list]:
        """Spans of every (chain, span positions) of ``todo`` run again (in that order),
        each by the process that holds its route records."""
        asked: dict[_Child, list[int]] = {}
        for i, (ci, _) in enumerate(todo):
            c = self.owner.get(ci)
            if c is not None and c.alive:
                asked.setdefault(c, []).append(i)
        for c, idx in asked.items():
            c.send(("rerun", [todo[i] for i in idx]))
        out: list[list | None] = [None] * len(todo)
        prog = self._prog if self.progress is not None else None
        remote = {i for idx in asked.values() for i in idx}
        for i, (ci, sp) in enumerate(todo):
            if i not in remote:
                out[i] = self.run(ci, prog, True, sp).spans
        for c, idx in asked.items():
            msg = c.receive(self._pump)
            if msg is not None and msg[0] == "spans":
                for i, spans in zip(idx, msg[1], strict=True):
                    out[i] = spans
            else:
                c.close()
                for i in idx:
                    out[i] = self.run(todo[i][0], prog, True, todo[i][1]).spans
        self._pump()
        return out

    def close(self) -> None:
        for c in self.children:
            c.close()


class _Child:
    """One forked process running ``block`` (its chains) for ``pool``."""

    def __init__(self, ctx, pool: ChainPool, block: list[int]) -> None:
        self.block = block
        self.counter = ctx.Value("q", 0, lock=False)
        self.seen = 0
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, daemon=True,
                                args=(pool, block, theirs, self.counter, self.conn))
        self.proc.start()
        theirs.close()
        self.alive = True

    def pump(self, progress) -> None:
        if not self.alive:
            return
        n = int(self.counter.value)
        if n > self.seen:
            progress("items", n - self.seen)
            self.seen = n

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):
            self.alive = False

    def receive(self, wait: Callable[[], None]):
        """The next message (None if the process ended without one); ``wait`` is called
        every 0.2 s meanwhile."""
        try:
            while not self.conn.poll(0.2):
                wait()
                if not self.proc.is_alive() and not self.conn.poll(0):
                    return None
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def close(self) -> None:
        if self.alive:
            self.send(("exit",))
            self.alive = False
            self.proc.join(timeout=1)      # it waits for this message, unless unwinding
            if self.proc.is_alive():
                self.proc.kill()
            self.conn.close()


class _Skip:
    """``progress`` without its first ``n`` items (those a failed process reported)."""

    def __init__(self, progress, n: int) -> None:
        self.progress, self.left = progress, n

    def __call__(self, kind: str, n: int) -> None:
        if kind == "items" and self.left > 0:
            used = min(n, self.left)
            self.left -= used
            n -= used
            if not n:
                return
        self.progress(kind, n)


def _serve(pool: ChainPool, block: list[int], conn, counter, parent_end) -> None:
    """The forked process: run ``block``, send it back, then rerun on request."""
    def prog(kind: str, n: int) -> None:
        if kind == "items":
            counter.value += n

    # the parent's ends of every pipe, inherited: closed, so that its end of ours is
    # closed when the parent ends and ``recv`` returns EOF instead of waiting forever
    for end in [parent_end, *(c.conn for c in pool.children)]:
        end.close()
    try:
        b, links = pool.b, pool.links
        links.restart()
        b.routes.journal = []
        before = set(b.routes.counted)
        outs = []
        for ci in block:
            ch = pool.run(ci, prog)
            outs.append((ci, ch.out, ch.spans))
        conn.send(("done", outs, b.routes.journal, b.routes.counted - before,
                   links.export()))
        b.routes.journal = None
        while True:
            msg = conn.recv()
            if msg[0] != "rerun":
                break
            links.enabled = False
            conn.send(("spans", [pool.run(ci, prog, True, sp).spans for ci, sp in msg[1]]))
    except EOFError:
        pass
    except BaseException:                 # the parent runs the block itself
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        conn.close()
