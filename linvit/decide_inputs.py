"""What `linvit decide` reads: its arguments (the config files, the folder, a dry run, what passes on to
Snakemake), the merged config, and what in it decides a sequence (recorded at each look; a change between looks
is refused, naming the key, but for cells added)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .config import ConfigError, load_config, validate
from .decide_state import DecideError
from .grid import all_cells
from .runrecord import merge_config

DEFAULT_CONFIGS = ("workflow/config/default.yaml", "workflow/config/decide.yaml")


def split_args(argv: list[str]) -> tuple[list[str], list[str], str]:
    """(config files named by --configfile/--configfiles, every other argument for Snakemake, the folder
    Snakemake runs in: its --directory, else here)."""
    files, rest, i = [], [], 0
    directory = "."
    while i < len(argv):
        arg = argv[i]
        if arg in ("--directory", "-d"):
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise DecideError(f"{arg} names no folder (the project folder Snakemake runs in)")
            directory = argv[i + 1]
        elif arg.startswith("--directory="):
            directory = arg.split("=", 1)[1]
        if arg in ("--configfile", "--configfiles"):
            i, given = i + 1, len(files)
            while i < len(argv) and not argv[i].startswith("-"):
                files.append(argv[i])
                i += 1
            if len(files) == given:  # never the default grid in their place
                raise DecideError(f"{arg} names no file (the grid's config files, e.g. --configfile grid.yaml)")
            continue
        if arg.startswith(("--configfile=", "--configfiles=")):
            if not arg.split("=", 1)[1]:
                raise DecideError(f"{arg} names no file (the grid's config files, e.g. --configfile=grid.yaml)")
            files.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-C") or arg.startswith("--config="):
            raise DecideError("--config overrides are not mirrored by the driver (it must read the plan Snakemake "
                              "runs): put them in a config file and give it with --configfile")
        else:
            rest.append(arg)
        i += 1
    return files, rest, directory


def grid_config(rest: list[str]) -> tuple[list[str], list[str]]:
    """`linvit decide CONFIG [ARGS]`: an argument naming a .yaml/.yml file outside --configfile is the grid's
    config, run under its own `sequential:` plan or, where it has none, the shipped plan (DEFAULT_CONFIGS'
    decide.yaml) laid over it. (Its config files, the other arguments.) Snakemake's targets here are rules and
    results files, never a YAML file."""
    named = [a for a in rest if a.endswith((".yaml", ".yml")) and not a.startswith("-")]
    if not named:
        return [], rest
    if len(named) > 1:
        raise DecideError(f"{' and '.join(named)}: one grid config at a time (give more with --configfile)")
    path = Path(named[0])
    if not path.is_file():
        raise DecideError(f"{path}: no such config file")
    try:
        plan = [] if "sequential" in load_config(path) else [DEFAULT_CONFIGS[1]]
    except ConfigError as err:
        raise DecideError(f"{path}: {err}") from None
    return [str(path), *plan], [a for a in rest if a != named[0]]


def merged_config(files: list[str]) -> dict:
    """The config Snakemake builds from `files`: each laid over the previous one, mappings key by key."""
    config: dict = {}
    for f in files:
        if not Path(f).is_file():
            raise DecideError(f"--configfile {f}: no such file")
        merge_config(config, load_config(f))
    try:
        return validate(config)
    except ConfigError as err:
        raise DecideError(f"{' + '.join(files)}: {err}") from None


# --- the runs the looks read (after the last look, each must still be there and whole) ----------------------
def keep_going(args: list[str]) -> list[str]:
    """Snakemake's arguments with --keep-going: a run that fails leaves the others of its look to finish, and the
    workflow's onerror still makes the report, which reads the look without it (Driver.failed_runs)."""
    return args if {"--keep-going", "-k"} & set(args) else [*args, "--keep-going"]


# --- the driver's own inputs and its Snakemake: a dry run, signals, the lock's holder, the state's shape ---
DRY_RUN = ("-n", "--dry-run", "--dryrun")


FLAGS = "tkfFlSDpa"  # Snakemake's short options that take no value (so `-pn` is -p -n)


def is_dry_run(args: list[str]) -> bool:
    """Whether Snakemake's arguments ask for a dry run: -n, --dry-run, --dryrun, -n among short flags
    (`-pn`, `-np`), or the dryrun executor."""
    for i, a in enumerate(args):
        if a in DRY_RUN or a in ("--executor=dryrun", "-edryrun"):
            return True
        if a.startswith("-") and not a.startswith("--") and "n" in a and set(a[1:a.index("n")]) <= set(FLAGS):
            return True
        if a in ("--executor", "-e") and args[i + 1:i + 2] == ["dryrun"]:
            return True
    return False


