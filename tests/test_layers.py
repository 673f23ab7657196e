"""The packages' floors: the statistics engine (linvit.stats) at the bottom, the claims (linvit.claims) above it,
the config and the grid, and the report and the sequential driver (linvit.decide) above them all. A module
imports only from its own floor or below (every import counts, also one inside a function); linvit.stats' own
check, that it imports nothing of the project but the predictions type, is test_stats_engine's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import linvit

PACKAGE = Path(linvit.__file__).parent


def imports(path: Path) -> set[str]:
    """The modules a file imports, relative imports resolved against its package."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            out |= {module} | ({f"{module}.{a.name}" for a in node.names} if node.module is None else set())
    return out


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("path", sorted((PACKAGE / "claims").glob("*.py")), ids=lambda p: p.name)
def test_the_claims_import_neither_the_report_nor_the_driver(path):
    above = [m for m in imports(path) if under(m, "linvit.report") or under(m, "linvit.decide")]
    assert not above, above


@pytest.mark.parametrize("name", ["config.py", "grid.py"])
def test_config_and_grid_import_nothing_above_them(name):
    """Only config.py's lazy import of the sequential plan (for a grid that has one) reaches the statistics."""
    found = imports(PACKAGE / name)
    above = [m for m in found if any(under(m, p) for p in ("linvit.report", "linvit.claims", "linvit.decide"))]
    assert not above, above
    assert {m for m in found if under(m, "linvit.stats")} <= ({"linvit.stats.sequential"} if name == "config.py"
                                                              else set())


# --- the whole package: floors from the statistics up to the command line, and no circle anywhere -----------
# Lowest first. A module on a floor imports nothing on a higher one (lazily or not; a TYPE_CHECKING import is
# an annotation, not an import). Modules on no floor (training, data, models) sit beside config and grid.
FLOORS = [
    ("linvit.stats",),
    ("linvit.config", "linvit.grid"),
    ("linvit.claims",),
    ("linvit.decide_state",),
    ("linvit.status", "linvit.status_machine", "linvit.status_slurm", "linvit.status_decide"),
    ("linvit.report",),
    ("linvit.decide", "linvit.decide_inputs", "linvit.decide_process"),
    ("linvit.cli",),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def project_imports(path: Path) -> set[str]:
    """The project's modules a file imports (each import resolved to the module it loads), but under
    `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # drop TYPE_CHECKING blocks
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found = set()
    for name in _imports_of(tree, path):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module_name(path) and name != "linvit":
            found.add(name)
    return found


def _imports_of(tree: ast.AST, path: Path) -> set[str]:
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return out


GRAPH = {name: project_imports(path) for name, path in MODULES.items()}


def floor(module: str) -> int | None:
    return next((i for i, names in enumerate(FLOORS) for n in names if under(module, n)), None)


def test_no_module_imports_from_a_floor_above_its_own():
    up = [f"{m} (floor {floor(m)}) imports {i} (floor {floor(i)})" for m, found in sorted(GRAPH.items())
          for i in sorted(found) if floor(m) is not None and floor(i) is not None and floor(i) > floor(m)]
    assert not up, up


def test_no_import_circle_in_the_package():
    """Tarjan's strongly connected components of the import graph: every one a single module."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_contract_sees_an_upward_import_and_a_circle():
    """The two checks above on a graph with one arrow added: they fail (a check that cannot fail guards nothing)."""
    assert "linvit.stats.paired" in GRAPH and "linvit.claims.judge" in GRAPH
    saved = set(GRAPH["linvit.stats.paired"])
    GRAPH["linvit.stats.paired"].add("linvit.claims.judge")  # up a floor, and judge imports stats: a circle
    try:
        with pytest.raises(AssertionError):
            test_no_module_imports_from_a_floor_above_its_own()
        with pytest.raises(AssertionError):
            test_no_import_circle_in_the_package()
    finally:
        GRAPH["linvit.stats.paired"] = saved


# --- the floors' sizes (issue 56): rooms a maintainer can read ----------------------------------------------
def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("package", ["stats", "claims", "report"])
def test_no_file_of_the_statistics_claims_or_report_is_over_450_lines(package):
    long = {p.name: lines(p) for p in (PACKAGE / package).glob("*.py") if lines(p) > 450}
    assert not long, long


def test_the_report_is_at_most_a_fifth_of_the_package():
    report = sum(lines(p) for p in (PACKAGE / "report").rglob("*.py"))
    total = sum(lines(p) for p in PACKAGE.rglob("*.py"))
    assert report <= 0.2 * total, f"linvit/report/ is {report} of {total} lines ({report / total:.0%})"


def test_the_driver_reads_top_to_bottom():
    """decide.Driver: no method over 50 lines (the loop in one screen, each step a method beside it)."""
    tree = ast.parse((PACKAGE / "decide.py").read_text())
    (driver,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver"]
    long = {f.name: f.end_lineno - f.lineno + 1 for f in driver.body
            if isinstance(f, ast.FunctionDef) and f.end_lineno - f.lineno + 1 > 50}
    assert not long, long
