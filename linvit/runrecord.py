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
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from .io import atomic_path

RECORD = ".snakemake/linvit/run.json"


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
        "slurm_head_job": os.environ.get("SLURM_JOB_ID"),
        "slurm_logdir": str(logdir) if logdir else None,
        "workdir": str(Path.cwd()),
        "argv": sys.argv,
    })


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
