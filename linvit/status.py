"""`linvit status`: where a grid stands, during or after a run (local or Slurm), read from its files.

The jobs are `linvit.grid.jobs(config)`, the list the workflow's DAG is checked against
(tests/test_workflow.py), so a rule added to or removed from the workflow is one change there. Each
job is, in this order:

    finished     every output it declares exists, Snakemake does not mark one incomplete, and no job
                 it reads failed
    running      a process of this machine runs its command (which names its log), or Slurm holds
                 its job (squeue), or, where neither can be asked, Snakemake runs and has started it
    interrupted  Snakemake started it (.snakemake/incomplete/) and nothing runs it: a killed run; the
                 next `snakemake` runs it again, from its checkpoint where it has one
    failed       its log exists, its outputs do not: the log's error line (linvit.report.aggregate reads it)
    blocked      it waits for a job that failed (or is blocked): Snakemake runs it only once that is fixed
                 (a report written under --keep-going from the cells that finished is blocked too)
    to run       none of these yet

A job Snakemake would rerun for a changed config, its outputs being there, counts as finished here
(`snakemake -n` says what it would rerun).

Time so far: the finished jobs' wall-clock seconds from their Snakemake benchmark files
(results/benchmarks/<rule>/...tsv, `read_benchmark`), and the running jobs' time since Snakemake
started them. What remains is estimated per job from the finished jobs of its rule: the mean of
those with the same init strategy, design and budget, else the same budget, else the whole rule's;
a running job's estimate less the time it has run (at least 0). Failed and blocked jobs are left out
(they run only once fixed), and a job of a rule with no finished job yet has no estimate (said).

Torch-free and quick: the config, the grid, and file and process listings.
"""

from __future__ import annotations

import base64
import getpass
import json
import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .grid import Job, jobs, operator_benchmark_path
from .report.aggregate import _log_line as log_line, read_benchmark  # a failed job's error line; benchmark TSVs

STATES = ("finished", "running", "interrupted", "failed", "blocked", "to run")
SNAKEMAKE = ".snakemake"
PROGRESS = re.compile(r"\bstep (\d+)/(\d+)\b")  # linvit.train's progress lines in a job's log
LOG_TOKEN = re.compile(r"[^\s'\"<>|;&()]+\.log")  # a path ending in .log in a command line
SLURM_WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


@dataclass
class JobStatus:
    job: Job
    state: str = "to run"
    detail: str = ""           # the error line, the progress, what it waits for
    seconds: float = math.nan  # finished: its benchmark's wall-clock s; running: since it started
    remaining: float = math.nan  # the estimate of what it still takes (nan: none, or not counted)


@dataclass
class Snakemake:
    """What this machine says of Snakemake in the project folder."""

    pids: list[int] = field(default_factory=list)  # Snakemake processes working in it
    started: float | None = None                   # when the oldest of them started (unix time)
    locked: bool = False                           # .snakemake/locks holds locks
    processes_known: bool = True                   # whether /proc could be read

    @property
    def running(self) -> bool:
        return bool(self.pids) if self.processes_known else self.locked


@dataclass
class GridStatus:
    root: Path
    jobs: list[JobStatus]
    snakemake: Snakemake
    now: float

    def of(self, state: str) -> list[JobStatus]:
        return [j for j in self.jobs if j.state == state]

    @property
    def rules(self) -> list[str]:
        return list(dict.fromkeys(j.job.rule for j in self.jobs))


def collect(config: dict, root: str | Path = ".", *, slurm: bool = True) -> GridStatus:
    """The status of every job of `config`'s grid in the project folder `root` (Snakemake's working
    directory). `slurm`: whether to ask squeue about jobs Snakemake submitted to Slurm."""
    root = Path(root).resolve()
    now = time.time()
    with_benchmark = (root / operator_benchmark_path()).exists()
    planned = jobs(config, with_benchmark=with_benchmark)
    markers = incomplete_markers(root)
    logs, snakemake = _processes(root)
    slurm_ids = {jobid for jobid, _ in markers.values() if jobid}
    queue = _squeue() if slurm and slurm_ids else None
    by_name: dict[str, JobStatus] = {}
    for job in planned:
        status = JobStatus(job)
        marked = [markers[out] for out in job.outputs if out in markers]
        stopped = [by_name[n] for n in job.needs if by_name[n].state in ("failed", "blocked")]
        if all((root / out).exists() for out in job.outputs) and not marked and not stopped:
            status.state = "finished"
            status.seconds = read_benchmark(root / job.benchmark)["wall_s"] if job.benchmark else math.nan
        elif job.log in logs or marked:
            _started(status, root, marked, job.log in logs, queue, snakemake, now)
        elif (root / job.log).exists():
            _, line = log_line(root / job.log)
            status.state, status.detail = "failed", line or f"no error line in its log ({job.log})"
        elif stopped:  # its outputs, if any, were written without them (the report under --keep-going)
            status.state = "blocked"
            status.detail = "waits for " + ", ".join(
                s.job.name if s.state == "failed" else f"{s.job.name} (blocked)" for s in stopped[:2]) + (
                f" and {len(stopped) - 2} more" if len(stopped) > 2 else "")
        by_name[job.name] = status
    grid = GridStatus(root, list(by_name.values()), snakemake, now)
    _estimate(grid)
    return grid


