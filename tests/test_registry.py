"""The torch-free view of the registries (what the workflow checks configs against) agrees with the
registries themselves, and the Snakefile's imports stay torch-free."""

import subprocess
import sys

from linvit.registry import LOSS_ALIASES, _declared, names


def test_names_read_from_source_equal_the_imported_registries():
    from linvit.attention import ATTENTION
    from linvit.data.sources import SOURCES
    from linvit.losses import LOSSES

    assert _declared("variant") == set(ATTENTION)
    assert _declared("source") == set(SOURCES)
    assert _declared("loss") == set(LOSSES)


def test_source_options_read_from_source_equal_the_registered_ones():
    from linvit.data.sources import SOURCE_OPTIONS
    from linvit.registry import _declared_source_options

    assert _declared_source_options() == SOURCE_OPTIONS
    assert all(options is not None for options in SOURCE_OPTIONS.values())  # every shipped source checks its keys


def test_loss_aliases_name_registered_losses_and_are_not_listed():
    from linvit.losses import LOSSES, distill_loss

    assert set(LOSS_ALIASES.values()) <= set(LOSSES)
    assert not set(LOSS_ALIASES) & set(names("loss"))
    assert names("loss") == sorted(LOSSES)
    assert all(distill_loss(old).name == new for old, new in LOSS_ALIASES.items())


def test_config_checking_imports_neither_torch_nor_timm(repo):
    code = ("import sys, yaml; from linvit.config import validate; import linvit.grid; "
            f"validate(yaml.safe_load(open('{repo}/workflow/config/default.yaml'))); "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
