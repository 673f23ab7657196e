"""`linvit bench`: the harness's own speed, measured against issue 10's targets.

Each benchmark returns rows (benchmark, metric, value, unit, target, meets); `save` writes them,
with the machine's slug, to results/bench/<machine>.csv, replacing that benchmark's earlier rows and
keeping the others'. Progress goes to stderr.

- train:   images/s of `fit`'s training steps (its own train_time_s: loader included, evaluation
           excluded) against a bare PyTorch loop with the same model, AdamW groups, clip, schedule
           and loss on batches already in memory; alternating, medians of repeats. Target >= 0.95.
           Also the final evaluation's own cost (fit's eval_time_s on the full test split).
- loader:  images/s of the train pipeline a job builds (steps._data: the config's transform and
           worker settings), against the bare loop's consumption. Target >= 5x.
           With --ranks N[,N...]: N processes reading as N ranks would, against one process: bytes
           and images/s per rank on ImageNet-size JPEGs at 224 px (linvit.bench_ranks). Targets:
           bytes per rank <= 1.2x 1/N of one process's, images/s per rank >= one process's.
- plan:    seconds of `snakemake -n --quiet` on a generated grid of about `jobs` jobs. Target <= 15 s.
- jobcost: a 1-step student run as the Snakemake rule runs it (a subprocess), split into
           interpreter+imports, setup, training, evaluations and exit (LINVIT_STAMPS, see
           linvit.cli.stamp); against a baseline checkout run the same way when given, else
           against the 28.9 s recorded before issue 10. Target: half or less.
- shards:  images/s of the shard writer (every image fully decoded once, its bytes kept, hashed and
           indexed) on a JPEG ImageFolder of ImageNet-size images (linvit.bench_ranks: about 400x350
           px, 105 kB, textured), with 1 worker (in process: the per-core rate) and with every core (a
           process pool, whose start-up weighs on a folder this small); and the hours ImageNet-1k's
           1,331,167 images would take on 8 and 32 cores at the per-core rate, assuming the writer
           scales with cores (docs/paper_scale.md).
- grid:    a finished grid's fixed cost: the sum of its jobs' wall times (Snakemake's benchmark files)
           over the sum of their training and distillation loops' times (each run's own train_time_s),
           per rule and in all. What lies between is start-up, imports, loads, the first and final
           evaluations and the writes. Target <= 1.2 (issue 42). Reads --results; trains nothing.
- status:  seconds of `linvit status` (a subprocess: interpreter, imports, config, every job's files,
           the text) on a generated results tree of the paper's grid (workflow/config/paper.yaml, 4,004
           jobs; --config for another): the run's record, 60% of the students and everything before them
           finished with benchmark files and logs, 40 started (Snakemake's markers), 20 failed, the rest to
           run. Target <= 5 s (issue 48).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from .bench_rows import COLUMNS, row, say  # noqa: F401 (row: the benchmarks' rows, read as bench.row)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "workflow" / "config" / "default.yaml"
BENCHMARKS = ("train", "loader", "plan", "jobcost", "shards", "grid", "status")
ALL = ("train", "loader", "plan", "jobcost", "shards")  # `all`: the ones that make their own data (grid reads a finished run)
RECORDED_JOB_S = 28.9  # a 1-step student's total before issue 10 (README: Harness benchmarks)
TRAIN_RATIO, LOADER_RATIO, PLAN_S, JOB_FRACTION, GRID_RATIO = 0.95, 5.0, 15.0, 0.5, 1.2
STATUS_S = 5.0  # `linvit status` on the paper grid's 4,004 jobs (issue 48)
PAPER_CONFIG = REPO / "workflow" / "config" / "paper.yaml"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_slug() -> str:
    """A filesystem-safe name of this machine: CPU model, its x86 family and model numbers, the
    vector instruction set torch's kernels use (machines named alike differ in both, and in speed
    by up to 2.5x), core count, plus the GPU's name: `amd-epyc-family-25-model-17-avx512-2cores`."""
    from .report.provenance import cpu_generation, cpu_kernels, cpu_model

    parts = [_slug(cpu_model()) or "cpu", _slug(cpu_generation()), _slug(cpu_kernels()), f"{os.cpu_count()}cores"]
    try:
        import torch

        if torch.cuda.is_available():
            parts.append(_slug(torch.cuda.get_device_name(0)))
    except Exception:  # noqa: BLE001 - no usable CUDA: a CPU machine
        pass
    return "-".join(p for p in parts if p)


