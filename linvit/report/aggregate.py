"""Read every expected cell's result files into two tidy tables: one row per run, one row per evaluation.

The list of expected cells comes from `linvit.grid` (one per dataset, size, variant, init, design,
budget and seed), so a cell that failed or never ran still gets a row instead of silently vanishing
from the report. Each row has a status:

    ok        metrics.json and eval.json read and match the contract
    missing   no metrics.json (reason: the log's last error line, or "not run (no log)"), or not evaluated
    diverged  no metrics.json and the job's log (or the distillation's it waited for) says "diverged"
    invalid   a result file (metrics.json, eval.json, train.jsonl) cannot be read or breaks the contract

One bad cell never stops the report: its reason names the file, the line where there is one, and the
key. Only a config the grid cannot be built from raises `ResultsError`.

A run's predictions.npz (every test image's prediction, written by linvit.steps.run_student) is
checked against its metrics (number of images, accuracy) and named in the `predictions` column (empty
for results from before it was written); `load_predictions` reads them for the claims' paired t and
Fieller intervals over seeds and test images (linvit.stats.paired).

Snakemake's benchmark TSVs (`benchmark_path` in linvit.grid) add each run's wall-clock seconds and peak
memory (max_rss, MB) of its training and evaluation jobs; a run made without Snakemake has none (NaN).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from linvit.config import design_names
from linvit.grid import Cell, all_cells
from linvit.grid import jobs as grid_jobs
from linvit.groups import GROUPS  # a group a run reports beyond these still gets a column
from linvit.io import atomic_path
from linvit.jobfiles import log_line as _log_line, read_benchmark  # noqa: F401 (read_benchmark: also for callers)
from linvit.predictions import PREDICTIONS, Predictions, PredictionsError, read_predictions

ID_COLUMNS = ["dataset", "size", "variant", "init", "design", "budget", "seed"]
STATUSES = ("ok", "diverged", "invalid", "missing")
FIDELITY_METRICS = ("kl", "js", "corr")  # per-block columns fidelity_<metric>_l<block> (eval.json lists)
BENCHMARK_COLUMNS = ["train_wall_s", "train_max_rss_mb"]  # the cell's job: training and evaluation
RUN_COLUMNS = ID_COLUMNS + [
    "status", "reason", "test_acc", "test_samples", "steps", "train_time_s", "images_seen",
    "distill_steps", "distill_time_s", "distill_loss", "distill_final_loss", "total_time_s", "train_losses",
    "task_weight", "params", "params_attn_extra", "throughput_img_s", "throughput_device", "throughput_dtype",
    "throughput_batch", "fidelity_kl_mean", "fidelity_js_mean", "fidelity_corr_mean", *BENCHMARK_COLUMNS,
    "predictions",  # path of the run's predictions.npz, empty when it has none
]
CURVE_COLUMNS = ID_COLUMNS + ["step", "epoch", "test_acc", "elapsed_s"]
CONFIG_KEYS = ("targets", "sizes", "variants", "inits", "seeds", "init_strategies")
# Per-rule rows of the cost table, in this order (distillations get one row per init strategy and
# design, students one per init strategy).
COST_RULES = ("teacher", "distill", "student", "reference")
# What a job upstream of a missing cell is called in its reason (a job of another rule: its name).
UPSTREAM = {"distill": "distillation", "reference": "softmax reference", "teacher": "teacher",
            "teacher_pretrained": "teacher", "teacher_replicate": "teacher"}


class ResultsError(ValueError):
    """A result file (or the config) does not match the contract; the message names the file and key."""


def collect(config: dict, results: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per expected cell (runs) and one row per evaluation line of every train.jsonl (curves)."""
    check_config(config)
    results = Path(results)
    graph = {job.name: job for job in grid_jobs(config, results)}
    jobs = benchmark_jobs(config, results, graph.values())
    timing = {job.job: job for job in jobs.itertuples()}
    rows, curve_rows = [], []
    for cell in all_cells(config):
        row, curves = _run_row(cell, results, config, graph)
        job = timing.get(f"{cell.rule} {cell.key}")  # the cell's job: it trains and evaluates
        row["train_wall_s"] = job.wall_s if job else math.nan
        row["train_max_rss_mb"] = job.max_rss_mb if job else math.nan
        rows.append(row)
        curve_rows.extend(curves)
    return _runs_frame(rows), pd.DataFrame(curve_rows, columns=CURVE_COLUMNS)


