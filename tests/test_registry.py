"""The torch-free view of the registries (what the workflow checks configs against) agrees with the
registries themselves, and the Snakefile's imports stay torch-free."""

import subprocess
import sys

from linvit.registry import _declared


def test_names_read_from_source_equal_the_imported_registries():
    from linvit.attention import ATTENTION
    from linvit.data.sources import SOURCES
    from linvit.distill import LOSSES

    assert _declared("variant") == set(ATTENTION)
    assert _declared("source") == set(SOURCES)
    assert _declared("loss") == set(LOSSES)


def test_config_checking_imports_neither_torch_nor_timm(repo):
    code = ("import sys, yaml; from linvit.config import validate; import linvit.grid; "
            f"validate(yaml.safe_load(open('{repo}/workflow/config/default.yaml'))); "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
