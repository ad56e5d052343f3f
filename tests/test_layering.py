"""Modules by concept, in the order data flows: each module imports only modules before it.

The order below is the design (config -> architecture -> parameters -> partition -> states ->
activations -> overhead -> per-device memory -> the paper's reading -> scenarios -> report).  A
new module must be placed in it, and an import that goes backwards fails here.  Imports inside
functions count too: a late import is still a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "memlib"

ORDER = [
    # leaves: units, the symbol table, the breakdown tree, kernel choices
    "units", "symbols", "breakdown", "kernels",
    "config", "architecture", "params", "partition", "states",
    # Megatron-Core's persistent buffers of one rank (DDP, distributed optimizer, framework buffers)
    "megatron_buffers",
    # activations: the ledger type, then each implementation's ledger, then their registry
    "activations", "ledgers_hf", "ledgers_megatron", "ledgers",
    "schedule",
    # the peak the allocator reports: persistent buffers, held activations, transient terms
    "transient", "peak",
    "overhead", "memory",
    # the same per-stage terms compiled to vectorised NumPy functions of the knobs; the search over them
    "compiled", "plan",
    # memory over time: the schedule replay on a clock, with each step's bytes
    "timeline",
    # Megatron-LM's launch flags read as a configuration
    "megatron_args",
    # published values, the paper's reading of them, the formulas the book numbers
    "reference", "paper", "formulas",
    "paper.static", "paper.zero", "paper.parameters", "paper.activations", "paper.errata",
    # optional measurements (torch, transformers, megatron-core imported lazily)
    "measure", "measure_megatron", "measure_peak",
    # what the book runs
    "scenarios", "scenarios.sweeps", "scenarios.static", "scenarios.models", "scenarios.activations",
    "scenarios.overheads", "scenarios.together", "scenarios.deepseek", "scenarios.validation", "scenarios.measured",
    "scenarios.architectures",
    # presentation
    "report", "report.format", "report.figures", "report.glue", "report.tables", "report.book",
    "report.ch01_introduction", "report.ch02_architecture", "report.ch03_parameters",
    "report.ch04_static", "report.ch05_zero", "report.ch06_activations", "report.ch07_overheads",
    "report.ch08_together", "report.ch09_deepseek", "report.ch10_validation", "report.ch11_measured",
    "report.ch12_architectures", "report.ch14_errata",
    "report.readme",
    # entry points and the package's facade
    "cli", "__main__", "",
]


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


def test_every_module_has_a_place_in_the_order():
    mods = set(_modules())
    assert len(ORDER) == len(set(ORDER))
    assert mods - set(ORDER) == set(), "place the new module in ORDER"
    assert set(ORDER) - mods == set(), "ORDER names a module that no longer exists"


def test_each_module_imports_only_earlier_ones():
    mods = _modules()
    rank = {m: i for i, m in enumerate(ORDER)}
    backwards = []
    for name, path in mods.items():
        for dep in _imports(name, path, set(mods)):
            assert dep in rank, f"{name} imports {dep!r}, which is not a memlib module"
            if rank[dep] >= rank[name]:
                backwards.append(f"{name} -> {dep}")
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
    p = tmp_path / "config.py"
    p.write_text("from .memory import estimate\nfrom . import states\nfrom .paper import errata\n")
    known = set(_modules())
    assert _imports("config", p, known) == {"memory", "states", "paper.errata"}
    p = tmp_path / "x.py"
    p.write_text("from .. import memory\nfrom ..report.format import fmt_bytes\n")
    assert _imports("report.chXX", p, known) == {"memory", "report.format"}