def check_config(config: dict) -> None:
    """What the grid is built from: its axes, every init's strategy, a budget and, for a distilling
    strategy, a design (the report reads no config the workflow would have refused, but says so in
    one line if it does)."""
    for key in CONFIG_KEYS:
        if key not in config:
            raise ResultsError(f"config: missing key '{key}'")
    if not config.get("budgets") and not ((config.get("student") or {}).get("train") or {}).get("steps"):
        raise ResultsError("config: missing key 'budgets' (or 'student.train.steps', the default budget)")
    strategies = config["init_strategies"] or {}
    for init in config["inits"]:
        spec = strategies.get(init)
        if not isinstance(spec, dict):
            raise ResultsError(f"config: init strategy '{init}' of inits is not defined under init_strategies")
        if spec.get("distill") is True and not design_names(config):
            raise ResultsError(f"config: init strategy '{init}' distills, but no distillation design is given "
                               f"(distills, distill_designs or distill.loss)")


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """The report's only CSV writer: through linvit.io.atomic_path, so an interrupted report never
    leaves a table that looks complete."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


# ---------------------------------------------------------------------------------------------
# One cell


def _run_row(cell: Cell, results: Path, config: dict, graph: dict | None = None) -> tuple[dict, list[dict]]:
    row: dict = {**cell.as_dict(), "status": "ok", "reason": ""}
    run_dir = cell.run_dir(results)
    metrics_path, eval_path = run_dir / "metrics.json", run_dir / "eval.json"
    curves, curves_problem = _curve_rows(cell, results)
    # Values that were read are kept even for a cell that is not ok (they can explain the failure);
    # only status "ok" rows enter the statistics and verdicts.
    try:
        metrics = _read_json(metrics_path, cell) if metrics_path.exists() else None
        if metrics is not None:
            row.update(_metrics_fields(metrics, metrics_path))
        evaluation = _read_json(eval_path, cell) if eval_path.exists() else None
        if evaluation is not None:
            row.update(_eval_fields(evaluation, eval_path))
    except ResultsError as err:
        row.update(status="invalid", reason=str(err))
        return row, curves
    if metrics is None:
        status, reason = failure(cell, results, config, graph)
        row.update(status=status, reason=reason)
    elif evaluation is None:
        _, line = _log_line(cell.log_path(results))
        row.update(status="missing", reason=f"not evaluated (no {eval_path})" + (f": {line}" if line else ""))
    elif curves_problem:
        row.update(status="invalid", reason=curves_problem)
    else:
        problem = _check_predictions(run_dir / PREDICTIONS, row)
        if problem:
            row.update(status="invalid", reason=problem)
    return row, curves


def _check_predictions(path: Path, row: dict) -> str:
    """Name a finished run's predictions file in `row` if it agrees with metrics.json; else what is wrong."""
    if not path.exists():
        return ""
    try:
        predictions = read_predictions(path)
    except PredictionsError as err:
        return str(err)
    samples = row.get("test_samples")
    if samples is not None and not math.isnan(samples) and predictions.samples != samples:
        return f"{path}: 'samples' is {predictions.samples} but metrics.json's 'test_samples' is {samples:g}"
    acc = float(predictions.correct.mean()) if predictions.samples else math.nan
    if not abs(acc - row["test_acc"]) <= 0.5 / max(predictions.samples, 1):
        return f"{path}: predictions give accuracy {acc:.6f} but metrics.json's 'test_acc' is {row['test_acc']:.6f}"
    row["predictions"] = str(path)
    return ""


def load_predictions(runs: pd.DataFrame) -> dict[tuple, Predictions]:
    """(dataset, size, variant, init, design, budget, seed) -> the per-image predictions of every ok
    run that has a predictions file (collect checked each)."""
    if "predictions" not in runs:
        return {}
    ok = runs[(runs["status"] == "ok") & runs["predictions"].notna() & (runs["predictions"] != "")]
    return {tuple(getattr(r, c) for c in ID_COLUMNS): read_predictions(r.predictions) for r in ok.itertuples()}


