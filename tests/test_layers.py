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
