# The grid, wildcard constraints and paths; the grid itself comes from linvit.grid, so the jobs
# Snakemake plans and the cells the report expects are the same list.
import json
import os
import shlex

from linvit.config import ConfigError, check_names
from linvit.grid import all_cells, reference_cells, student_cells

try:
    check_names(config)
except ConfigError as err:
    raise WorkflowError(str(err)) from None

CELLS = all_cells(config)
TEACHER_DATASET = config["teacher"]["dataset"]
TEACHER_SEED = config["teacher"].get("seed", 0)


def _alternatives(names):
    return "|".join(sorted(names))


wildcard_constraints:
    dataset=_alternatives(config["datasets"]),
    size=_alternatives(config["sizes"]),
    variant=_alternatives(config["variants"]),
    init=_alternatives(config["init_strategies"]),
    seed=r"\d+",


def job_config(*keys):
    """The parts of the config a job reads, as JSON: a job reruns only when those parts change."""
    parts = {}
    for key in keys:
        node, target = config, parts
        *parents, last = key.split(".")
        for p in parents:
            node, target = node[p], target.setdefault(p, {})
        target[last] = node[last]
    return json.dumps(parts, sort_keys=True)


def res(rule_name, key, default):
    return config.get("resources", {}).get(rule_name, {}).get(key, default)


def shards(dataset):
    return f"results/data/{dataset}/_info.json"


def teacher(size):
    return f"results/teacher/{size}/metrics.json"


def distilled(dataset, size, variant, seed):
    return f"results/distill/{dataset}/{size}/{variant}/seed{seed}/metrics.json"


def strategy(init):
    return config["init_strategies"][init]
