"""Repository structure: no import cycle in moesim/ (function-level imports count), no
module over 500 lines, no tracked file naming a path of a build machine, and no package
using another package's private names or attributes.

The import graph is built with ``ast`` from every ``import`` and ``from ... import``
anywhere in a module (top level or inside a function), resolved to the deepest module of
the package that the statement names, and from every string constant that is exactly the
name of a module of the package (an ``importlib.import_module("moesim.x")`` hop). A
package's ``__init__`` importing its own submodules is not an edge (the package and its
parts are one unit there), as in the issue's definition. The layers built on this graph
are checked in tests/test_layers.py.
"""

from __future__ import annotations

import ast
import functools
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "moesim"


def _modules(pkg: Path | None = None) -> dict[str, Path]:
    """Dotted name -> file of every module of ``pkg`` (default: moesim/)."""
    pkg = PKG if pkg is None else pkg
    mods = {}
    for p in pkg.rglob("*.py"):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
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


def _named_modules(node: ast.AST, mods: dict[str, Path]) -> list[str]:
    """A string constant that is exactly the name of a module: a module imported by name
    (``importlib.import_module("moesim.topology")``, a table of command modules)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mods:
        return [node.value]
    return []


def import_graph(pkg: Path | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ``pkg`` (default: moesim/) it imports, anywhere in it
    (read once per folder and session; do not change the sets returned)."""
    return _import_graph(PKG if pkg is None else pkg)


@functools.cache
def _import_graph(pkg: Path) -> dict[str, set[str]]:
    mods = _modules(pkg)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        for node in ast.walk(tree):
            for t in _targets(node, m, p.name == "__init__.py") + _named_modules(node, mods):
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


def _two_packages(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    """A synthetic ``moesim`` with packages ``a`` and ``b`` holding ``files`` (path ->
    source), made the tree the finders read."""
    pkg = tmp_path / "moesim"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for f in ("__init__.py", "a/__init__.py", "b/__init__.py"):
        (pkg / f).write_text("")
    for f, text in files.items():
        (pkg / f).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PKG", pkg)


def test_private_import_finder_finds_one(tmp_path, monkeypatch):
    _two_packages(tmp_path, monkeypatch, {
        "a/x.py": "def _f():\n    pass\n",
        "a/y.py": "from moesim.a.x import _f\n",                           # same package
        "b/z.py": "def g():\n    from moesim.a.x import _f\n"})
    assert private_imports() == ["moesim.b.z imports moesim.a.x._f"]


def test_no_package_imports_another_packages_private_names():
    assert private_imports() == []


def _package(mod: str) -> str:
    """The top-level package of a module (``moesim.engine.fast.dp`` -> ``engine``; a base
    module such as ``moesim.errors`` is its own)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, names assigned or annotated
    (module, class or function level), attributes assigned on ``self``/``cls`` and the
    entries of a ``__slots__``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            out.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            out |= {c.value for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return {n for n in out if _private(n)}


def _attribute_access(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(object, private name) of ``obj._name`` or ``getattr/setattr/hasattr(obj, "_name")``."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        return node.value, node.attr
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)):
        return node.args[0], node.args[1].value
    return None


def private_attribute_reads() -> list[str]:
    """Every ``obj._name`` (read or written, also through ``getattr``; ``obj`` not
    ``self``/``cls``; not a dunder)
    in a module of package P where ``_name`` is defined nowhere in P but is defined in a
    module of another package: P reaches into another package's object (issue 37: the
    fast engine read ``Builder``'s ``b._routes``). A package is a folder of moesim/ (or a
    base module). An approximation: a name defined in both packages is not reported."""
    mods = _modules()
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in mods.items()}
    defined: dict[str, set[str]] = {}
    for m, tree in trees.items():
        defined.setdefault(_package(m), set()).update(_defined_names(tree))
    bad: list[tuple[str, int, str]] = []
    for m, tree in trees.items():
        own = _package(m)
        for node in ast.walk(tree):
            found = _attribute_access(node)
            if found is None:
                continue
            obj, attr = found
            if (isinstance(obj, ast.Name) and obj.id in ("self", "cls")) or attr in defined[own]:
                continue
            owners = sorted(p for p, names in defined.items() if attr in names)
            if owners:
                bad.append((m, node.lineno, f"{m}:{node.lineno} reads {ast.unparse(node)} "
                                            f"(defined in {', '.join(owners)})"))
    return [text for *_, text in sorted(bad)]


def test_private_attribute_finder_finds_one(tmp_path, monkeypatch):
    _two_packages(tmp_path, monkeypatch, {
        "a/x.py":
        "class Builder:\n    __slots__ = ('_slot',)\n\n    def __init__(self):\n"
        "        self._routes = {}\n        self._slot = 0\n\n"
        "    def n(self, other):\n        return len(self._routes) + other._routes.__len__()\n",
        "a/y.py": "def f(b):\n    return b._routes, b._slot\n",                # own package
        "b/z.py":
        "def g(b):\n    b._routes.clear()\n    b._slot = 1\n    return b.__dict__, b._other\n\n\n"
        "def h(b):\n    return getattr(b, '_routes', None), getattr(b, 'routes')\n"})
    assert private_attribute_reads() == [
        "moesim.b.z:2 reads b._routes (defined in a)", "moesim.b.z:3 reads b._slot (defined in a)",
        "moesim.b.z:8 reads getattr(b, '_routes', None) (defined in a)"]


def test_no_package_reads_another_packages_private_attributes():
    found = private_attribute_reads()
    assert found == [], "\n".join(found)
