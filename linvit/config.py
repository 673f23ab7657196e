"""Loading and checking configs: the JSON schema for structure, the registries for names.

The schema (workflow/schemas/config.schema.yaml) checks shapes and types; names that live in
code registries (variants, sizes, sources, losses) are checked here, so adding a variant never
means editing the schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .io import file_sha256

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
# The init name of the softmax reference runs (linvit.grid.REFERENCE_INIT): what identifies a reference
# run (its variant is softmax, but so is a softmax control student's when `variants` lists softmax).
REFERENCE_INIT = "reference"
# Sources that read a user's folder or file: a `path` is required when the config is checked, before planning.
NEEDS_PATH = ("imagefolder", "cifar", "idx")
REFERENCE_STRATEGY = {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": False}
NO_DESIGN = "none"  # the design of a cell that does not distill (linvit.grid.Cell.design)


class ConfigError(ValueError):
    """A config mistake, reported in one line naming the key."""


def load_config(path: str | Path | None = None, text: str | None = None) -> dict:
    """A config from a YAML/JSON file, or from JSON text (what the Snakemake rules pass)."""
    if text is not None:
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"--config-json: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError("--config-json: the text does not hold a mapping")
        return data
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} does not hold a mapping")
    return data


def get(config: dict, dotted: str):
    """config['a']['b'] for 'a.b', with an error naming the missing key."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"config is missing key {dotted!r}")
        node = node[part]
    return node