def failure(cell: Cell, results: Path, config: dict, graph: dict | None = None) -> tuple[str, str]:
    """Why a cell has no metrics: (status, reason) from its job's log; else, the job never started, from the
    nearest job upstream of it (grid.jobs's `needs`, followed breadth-first: its distillation, softmax
    reference, teacher, shards, and theirs) whose log has an error line. `graph`: {Job.name: Job} of
    grid.jobs(config, results), built here when not given."""
    log = cell.log_path(results)
    if log.exists():
        status, line = _log_line(log)
        return status, line or f"failed (see {log})"
    if graph is None:
        graph = {job.name: job for job in grid_jobs(config, results)}
    job = graph.get(f"{cell.rule} {cell.key}")
    # The later stages first (needs lists shards, teacher, distillation, reference): the nearest cause.
    queue, seen = list(reversed(job.needs)) if job else [], set()
    while queue:
        name = queue.pop(0)
        if name in seen or name not in graph:
            continue
        seen.add(name)
        upstream = graph[name]
        status, line = _log_line(Path(upstream.log))
        if line:
            what = UPSTREAM.get(upstream.rule, upstream.name)
            return status, f"{what} {'diverged' if status == 'diverged' else 'failed'} ({upstream.log}): {line}"
        queue += reversed(upstream.needs)
    return "missing", "not run (no log)"


def _read_json(path: Path, cell: Cell) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: cannot be read ({err})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    # A file copied into the wrong directory would silently corrupt every comparison.
    for key, expected in cell.as_dict().items():
        if key in data and str(data[key]) != str(expected):
            raise ResultsError(f"{path}: '{key}' is {data[key]!r} but the file lies in cell {cell.key}")
    return data


def _metrics_fields(m: dict, path: Path) -> dict:
    acc = _number(m, "test_acc", path)
    if not 0.0 <= acc <= 1.0:
        raise ResultsError(f"{path}: 'test_acc' is {acc}, expected a fraction in 0..1")
    train_time = _number(m, "train_time_s", path)
    fields = {
        "test_acc": acc,
        "test_samples": _count(m, "test_samples", path),
        "steps": _count(m, "steps", path),
        "train_time_s": train_time,
        "images_seen": _count(m, "images_seen", path),
    }
    # distill is null (or absent) when the strategy has no distillation stage: it then costs nothing.
    distill = m.get("distill")
    if distill is None:
        fields.update(distill_steps=0, distill_time_s=0.0, distill_loss=None, distill_final_loss=math.nan)
    elif isinstance(distill, dict):
        where = f"{path} 'distill'"
        fields.update(distill_steps=_count(distill, "steps", where),
                      distill_time_s=_number(distill, "time_s", where),
                      distill_loss=str(distill.get("loss", "")) or None,
                      distill_final_loss=_number(distill, "final_loss", where, required=False))
    else:
        raise ResultsError(f"{path}: 'distill' must be null or an object, got {type(distill).__name__}")
    fields["total_time_s"] = train_time + fields["distill_time_s"]
    # Stage-2 losses beside the task's (logit KD, attention distillation), as "name:weight" names.
    fields["train_losses"] = _train_losses(m.get("train_losses"), path)
    fields["task_weight"] = _number(m, "task_weight", path, required=False)
    if math.isnan(fields["task_weight"]):
        fields["task_weight"] = 1.0  # absent in metrics.json files older than the key: the task's loss alone
    copied = m.get("copied", {})
    if not isinstance(copied, dict):
        raise ResultsError(f"{path}: 'copied' must be an object of group -> parameter count")
    for group in dict.fromkeys([*GROUPS, *copied]):
        fields[f"copied_{group}"] = _count(copied, group, f"{path} 'copied'", required=False)
    return fields


def _train_losses(terms, path: Path) -> str | None:
    """metrics.json's train_losses (a list of {loss, weight, ...} or names) as 'logit_kd:0.5+map_ce:3'."""
    if terms is None:
        return None
    if not isinstance(terms, list):
        raise ResultsError(f"{path}: 'train_losses' must be a list of loss terms, got {type(terms).__name__}")
    names = []
    for i, term in enumerate(terms):
        if isinstance(term, str):
            term = {"loss": term}
        if not isinstance(term, dict) or not isinstance(term.get("loss"), str):
            raise ResultsError(f"{path}: 'train_losses[{i}]' must be a loss name or an object with a 'loss' name")
        weight = _as_float(term.get("weight", 1.0), f"{path}: 'train_losses[{i}].weight'")
        names.append(f"{term['loss']}:{weight:g}")
    return "+".join(names) or None


