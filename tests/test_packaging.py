"""environment.yml (conda) and pyproject.toml (pip) ask for the same packages, and an installed package
finds its data (the calibration tables)."""

import tomllib

import pytest
import yaml

from conftest import REPO


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["test"])
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert set(pip) - {"-e ."} == wanted
    assert "-e ." in pip


def test_console_script_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["linvit"] == "linvit.cli:main"


CALIBRATION_TABLES = ("coverage.csv", "coverage_sequential.csv")  # the report and the docs print them


def test_the_calibration_tables_are_package_data_of_the_claims():
    import importlib.resources

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-data"]["linvit.claims"] == list(CALIBRATION_TABLES)
    here = importlib.resources.files("linvit.claims")
    assert all(here.joinpath(name).is_file() for name in CALIBRATION_TABLES)


def test_a_built_wheel_carries_the_calibration_tables(tmp_path):
    """The wheel an install would use (built offline from a copy of the package: no index, no build isolation)
    holds both tables beside linvit/claims' modules, where the report and the calibration commands read them."""
    import shutil
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "linvit", src / "linvit", ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("linvit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"linvit/claims/{name}" for name in CALIBRATION_TABLES} <= names
    assert "linvit/claims/calibration.py" in names and "linvit/stats/sequential.py" in names