def validate_schema(config: dict, schema_path: str | Path = SCHEMA, *, partial: bool = False) -> None:
    """The first schema error as a ConfigError naming its key. `partial`: a config given to one
    step by hand (`linvit teacher --config FILE`) may leave out the top-level sections that step
    does not read; what it holds is still checked (types, ranges, unknown keys)."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(config), key=lambda e: list(e.path))
    if partial:
        errors = [e for e in errors if e.path or e.validator != "required"]
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.path) or "(top level)"
        # A choice of forms (oneOf) says what it accepts where the schema describes it, not "is not
        # valid under any of the given schemas".
        message = (f"{err.instance!r} is not {err.schema['description']}"
                   if err.validator == "oneOf" and "description" in err.schema else err.message)
        raise ConfigError(f"config key {where}: {message}")


def _known(kind: str, key: str, names, known) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        plural = kind + ("es" if kind.endswith(("s", "x", "sh", "ch")) else "s")  # losses, not losss
        raise ConfigError(f"config key {key}: unknown {kind} {', '.join(map(repr, unknown))}; "
                          f"known {plural}: {', '.join(map(str, sorted(known)))}")


# Keys of every dataset entry (the schema checks them), beside its source's own options.
DATASET_KEYS = ("source", "labels", "transform", "classes")


def classes_problem(classes, num_labels: int | None = None) -> str | None:
    """What is wrong with a dataset's `classes` entry (None: nothing): it must be a non-empty list of
    distinct labels (whole numbers from 0), below `num_labels` when that is known."""
    if not isinstance(classes, list):
        return f"{classes!r} is not a list of the source's labels to keep"
    if not classes:
        return "the list is empty; give the source's labels to keep (e.g. [5, 6, 7, 8, 9])"
    for c in classes:
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            return f"{c!r} is not a label (a whole number from 0)"
    seen = set()
    for c in classes:
        if c in seen:
            return f"label {c} is listed twice"
        seen.add(c)
    if num_labels is not None:
        outside = [c for c in classes if c >= num_labels]
        if outside:
            return (f"label{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))} "
                    f"{'are' if len(outside) > 1 else 'is'} outside the source's labels 0..{num_labels - 1}")
    return None


def check_classes(name: str, spec: dict) -> None:
    """A dataset entry's `classes` (the source's labels to keep, relabelled 0..k-1 in that order;
    linvit.data.sources.select_classes): a non-empty list of distinct labels, inside the source's
    labels where its declaration tells them before loading (else that is checked when loading)."""
    if "classes" not in spec:
        return
    from .registry import source_num_labels

    key = f"config key datasets.{name}.classes"
    classes = spec["classes"]
    problem = classes_problem(classes, source_num_labels(spec))
    if problem:
        if spec.get("source") == "idx" and isinstance(classes, list) and any(isinstance(c, str) for c in classes):
            problem += "; the idx source's class names are its `class_names` option"
        raise ConfigError(f"{key}: {problem}")
    if spec.get("labels") == "teacher":
        raise ConfigError(f"{key}: a subset of classes is relabelled 0..{len(classes) - 1}, so it cannot share the "
                          f"teacher's label space (labels: teacher); leave `labels` out (own)")


def check_source_options(name: str, spec: dict) -> None:
    """A dataset entry's keys against its source's declared options (linvit.data.sources'
    register_source): a misspelt key would otherwise be ignored, and a wrong value fail only in
    the shards job, after Snakemake removed that job's earlier output. Its `classes` too (every
    source takes it)."""
    import jsonschema

    from .registry import source_options

    check_classes(name, spec)
    options = source_options(spec["source"])
    if options is None:
        return
    unknown = sorted(set(spec) - set(DATASET_KEYS) - set(options))
    if unknown:
        raise ConfigError(f"config key datasets.{name}: unknown option(s) {', '.join(map(repr, unknown))} of source "
                          f"{spec['source']!r}; known: {', '.join(sorted(options))}")
    for key, fragment in options.items():
        if key in spec:
            try:
                jsonschema.validate(spec[key], fragment)
            except jsonschema.ValidationError as err:
                raise ConfigError(f"config key datasets.{name}.{key}: {err.message}") from None


def check_names(config: dict) -> None:
    """Every name the grid uses must exist: variants, sizes, datasets and their sources, inits, losses."""
    from .groups import GROUPS
    from .registry import LOSS_ALIASES, names
    from .sizes import SIZES

    # `softmax` among them is the control: softmax students initialized by the same strategies as the
    # linear ones (init strategies' names; never the reference, whose init is REFERENCE_INIT).
    _known("variant", "variants", config["variants"], names("variant"))
    _check_sequential(config)
    teachers = config.get("teachers", {})
    _known("size", "sizes", config["sizes"], {*SIZES, *teachers})
    for size in config["sizes"]:
        _check_replicates(config, size)
    datasets = config["datasets"]
    _known("dataset", "targets", config["targets"], datasets)
    _check_cells(config)
    trained = trained_sizes(config)
    if trained:
        teacher = config.get("teacher", {})
        missing = [k for k in ("dataset", "train") if k not in teacher]
        if missing:
            raise ConfigError(f"config key teacher.{missing[0]}: sizes {', '.join(trained)} are trained by the "
                              f"harness and need it (or name them under `teachers:` to load pretrained weights)")
        _known("dataset", "teacher.dataset", [teacher["dataset"]], datasets)
    for name, spec in datasets.items():
        _known("source", f"datasets.{name}.source", [spec["source"]], names("source"))
        if spec["source"] in NEEDS_PATH and "path" not in spec:
            raise ConfigError(f"config key datasets.{name}.path: source {spec['source']!r} reads the dataset from "
                              f"a folder you give (set it in the config, or in a second --configfile)")
        check_source_options(name, spec)
    strategies = config["init_strategies"]
    if REFERENCE_INIT in strategies:
        # init_strategy() would silently replace it by the reference's, and its runs share its name.
        raise ConfigError(f"config key init_strategies: {REFERENCE_INIT!r} names the softmax reference runs, "
                          f"not an init strategy; rename it")
    _known("init strategy", "inits", config["inits"], strategies)
    outside = [n for n in config.get("control_inits") or [] if n not in config["inits"]]
    if outside:
        raise ConfigError(f"config key control_inits: {', '.join(map(repr, outside))} not in inits "
                          f"({', '.join(config['inits'])}); the control takes a subset of them")
    losses = {*names("loss"), *LOSS_ALIASES}
    if "loss" in config["distill"]:
        _known("distillation loss", "distill.loss", [config["distill"]["loss"]], losses)
    known_designs = design_specs(config)
    if NO_DESIGN in known_designs:
        raise ConfigError(f"config key distill_designs: {NO_DESIGN!r} names the cells that do not distill; rename it")
    for name, design in known_designs.items():
        if ("losses" in design) == ("phases" in design):
            raise ConfigError(f"config key distill_designs.{name}: give either `losses` (one phase) or `phases`, "
                              f"{'not both' if 'losses' in design else 'neither is given'}")
        for i, phase in enumerate(design.get("phases") or [design]):
            where = f"distill_designs.{name}" + (f".phases[{i}]" if "phases" in design else "")
            _check_terms(phase["losses"], f"{where}.losses", losses)
    if "distills" in config:
        _known("distillation design", "distills", config["distills"], known_designs)
    for name, spec in strategies.items():
        _known("parameter group", f"init_strategies.{name}.copy", spec["copy"], GROUPS)
        _check_terms(spec.get("train_losses") or [], f"init_strategies.{name}.train_losses", losses)
        distill = spec.get("distill")
        if isinstance(distill, str):
            _known("distillation design", f"init_strategies.{name}.distill", [distill], known_designs)
        elif distill and name in config["inits"] and not design_names(config):
            raise ConfigError(f"config key distills: init strategy {name!r} distills, but no distillation design is "
                              f"given (list designs of distill_designs in `distills`, or set distill.loss)")


def all_seeds(config: dict) -> list[int]:
    """The configured seeds, then those a sequential look added (`added_seeds`, linvit decide)."""
    added = [int(seed) for a in config.get("added_seeds") or [] for seed in a["seeds"]]
    return list(dict.fromkeys([*map(int, config["seeds"]), *sorted(added)]))


def seed_sequence(config: dict, n: int) -> list[int]:
    """The first n seeds of a sequential design: the configured ones in order, then the next unused
    integers (look k's seeds are the first looks[k] of these)."""
    seeds = [int(s) for s in config["seeds"]][:n]
    nxt = max(seeds, default=-1) + 1
    while len(seeds) < n:
        seeds.append(nxt)
        nxt += 1
    return seeds


def _check_sequential(config: dict) -> None:
    """The plan (linvit.stats.sequential.Plan) and the runs a look added: each names a cell of the grid."""
    if "sequential" in config:
        from .stats.sequential import Plan  # scipy: only for a grid that has a plan
        try:
            Plan.from_config(config)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    from .registry import SOFTMAX

    for i, a in enumerate(config.get("added_seeds") or []):
        key = f"added_seeds[{i}]"
        reference = a["init"] == REFERENCE_INIT
        if not reference:
            _known("init strategy", f"{key}.init", [a["init"]], config["inits"])
        # The softmax reference is trained as softmax whether or not `variants` lists the softmax control.
        variants = [SOFTMAX] if reference else config["variants"]
        for field, names in (("dataset", config["targets"]), ("size", config["sizes"]),
                             ("variant", variants), ("budget", budgets(config))):
            _known(field, f"{key}.{field}", [a[field]], names)
        if a["design"] not in [NO_DESIGN, *design_specs(config)]:
            raise ConfigError(f"config key {key}.design: unknown design {a['design']!r}")
        cell = (a["dataset"], a["size"], a["variant"], int(a["budget"]))
        if not any(c == cell or (reference and (c[0], c[1], c[3]) == (cell[0], cell[1], cell[3]))
                   for c in grid_cells(config)):
            raise ConfigError(f"config key {key}: {'/'.join(map(str, cell))} is not a cell of the grid (`cells`)")
        again = sorted(set(map(int, a["seeds"])) & set(map(int, config["seeds"])))
        if again:
            raise ConfigError(f"config key {key}.seeds: seeds {', '.join(map(str, again))} are configured seeds "
                              f"already; a look adds only new ones")


def _check_terms(terms: list, key: str, losses) -> None:
    """The loss names of a list of loss terms (their structure is the schema's)."""
    for i, term in enumerate(terms):
        name = term if isinstance(term, str) else term["loss"]
        _known("distillation loss", f"{key}[{i}].loss", [name], losses)


def validate(config: dict, schema_path: str | Path = SCHEMA) -> dict:
    """Schema first (structure), then names against the registries; raises ConfigError."""
    validate_schema(config, schema_path)
    check_names(config)
    return config


def pretrained(config: dict, size: str) -> dict | None:
    """The `teachers:` entry of a loaded (pretrained) teacher, None for a size the harness trains."""
    return config.get("teachers", {}).get(size)


def checkpoint(config: dict, size: str, seed=None) -> dict:
    """The checkpoint student seed `seed` of a pretrained size copies from: its `teachers:` entry, or
    where the entry lists `replicates`, replicate number `seed` laid over the entry's keys (a replicate
    gives its own `file`, or its own hub `model`). Replicates are picked by seed value, not by position
    in `seeds`: seed s copies from replicates[s] whatever seeds the grid lists, so dropping or adding a
    seed never hands another seed's teacher folder a new checkpoint. Without `replicates` the seed is
    not used: every seed copies from the one checkpoint."""
    entry = pretrained(config, size)
    if entry is None:
        raise ConfigError(f"config key teachers.{size}: {size!r} is not a pretrained teacher")
    base = {k: v for k, v in entry.items() if k != "replicates"}
    replicates = entry.get("replicates")
    if not replicates:
        return base
    if seed is None:
        raise ConfigError(f"config key teachers.{size}.replicates: {len(replicates)} checkpoints, one per "
                          f"student seed; say which (--seed)")
    seed = int(seed)
    if not 0 <= seed < len(replicates):
        n = len(replicates)
        raise ConfigError(f"config key teachers.{size}.replicates: seed {seed} has no checkpoint ({n} listed, for "
                          f"seeds 0-{n - 1}): seed s copies from replicates[s], by seed value, not by position in "
                          f"seeds; list one for every seed up to {seed}, or use seeds 0-{n - 1}")
    return {**base, **replicates[seed]}


def checkpoint_file(entry: dict) -> Path | None:
    """The weights file of a checkpoint entry as the jobs open it (user folder expanded, links and
    `./` resolved, relative to the working folder), None for a hub checkpoint."""
    file = entry.get("file")
    return Path(file).expanduser().resolve() if file else None


def file_stamp(entry: dict) -> dict | None:
    """What a teacher job records of the file it loads, and what its rule's params hold so that
    Snakemake reruns it when the file changes (a file replaced by an older copy keeps Snakemake's
    mtime check quiet): the resolved path, size and modification time. None for a hub checkpoint."""
    path = checkpoint_file(entry)
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return {"path": str(path), "size": None, "mtime_ns": None}
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _check_replicates(config: dict, size: str) -> None:
    """Every seed of the grid has its own checkpoint, which exists, no two replicates are the same
    checkpoint (they would count one teacher twice, and the intervals would claim more than the data
    hold: the same file through another spelling, a link or a byte-identical copy counts), and the
    replicates are checkpoints of one recipe (no replicate gives its own model_args)."""
    entry = pretrained(config, size)
    if not entry or "replicates" not in entry:
        return
    key = f"config key teachers.{size}.replicates"
    for seed in all_seeds(config):
        checkpoint(config, size, seed)
    for i, replicate in enumerate(entry["replicates"]):
        if "model_args" in replicate:
            raise ConfigError(f"{key}[{i}].model_args: replicates are checkpoints of one recipe and share its "
                              f"options; give model_args once beside `model` (a checkpoint of another recipe "
                              f"is another teacher: name it as a size of its own)")
    checkpoints = [checkpoint(config, size, i) for i in range(len(entry["replicates"]))]
    files = [checkpoint_file(c) for c in checkpoints]
    seen = {}
    for i, c in enumerate(checkpoints):
        same = json.dumps([c.get("model"), str(files[i]) if files[i] else None], sort_keys=True)
        if same in seen:
            raise ConfigError(f"{key}[{i}]: the same checkpoint as replicates[{seen[same]}]; each seed needs its own")
        seen[same] = i
    for i, (c, file) in enumerate(zip(checkpoints, files)):
        if file is not None and not file.is_file():
            raise ConfigError(f"{key}[{i}].file: {c['file']} does not exist")
    # Byte-identical copies, reading as little as the check allows (configs are checked at every parse):
    # files of one size (checkpoints of one architecture all are) whose first and last MiB agree, then
    # their sha256.
    same = [[i for i, file in enumerate(files) if file is not None]]
    for fingerprint in (lambda f: f.stat().st_size, _ends, file_sha256):
        groups = {}
        for group in same:
            for i in group:
                groups.setdefault((group[0], fingerprint(files[i])), []).append(i)
        same = [group for group in groups.values() if len(group) > 1]
    if same:
        j, i = min(same)[:2]
        raise ConfigError(f"{key}[{i}]: {checkpoints[i]['file']} is a byte-identical copy of replicates[{j}]'s "
                          f"{checkpoints[j]['file']}; each seed needs its own checkpoint")


def _ends(path: Path, n: int = 1 << 20) -> bytes:
    """The first and last n bytes of a file."""
    with open(path, "rb") as f:
        head = f.read(n)
        f.seek(max(0, path.stat().st_size - n))
        return head + f.read(n)


# How a grid's teachers are replicated (teacher_design): what every verdict's intervals are over.
PER_SEED = "per_seed"        # a trained teacher per student seed: the intervals cover teachers
ONE_TEACHER = "one"          # one trained teacher for every seed (teacher.seed an integer): conditional on it
CHECKPOINT = "checkpoint"    # a pretrained teacher (teachers:): the verdicts are about that checkpoint
CHECKPOINTS = "checkpoints"  # pretrained checkpoints, one per seed (teachers.<size>.replicates): they cover them


def teacher_design(config: dict, size: str) -> str:
    """How the teacher of `size` is replicated across the grid's seeds: PER_SEED (the default where the
    harness trains it; `teacher.seed: per_seed` or left out), ONE_TEACHER (`teacher.seed: <int>`),
    CHECKPOINT (a pretrained teacher, `teachers:`) or CHECKPOINTS (`teachers.<size>.replicates`)."""
    entry = pretrained(config, size)
    if entry is not None:
        return CHECKPOINTS if entry.get("replicates") else CHECKPOINT
    seed = (config.get("teacher") or {}).get("seed", PER_SEED)
    return PER_SEED if seed == PER_SEED else ONE_TEACHER


def replicated(config: dict, size: str) -> bool:
    """Whether every seed of `size` has its own teacher (PER_SEED or CHECKPOINTS), so that the seed-to-seed
    variation holds the teacher-to-teacher variation and the intervals cover teachers."""
    return teacher_design(config, size) in (PER_SEED, CHECKPOINTS)


def teacher_seed(config: dict, size: str, seed) -> int | None:
    """The seed of the teacher that student seed `seed` of `size` copies from: the student's own under
    PER_SEED and CHECKPOINTS (replicate number `seed`), `teacher.seed` under ONE_TEACHER, None for one
    pretrained checkpoint (which has no seed)."""
    design = teacher_design(config, size)
    if design == CHECKPOINT:
        return None
    return int(config["teacher"]["seed"]) if design == ONE_TEACHER else int(seed)


def trained_sizes(config: dict) -> list[str]:
    """The sizes of the grid whose teacher the harness trains (the others are loaded)."""
    return [s for s in config["sizes"] if pretrained(config, s) is None]


def init_strategy(config: dict, init: str) -> dict:
    """The copy groups and distill flag of an init strategy ('reference' is the softmax reference)."""
    if init == REFERENCE_INIT:
        return REFERENCE_STRATEGY
    strategies = get(config, "init_strategies")
    if init not in strategies:
        raise ConfigError(f"config key init_strategies: unknown init strategy {init!r}; known: "
                          f"{', '.join(sorted(strategies))}")
    return strategies[init]


def budgets(config: dict) -> list[int]:
    """The students' training budgets (stage 2 steps): the `budgets` axis, else student.train.steps."""
    return [int(b) for b in config.get("budgets") or [get(config, "student.train.steps")]]


AXES = (("target", "targets"), ("size", "sizes"), ("variant", "variants"), ("budget", "budgets"))


def grid_cells(config: dict) -> frozenset[tuple[str, str, str, int]]:
    """The grid's cells (target dataset, size, variant, budget) that train: the full product of the axes by
    default; with `cells: {around: {target, size, variant, budget}}` the center and, for each axis, each of its
    values with the other axes at the center's (one axis at a time); with `cells: [{...}, ...]` those listed.
    Each listed cell's runs are every init strategy (and design) and seed, as in the product; the softmax
    reference is trained at every (target, size, budget) a cell uses."""
    values = {axis: (budgets(config) if axis == "budgets" else list(config[axis])) for _, axis in AXES}
    spec = config.get("cells")
    if spec is None:
        return frozenset((d, s, v, b) for d in values["targets"] for s in values["sizes"]
                         for v in values["variants"] for b in values["budgets"])
    if isinstance(spec, dict):  # around a center
        center = tuple(spec["around"][field] for field, _ in AXES)
        out = {center}
        for i, (_, axis) in enumerate(AXES):
            out |= {center[:i] + (value,) + center[i + 1:] for value in values[axis]}
        return frozenset((d, s, v, int(b)) for d, s, v, b in out)
    return frozenset((c["target"], c["size"], c["variant"], int(c["budget"])) for c in spec)


def _check_cells(config: dict) -> None:
    """`cells`' values are on their axes, and every value of an axis is in some cell (an axis value no cell
    uses would train teachers and shards for nothing)."""
    spec = config.get("cells")
    if spec is None:
        return
    values = {axis: (budgets(config) if axis == "budgets" else list(config[axis])) for _, axis in AXES}
    listed = [("cells.around", spec["around"])] if isinstance(spec, dict) else \
        [(f"cells[{i}]", c) for i, c in enumerate(spec)]
    for key, cell in listed:
        for field, axis in AXES:
            _known(field, f"{key}.{field}", [cell[field]], values[axis])
    cells = grid_cells(config)
    for i, (field, axis) in enumerate(AXES):
        unused = [v for v in values[axis] if not any(c[i] == v for c in cells)]
        if unused:
            raise ConfigError(f"config key {axis}: {unused[0]!r} is in no cell of `cells` (list it in a cell, or "
                              f"remove it from {axis})")


def design_specs(config: dict) -> dict[str, dict]:
    """Every distillation design a config defines, by name: `distill_designs`, plus the design
    `distill.loss` names (that one loss, teacher-forced, attention only: the older configs' form)."""
    specs = dict(config.get("distill_designs") or {})
    loss = (config.get("distill") or {}).get("loss")
    if loss is not None and loss not in specs:
        specs[loss] = {"losses": [loss], "description": f"{loss}, teacher-forced (distill.loss)"}
    return specs


def design_names(config: dict) -> list[str]:
    """The designs the `distill: true` strategies are crossed with: `distills`, else `distill.loss`'s
    design, else the first of `distill_designs`."""
    if config.get("distills"):
        return list(config["distills"])
    specs = design_specs(config)
    loss = (config.get("distill") or {}).get("loss")
    return [loss] if loss is not None else list(specs)[:1]


def designs(config: dict, init: str) -> list[str]:
    """The designs init strategy `init` runs with: ['none'] when it does not distill, the one it names
    (`distill: <design>`, a literature baseline's fixed recipe), or the `distills` axis (`distill: true`)."""
    distill = init_strategy(config, init).get("distill", False)
    if isinstance(distill, str):
        return [distill]
    if not distill:
        return [NO_DESIGN]
    names = design_names(config)
    if not names:  # its cells would silently vanish from the grid
        raise ConfigError(f"config key distills: init strategy {init!r} distills, but no distillation design is "
                          f"given (list designs of distill_designs in `distills`, or set distill.loss)")
    return names


def design_spec(config: dict, name: str) -> dict:
    """A design's entry, as a list of phases: [{losses: [...], freeze: bool, fraction: float}]."""
    specs = design_specs(config)
    if name not in specs:
        raise ConfigError(f"config key distill_designs: unknown distillation design {name!r}; known: "
                          f"{', '.join(sorted(specs)) or 'none'}")
    return specs[name]


# The losses that read a teacher's logits (linvit.losses registers them): on a target whose label
# space the teacher does not share, the softmax reference of the cell gives those logits instead.
LOGIT_LOSSES = ("logit_kd", "logit_kd_hard")


def shares_teacher_labels(config: dict, dataset: str, size: str) -> bool:
    """Whether the teacher of `size` classifies `dataset`'s labels: the dataset it was trained on by
    the harness, or one declared `labels: teacher`."""
    if (config.get("datasets", {}).get(dataset) or {}).get("labels") == "teacher":
        return True
    return pretrained(config, size) is None and (config.get("teacher") or {}).get("dataset") == dataset


def kd_reference(config: dict, init: str, dataset: str, size: str) -> bool:
    """Whether a student of `init` on `dataset` takes its logit teacher from the softmax reference."""
    terms = init_strategy(config, init).get("train_losses") or []
    logits = any((t if isinstance(t, str) else t["loss"]) in LOGIT_LOSSES for t in terms)
    return logits and not shares_teacher_labels(config, dataset, size)
