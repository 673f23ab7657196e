"""`linvit status`: where a grid stands, during or after a run (local or Slurm), read from its files.

What the run is comes from the record the workflow writes when it starts (linvit.runrecord: the config
as Snakemake merged it, the host, the process, the executor); a config given on the command line is for
a grid not yet started. The jobs are `linvit.grid.jobs(config)`, the list the workflow's DAG is checked
against (tests/test_workflow.py). Each job is, in this order:

    finished     every output it declares exists, Snakemake does not mark one incomplete, and every job
                 it reads finished
    running      a process of this machine runs its command (which names its log), or Slurm runs its
                 job (squeue), or, where neither can be asked, the Snakemake that started it runs
    queued       Slurm holds its job, waiting to start (PENDING, ...): neither running nor in the time so
                 far; its wait is shown apart
    interrupted  Snakemake started it (.snakemake/incomplete/) and nothing runs it: a killed run; the
                 next `snakemake` runs it again, from its checkpoint where it has one
    blocked      a job it reads failed, is blocked, or lost outputs it made before: it runs only once that
                 is fixed (checked before its own log: an old log of a job whose inputs went is no failure)
    failed       its log exists and its outputs do not: the log's error line; for a Slurm job, Slurm's
                 state (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, CANCELLED, ...), its attempt and its Slurm log;
                 or its outputs exist but one read whole (WHOLE: metrics.json, eval.json, predictions.npz,
                 model.safetensors) is cut short: remove it, and the next snakemake makes it again
    to run       none of these yet (a job that lost some outputs and whose log names no error is to run:
                 the next `snakemake` makes them again)

A job Snakemake would rerun for a changed config, its outputs being there, counts as finished here
(`snakemake -n` says what it would rerun).

Time so far: the finished jobs' wall-clock seconds from their Snakemake benchmark files
(results/benchmarks/<rule>/...tsv, linvit.jobfiles.read_benchmark), and the running jobs' time since
they started (Slurm's start time, else Snakemake's mark). What remains is estimated per job from the
finished jobs of its kind (estimate_keys: its rule and size, then dataset, variant, init, design and
budget where the grid varies them), from the closest kind that finished; a kind no job of its size has
finished is scaled from other sizes by the rules' runtime factors (linvit.sizes.size_factor); a running
job's estimate less the time it has run (at least 0). Queue wait is apart: Slurm's submit and start
times. GPU-hours: wall-clock times the job's `gpu` resource (the config's `resources:` and the run's
--set-resources). Failed and blocked jobs are left out (they run only once fixed).

Torch- and pandas-free and quick (a 4,000-job tree in well under 5 s: `linvit bench status`): the config,
the grid, file and process listings, and at most three Slurm commands (squeue; sacct or scontrol).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .grid import Job, jobs, operator_benchmark_path
from .jobfiles import log_line, read_benchmark
from .sizes import size_factor
from .status_machine import Snakemake, incomplete_markers, is_snakemake, processes
from .status_slurm import SLURM_LOGS, SlurmJob, ended, killed_by, slurm_logs, squeue, wildcards_of

STATES = ("finished", "running", "queued", "interrupted", "failed", "blocked", "to run")
TODO = ("running", "queued", "interrupted", "to run")  # the states an estimate counts
PROGRESS = re.compile(r"\bstep (\d+)/(\d+)\b")  # linvit.train's progress lines in a job's log
# The config section of `resources:` that gives each rule's `gpu` (the rules that take one).
GPU_RESOURCE = {"teacher": "teacher", "distill": "distill", "student": "student", "reference": "student"}


@dataclass
class JobStatus:
    job: Job
    state: str = "to run"
    detail: str = ""           # the error line, the progress, what it waits for
    seconds: float = math.nan  # finished: its benchmark's wall-clock s; running: since it started
    remaining: float = math.nan  # the estimate of what it still takes (nan: none, or not counted)
    scaled: bool = False       # the estimate comes from another size, scaled by the size factors
    queued: float = math.nan   # Slurm: seconds it waited in the queue (so far, for a queued job)
    gpus: int = 0              # its `gpu` resource
    slurm: SlurmJob | None = None  # its Slurm job now (or the last one, for a failed job)
    attempt: int = 1           # Slurm submissions of it in this run (a retried job: 2, 3, ...)
    slurm_log: str = ""        # the plugin's log of its Slurm job
    previous: SlurmJob | None = None  # a retried job's attempt before, as Slurm ended it


@dataclass
class GridStatus:
    root: Path
    jobs: list[JobStatus]
    snakemake: Snakemake
    now: float
    slurm_known: bool = True  # squeue could be asked (when jobs went to Slurm)

    def of(self, state: str) -> list[JobStatus]:
        return [j for j in self.jobs if j.state == state]

    @property
    def rules(self) -> list[str]:
        return list(dict.fromkeys(j.job.rule for j in self.jobs))


def collect(config: dict, root: str | Path = ".", *, slurm: bool = True, record: dict | None = None) -> GridStatus:
    """The status of every job of `config`'s grid in the project folder `root` (Snakemake's working
    directory). `slurm`: whether to ask Slurm about jobs Snakemake submitted to it. `record`: the run's
    record (linvit.runrecord), for its host, process, executor and --set-resources."""
    root = Path(root).resolve()
    now = time.time()
    with_benchmark = (root / operator_benchmark_path()).exists()
    planned = jobs(config, with_benchmark=with_benchmark)
    markers = incomplete_markers(root)
    logs, snakemake = processes(root)
    snakemake.record = record
    if record and record.get("host") == socket.gethostname() and is_snakemake(record.get("pid")):
        snakemake.pids = sorted({*snakemake.pids, int(record["pid"])})
    logdir = Path((record or {}).get("slurm_logdir") or root / SLURM_LOGS)
    slurm_index = slurm_logs(logdir) if slurm else {}
    marked_ids = {jobid for jobid, _ in markers.values() if jobid}
    head_id = str((record or {}).get("slurm_head_job") or "")
    asked = marked_ids or slurm_index or head_id or (record or {}).get("executor") == "slurm"
    queue = squeue() if slurm and asked else None
    # The run's Slurm jobs: those working in this folder (a job of the workflow: the plugin's comment names
    # its rule and wildcards; Snakemake's marks hold the id only at times: null for a running job on the test
    # cluster), or a marked id.
    mine = [j for j in (queue or {}).values() if j.id != head_id and (
        j.id in marked_ids or Path(j.workdir or "/").resolve() == root)]
    slurm_of = {j.rule_wildcards: j for j in sorted(mine, key=lambda j: int(j.id) if j.id.isdigit() else 0)
                if j.rule_wildcards}
    if queue is not None:
        snakemake.alive_jobs = sorted(j.id for j in mine)
        snakemake.head = queue.get(head_id)
    run_start = float((record or {}).get("started") or 0)
    by_name: dict[str, JobStatus] = {}
    failed_slurm: list[JobStatus] = []
    retried: list[JobStatus] = []
    for job in planned:
        status = JobStatus(job, gpus=_gpus(config, record, job.rule))
        marked = [markers[out] for out in job.outputs if out in markers]
        present = [(root / out).exists() for out in job.outputs]
        needs = [by_name[n] for n in job.needs if n in by_name]
        unfinished = [s for s in needs if s.state != "finished"]
        wildcards = wildcards_of(job.key)
        attempts = slurm_index.get((job.rule, wildcards), []) if slurm_index else []
        marked_id = next((i for i, _ in marked if i), None)
        slurm_job = slurm_of.get((job.rule, wildcards)) or (queue or {}).get(marked_id or "")
        broken = [(out, why) for out, there in zip(job.outputs, present)
                  if there and Path(out).name in WHOLE and (why := unreadable(root / out))]
        if all(present) and not marked and not unfinished and slurm_job is None and broken:
            # Snakemake judges by times and would never remake it: it waits for the broken files to go.
            status.state = "failed"
            status.detail = "; ".join(f"{Path(out).name} {why}" for out, why in broken) + (
                f": rm {' '.join(out for out, _ in broken)}, and the next snakemake makes "
                f"{'it' if len(broken) == 1 else 'them'} again")
        elif all(present) and not marked and not unfinished and slurm_job is None:
            status.state = "finished"
            status.seconds = read_benchmark(root / job.benchmark)["wall_s"] if job.benchmark else math.nan
        elif job.log in logs or marked or slurm_job is not None:
            current = slurm_job.id if slurm_job else marked_id  # its Slurm job, if it went to Slurm
            this_run = {str(i) for i, _, mtime in attempts if mtime >= run_start} | ({current} if current else set())
            status.attempt = max(1, len(this_run))
            status.slurm_log = next((str(p) for i, p, _ in attempts if str(i) == current), "")
            _started(status, root, marked, job.log in logs, slurm_job, current, queue is not None, snakemake, now)
            before = [(i, p) for i, p, mtime in attempts if mtime >= run_start and str(i) != current]
            if before:  # a retried job: how its last attempt ended
                status.previous = SlurmJob(str(before[-1][0]), killed_by(before[-1][1]))
                retried.append(status)
        elif unfinished and (stopped := [s for s in unfinished if _stops(s)]):
            status.state = "blocked"
            status.detail = "waits for " + ", ".join(_why(s) for s in stopped[:2]) + (
                f" and {len(stopped) - 2} more" if len(stopped) > 2 else "")
        elif unfinished:  # what it reads is on its way: Snakemake runs it after (an old log of it says nothing)
            status.detail = f"after {unfinished[0].job.name}" + (f" and {len(unfinished) - 1} more"
                                                                   if len(unfinished) > 1 else "")
        elif (root / job.log).exists() or attempts:
            _, line = log_line(root / job.log)
            if any(present) and not line:  # it made them once, some went since: the next snakemake remakes them
                missing = [Path(out).name for out, there in zip(job.outputs, present) if not there]
                status.detail = f"lost {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "") + (
                    " (its log names no error): the next snakemake makes them again")
            else:
                status.state, status.detail = "failed", line
                if attempts:
                    status.attempt = max(1, sum(mtime >= run_start for _, _, mtime in attempts))
                    jobid, path, _ = attempts[-1]
                    status.slurm, status.slurm_log = SlurmJob(str(jobid), killed_by(path)), str(path)
                    failed_slurm.append(status)
                elif not line:
                    status.detail = f"no error line in its log ({job.log})"
        by_name[job.name] = status
    _slurm_ends(failed_slurm, retried, slurm)
    grid = GridStatus(root, list(by_name.values()), snakemake, now, slurm_known=queue is not None or not (slurm and asked))
    _estimate(grid, config)
    return grid


# The files of a finished job that are read whole (a teacher's, a distillation's, a student's): one cut short by
# a full disk or a killed copy still exists, and Snakemake, judging by times, would never make it again.
WHOLE = ("metrics.json", "eval.json", "predictions.npz", "model.safetensors")


def unreadable(path: Path) -> str:
    """Why a job's file cannot be read ('' where it is whole): "missing", JSON that does not parse, a safetensors
    file whose header or tensors are cut, an npz (a zip) whose directory is gone. Reads headers, never weights."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".safetensors":
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                n = int.from_bytes(f.read(8), "little")
                if size < 8 or n > size - 8:
                    return f"is cut short ({size} bytes, no whole header)"
                header = json.loads(f.read(n))
                end = 8 + n + max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
                if end != size:
                    return f"is cut short ({size} of {end} bytes)" if size < end else f"has {size - end} bytes too many"
        elif path.suffix == ".npz":
            with zipfile.ZipFile(path) as z:
                z.infolist()
    except FileNotFoundError:
        return "missing"
    except json.JSONDecodeError:
        return "is not valid JSON (cut short?)" if path.suffix == ".json" else "has a header cut short"
    except zipfile.BadZipFile:
        return "is not a whole zip (cut short?)"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"is not whole ({type(err).__name__}: {str(err)[:60]})"
    return ""


