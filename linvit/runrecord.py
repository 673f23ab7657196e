"""The record a run of the workflow leaves of itself, for `linvit status`: written by the Snakefile's
`onstart` (each `snakemake` that has jobs to run, in the process that schedules them; never by a dry run
nor by the copies of Snakemake inside cluster jobs, which run with --no-hooks), read by `linvit status`
from any shell.

It lives in `.snakemake/linvit/run.json`, beside Snakemake's own state of the same working directory
(its locks and its marks of started jobs, which status reads too), not under results/: it describes
the run, not a result, goes with the working directory the run's markers belong to, and a results/
folder copied elsewhere carries no stale claim that a process on some host runs it. Each run replaces
it (atomically); the last run's stays after it ends.

What it holds: the config as Snakemake merged it (every --configfile, then --config KEY=VALUE), the
config files and overrides as given, the --set-resources overrides, the host, the process id, the
start time, the executor (`local`, `slurm`, ...), the Slurm job id where Snakemake itself runs inside
one (a head job), the Slurm plugin's log folder, and the command line.

`status_config` is the config `linvit status` reads: the record's, or the config files and overrides given
on its command line, merged as Snakemake merges them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import yaml

from .config import ConfigError, load_config
from .io import atomic_path

RECORD = ".snakemake/linvit/run.json"
DEFAULT_CONFIG = str(Path(__file__).resolve().parents[1] / "workflow" / "config" / "default.yaml")


def _plain(value):
    """JSON-able: Snakemake's settings hold Paths, immutable maps and tuples."""
    return json.loads(json.dumps(value, default=lambda v: dict(v) if hasattr(v, "items") else
                                 list(v) if isinstance(v, (tuple, set, frozenset)) else str(v)))


def record_of(config: dict, workflow) -> dict:
    """What the record says of the run of `workflow` (Snakemake's Workflow object) with `config`."""
    settings = getattr(workflow, "config_settings", None)
    plugin = getattr(workflow, "executor_plugin", None)
    executor = getattr(plugin, "name", None) or "local"
    executor_settings = getattr(workflow, "executor_settings", None)
    logdir = getattr(executor_settings, "logdir", None)
    resources = getattr(getattr(workflow, "resource_settings", None), "overwrite_resources", None) or {}
    return _plain({
        "config": config,
        "configfiles": [str(p) for p in getattr(settings, "configfiles", None) or ()],
        "overrides": dict(getattr(settings, "config", None) or {}),
        "set_resources": {rule: dict(values) for rule, values in dict(resources).items()},
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "executor": executor.removeprefix("snakemake-executor-plugin-"),
        "slurm_head_job": head_job(),
        "slurm_logdir": str(logdir) if logdir else None,
        "workdir": str(Path.cwd()),
        "argv": sys.argv,
    })


def head_job() -> str | None:
    """The Slurm job Snakemake runs in, if any. The Slurm executor deletes SLURM_* from os.environ before
    onstart runs (so that its submissions do not inherit them); the environment the process started with
    (/proc/self/environ) still has it."""
    if os.environ.get("SLURM_JOB_ID"):
        return os.environ["SLURM_JOB_ID"]
    try:
        start = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [v.split(b"=", 1)[1].decode() for v in start if v.startswith(b"SLURM_JOB_ID=")]
    return found[0] if found else None


def write_record(config: dict, workflow, root: str | Path = ".") -> Path:
    path = Path(root) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record_of(config, workflow), indent=1, sort_keys=True) + "\n")
    return path


class RecordError(ValueError):
    pass


def read_record(root: str | Path = ".") -> dict | None:
    """The last run's record in the working directory `root`; None where no run has started there."""
    path = Path(root) / RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise RecordError(f"{path}: unreadable ({err}); remove it to read the config from --configfile") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise RecordError(f"{path}: holds no config; remove it to read the config from --configfile")
    return data


def status_config(configfiles: list[str] | None, overrides: list[str] | None, record: dict | None) -> tuple[dict, str]:
    """The config `linvit status` reads, and its name for the title: the config files merged as Snakemake
    merges them (each over the one before, key by key), then the KEY=VALUE overrides; with none given, the
    config the last run recorded, else the embedded default (as `snakemake` with no --configfile)."""
    if overrides:
        bad = next((o for o in overrides if "=" not in o), None)
        if bad is not None:
            hint = f"; a config file is --configfile {bad}" if bad.endswith((".yaml", ".yml", ".json")) else ""
            raise ConfigError(f"--config {bad}: not KEY=VALUE (overrides, as Snakemake's --config takes them){hint}")
    if not configfiles and not overrides and record is not None:
        given = [Path(f).name for f in record.get("configfiles") or []] or ["default.yaml"]
        given += [f"{k}={json.dumps(v)}" for k, v in (record.get("overrides") or {}).items()]
        return record["config"], f"{' + '.join(given)} (as its run recorded)"
    config: dict = {}
    for path in configfiles or [DEFAULT_CONFIG]:
        merge_config(config, load_config(path))
    for entry in overrides or []:
        key, value = entry.split("=", 1)
        merge_config(config, {key: _parse_value(value)})
    name = " + ".join([*(Path(f).name for f in configfiles or [DEFAULT_CONFIG]), *(overrides or [])])
    return config, name


def merge_config(config: dict, over: dict) -> dict:
    """snakemake.utils.update_config: `over` into `config`, mappings merged key by key."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge_config(config[key], value)
        else:
            config[key] = value
    return config


def _parse_value(text: str):
    """A --config value as Snakemake parses it (snakemake.cli.parse_config): int, float, True/False, then
    YAML's base loader (strings, lists, mappings of strings), else the text."""
    if text == "":
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if text in ("True", "False"):
        return text == "True"
    try:
        return yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        return text
