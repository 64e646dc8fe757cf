"""The layer's kernel recipe (moesim.program.recipe) is written once: no other module of
moesim calls the model's ``*_kernels`` functions, and a kernel added to one op there
reaches both engines.

Hand figures for the made-up kernel: toy-cpu shrunk to one rank (tp = pp = ep = dp = 1,
no communication) runs its 2 layers x 2 micro-batches forward and backward on one
compute stream, so its ``fwd.attn`` / ``bwd.attn`` ops (8 of them) are all on the
critical path: a kernel of a made-up kind registered at 1 ms of work
(:mod:`moesim.compute.kinds`) and added to the attention op lengthens the step by
8 x (1 ms + one launch) on either engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moesim.compute import kinds
from moesim.compute.base import Kernel
from moesim.program import recipe
from moesim.wiring import resolve_path, simulate

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "moesim"
RECIPE = "moesim/program/recipe.py"
#: modules whose ``*_kernels`` functions are the model's kernel lists
MODEL = "moesim.model"


def _kernel_calls(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, call) of every call of a ``*_kernels`` function of a moesim.model module in
    ``tree``: ``m.f(...)`` with ``m`` a moesim.model module imported under any name, or
    ``f(...)`` imported from one."""
    mods: set[str] = set()      # local names bound to a moesim.model module
    funcs: set[str] = set()     # local names bound to a moesim.model *_kernels function
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(MODEL):
                    mods.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(MODEL):
            for a in node.names:
                local = a.asname or a.name
                (funcs if a.name.endswith("_kernels") else mods).add(local)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr.endswith("_kernels") and \
                ast.unparse(f.value) in mods:
            out.append((node.lineno, ast.unparse(f)))
        elif isinstance(f, ast.Name) and f.id in funcs:
            out.append((node.lineno, f.id))
    return out


def kernel_callers(root: Path = PKG) -> dict[str, list[tuple[int, str]]]:
    """{module path: its calls of the model's ``*_kernels`` functions}, moesim/model/
    itself left out (the model builds its lists from its own parts)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root.parent).as_posix()
        if rel.startswith("moesim/model/"):
            continue
        calls = _kernel_calls(ast.parse(p.read_text(), filename=str(p)))
        if calls:
            out[rel] = calls
    return out


def test_only_the_recipe_calls_the_models_kernel_functions():
    callers = kernel_callers()
    assert list(callers) == [RECIPE], {k: v for k, v in callers.items() if k != RECIPE}
    named = {c.split(".")[-1] for _, c in callers[RECIPE]}
    assert {"attention_kernels", "norm_kernels", "router_kernels", "permute_kernels",
            "unpermute_kernels", "shared_expert_kernels", "dense_ffn_kernels",
            "expert_kernels", "embedding_kernels", "lm_head_kernels", "head_kernels",
            "optimizer_kernels"} <= named


def test_the_counter_sees_every_way_of_importing(tmp_path):
    pkg = tmp_path / "moesim"
    (pkg / "model").mkdir(parents=True)
    (pkg / "x").mkdir()
    (pkg / "model" / "costs.py").write_text("def a_kernels(): return costs.b_kernels()\n")
    (pkg / "x" / "a.py").write_text(
        "from moesim.model import costs as C, mtp\n"
        "from moesim.model.costs import norm_kernels as nk, gemm\n"
        "import moesim.model.costs\n"
        "def f(s):\n"
        "    C.attention_kernels(s)\n"
        "    mtp.head_kernels(s)\n"
        "    nk(s)\n"
        "    moesim.model.costs.router_kernels(s)\n"
        "    gemm(s)\n"                       # not a *_kernels function
        "    other.dense_ffn_kernels(s)\n")   # not a model module
    (pkg / "x" / "b.py").write_text("def g(ks):\n    return ks\n")
    assert kernel_callers(pkg) == {"moesim/x/a.py": [
        (5, "C.attention_kernels"), (6, "mtp.head_kernels"), (7, "nk"),
        (8, "moesim.model.costs.router_kernels")]}


@pytest.mark.parametrize("engine", ["exact", "fast"])
def test_a_kernel_added_to_the_attention_op_reaches_the_engine(engine, monkeypatch):
    res = resolve_path(ROOT / "scenarios" / "toy-cpu.yaml",
                       ["cluster.params.gpus_per_node=1", "parallel.ep=1",
                        "cluster.device=H100"])     # the kernel catalog prices on an H100
    assert res.layout.world == 1
    before = simulate(res, engine=engine).step_time_s
    secs = 1e-3
    made_up = Kernel("made_up", 0.0, 0.0, kind="made_up")    # one launch
    attn = recipe.attn
    monkeypatch.setattr(recipe, "attn", lambda *a, **k: [*attn(*a, **k), made_up])
    with kinds.registered_kind("made_up", kinds.fixed_price(secs)):
        after = simulate(res, engine=engine).step_time_s
    layers, mbs, phases = 2, 2, 2          # toy: 2 layers; 2 micro-batches; fwd and bwd
    per_op = secs + res.device.launch_overhead_s      # its work and its one launch
    assert after - before == pytest.approx(layers * mbs * phases * per_op, rel=1e-9)