def _stops(status: JobStatus) -> bool:
    """Whether a job behind `status` waits for a fix rather than for it to run: it failed, is blocked, or
    lost outputs it made."""
    return status.state in ("failed", "blocked") or status.detail.startswith("lost ")


def _why(status: JobStatus) -> str:
    if status.state == "failed":
        return status.job.name
    return f"{status.job.name} ({'blocked' if status.state == 'blocked' else status.detail.split(' (')[0]})"


def _slurm_ends(failed: list[JobStatus], retried: list[JobStatus], ask: bool) -> None:
    """How Slurm ended the failed jobs' last attempts and the retried jobs' attempts before, as Slurm remembers
    it (sacct, else scontrol; one command), else as their Slurm logs say (slurmstepd's line)."""
    ids = {s.slurm.id for s in failed} | {s.previous.id for s in retried}
    known = ended(ids) if ask and ids else {}
    for s in failed:
        slurm = known.get(s.slurm.id)
        if slurm is not None and slurm.state:  # else what its log says (killed_by), if anything
            s.slurm = slurm
        said = [f"Slurm job {s.slurm.id} {s.slurm.state or 'ended'}"]
        if s.attempt > 1:
            said.append(f"attempt {s.attempt}")
        said.append(f"Slurm log {s.slurm_log}")
        s.detail = "; ".join([*said, *([s.detail] if s.detail else [])])
    for s in retried:
        slurm = known.get(s.previous.id)
        if slurm is not None and slurm.state:
            s.previous = slurm
        s.detail = s.detail.replace(f"attempt {s.attempt}", f"attempt {s.attempt} (the last: Slurm job {s.previous.id} "
                                    f"{s.previous.state or 'ended'})", 1)