def save(rows: list[dict], out_dir: str | Path, machine: str | None = None) -> Path:
    """Write `rows` to <out_dir>/<machine>.csv: the rows of their benchmarks replace those already
    there, the other benchmarks' rows stay."""
    from .io import atomic_path

    machine = machine or machine_slug()
    path = Path(out_dir) / f"{machine}.csv"
    new = pd.DataFrame(rows, columns=COLUMNS[:-1]).assign(machine=machine)[COLUMNS]
    if path.exists():
        try:
            old = pd.read_csv(path, keep_default_na=False)
        except (ValueError, pd.errors.ParserError) as err:
            raise ValueError(f"{path}: not a benchmark CSV ({err}); move it away") from None
        if list(old.columns) != COLUMNS:
            raise ValueError(f"{path}: columns {list(old.columns)}, expected {COLUMNS}; move it away")
        new = pd.concat([old[~old["benchmark"].isin(set(new["benchmark"]))], new], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        new.to_csv(tmp, index=False)
    return path


def table(rows: list[dict]) -> str:
    df = pd.DataFrame(rows, columns=COLUMNS[:-1])
    df["value"] = [f"{v:.4g}" if isinstance(v, float) else v for v in df["value"]]
    return df.to_string(index=False)


# -- shared setup ------------------------------------------------------------------------------

def load(config_path: str | Path | None) -> dict:
    from .config import load_config

    return load_config(config_path or DEFAULT_CONFIG)


def digits_shards(out_dir: str | Path) -> Path:
    """scikit-learn's digits (28x28, real images) written by the harness's shard writer: what the
    benchmarks read when not given --shards."""
    from .data.shards import write_shards

    out = Path(out_dir) / "digits"
    if not (out / "_info.json").exists():
        write_shards("digits", {"source": "digits"}, out, samples_per_shard=500, workers=1)
    return out


def _student_spec(config: dict, steps: int, **changes):
    from .train import TrainSpec

    return TrainSpec.from_dict({**config["student"]["train"], "steps": steps, **changes}, "student.train")


def _job_data(config: dict, shards: Path, runtime):
    """The shards as a student job reads them (steps._data: transform, workers, prefetch)."""
    from .steps import _data

    dataset = _dataset_of(shards)
    return _data(shards, runtime, config.get("datasets", {}).get(dataset, {}), None)


def _dataset_of(shards: Path) -> str:
    from .data.loader import read_manifest
    from .data.shards import MANIFEST

    return str(read_manifest(Path(shards) / MANIFEST).get("dataset", Path(shards).name))


def _model(config: dict, data, seed: int = 0):
    import torch

    from .models import build_vit

    torch.manual_seed(seed)
    return build_vit(config["sizes"][0], variant=config["variants"][0], num_classes=data.num_classes,
                     img_size=tuple(data.input_size), in_chans=data.channels)


def bare_loop(config: dict, data, batches: list, spec, runtime) -> float:
    """Images/s of a plain PyTorch loop: the harness's model (placed as fit places it, so both use
    the same linear kernels), AdamW groups, schedule, clip and loss, on `batches` already in memory
    (every step timed, the first included, as in fit)."""
    import torch
    import torch.nn.functional as F

    from .train import make_optimizer

    model = runtime.place(_model(config, data)).train()
    named = list(model.named_parameters())
    optimizer = make_optimizer(model, named, spec)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, spec.lr_factor)
    start = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, label_smoothing=spec.label_smoothing)
        loss.backward()
        if spec.clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad)
        optimizer.step()
        scheduler.step()
    return len(batches) * spec.batch_size / (time.perf_counter() - start)


def _train_batches(data, spec, steps: int) -> list:
    return [b for _, b in zip(range(steps), data.batches("train", spec.batch_size, seed=0, epoch=0, shuffle=True,
                                                           drop_last=True))]


# -- the benchmarks ----------------------------------------------------------------------------

