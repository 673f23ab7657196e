"""The names a config may use, known without importing torch.

Operators (`@register_attention`), data sources (`@register_source`) and distillation losses
(`@register_loss`) register themselves when their module is imported. Importing those modules costs
seconds (torch, timm, torchvision), which every parse of the Snakefile would pay. So the workflow
checks a config against the names read from the decorators in the package's source files, plus
anything already registered in this process (an operator a test or a user's script registered at
run time). tests/test_registry.py checks that this reading agrees with the imported registries.
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

# The softmax operator: the teacher's attention, and the variant of the softmax reference runs.
SOFTMAX = "softmax"

# Old loss names a config may still use -> the registered loss they mean. Resolved wherever a loss
# name is looked up; `names("loss")` lists only registered names, never these.
LOSS_ALIASES = {"mse": "proj_mse", "attn_ce": "map_ce"}

# kind -> (decorator name, source files that register that kind, module holding the live registry)
_KINDS = {
    "variant": ("register_attention", "attention/*.py", ("linvit.attention.base", "ATTENTION")),
    "source": ("register_source", "data/sources.py", ("linvit.data.sources", "SOURCES")),
    "loss": ("register_loss", "losses/*.py", ("linvit.losses", "LOSSES")),
}


@lru_cache(maxsize=None)
def _declared(kind: str) -> frozenset[str]:
    decorator, pattern, _ = _KINDS[kind]
    names = set()
    for path in sorted(PACKAGE.glob(pattern)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == decorator
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return frozenset(names)


@lru_cache(maxsize=None)
def _declared_source_keyword(keyword: str) -> dict:
    """Each source's `keyword=` literal in its @register_source call (None where it gives none)."""
    decorator, pattern, _ = _KINDS["source"]
    found = {}
    for path in sorted(PACKAGE.glob(pattern)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == decorator
                    and node.args and isinstance(node.args[0], ast.Constant)):
                given = [k.value for k in node.keywords if k.arg == keyword]
                found[node.args[0].value] = ast.literal_eval(given[0]) if given else None
    return found


def _declared_source_options() -> dict[str, dict | None]:
    """Each source's `options=` literal in its @register_source call (None where it gives none)."""
    return _declared_source_keyword("options")


def _source_declaration(source: str, registry: str, keyword: str):
    module = sys.modules.get(_KINDS["source"][2][0])
    if module is not None and source in getattr(module, registry, {}):
        return getattr(module, registry)[source]
    return _declared_source_keyword(keyword).get(source)


def source_options(source: str) -> dict | None:
    """The options a data source declares (JSON-schema fragments by key; see register_source), as
    registered in this process if its module is imported, else as read from its source file."""
    return _source_declaration(source, "SOURCE_OPTIONS", "options")


def source_num_labels(spec: dict) -> int | None:
    """How many labels the source of dataset entry `spec` gives, when its `num_labels` declaration
    (see register_source) says so without loading it: a number, or the option that sets it (with
    the option's declared default); None when only loading the data tells."""
    declared = _source_declaration(spec.get("source"), "SOURCE_LABELS", "num_labels")
    if isinstance(declared, str):
        default = ((source_options(spec.get("source")) or {}).get(declared) or {}).get("default")
        declared = spec.get(declared, default)
    return declared if isinstance(declared, int) and not isinstance(declared, bool) else None


def names(kind: str) -> list[str]:
    """Sorted names of `kind` ('variant', 'source' or 'loss') that a config may use; for losses the
    registered names only, not the old names of LOSS_ALIASES."""
    found = set(_declared(kind))
    module, attr = _KINDS[kind][2]
    if module in sys.modules:  # registered at run time in this process (only if already imported)
        found |= set(getattr(sys.modules[module], attr))
    if kind == "loss":
        found -= set(LOSS_ALIASES)
    return sorted(found)