def _gpus(config: dict, record: dict | None, rule: str) -> int:
    """A job's `gpu` resource: the run's --set-resources, else the config's `resources:` (0 where its rule takes none)."""
    if rule not in GPU_RESOURCE:
        return 0
    given = ((record or {}).get("set_resources") or {}).get(rule, {}).get("gpu")
    if given is None:
        given = ((config.get("resources") or {}).get(GPU_RESOURCE[rule]) or {}).get("gpu", 0)
    try:
        return int(given)
    except (TypeError, ValueError):
        return 0


def _started(status: JobStatus, root: Path, marked: list, has_process: bool, slurm: SlurmJob | None,
             slurm_id: str | None, asked: bool, snakemake: Snakemake, now: float) -> None:
    """A job Snakemake started, Slurm holds or a process runs: running, queued or interrupted, with its
    progress. `slurm`: its job in squeue; `slurm_id`: its Slurm job id where known; `asked`: squeue answered."""
    job = status.job
    since = min((start for _, start in marked), default=None)
    progress = _progress(root / job.log)
    alive = snakemake.running
    if slurm is not None:
        status.slurm = slurm
        if slurm.waiting:
            state, progress = "queued", ""
            status.queued = now - slurm.submitted if slurm.submitted else math.nan
            how = f"Slurm job {slurm_id} {slurm.state.lower()}" + (f" ({slurm.reason})" if slurm.reason else "") + (
                f" for {duration(status.queued)}" if not math.isnan(status.queued) else "")
        else:
            state = "running"
            since = slurm.started or since
            status.queued = slurm.queue_wait if slurm.queue_wait is not None else math.nan
            how = f"Slurm job {slurm_id} {slurm.state.lower()}" + (f" on {slurm.node}" if slurm.node else "")
    elif has_process:
        state, how = "running", "runs here"
    elif asked and (slurm_id or (snakemake.record or {}).get("executor", "local") != "local"):
        # Slurm no longer holds it (a mark may hold no id: the run's executor says it went to Slurm)
        state = "running" if alive is not False else "interrupted"
        which = f"Slurm job {slurm_id}" if slurm_id else "its Slurm job"
        how = (f"{which} ended; Snakemake has yet to collect it" if alive else
               f"{which} ended; Snakemake, on {snakemake.host}, collects it if it runs"
               if alive is None else f"{which} ended")
    else:  # no process of this machine runs it: is the Snakemake that started it still there?
        # (a Snakemake seen elsewhere, in its head job, runs its jobs where this machine cannot see them)
        seen = alive is None or (alive and (slurm_id is not None or not snakemake.processes_known or not snakemake.pids))
        state = "running" if seen else "interrupted"
        how = f"Slurm job {slurm_id}" if slurm_id else (
            f"started by Snakemake on {snakemake.host}, whose processes this machine cannot see"
            if alive is None and snakemake.elsewhere else "")
    status.state = state
    if state == "running":
        status.seconds = now - since if since is not None else math.nan
    parts = [how] if how else []
    if status.attempt > 1:
        parts.append(f"attempt {status.attempt}")
    if progress:
        parts.append(f"at {progress}" if state == "running" else f"stopped at {progress}")
    if state == "interrupted":
        trains = any(out.endswith("/train.jsonl") for out in job.outputs)
        parts.append(("Snakemake, running, may start it again" if alive else "the next snakemake runs it again")
                     + (", from its last checkpoint if it made one" if trains else ""))
    status.detail = "; ".join(parts)