def bench_train(config: dict, shards: Path, *, steps: int | None = None, repeats: int = 5) -> tuple[list[dict], float]:
    """Rows, and the bare loop's images/s (the loader benchmark's consumption).

    `steps` (default: the config's student steps, a grid job's length) is capped at one epoch, the
    bare loop's batches. The ratio is the median over repeats of each repeat's fit/bare, the two
    run back to back: on a machine whose speed drifts by 8% between identical runs (this
    project's), a pair shares the drift, where a ratio of medians would not."""
    from .device import cpu_runtime
    from .steps import ClassifyTask
    from .train import fit

    runtime = cpu_runtime()
    data = _job_data(config, shards, runtime)
    steps = config["student"]["train"]["steps"] if steps is None else steps
    steps = max(1, min(steps, data.steps_per_epoch("train", config["student"]["train"]["batch_size"])))
    # No intermediate evaluation or checkpoint: fit's train_time_s is its training steps alone.
    spec = _student_spec(config, steps, eval_every=0, checkpoint_every=0)
    batches = _train_batches(data, spec, steps)
    harness, bare, evals = [], [], []
    with tempfile.TemporaryDirectory(prefix="linvit-bench-") as tmp:
        for r in range(repeats):
            # Alternating which goes first: neither always runs on a warmer (or busier) machine.
            order = ["bare", "fit"] if r % 2 == 0 else ["fit", "bare"]
            say(f"train: repeat {r + 1}/{repeats}: {order[0]}, then {order[1]} ({steps} steps of {spec.batch_size})")
            for which in order:
                if which == "bare":
                    bare.append(bare_loop(config, data, batches, spec, runtime))
                    continue
                task = ClassifyTask(_model(config, data), data, spec, runtime)
                summary = fit(task, spec, data, Path(tmp) / f"run{r}", seed=0, desc="bench", runtime=runtime)
                harness.append(steps * spec.batch_size / summary["train_time_s"])
                evals.append(summary["eval_time_s"])
    pairs = [h / b for h, b in zip(harness, bare)]
    ratio = statistics.median(pairs)
    test = data.num_samples("test")
    rows = [row("train", "steps", float(steps), "steps"),
            row("train", "bare_loop_images_per_s", statistics.median(bare), "images/s"),
            row("train", "fit_images_per_s", statistics.median(harness), "images/s"),
            row("train", "fit_over_bare_lowest", min(pairs), "ratio"),
            row("train", "fit_over_bare_highest", max(pairs), "ratio"),
            row("train", "fit_over_bare", ratio, "ratio", f">= {TRAIN_RATIO}", ratio >= TRAIN_RATIO),
            row("train", "final_eval_s", statistics.median(evals), "s"),
            row("train", "final_eval_images", float(test), "images"),
            row("train", "final_eval_images_per_s", test / max(statistics.median(evals), 1e-9), "images/s")]
    return rows, statistics.median(bare)


def bench_loader(config: dict, shards: Path, *, images: int = 4096, consumption: float | None = None,
                 steps: int = 10) -> list[dict]:
    from .device import runtime as make_runtime

    runtime = make_runtime(config, "cpu")  # the config's workers on the CPU (the grid's default machine)
    data = _job_data(config, shards, runtime)
    spec = _student_spec(config, 1)
    if consumption is None:
        say(f"loader: the bare loop's consumption ({steps} steps of {spec.batch_size})")
        batches = _train_batches(data, spec, steps)
        bare_loop(config, data, batches[:1], spec, runtime)  # warm-up
        consumption = bare_loop(config, data, batches, spec, runtime)
    say(f"loader: {images} images through the train pipeline (workers {runtime.workers}, "
        f"prefetch {data.prefetch}, transform {'timm' if data.pipeline is not None else 'none'})")
    seen, epoch, start, first = 0, 0, time.perf_counter(), None
    while seen < images:
        for x, _ in data.batches("train", spec.batch_size, seed=0, epoch=epoch, shuffle=True, drop_last=True):
            first = first if first is not None else time.perf_counter() - start
            seen += len(x)
            if seen >= images:
                break
        epoch += 1
    rate = seen / (time.perf_counter() - start)
    ratio = rate / consumption
    return [row("loader", "loader_images_per_s", rate, "images/s"),
            row("loader", "first_batch_s", first, "s"),
            row("loader", "training_images_per_s", consumption, "images/s"),
            row("loader", "loader_over_training", ratio, "ratio", f">= {LOADER_RATIO:g}", ratio >= LOADER_RATIO)]


