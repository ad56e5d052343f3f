"""Packages by concern, in the order data flows: each package imports only packages before it.

The order is the design, :data:`memlib.PACKAGES`.  A new package or top-level module must be placed
in it, and an import that goes backwards fails here.  Inside a package any order goes, but the
import graph of the modules has no cycle.  Imports inside functions count too: a late import is
still a dependency.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import memlib

ROOT = Path(__file__).resolve().parents[1] / "memlib"

#: the design: memlib's packages in the order data flows (defined once, in the package), then the
#: entry point and the package's facade, which may import anything
ORDER = [*memlib.PACKAGES, "__main__", ""]


def _unit(module: str) -> str:
    """The package (or top-level module) of ``module`` that ORDER ranks."""
    return module.split(".")[0]


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The memlib modules ``name`` imports (``from .x import y`` counts ``x.y`` when that is a module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "":
        package = []
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "memlib" or node.module.startswith("memlib.")):
                mod = node.module.removeprefix("memlib").lstrip(".")
            else:
                continue
            subs = [f"{mod}.{a.name}".lstrip(".") for a in node.names]
            targets = [s for s in subs if s in known] or [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("memlib").lstrip(".") for a in node.names
                       if a.name == "memlib" or a.name.startswith("memlib.")]
        deps.update(t for t in targets if t != name)
    return deps


def test_every_package_has_a_place_in_the_order():
    units = {_unit(m) for m in _modules()}
    assert len(ORDER) == len(set(ORDER))
    assert units - set(ORDER) == set(), "place the new package or module in ORDER"
    assert set(ORDER) - units == set(), "ORDER names a package that no longer exists"


def test_each_package_imports_only_earlier_ones():
    mods = _modules()
    rank = {m: i for i, m in enumerate(ORDER)}
    backwards = []
    for name, path in mods.items():
        for dep in _imports(name, path, set(mods)):
            assert dep in mods, f"{name} imports {dep!r}, which is not a memlib module"
            if _unit(dep) != _unit(name) and rank[_unit(dep)] >= rank[_unit(name)]:
                backwards.append(f"{name} -> {dep}")
    assert backwards == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_modules_import_no_cycle():
    """Inside a package too: a submodule imports its siblings, never its package's ``__init__`` that imports it."""
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _steps(package: str) -> dict[str, int]:
    """A package's modules by their step in the data flow its docstring writes (``a`` → ``b and c`` → ``d``)."""
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))) or ""
    return {m: i for i, step in enumerate(doc.split("→"))
            for m in re.findall(rf":mod:`~?memlib\.{package}\.(\w+)`", step)}


def test_a_package_that_writes_its_data_flow_places_every_module_in_it():
    """Where a package's docstring orders its modules with arrows, every module has a step, and imports only modules
    of its own step or an earlier one."""
    mods = _modules()
    packages = [p for p in memlib.PACKAGES if (ROOT / p / "__init__.py").exists()
                and "→" in (ROOT / p / "__init__.py").read_text(encoding="utf-8")]
    assert {"config", "model", "device", "megatron"} <= set(packages)
    unplaced, backwards = [], []
    for package in packages:
        steps = _steps(package)
        for name, path in mods.items():
            if not name.startswith(package + ".") or name.count(".") != 1:
                continue
            short = name.split(".")[1]
            if short not in steps:
                unplaced.append(name)
                continue
            backwards += [f"{name} -> {d}" for d in _imports(name, path, set(mods))
                          if d.startswith(package + ".") and steps.get(d.split(".")[1], -1) > steps[short]]
    assert unplaced == [], "name the module in its package's docstring, at its step"
    assert backwards == []


def test_chapter_modules_never_import_each_other():
    mods = _modules()
    chapters = {m for m in mods if m.startswith("report.ch")}
    crossing = sorted(f"{c} -> {d}" for c in chapters for d in _imports(c, mods[c], set(mods)) if d in chapters)
    assert crossing == []


def test_the_library_never_imports_the_report():
    mods = _modules()
    leaking = sorted(f"{m} -> {d}" for m in mods if not m.startswith("report") and m not in ("cli", "__main__", "")
                     for d in _imports(m, mods[m], set(mods)) if d == "report" or d.startswith("report."))
    assert leaking == []


def test_the_checker_sees_a_backward_import(tmp_path):
    """The parser resolves relative imports: a module importing a later one is caught."""
    p = tmp_path / "training.py"
    p.write_text("from ..device.estimate import estimate\nfrom ..model import states\nfrom ..paper import errata\n")
    known = set(_modules())
    assert _imports("config.training", p, known) == {"device.estimate", "model.states", "paper.errata"}
    p = tmp_path / "x.py"
    p.write_text("from .. import device\nfrom ..report.format import fmt_bytes\n")
    assert _imports("report.chXX", p, known) == {"device", "report.format"}
