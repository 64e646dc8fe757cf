"""Repository structure: no import cycle in moesim/ (function-level imports count), no
module over 500 lines, and no tracked file naming a path of a build machine.

The import graph is built with ``ast`` from every ``import`` and ``from ... import``
anywhere in a module (top level or inside a function), resolved to the deepest module of
the package that the statement names. A package's ``__init__`` importing its own
submodules is not an edge (the package and its parts are one unit there), as in the
issue's definition.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "moesim"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _targets(node: ast.AST, mod: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = mod.split(".")
            keep = len(parts) - node.level + (1 if is_pkg else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]
    return []


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        for node in ast.walk(tree):
            for t in _targets(node, m, p.name == "__init__.py"):
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if not t or t == m or t.startswith(m + ".") or m.startswith(t + "."):
                    continue
                edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_function_level_cycle():
    # a -> b at top level, b -> a inside a function: one cycle; c alone: none.
    edges = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(edges) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_imports_are_edges(tmp_path):
    src = "def f():\n    from moesim.units import parse_size\n    return parse_size\n"
    tree = ast.parse(src)
    found = [t for n in ast.walk(tree) for t in _targets(n, "moesim.x", False)]
    assert "moesim.units" in found


def test_no_import_cycle_in_moesim():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_engines_do_not_import_each_other():
    edges = import_graph()
    for m, ts in edges.items():
        if m.startswith("moesim.engine.exact"):
            assert not any(t.startswith("moesim.engine.fast") for t in ts), (m, ts)
        if m.startswith("moesim.engine.fast"):
            assert not any(t.startswith("moesim.engine.exact") for t in ts), (m, ts)


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_no_tracked_file_names_a_machine_path():
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    bad = []
    needles = ("/work/", "/root/", "/home/", "REFERENCE.md", "shared/traces", "../shared")
    for f in filter(None, files):
        p = ROOT / f
        if not p.is_file() or p.suffix in {".png", ".ipynb"} or f == "tests/test_structure.py":
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{f}: {n}" for n in needles if n in text]
    assert bad == []


def private_imports() -> list[str]:
    """Every ``from X import _name`` (top level or in a function) where X is a module of
    another package than the importing module's (issue 20: serving imported the fast
    engine's ``_chains`` and ``_route_rec``). A package is a folder of moesim/."""
    mods = _modules()
    bad = []
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        own = m if is_pkg else m.rpartition(".")[0]
        tree = ast.parse(p.read_text(), filename=str(p))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _targets(node, m, is_pkg)[0]
            if not base.startswith("moesim"):
                continue
            src = base if base in mods and mods[base].name == "__init__.py" \
                else base.rpartition(".")[0]
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and src != own:
                    bad.append(f"{m} imports {base}.{a.name}")
    return bad


def test_private_import_finder_finds_one(tmp_path, monkeypatch):
    pkg = tmp_path / "moesim"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for f in ("__init__.py", "a/__init__.py", "b/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "a" / "x.py").write_text("def _f():\n    pass\n")
    (pkg / "a" / "y.py").write_text("from moesim.a.x import _f\n")          # same package
    (pkg / "b" / "z.py").write_text("def g():\n    from moesim.a.x import _f\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PKG", pkg)
    assert private_imports() == ["moesim.b.z imports moesim.a.x._f"]


def test_no_package_imports_another_packages_private_names():
    assert private_imports() == []