def _eval_fields(e: dict, path: Path) -> dict:
    fields = {key: _count(e, key, path) for key in ("params", "params_attn_extra")}
    fields.update({key: _number(e, key, path) for key in ("throughput_img_s", "fidelity_kl_mean")})
    # The divergences beside KL (eval.json files older than them have none: NaN).
    fields.update({key: _number(e, key, path, required=False) for key in ("fidelity_js_mean", "fidelity_corr_mean")})
    # What each throughput figure was measured on; absent in eval.json files older than these keys.
    fields.update(throughput_device=e.get("device"), throughput_dtype=e.get("dtype"),
                  throughput_batch=_number(e, "throughput_batch", path, required=False))
    for metric in FIDELITY_METRICS:
        key = f"fidelity_{metric}"
        per_layer = e.get(key)
        if not isinstance(per_layer, list):
            raise ResultsError(f"{path}: missing key '{key}' (a list with one float per block)")
        for layer, value in enumerate(per_layer):
            fields[f"{key}_l{layer}"] = _as_float(value, f"{path}: '{key}[{layer}]'")
    return fields


def _number(d: dict, key: str, where, required: bool = True) -> float:
    if key not in d or d[key] is None:
        if required:
            raise ResultsError(f"{where}: missing key '{key}'")
        return math.nan
    return _as_float(d[key], f"{where}: '{key}'")


def _count(d: dict, key: str, where, required: bool = True) -> float:
    """A whole number (steps, samples, parameters): kept as float here, stored as a nullable integer column."""
    value = _number(d, key, where, required)
    if not (math.isnan(value) or value.is_integer()):
        raise ResultsError(f"{where}: '{key}' is {value}, expected a whole number")
    return value


