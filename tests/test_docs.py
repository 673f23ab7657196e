"""The documentation stands alone and says what the code does."""

import re
import subprocess

import pytest

from linvit.config import ConfigError, check_names

from conftest import REPO


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / n for n in names if n.endswith((".py", ".md", ".smk", ".yaml", ".yml", ".sh", ".toml"))
            or n == "Snakefile"]


def test_nothing_points_at_notes_outside_the_repository():
    # A maintainer only has the repository: design notes elsewhere must be written into it.
    outside = re.compile(r"DESIGN\.md|\.\./shared|design notes")
    hits = [f"{path.relative_to(REPO)}:{n}" for path in tracked_text_files()
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if outside.search(line) and path.name != "test_docs.py"]
    assert hits == []


def test_readme_quotes_the_real_unknown_variant_error():
    readme = " ".join((REPO / "README.md").read_text().split())
    quoted = re.search(r"`(config key variants: unknown variant 'nope'; known variants: [^`]*)`", readme)
    assert quoted, "README no longer quotes the unknown-variant error"
    config = {"variants": ["nope"], "sizes": ["micro"], "targets": ["d"], "datasets": {"d": {"source": "digits"}},
              "teacher": {"dataset": "d"}, "inits": [], "init_strategies": {}, "distill": {"loss": "mse"}}
    with pytest.raises(ConfigError) as err:
        check_names(config)
    assert quoted.group(1) == str(err.value)


def test_docs_tests_lists_every_test_file():
    # docs/tests.md is the map of the suite: a test file missing from it is a check nobody can find.
    listed = set(re.findall(r"`(test_\w+\.py)`", (REPO / "docs" / "tests.md").read_text()))
    files = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert files - listed == set(), "docs/tests.md has no row for these"
    assert listed - files == set(), "docs/tests.md lists test files that do not exist"