def _started(status: JobStatus, root: Path, marked: list, has_process: bool, queue, snakemake: Snakemake,
             now: float) -> None:
    """A job Snakemake started or a process runs: running or interrupted, with its progress."""
    job = status.job
    slurm_id = next((jobid for jobid, _ in marked if jobid), None)
    since = min((start for _, start in marked), default=None)
    progress = _progress(root / job.log)
    if has_process:
        running, how = True, "runs here"
    elif slurm_id and queue is not None:
        state = queue.get(slurm_id)
        running = state is not None or snakemake.running
        how = (f"Slurm job {slurm_id} {state.lower()}" if state else
               f"Slurm job {slurm_id} ended; Snakemake has yet to collect it" if running else
               f"Slurm job {slurm_id} ended")
        if state in SLURM_WAITING:
            progress = ""
    else:  # no process of this machine runs it: is the Snakemake that started it still there?
        running = snakemake.running and (slurm_id is not None or not snakemake.processes_known)
        how = f"Slurm job {slurm_id}" if slurm_id else ""
    status.state = "running" if running else "interrupted"
    if running:
        status.seconds = now - since if since is not None else math.nan
    parts = [how] if how else []
    if progress:
        parts.append(f"at {progress}" if running else f"stopped at {progress}")
    if not running:
        trains = any(out.endswith("/train.jsonl") for out in job.outputs)
        parts.append(("Snakemake, running, may start it again" if snakemake.running else "the next snakemake runs it again")
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


def _estimate(grid: GridStatus) -> None:
    """Each unfinished job's remaining seconds from the finished jobs of its rule (see the module's doc)."""
    groups: dict[tuple, list[float]] = {}
    for s in grid.jobs:
        if s.state == "finished" and not math.isnan(s.seconds):
            for key in _estimate_keys(s.job):
                groups.setdefault(key, []).append(s.seconds)
    for s in grid.jobs:
        if s.state not in ("running", "interrupted", "to run"):
            continue
        found = next((groups[k] for k in _estimate_keys(s.job) if k in groups), None)
        if found is None:
            continue
        mean = sum(found) / len(found)
        s.remaining = max(0.0, mean - s.seconds) if s.state == "running" and not math.isnan(s.seconds) else mean


def _estimate_keys(job: Job) -> list[tuple]:
    """From the closest group of finished jobs to the whole rule."""
    cell = job.cell
    if cell is None:
        return [(job.rule,)]
    return [(job.rule, cell.init, cell.design, cell.budget), (job.rule, cell.budget), (job.rule,)]


# -- what Snakemake and this machine say --------------------------------------------------------------

def incomplete_markers(root: Path) -> dict[str, tuple[str | None, float]]:
    """Snakemake's marks of started, unfinished jobs: {output path: (the Slurm job id or None, when it
    started)}. Snakemake (its file persistence) writes one file per output of a job it starts, named by
    the output's path in URL-safe base64, split into folders of at most NAME_MAX characters (all but the
    last prefixed with '@'), holding {"external_jobid": ...}; it removes them when the job ends."""
    folder = root / SNAKEMAKE / "incomplete"
    found = {}
    if not folder.is_dir():
        return found
    for path in folder.rglob("*"):
        if not path.is_file() or path.name == "migration_underway":
            continue
        encoded = "".join(part.removeprefix("@") for part in path.relative_to(folder).parts)
        try:
            output = base64.urlsafe_b64decode(encoded.encode()).decode()
            started = path.stat().st_mtime
        except (ValueError, UnicodeDecodeError, OSError):
            continue
        try:
            jobid = json.loads(path.read_text() or "{}").get("external_jobid")
        except (OSError, ValueError, AttributeError):
            jobid = None
        found[output] = (str(jobid) if jobid else None, started)
    return found


def _processes(root: Path) -> tuple[set[str], Snakemake]:
    """The job logs that command lines of this machine's processes name (a job's shell command redirects
    into its log; a `linvit` command among its words, so that `tail -f` on a log does not count), and
    the Snakemake processes working in `root`. Without /proc: nothing, and Snakemake judged by its locks."""
    locks = root / SNAKEMAKE / "locks"
    snakemake = Snakemake(locked=locks.is_dir() and any(locks.iterdir()))
    logs: set[str] = set()
    proc = Path("/proc")
    if not (proc / "self" / "cmdline").exists():
        snakemake.processes_known = False
        return logs, snakemake
    me, starts = os.getpid(), []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            args = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            cwd = None
        if not args:
            continue
        words = " ".join(args)
        if cwd == root and any(Path(a).name == "snakemake" or a == "snakemake" for a in args[:3]):
            snakemake.pids.append(int(entry.name))
            starts.append(_process_start(entry))
        if "linvit" not in words:
            continue
        for token in LOG_TOKEN.findall(words):
            path = Path(token)
            if path.is_absolute():
                if path.is_relative_to(root):
                    logs.add(path.relative_to(root).as_posix())
            elif cwd == root:
                logs.add(path.as_posix())
    known = [s for s in starts if s is not None]
    snakemake.started = min(known) if known else None
    return logs, snakemake


def _process_start(entry: Path) -> float | None:
    """When a process started (unix time), from /proc/<pid>/stat and the boot time."""
    try:
        ticks = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _squeue() -> dict[str, str] | None:
    """{Slurm job id: state} of this user's jobs Slurm holds; None where squeue is not there or fails."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T", "-u", getpass.getuser()], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


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
    """The summary, a table of the rules, then per rule its jobs that are running, interrupted, failed or
    blocked (with `every`, all its jobs)."""
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
    lines.append("")
    header = ["rule", "jobs", *STATES, "time so far", "per job", "remaining"]
    rows = []
    for rule in grid.rules:
        mine = [j for j in grid.jobs if j.job.rule == rule]
        finished = [j.seconds for j in mine if j.state == "finished"]
        known = [s for s in finished if not math.isnan(s)]
        todo = [j for j in mine if j.state in ("running", "interrupted", "to run")]
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
                 and (every or j.state in ("running", "interrupted", "failed", "blocked"))]
        if not shown:
            continue
        mine = [j for j in grid.jobs if j.job.rule == rule]
        said = ", ".join(f"{n} {s}" for s in STATES if (n := sum(j.state == s for j in mine)))
        lines += ["", f"{rule}: {said}"]
        blocked = [j for j in shown if j.state == "blocked"]
        folded = not every and len(blocked) > 3  # one line for many jobs behind the same failures
        if folded:
            shown = [j for j in shown if j.state != "blocked"]
        rows = [[j.state, j.job.key, duration(j.seconds), j.detail or _detail(j)] for j in shown]
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
    if status.state == "to run" and not math.isnan(status.remaining):
        return f"about {duration(status.remaining)}"
    return ""


def _snakemake_line(grid: GridStatus) -> str:
    s = grid.snakemake
    if s.running and s.pids:
        since = f", for {duration(grid.now - s.started)}" if s.started else ""
        return f"running (process {', '.join(map(str, s.pids[:3]))}{since})"
    if s.running:
        return "running, by its locks in .snakemake/locks (this machine's processes cannot be listed)"
    if s.locked:
        return ("not running, but its locks are left in .snakemake/locks (a killed run): "
                "`snakemake --unlock` before the next run")
    return "not running"


def _remaining_line(grid: GridStatus) -> str:
    todo = [j for j in grid.jobs if j.state in ("running", "interrupted", "to run")]
    if not todo:
        stopped = len(grid.of("failed")) + len(grid.of("blocked"))
        return "Remaining: nothing" + (f" but the {stopped} failed and blocked jobs, once fixed" if stopped else "")
    left = _total(j.remaining for j in todo)
    unknown = sum(math.isnan(j.remaining) for j in todo)
    text = f"Remaining: about {duration(left)} of job time for {len(todo)} jobs" if not math.isnan(left) else \
        f"Remaining: {len(todo)} jobs"
    if unknown:
        text += f" ({unknown} not estimated: no finished job of their rule yet)"
    running = len(grid.of("running"))
    if running > 1 and not math.isnan(left):
        text += f"; at the {running} jobs running now, about {duration(left / running)}"
    stopped = len(grid.of("failed")) + len(grid.of("blocked"))
    if stopped:
        text += f"; the {stopped} failed and blocked jobs not counted"
    return text

