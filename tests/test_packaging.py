"""environment.yml (conda) and pyproject.toml (pip) ask for the same packages."""

import tomllib

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