def plan_config(config: dict, jobs: int) -> dict:
    """The config with as many seeds as it takes for about `jobs` jobs (the other axes as they are)."""
    from .grid import all_cells, teacher_keys

    one = {**config, "seeds": [0]}
    cells = all_cells(one)
    distills = len({c.distill_key for c in cells if c.distills})
    # Per seed: its students and reference (each evaluating its model), its distillations, and its
    # teachers when they are replicated per seed (teacher.seed: per_seed).
    per_seed_teachers = len(teacher_keys({**config, "seeds": [0, 1]})) - len(teacher_keys(one))
    per_seed = len(cells) + distills + per_seed_teachers
    fixed = len(one["targets"]) + len(teacher_keys(one)) - per_seed_teachers + 3  # shards, shared teachers, report, all
    seeds = max(1, math.ceil((jobs - fixed) / per_seed))
    return {**config, "seeds": list(range(seeds))}


def bench_plan(config: dict, *, jobs: int = 2000) -> list[dict]:
    import yaml

    grid_config = plan_config(config, jobs)
    with tempfile.TemporaryDirectory(prefix="linvit-plan-") as tmp:
        path = Path(tmp) / "grid.yaml"
        path.write_text(yaml.safe_dump(grid_config))
        cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "--quiet", "rules", "-s", str(REPO / "Snakefile"),
               "--configfile", str(path), "--directory", tmp, "--cores", "1"]
        say(f"plan: snakemake -n on {len(grid_config['seeds'])} seeds of the grid")
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        # Snakemake prints a config's error on stdout or stderr, depending on where it is caught.
        why = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        raise RuntimeError(f"snakemake -n failed ({proc.returncode}): {why}")
    found = re.search(r"^total\s+(\d+)", proc.stdout + proc.stderr, re.M)
    if not found:
        raise RuntimeError("snakemake -n printed no job count ('total N')")
    return [row("plan", "jobs", float(found.group(1)), "jobs"),
            row("plan", "dry_run_s", seconds, "s", f"<= {PLAN_S:g}", seconds <= PLAN_S)]


def _job_command(shards: Path, teacher: Path, out: Path, config_json: str) -> list[str]:
    return [sys.executable, "-m", "linvit.cli", "student", "--config-json", config_json, "--dataset", _dataset_of(shards),
            "--size", "micro", "--variant", "elu", "--init", "copy_mlp", "--design", "none", "--seed", "0",
            "--budget", "1", "--teacher", str(teacher), "--shards", str(shards), "--out", str(out), "--threads", "1"]