def _progress(log: Path) -> str:
    """'step N/T', the last progress line of a training job's log ('' if none)."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    found = PROGRESS.findall(text)
    return f"step {found[-1][0]}/{found[-1][1]}" if found else ""


def _estimate(grid: GridStatus, config: dict) -> None:
    """Each unfinished job's remaining seconds from the finished jobs of its kind (see the module's doc)."""
    same: dict[tuple, list[float]] = {}    # by kind, within a size
    scaled: dict[tuple, list[float]] = {}  # by kind across sizes: seconds over the size's runtime factor
    factor = {size: float(size_factor(config, size, "runtime")) or 1.0 for size in config.get("sizes", [])}
    for s in grid.jobs:
        if s.state == "finished" and not math.isnan(s.seconds):
            size = _size(s.job)
            for key in estimate_keys(s.job):
                same.setdefault((size, *key), []).append(s.seconds)
                scaled.setdefault(key, []).append(s.seconds / factor.get(size, 1.0))
    for s in grid.jobs:
        if s.state not in TODO:
            continue
        size = _size(s.job)
        keys = estimate_keys(s.job)
        found = next((same[(size, *k)] for k in keys if (size, *k) in same), None)
        if found is None:
            found = next(([v * factor.get(size, 1.0) for v in scaled[k]] for k in keys if k in scaled), None)
            s.scaled = found is not None
        if found is None:
            continue
        mean = sum(found) / len(found)
        s.remaining = max(0.0, mean - s.seconds) if s.state == "running" and not math.isnan(s.seconds) else mean


def _size(job: Job) -> str:
    if job.cell is not None:
        return job.cell.size
    return job.key.split("/")[0] if job.rule.startswith("teacher") else ""


def estimate_keys(job: Job) -> list[tuple]:
    """A job's kinds, from the closest to its whole rule (its size is added by the caller): the cell's
    dataset, variant, init strategy, design and budget, then fewer of them; a job without a cell (the
    shards, a teacher, the report) is its rule (and the shards' dataset)."""
    cell = job.cell
    if cell is None:
        return [(job.rule, job.key), (job.rule,)] if job.rule == "shards" else [(job.rule,)]
    rule = job.rule
    return [(rule, cell.dataset, cell.variant, cell.init, cell.design, cell.budget),
            (rule, cell.dataset, cell.init, cell.design, cell.budget),
            (rule, cell.dataset, cell.budget), (rule, cell.init, cell.design, cell.budget), (rule, cell.budget),
            (rule,)]


# -- the text ---------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '2 h 07 min', '3 d 4 h'; '-' for no number."""
    if seconds is None or math.isnan(seconds):
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _total(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) if values else math.nan


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    cell = lambda r, i: str(r[i]).rjust(widths[i]) if i in right else str(r[i]).ljust(widths[i])  # noqa: E731
    return ["  ".join(cell(r, i) for i in range(len(header))).rstrip() for r in [header, *rows]]


def render(grid: GridStatus, config_name: str = "", every: bool = False) -> str:
    """The summary, a table of the rules, then per rule its jobs that are running, queued, interrupted,
    failed or blocked (with `every`, all its jobs)."""
    lines = []
    counts = {state: len(grid.of(state)) for state in STATES}
    title = f"Grid {config_name} in {grid.root}" if config_name else f"Grid in {grid.root}"
    lines.append(f"{title}: {len(grid.jobs)} jobs, " + ", ".join(f"{counts[s]} {s}" for s in STATES))
    lines.append("Snakemake: " + _snakemake_line(grid))
    done = _total(j.seconds for j in grid.of("finished"))
    running = grid.of("running")
    so_far = f"Time so far: {duration(done)} in finished jobs (Snakemake's benchmarks)"
    if running:
        so_far += f", {duration(_total(j.seconds for j in running))} in the {len(running)} running"
    lines.append(so_far)
    lines.append(_remaining_line(grid))
    lines += _queue_lines(grid) + _gpu_lines(grid)
    lines.append("")
    header = ["rule", "jobs", *STATES, "time so far", "per job", "remaining"]
    rows = []
    for rule in grid.rules:
        mine = [j for j in grid.jobs if j.job.rule == rule]
        finished = [j.seconds for j in mine if j.state == "finished"]
        known = [s for s in finished if not math.isnan(s)]
        todo = [j for j in mine if j.state in TODO]
        left = _total(j.remaining for j in todo)
        unknown = sum(math.isnan(j.remaining) for j in todo)
        rows.append([rule, len(mine), *(sum(j.state == s for j in mine) for s in STATES),
                     duration(_total([*finished, *(j.seconds for j in mine if j.state == "running")])),
                     duration(sum(known) / len(known) if known else math.nan),
                     "0 s" if not todo else (duration(left) if not unknown else
                                             ("?" if math.isnan(left) else f"{duration(left)} + ?"))])
    lines += _table(header, rows, right=set(range(1, len(header))))
    for rule in grid.rules:
        shown = [j for j in grid.jobs if j.job.rule == rule
                 and (every or j.state in ("running", "queued", "interrupted", "failed", "blocked"))]
        if not shown:
            continue
        mine = [j for j in grid.jobs if j.job.rule == rule]
        said = ", ".join(f"{n} {s}" for s in STATES if (n := sum(j.state == s for j in mine)))
        lines += ["", f"{rule}: {said}"]
        blocked = [j for j in shown if j.state == "blocked"]
        folded = not every and len(blocked) > 3  # one line for many jobs behind the same failures
        if folded:
            shown = [j for j in shown if j.state != "blocked"]
        rows = [[j.state, j.job.key, duration(j.seconds),
                 "; ".join(p for p in (j.detail, _detail(j)) if p)] for j in shown]
        if rows:
            lines += ["  " + line for line in _table(["state", "job", "time", "detail"], rows, right={2})]
        if folded:
            causes = list(dict.fromkeys(j.detail for j in blocked))
            lines.append(f"  {len(blocked)} blocked: " + "; ".join(causes[:3])
                         + (f"; and {len(causes) - 3} more" if len(causes) > 3 else "") + " (each: --all)")
    return "\n".join(lines) + "\n"


def _detail(status: JobStatus) -> str:
    if status.state == "finished":
        return "" if not math.isnan(status.seconds) else "no benchmark file"
    if status.state in ("to run", "queued") and not math.isnan(status.remaining):
        return f"about {duration(status.remaining)}" + (" (scaled from another size)" if status.scaled else "")
    return ""


def _snakemake_line(grid: GridStatus) -> str:
    s, record = grid.snakemake, grid.snakemake.record or {}
    started = record.get("started")
    run = (f"the last run started {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} on {s.host} "
           f"(process {record.get('pid')}, executor {record.get('executor', 'local')})") if started else ""
    alive = s.alive_jobs
    jobs_alive = (f"{len(alive)} of its Slurm jobs alive (squeue: {', '.join(alive[:3])}"
                  + (" ..." if len(alive) > 3 else "") + ")") if alive else ""
    if s.running:
        where = (f"in Slurm job {s.head.id} ({s.head.state.lower()}" + (f" on {s.head.node}" if s.head.node else "")
                 + ")") if s.head is not None else ""
        if s.pids:
            since = f", for {duration(grid.now - s.started)}" if s.started else ""
            return f"running (process {', '.join(map(str, s.pids[:3]))}{since}" + (f", {where}" if where else "") + ")"
        return f"running {where}" + (f"; {run}" if run else "")
    if s.running is None:  # this machine cannot tell: say what it saw and what to check
        if s.elsewhere:
            text = (f"{run}; this machine ({socket.gethostname()}) cannot see {s.host}'s processes: check there "
                    f"(ssh {s.host} ps -p {record.get('pid')})")
        else:
            text = "this machine's processes cannot be listed" + (f"; {run}" if run else "")
        if jobs_alive:
            text += f"; {jobs_alive}"
        if s.locked:
            text += "; its locks are in .snakemake/locks: do not `snakemake --unlock` while it may run"
        return text
    if s.locked and (alive or s.head is not None):
        return (f"not running on this machine, but {jobs_alive or f'its head job {s.head.id} is alive'}: it may run "
                "elsewhere (a login node, a head job) or have been killed and left them. Do not `snakemake --unlock`"
                " while they run (with rerun-incomplete the next run would submit them again): check `squeue -u "
                "$USER` and where Snakemake was started" + (f" ({run})" if run else ""))
    if alive:
        return f"not running; {jobs_alive}: `squeue -u $USER` shows them, `scancel` ends them"
    if s.locked and (busy := _still_working(grid)):
        return (f"not running, but {busy}: do not `snakemake --unlock` while they run (a second Snakemake would work "
                f"beside them); let them end or stop them, then unlock" + (f"; {run}" if run else ""))
    if s.locked:
        return ("not running, but its locks are left in .snakemake/locks (a killed run): "
                "`snakemake --unlock` before the next run, and run it with `--rerun-incomplete` (a killed job's "
                "outputs are marked incomplete)" + (f"; {run}" if run else ""))
    return "not running" + (f"; {run}" if run else "")


def _still_working(grid: GridStatus) -> str:
    """What still works in the folder while no Snakemake does: a linvit decide driver or its Snakemake that
    results/decide/driver.lock names, and jobs whose processes run here (a killed Snakemake left them)."""
    from .decide_state import lock_owners

    here = [j.job.name for j in grid.jobs if j.state == "running" and j.detail.startswith("runs here")]
    parts = [p for p in (lock_owners(grid.root), here and f"{len(here)} of its jobs still run here ("
                         + ", ".join(here[:3]) + (" ..." if len(here) > 3 else "") + ")") if p]
    return " and ".join(parts)


def _remaining_line(grid: GridStatus) -> str:
    todo = [j for j in grid.jobs if j.state in TODO]
    if not todo:
        stopped = len(grid.of("failed")) + len(grid.of("blocked"))
        return "Remaining: nothing" + (f" but the {stopped} failed and blocked jobs, once fixed" if stopped else "")
    left = _total(j.remaining for j in todo)
    unknown = sum(math.isnan(j.remaining) for j in todo)
    scaled = sum(j.scaled for j in todo)
    text = f"Remaining: about {duration(left)} of job time for {len(todo)} jobs" if not math.isnan(left) else \
        f"Remaining: {len(todo)} jobs"
    notes = [f"{scaled} from finished jobs of another size, by the size factors"] if scaled else []
    if unknown:
        notes.append(f"{unknown} not estimated: no finished job of their rule yet")
    if notes:
        text += f" ({'; '.join(notes)})"
    running = len(grid.of("running"))
    if running > 1 and not math.isnan(left):
        text += f"; at the {running} jobs running now, about {duration(left / running)}"
    stopped = len(grid.of("failed")) + len(grid.of("blocked"))
    if stopped:
        text += f"; the {stopped} failed and blocked jobs not counted"
    slurm = (grid.snakemake.record or {}).get("executor") == "slurm" or any(j.slurm for j in grid.jobs)
    return text + ("; queue wait apart" if slurm else "")


def _queue_lines(grid: GridStatus) -> list[str]:
    """Slurm's queue, apart from the job time: how long the queued jobs wait, how long the started ones waited."""
    queued = [j.queued for j in grid.of("queued") if not math.isnan(j.queued)]
    waited = [j.queued for j in grid.jobs if j.state != "queued" and not math.isnan(j.queued)]
    lines = []
    if grid.of("queued"):
        lines.append(f"Queue: {_jobs(len(grid.of('queued')))} waiting in Slurm's queue" + (
            f", for {duration(sum(queued) / len(queued))} on average (longest {duration(max(queued))})" if queued else ""))
    if waited:
        lines.append(f"Queue wait of the started Slurm jobs: {duration(sum(waited) / len(waited))} on average "
                     f"(longest {duration(max(waited))}, {_jobs(len(waited))})")
    if not grid.slurm_known:
        lines.append("Slurm: squeue could not be asked; jobs Snakemake submitted are judged by Snakemake alone")
    return lines


def _jobs(n: int) -> str:
    return f"{n} job" + ("" if n == 1 else "s")


def _gpu_lines(grid: GridStatus) -> list[str]:
    """GPU-hours: wall-clock times each job's `gpu` resource, where any job takes one."""
    if not any(j.gpus for j in grid.jobs):
        return []
    done = _total(j.seconds * j.gpus for j in grid.of("finished") if j.gpus)
    running = _total(j.seconds * j.gpus for j in grid.of("running") if j.gpus)
    left = _total(j.remaining * j.gpus for j in grid.jobs if j.state in TODO and j.gpus)
    hours = lambda s: "-" if math.isnan(s) else f"{s / 3600:,.1f}"  # noqa: E731
    return [f"GPU-hours (wall-clock x each job's gpu resource): {hours(done)} in finished jobs"
            + (f", {hours(running)} in running ones" if not math.isnan(running) else "")
            + (f", about {hours(left)} to come" if not math.isnan(left) else "")]