# --- what decides a sequence (recorded at each look; a change between looks is refused, naming the key) ----
# Config keys that decide nothing a look reads or trains: the grid's description, its resources (threads,
# memory, time: how jobs are scheduled, not what they compute) and the driver's own added_seeds. Every other
# key decides, a key the schema gains later included, until it is named here.
NOT_DECIDING = ("description", "resources", "added_seeds")


# The cells' axes and roles: a change other than a cell added (ADDABLE) would change what decided looks read.
CELL_KEYS = ("targets", "sizes", "variants", "budgets", "inits", "control_inits", "distills")


LONG = 120  # a value whose JSON is longer is recorded as its digest (the key is still named)


def deciding(config: dict) -> dict[str, str]:
    """Everything that decides a sequence, key by key: dotted key -> the value as canonical JSON (or
    'sha256:<16 hex>' where that is longer than LONG). The plan and `claims.*` with their defaults filled in
    (a default written out is no change), the seeds, the cells' axes, and what the runs train and how they
    are judged: teacher(s), student, distill, evaluation, runtime, shards, the datasets, init strategies and
    distillation designs the grid uses (an unused one may change), and any other key but NOT_DECIDING."""
    from dataclasses import asdict

    from .config import designs
    from .claims.table import Design, Thresholds
    from .stats.paired import Settings

    given = {k: v for k, v in config.items() if k not in NOT_DECIDING}
    given["sequential"] = Design.from_config(config).plan.as_dict()
    given["claims"] = {**asdict(Thresholds()), **asdict(Settings()), **(config.get("claims") or {})}
    inits = list(dict.fromkeys([*config["inits"], *(config.get("control_inits") or [])]))
    if "init_strategies" in given:
        given["init_strategies"] = {k: v for k, v in config["init_strategies"].items() if k in inits}
    if "distill_designs" in given:
        used = {d for i in inits for d in designs(config, i)}
        given["distill_designs"] = {k: v for k, v in config["distill_designs"].items() if k in used}
    if "datasets" in given:
        used = {*config["targets"], (config.get("teacher") or {}).get("dataset")}
        given["datasets"] = {k: v for k, v in config["datasets"].items() if k in used}
    out: dict[str, str] = {}

    def walk(node, key: str) -> None:
        if isinstance(node, dict) and node:
            for k in sorted(node):
                walk(node[k], f"{key}.{k}" if key else str(k))
            return
        text = json.dumps(node, sort_keys=True)
        out[key] = text if len(text) <= LONG else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    walk(given, "")
    return out


def changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """Each key whose value differs, as 'key: before -> now' ('(not set)' for a key one side lacks); the shallowest
    first (an init dropped from `inits` is named before its strategy's settings, which go with it)."""
    return [f"{k}: {before.get(k, '(not set)')} -> {now.get(k, '(not set)')}"
            for k in sorted({*before, *now}, key=lambda k: (k.count("."), k)) if before.get(k) != now.get(k)]


# The axes a cell is added by mid-sequence (Driver.seed_cells): each a list that keeps its past values.
ADDABLE = ("targets", "sizes", "variants", "budgets")


def grown_axes(before: dict[str, str], now: dict[str, str]) -> dict[str, list] | None:
    """Where every change between two `deciding` records is cells added (an ADDABLE axis grown, its past values
    kept, and the definitions of datasets it newly uses): each grown axis's values before. Else None."""
    grown = {}
    for key in {*before, *now}:
        if before.get(key) == now.get(key):
            continue
        if key.startswith("datasets.") and key not in before:
            continue  # a new target's definition (the record holds the datasets the grid uses)
        try:
            old, new = json.loads(before[key]), json.loads(now[key])
        except (KeyError, ValueError):  # a key one side lacks, or a digest
            return None
        if key not in ADDABLE or not isinstance(old, list) or not isinstance(new, list) or not set(old) <= set(new):
            return None
        grown[key] = old
    return grown


def linear_cells(config: dict) -> set[tuple[str, str, str, int]]:
    """The grid's linear cells (dataset, size, variant, budget): those whose tests decide."""
    return {(c.dataset, c.size, c.variant, c.budget) for c in all_cells(config)
            if not c.is_reference and not c.is_control}
