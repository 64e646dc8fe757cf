"""Layers (issue 37 item 3): the graph of moesim's top-level packages has no cycle, with
function-level imports and imports by name counted; the packages keep the tier order of
:data:`moesim.layers.TIERS` (at most two imports run from a lower tier up to a higher
one); and the file-level import graphs of moesim/ and benchmarks/ have no cycle.

Module edges come from :func:`tests.test_structure.import_graph`; a module's package is
the first name under ``moesim`` (``moesim.engine.fast.dp`` -> ``engine``; a base module
such as ``moesim.errors`` is a package of its own; ``moesim`` itself is the root).
"""

from __future__ import annotations

import ast
from pathlib import Path

from moesim.layers import TIERS, tier_of
from tests.test_structure import PKG, ROOT, cycles, import_graph

BENCH = ROOT / "benchmarks"
#: imports allowed to run from a lower tier up to a higher one
MAX_UPWARD = 2


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(edges: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Package -> package it imports -> the module edges ``"a.b -> c.d"`` behind it."""
    out: dict[str, dict[str, list[str]]] = {package_of(m): {} for m in edges}
    for m, ts in edges.items():
        a = package_of(m)
        for t in sorted(ts):
            b = package_of(t)
            if a != b:
                out[a].setdefault(b, []).append(f"{m} -> {t}")
    return out


def cycle_edges(pg: dict[str, dict[str, list[str]]]) -> list[str]:
    """The module edges between packages of a cycle of the package graph."""
    found = []
    for comp in cycles({a: set(bs) for a, bs in pg.items()}):
        inside = set(comp)
        found += [f"[{a} -> {b}] {e}" for a in comp for b in sorted(pg[a]) if b in inside
                  for e in pg[a][b]]
    return found


def upward_imports(edges: dict[str, set[str]], tiers: dict[str, int]) -> list[str]:
    """Module edges from a package of a lower tier to one of a higher tier."""
    return sorted(f"{m} -> {t} (tier {tiers[package_of(m)]} -> {tiers[package_of(t)]})"
                  for m, ts in edges.items() for t in ts
                  if tiers[package_of(m)] < tiers[package_of(t)])


def bench_graph(folder: Path = BENCH) -> dict[str, set[str]]:
    """Benchmark script -> the scripts of ``folder`` it imports, anywhere in it, as
    ``import bench_x`` / ``from bench_x import`` (the folder is on ``sys.path``: the
    script's own, or inserted) or ``from benchmarks.bench_x import``."""
    names = {p.stem: p for p in folder.glob("*.py")}
    edges: dict[str, set[str]] = {n: set() for n in names}
    for n, p in names.items():
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module or ""] + [a.name for a in node.names]
            else:
                continue
            for t in targets:
                t = t.removeprefix(f"{folder.name}.")
                if t in names and t != n:
                    edges[n].add(t)
    return edges


# ---------------------------------------------------------------- the finders find


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_package_cycle_found_through_a_function_level_import(tmp_path):
    """a.x imports b.y at the top; b.z imports a.w inside a function, and c imports a by
    name: modules have no cycle, packages a and b do."""
    _write(tmp_path, {
        "moesim/__init__.py": "", "moesim/a/__init__.py": "", "moesim/b/__init__.py": "",
        "moesim/c/__init__.py": "",
        "moesim/a/x.py": "from moesim.b.y import f\n", "moesim/a/w.py": "",
        "moesim/b/y.py": "def f():\n    pass\n",
        "moesim/b/z.py": "def g():\n    from moesim.a import w\n    return w\n",
        "moesim/c/v.py": "import importlib\nM = importlib.import_module('moesim.a.w')\n"})
    edges = import_graph(tmp_path / "moesim")
    assert cycles(edges) == []
    pg = package_graph(edges)
    assert cycles({a: set(bs) for a, bs in pg.items()}) == [["a", "b"]]
    assert cycle_edges(pg) == ["[a -> b] moesim.a.x -> moesim.b.y",
                               "[b -> a] moesim.b.z -> moesim.a",   # from moesim.a import w
                               "[b -> a] moesim.b.z -> moesim.a.w"]
    assert pg["c"] == {"a": ["moesim.c.v -> moesim.a.w"]}   # by name


def test_upward_imports_listed(tmp_path):
    _write(tmp_path, {
        "moesim/__init__.py": "", "moesim/low/__init__.py": "", "moesim/high/__init__.py": "",
        "moesim/low/a.py": "def f():\n    from moesim.high.b import g\n",
        "moesim/high/b.py": "from moesim.low import a\ndef g():\n    pass\n"})
    edges = import_graph(tmp_path / "moesim")
    tiers = {"moesim": 0, "low": 0, "high": 1}
    assert upward_imports(edges, tiers) == ["moesim.low.a -> moesim.high.b (tier 0 -> 1)"]
    assert upward_imports(edges, {"moesim": 0, "low": 1, "high": 1}) == []


def test_benchmark_cycle_found_both_ways_of_importing(tmp_path):
    """x imports y on sys.path inside a function, y imports x as benchmarks.x: a cycle;
    z imports y only: none."""
    b = tmp_path / "benchmarks"
    _write(b, {"x.py": "def main():\n    from y import run\n    return run\n",
               "y.py": "import sys\nsys.path.insert(0, '.')\nfrom benchmarks.x import main\n",
               "z.py": "import y\nimport numpy\n"})
    edges = bench_graph(b)
    assert edges == {"x": {"y"}, "y": {"x"}, "z": {"y"}}
    assert cycles(edges) == [["x", "y"]]


# ---------------------------------------------------------------- the rules hold


def tier_problems(tiers: tuple[tuple[str, ...], ...], pkg: Path = PKG) -> list[str]:
    """Packages of ``pkg`` in no tier or in two, and tier entries naming no package."""
    declared = [p for tier in tiers for p in tier]
    present = {package_of(m) for m in import_graph(pkg)}
    return ([f"{p} is in two tiers" for p in sorted({p for p in declared
                                                     if declared.count(p) > 1})]
            + [f"{p} is in no tier" for p in sorted(present - set(declared))]
            + [f"{p} does not exist" for p in sorted(set(declared) - present)])


def test_tier_problems_found(tmp_path):
    _write(tmp_path, {"moesim/__init__.py": "", "moesim/a/__init__.py": "",
                      "moesim/b.py": "", "moesim/c/__init__.py": ""})
    assert tier_problems((("moesim", "a"), ("a", "z")), tmp_path / "moesim") == [
        "a is in two tiers", "b is in no tier", "c is in no tier", "z does not exist"]


def test_every_package_is_in_one_tier():
    assert tier_problems(TIERS) == [], "moesim/layers.py and moesim/ disagree"


def test_package_graph_has_no_cycle():
    found = cycle_edges(package_graph(import_graph()))
    assert found == [], "imports that tie packages into a cycle:\n" + "\n".join(found)


def test_at_most_two_imports_run_up_the_tiers():
    up = upward_imports(import_graph(), tier_of())
    assert len(up) <= MAX_UPWARD, (f"{len(up)} imports run from a lower tier up to a higher "
                                   "one (moesim/layers.py):\n" + "\n".join(up))


def test_no_import_cycle_in_benchmarks():
    found = cycles(bench_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def benchmark_imports(pkg: Path = PKG, folder: Path = BENCH) -> list[str]:
    """Imports of a benchmark script (``bench_x`` or ``benchmarks.bench_x``) anywhere in
    the package ``pkg``."""
    bench = {p.stem for p in folder.glob("*.py")}
    bad = []
    for p in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            bad += [f"{p.relative_to(pkg.parent)}: {n}" for n in names
                    if n.split(".")[0] in bench or n.split(".")[0] == folder.name]
    return bad


def test_benchmark_imports_found(tmp_path):
    _write(tmp_path, {"benchmarks/bench_a.py": "import moesim\n",
                      "moesim/x.py": "def f():\n    import bench_a\n",
                      "moesim/y.py": "from benchmarks.bench_a import main\nimport numpy\n"})
    assert benchmark_imports(tmp_path / "moesim", tmp_path / "benchmarks") == [
        "moesim/x.py: bench_a", "moesim/y.py: benchmarks.bench_a"]


def test_benchmarks_import_moesim_never_the_reverse():
    """moesim/ imports no benchmark script: with neither graph cyclic alone, the
    file-level graph of both together has no cycle."""
    assert benchmark_imports() == []