def _run_job(code: Path, shards: Path, teacher: Path, out: Path, config_json: str) -> dict:
    """One 1-step student job in a fresh interpreter, with `code` (a checkout) as the linvit it imports."""
    stamps = out.parent / f"{out.name}.stamps"
    env = {**os.environ, "PYTHONPATH": str(code), "LINVIT_STAMPS": str(stamps)}
    start = time.time()
    proc = subprocess.run(_job_command(shards, teacher, out, config_json), cwd=code, env=env,
                          capture_output=True, text=True)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the 1-step student job ({code}) failed: {proc.stderr.strip()[-500:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    marks = dict(line.split() for line in stamps.read_text().splitlines()) if stamps.exists() else {}
    result = {"total": end - start, "training": metrics["train_time_s"]}
    if {"imported", "finished"} <= set(marks) and "eval_time_s" in metrics:
        imported, finished = float(marks["imported"]), float(marks["finished"])
        result.update(imports=imported - start, evaluations=metrics["eval_time_s"], exit=end - finished,
                      setup=finished - imported - metrics["train_time_s"] - metrics["eval_time_s"])
    return result


def bench_jobcost(config: dict, shards: Path, *, baseline: str | Path | None = None, repeats: int = 1) -> list[dict]:
    """The 1-step student of the Snakemake rule: `linvit student ... --budget 1` with the job's config
    slice, on `shards` (its test split is what the final evaluation reads)."""
    from .device import cpu_runtime
    from .steps import run_teacher

    dataset = _dataset_of(shards)
    job = {"student": config["student"], "init_strategies": {"copy_mlp": config["init_strategies"]["copy_mlp"]},
           "datasets": {dataset: config.get("datasets", {}).get(dataset, {"source": dataset})}}
    with tempfile.TemporaryDirectory(prefix="linvit-job-") as tmp:
        tmp = Path(tmp)
        say(f"jobcost: a 1-step teacher on {dataset} for the students to start from")
        teacher_config = {**config, "teacher": {**config["teacher"], "dataset": dataset,
                                                "train": {**config["teacher"]["train"], "steps": 1, "eval_every": 0,
                                                          "batch_size": config["student"]["train"]["batch_size"]}}}
        run_teacher(teacher_config, "micro", 0, shards, tmp / "teacher", runtime=cpu_runtime())
        runs: dict[str, list[dict]] = {"now": [], "baseline": []}
        for r in range(repeats):
            for name, code in [("now", REPO), ("baseline", baseline)]:
                if code is None:
                    continue
                say(f"jobcost: repeat {r + 1}/{repeats}: 1-step student with {code}")
                runs[name].append(_run_job(Path(code), shards, tmp / "teacher", tmp / f"{name}{r}", json.dumps(job)))
    now = {k: statistics.median(run[k] for run in runs["now"]) for k in runs["now"][0]}
    old = statistics.median(run["total"] for run in runs["baseline"]) if baseline else RECORDED_JOB_S
    rows = [row("jobcost", f"{part}_s", now[part], "s")
            for part in ("imports", "setup", "training", "evaluations", "exit") if part in now]
    rows.append(row("jobcost", "baseline_total_s", old, "s"))
    limit = JOB_FRACTION * old
    rows.append(row("jobcost", "total_s", now["total"], "s", f"<= {limit:.3g}", now["total"] <= limit))
    return rows


IMAGENET_1K = 1_281_167 + 50_000  # train + validation images


def bench_shards(*, per_class: int = 60, size: int | None = None) -> list[dict]:
    """The shard writer on a JPEG ImageFolder (10 classes x `per_class` train images plus a fifth as
    many test): one worker, then every core (os.cpu_count()). The JPEGs are the size of ImageNet's
    (linvit.bench_ranks.imagenet_like_folder: about 400x350 px, 105 kB); with `size`, Fashion-MNIST
    (else digits) upscaled to `size` px instead, a floor (smooth images of a few kB)."""
    from .bench_ranks import imagenet_like_folder
    from .data.images import make_imagefolder
    from .data.shards import write_shards
    from .data.sources import DataError

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="linvit-bench-shards-") as tmp:
        tmp = Path(tmp)
        folder, missing = None, []
        if size is None:
            say(f"shards: making {per_class * 12} ImageNet-size JPEGs")
            folder = imagenet_like_folder(tmp / "jpeg", per_class_train=per_class, per_class_test=max(1, per_class // 5))
        for source in ({"source": "fashion_mnist"}, {"source": "digits"}) if size is not None else ():
            try:
                folder = make_imagefolder(source, tmp / "jpeg", size=size, per_class_train=per_class,
                                          per_class_test=max(1, per_class // 5))
                break
            except DataError as err:  # no Fashion-MNIST here: digits ships with scikit-learn
                missing.append(str(err).splitlines()[0])
                say(f"shards: {source['source']} unavailable ({err}); trying the next source")
            except ImportError as err:  # digits without scikit-learn
                missing.append(f"digits needs scikit-learn, which is not installed ({err}): pip install scikit-learn")
        if folder is None:
            raise DataError(f"shards: no dataset to make the JPEG folder from: {'; '.join(missing)}")
        jpegs = list(folder.rglob("*.jpg"))
        images = len(jpegs)
        rows, rates = [row("shards", "jpeg_kb_mean", sum(p.stat().st_size for p in jpegs) / images / 1e3, "kB")], {}
        for workers in dict.fromkeys((1, cores)):
            say(f"shards: {images} JPEGs ({'ImageNet-size' if size is None else f'{size} px'}) with {workers} worker(s)")
            start = time.perf_counter()
            write_shards("jpeg", {"source": "imagefolder", "path": str(folder)}, tmp / f"shards{workers}",
                         samples_per_shard=max(1, images // (4 * workers)), workers=workers)
            rates[workers] = images / (time.perf_counter() - start)
            rows.append(row("shards", f"images_per_s_{workers}_workers", rates[workers], "images/s"))
    per_core = rates[1]  # one worker writes in this process: no pool to start
    rows.append(row("shards", "images_per_s_per_core", per_core, "images/s"))
    for n in (8, 32):
        rows.append(row("shards", f"imagenet_1k_hours_{n}_cores", IMAGENET_1K / (per_core * n) / 3600, "h"))
    return rows


def _loop_seconds(folder: str | Path) -> float:
    """A job's training (or distillation) loop time, from the metrics.json of the folder it writes
    (grid.Job.folder; train_time_s)."""
    path = Path(folder) / "metrics.json"
    try:
        return float(json.loads(path.read_text())["train_time_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return math.nan


def bench_grid(config: dict, results: str | Path = "results") -> list[dict]:
    """The grid's jobs' wall times over their loops' times, per rule and in all (finished jobs only:
    a job with both a benchmark file and a metrics.json)."""
    from .report.aggregate import benchmark_jobs

    results = Path(results)
    jobs = benchmark_jobs(config, results)
    jobs["loop_s"] = [_loop_seconds(folder) for folder in jobs["folder"]]
    done = jobs.dropna(subset=["wall_s", "loop_s"])
    if done.empty:
        raise ValueError(f"--results {results}: no finished job of this grid (benchmark files under "
                         f"{results}/benchmarks and metrics.json beside them); run the grid first")
    rows = []
    for rule, part in done.groupby("rule", sort=False):
        rows += [row("grid", f"{rule}_jobs", float(len(part)), "jobs"),
                 row("grid", f"{rule}_wall_s", float(part["wall_s"].sum()), "s"),
                 row("grid", f"{rule}_loop_s", float(part["loop_s"].sum()), "s"),
                 row("grid", f"{rule}_ratio", float(part["wall_s"].sum() / part["loop_s"].sum()), "x")]
    ratio = float(done["wall_s"].sum() / done["loop_s"].sum())
    rows += [row("grid", "jobs", float(len(done)), "jobs", f"of {len(jobs)}"),
             row("grid", "wall_s", float(done["wall_s"].sum()), "s"),
             row("grid", "loop_s", float(done["loop_s"].sum()), "s"),
             row("grid", "wall_over_loops", ratio, "x", f"<= {GRID_RATIO:g}", ratio <= GRID_RATIO)]
    return rows


def status_tree(config: dict, root: Path, *, started: int = 40, failed: int = 20, fraction: float = 0.6) -> dict:
    """A results tree of `config`'s grid in `root` as a long run leaves it: the run's record (local executor),
    every job before the students and `fraction` of the students finished (their outputs, a benchmark TSV,
    a log), then `started` students Snakemake marked as started and `failed` students whose log has an
    error line; the rest to run. Returns {state: jobs} as made."""
    import base64

    from .grid import jobs
    from .runrecord import RECORD

    planned = [j for j in jobs(config) if j.rule != "report"]
    students = [j for j in planned if j.rule == "student"]
    done = [j for j in planned if j.rule != "student"] + students[:int(len(students) * fraction)]
    rest = students[len(done) - (len(planned) - len(students)):]
    made = {"finished": done, "started": rest[:started], "failed": rest[started:started + failed]}
    for i, job in enumerate(done):
        for out in job.outputs:
            path = root / out
            path.parent.mkdir(parents=True, exist_ok=True)
            if "." in Path(out).name:
                write_stub(path)
            else:
                path.mkdir(exist_ok=True)
        (root / job.log).parent.mkdir(parents=True, exist_ok=True)
        (root / job.log).write_text(f"{job.name}: step 100/100\n")
        if job.benchmark:
            (root / job.benchmark).parent.mkdir(parents=True, exist_ok=True)
            (root / job.benchmark).write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load"
                                              f"\tcpu_time\n{600 + i % 97}\t0:10:00\t900\t1800\t800\t850\t1\t2\t98\t590\n")
    for job in made["started"]:  # Snakemake's marks (linvit.status.incomplete_markers reads them back)
        for out in job.outputs:
            path = root / ".snakemake/incomplete" / base64.urlsafe_b64encode(out.encode()).decode()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"external_jobid": None}))
        (root / job.log).parent.mkdir(parents=True, exist_ok=True)
        (root / job.log).write_text(f"{job.name}: step 40/100\n")
    for job in made["failed"]:
        (root / job.log).parent.mkdir(parents=True, exist_ok=True)
        (root / job.log).write_text(f"{job.name}: step 3/100\nlinvit: error: out of memory\n")
    record = root / RECORD
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"config": config, "configfiles": ["paper.yaml", "paths.yaml"], "host": "login1",
                                  "pid": 1, "started": time.time() - 86400, "executor": "local"}))
    return made


def write_stub(path: Path) -> None:
    """A finished job's file as small as it can be and still whole (linvit.status.unreadable): an empty
    safetensors file (its length, then an empty header), an empty zip for an npz, {} for the others."""
    if path.suffix == ".safetensors":
        path.write_bytes((2).to_bytes(8, "little") + b"{}")
    elif path.suffix == ".npz":
        path.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: its end-of-directory record alone
    else:
        path.write_text("{}")


def bench_status(config_path: str | Path | None = None, *, repeats: int = 3) -> list[dict]:
    """`linvit status` on a generated tree of the paper grid (or --config's), timed as a user runs it."""
    import yaml

    config = load(config_path or PAPER_CONFIG)
    for spec in config.get("datasets", {}).values():  # a dataset read from a folder: any path validates
        if spec.get("source") == "imagefolder" and not spec.get("path"):
            spec["path"] = "/data"
    from .config import validate

    config = validate(config)
    with tempfile.TemporaryDirectory(prefix="linvit-status-") as tmp:
        root = Path(tmp)
        say("status: writing a results tree")
        made = status_tree(config, root)
        (root / "grid.yaml").write_text(yaml.safe_dump(config))
        times, out = [], ""
        for _ in range(repeats):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "linvit.cli", "status", "--directory", str(root)],
                                  capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if proc.returncode != 0:
                raise RuntimeError(f"linvit status failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
            out = proc.stdout
    found = re.search(r": (\d+) jobs, (\d+) finished, ", out)
    if not found or int(found.group(2)) != len(made["finished"]):
        raise RuntimeError(f"linvit status did not read the tree it was given: {out.splitlines()[:1]}")
    seconds = statistics.median(times)
    return [row("status", "jobs", float(found.group(1)), "jobs"),
            row("status", "finished_jobs", float(found.group(2)), "jobs"),
            row("status", "seconds", seconds, "s", f"<= {STATUS_S:g}", seconds <= STATUS_S)]


def run(names: list[str], *, config_path=None, shards=None, out_dir="results/bench", steps: int | None = None,
        repeats: int = 5, images: int = 4096, jobs: int = 2000, baseline=None, job_repeats: int = 1,
        machine: str | None = None, results: str | Path = "results", ranks: list[int] | None = None) -> list[dict]:
    """Run the benchmarks `names` in order, print each table, save the rows; returns all rows.
    The settings are checked first: a bad one fails before any benchmark runs or any row is saved.
    `ranks` (loader): read as that many ranks against one process instead (linvit.bench_ranks)."""
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r} (known: {', '.join(BENCHMARKS)}, all)")
    for flag, value in (("--repeats", repeats), ("--images", images), ("--jobs", jobs),
                        ("--job-repeats", job_repeats), ("--steps", 1 if steps is None else steps),
                        *(("--ranks", n) for n in ranks or ())):
        if value < 1:
            raise ValueError(f"{flag} must be 1 or more, got {value}")
    if baseline is not None and "jobcost" in names and not (Path(baseline) / "linvit" / "cli.py").is_file():
        raise ValueError(f"--baseline {baseline}: not a checkout of linvit (no linvit/cli.py there)")
    from .data.shards import MANIFEST

    if shards is not None and not (Path(shards) / MANIFEST).is_file():
        raise ValueError(f"--shards {shards}: no shard manifest {MANIFEST} there")
    config = load(config_path)
    out = []
    with tempfile.TemporaryDirectory(prefix="linvit-bench-data-") as tmp:
        data = Path(shards).resolve() if shards else None  # absolute: jobcost's jobs run in other folders
        consumption = None
        for name in names:
            if name not in ("plan", "grid", "shards", "status") and data is None and not (name == "loader" and ranks):
                say("writing scikit-learn digits shards to read")
                data = digits_shards(tmp)
            if name == "train":
                rows, consumption = bench_train(config, data, steps=steps, repeats=repeats)
            elif name == "loader" and ranks:
                from .bench_ranks import bench_loader_ranks

                rows = bench_loader_ranks(ranks, shards=data)
            elif name == "loader":
                rows = bench_loader(config, data, images=images, consumption=consumption)
            elif name == "plan":
                rows = bench_plan(config, jobs=jobs)
            elif name == "grid":
                rows = bench_grid(config, results)
            elif name == "shards":
                rows = bench_shards()
            elif name == "status":
                rows = bench_status(config_path)
            else:  # jobcost (the names were checked above)
                rows = bench_jobcost(config, data, baseline=baseline, repeats=job_repeats)
            path = save(rows, out_dir, machine)
            print(f"{name}:\n{table(rows)}\n(wrote {path})", flush=True)
            out += rows
    return out