def _as_float(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultsError(f"{what} is {value!r}, expected a number")
    return float(value)


def _curve_rows(cell: Cell, results: Path) -> tuple[list[dict], str]:
    """The eval lines of train.jsonl, up to the first bad line; and what is wrong with that line ("" if none)."""
    path = cell.run_dir(results) / "train.jsonl"
    if not path.exists():
        return [], ""
    rows = []
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ResultsError(f"{where}: not valid JSON ({err.msg})") from None
                if not isinstance(record, dict) or "kind" not in record:
                    raise ResultsError(f"{where}: expected a JSON object with a 'kind' key")
                if record["kind"] != "eval":
                    continue
                rows.append({**cell.as_dict(), **{key: _number(record, key, where)
                                                  for key in ("step", "epoch", "test_acc", "elapsed_s")}})
    except ResultsError as err:
        return rows, str(err)
    except (OSError, UnicodeDecodeError) as err:
        return rows, f"{path}: cannot be read ({err})"
    return rows, ""


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    """Fix the column order: the contract's columns, then per-layer fidelity and copied counts in numeric/group order."""
    seen = dict.fromkeys(key for row in rows for key in row)
    layers = [k for metric in FIDELITY_METRICS
              for k in sorted((k for k in seen if k.startswith(f"fidelity_{metric}_l")),
                              key=lambda k: int(k.removeprefix(f"fidelity_{metric}_l")))]
    copied = [f"copied_{g}" for g in GROUPS] + [k for k in seen if k.startswith("copied_") and k.removeprefix("copied_") not in GROUPS]
    frame = pd.DataFrame(rows).reindex(columns=RUN_COLUMNS + layers + copied)
    counts = ["test_samples", "steps", "images_seen", "distill_steps", "params", "params_attn_extra", *copied]
    return frame.astype({"seed": int, "budget": int, **{col: "Int64" for col in counts}})


# ---------------------------------------------------------------------------------------------
# Attention maps: the class-token rows evaluate records in eval.json (cls_attention)


def attention_records(runs: pd.DataFrame, results: str | Path) -> list[dict]:
    """The class-token attention rows of every finished run (eval.json's `cls_attention`, written by
    linvit.evaluate.attention_report), as records for figures.attention_maps: the run's ID_COLUMNS,
    "model" ("teacher" or "student") and class_token_rows' "row", "block", "prefix", "grid", "heads".

    A run whose eval.json has no (or a malformed) `cls_attention` adds nothing: the figure then says
    "no results" for it; the run itself stays ok (the maps are an illustration, not a result).
    """
    results = Path(results)
    records = []
    for row in runs[runs["status"] == "ok"].itertuples():
        ids = {col: getattr(row, col) for col in ID_COLUMNS}
        cell = Cell(**{**ids, "seed": int(ids["seed"]), "budget": int(ids["budget"])})
        try:
            maps = json.loads((cell.run_dir(results) / "eval.json").read_text(encoding="utf-8")).get("cls_attention")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(maps, dict):
            continue
        for model in ("teacher", "student"):
            rec = maps.get(model)
            if isinstance(rec, dict) and isinstance(rec.get("heads"), list):
                records.append({**cell.as_dict(), "model": model,
                                **{k: rec.get(k) for k in ("row", "block", "prefix", "grid", "heads")}})
    return records


# ---------------------------------------------------------------------------------------------
# Cost: Snakemake's benchmark TSVs


def benchmark_jobs(config: dict, results: str | Path, planned=None) -> pd.DataFrame:
    """One row per job the grid runs: its rule ('distill' and 'student' rows carry the init and design),
    name (grid.Job.name), key, folder (where it writes), benchmark file, wall-clock seconds (mean over
    repeats), peak max_rss MB and cpu seconds; `problem` names an unreadable file. `planned`: the jobs of
    grid.jobs(config, results), listed here when not given.

    A job without a benchmark file (run without Snakemake, or not run) has NaN numbers and no problem.
    """
    check_config(config)
    rows = []
    for job in planned if planned is not None else grid_jobs(config, results):  # the jobs with a benchmark file
        if job.benchmark is None:
            continue
        # Every teacher job (trained, or a checkpoint loaded) is costed as `teacher`.
        rule = "teacher" if job.rule.startswith("teacher") else job.rule
        student = job.cell is not None and not job.cell.is_reference
        rows.append({"rule": rule, "init": job.cell.init if student else "",
                     "design": job.cell.design if student else "", "job": job.name, "key": job.key,
                     "folder": job.folder, "path": job.benchmark, **read_benchmark(Path(job.benchmark))})
    return pd.DataFrame(rows, columns=["rule", "init", "design", "job", "key", "folder", "path", "wall_s",
                                       "max_rss_mb", "cpu_time_s", "problem"])


def rule_costs(jobs: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Per rule (distillations per init strategy and design, students per init strategy) and in total:
    jobs, how many have a benchmark, wall-clock total and mean per job, peak memory, cpu seconds. Totals
    are sums over jobs, not elapsed time."""
    groups = []
    for rule in COST_RULES:
        if rule == "distill":
            distills = jobs[jobs["rule"] == rule]
            pairs = dict.fromkeys(zip(distills["init"], distills["design"]))
            groups += [(f"distill: {init}/{design}",
                        distills[(distills["init"] == init) & (distills["design"] == design)]) for init, design in pairs]
        elif rule == "student":
            groups += [(f"student: {init}", jobs[(jobs["rule"] == rule) & (jobs["init"] == init)])
                       for init in dict.fromkeys(config["inits"])]
        else:
            groups.append((rule, jobs[jobs["rule"] == rule]))
    groups.append(("total", jobs))
    rows = [{"rule": name, "jobs": len(g), "benchmarked": int(g["wall_s"].notna().sum()),
             "wall_s_total": g["wall_s"].sum(min_count=1), "wall_s_mean": g["wall_s"].mean(),
             "max_rss_mb_peak": g["max_rss_mb"].max(), "cpu_time_s_total": g["cpu_time_s"].sum(min_count=1)}
            for name, g in groups if len(g)]
    return pd.DataFrame(rows, columns=["rule", "jobs", "benchmarked", "wall_s_total", "wall_s_mean",
                                       "max_rss_mb_peak", "cpu_time_s_total"])


def collect_benchmarks(config: dict, results: str | Path) -> pd.DataFrame:
    """The per-rule cost table of a results tree (see rule_costs)."""
    return rule_costs(benchmark_jobs(config, results), config)
