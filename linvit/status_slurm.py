"""What Slurm says of a grid's jobs, for `linvit status`: the jobs it holds (`squeue`), the jobs it ended
(`sacct` where the cluster keeps accounting, else `scontrol show job`, which remembers a job for the
cluster's MinJobAge), and the Slurm logs the executor plugin keeps
(`.snakemake/slurm_logs/rule_<rule>/<wildcards>/<jobid>.log`: the wildcards' values joined by `_`, one
file per submission, so a retried job has one per attempt). Each is one command, whatever the grid's
size; none is run where no job went to Slurm.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SLURM_LOGS = ".snakemake/slurm_logs"  # the plugin's default log folder (--slurm-logdir moves it)
# States of a job that waits to run (squeue's long names).
WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED")
ALIVE = (*WAITING, "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED")
# What slurmstepd writes into a job's output when it ends it, and the state each means (a job Slurm no
# longer remembers is read from its log).
KILLED = ((re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT"), "TIMEOUT"),
          (re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION"), "PREEMPTED"),
          (re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO NODE FAILURE"), "NODE_FAIL"),
          (re.compile(r"oom[-_ ]kill|Out Of Memory", re.I), "OUT_OF_MEMORY"),
          (re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT"), "CANCELLED"))


@dataclass
class SlurmJob:
    id: str
    state: str                      # Slurm's long state name (PENDING, RUNNING, TIMEOUT, ...)
    reason: str = ""                # why it waits (Priority, Resources, JobHeldUser, ...)
    submitted: float | None = None  # unix times
    started: float | None = None
    ended: float | None = None
    workdir: str = ""
    node: str = ""
    comment: str = ""               # the plugin's: rule_<rule>_wildcards_<wildcards> (or rule_<rule>)

    @property
    def rule_wildcards(self) -> tuple[str, str] | None:
        """(rule, wildcards folder) of the Snakemake job it runs, from the plugin's comment."""
        if not self.comment.startswith("rule_"):
            return None
        rule, _, wildcards = self.comment.removeprefix("rule_").partition("_wildcards_")
        return rule, wildcards

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def queue_wait(self) -> float | None:
        """Seconds it waited in the queue before it started (None while it waits, or unknown)."""
        return self.started - self.submitted if self.started is not None and self.submitted is not None else None


def _time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # N/A, Unknown, None, (null)
        return None


def _run(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def squeue() -> dict[str, SlurmJob] | None:
    """This user's jobs Slurm holds, by job id; None where squeue is not there or fails."""
    out = _run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%r|%V|%S|%N|%Z|%k"])
    if out is None:
        return None
    found = {}
    for line in out.splitlines():
        parts = line.split("|", 7)
        if len(parts) < 2:
            continue
        parts += [""] * (8 - len(parts))
        job = SlurmJob(parts[0].strip(), parts[1].strip(), parts[2].strip(), _time(parts[3]), _time(parts[4]),
                       workdir=parts[6].strip(), node=parts[5].strip(), comment=parts[7].strip())
        if job.waiting:
            job.started = None  # squeue gives a pending job's expected start time
        found[job.id] = job
    return found


def ended(ids: set[str]) -> dict[str, SlurmJob]:
    """Jobs `ids` as Slurm remembers them after they left the queue: sacct where accounting works, else
    `scontrol show job` (every job the controller still holds, one command)."""
    if not ids:
        return {}
    out = _run(["sacct", "-X", "-n", "-P", "-j", ",".join(sorted(ids)), "-o",
                "JobIDRaw,State,Reason,Submit,Start,End,NodeList,WorkDir"])
    if out is not None:
        found = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) >= 8 and parts[0] in ids:
                found[parts[0]] = SlurmJob(parts[0], parts[1].split()[0] if parts[1] else "", parts[2],
                                           _time(parts[3]), _time(parts[4]), _time(parts[5]), parts[7], parts[6])
        return found
    out = _run(["scontrol", "-o", "show", "job"])
    found = {}
    for line in (out or "").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("JobId") in ids:
            found[fields["JobId"]] = SlurmJob(
                fields["JobId"], fields.get("JobState", ""), fields.get("Reason", ""), _time(fields.get("SubmitTime", "")),
                _time(fields.get("StartTime", "")), _time(fields.get("EndTime", "")), fields.get("WorkDir", ""),
                fields.get("NodeList", ""))
    return found


def wildcards_of(key: str) -> str:
    """The plugin's folder name for a job of key `key` (linvit.grid: the wildcards' values as a path, with
    `steps`/`seed` before the numbers): the values joined by `_`."""
    return re.sub(r"(^|/)(?:steps|seed)(\d+)(?=/|$)", r"\1\2", key).replace("/", "_")


def slurm_logs(folder: Path) -> dict[tuple[str, str], list[tuple[int, Path, float]]]:
    """{(rule, wildcards folder): [(Slurm job id, its log, when last written), ...] in id order}."""
    found: dict[tuple[str, str], list] = {}
    if not folder.is_dir():
        return found
    for rule_dir in folder.iterdir():
        if not rule_dir.name.startswith("rule_") or not rule_dir.is_dir():
            continue
        rule = rule_dir.name.removeprefix("rule_")
        for entry in rule_dir.iterdir():
            files = [(entry.name, entry)] if entry.is_file() else []
            wildcards = ""
            if entry.is_dir():
                wildcards, files = entry.name, [(f.name, f) for f in entry.iterdir()]
            for name, path in files:
                stem = name.removesuffix(".log")
                if name.endswith(".log") and stem.isdigit():
                    found.setdefault((rule, wildcards), []).append((int(stem), path, path.stat().st_mtime))
    for logs in found.values():
        logs.sort()
    return found


def killed_by(log: Path) -> str:
    """Slurm's state for a job its log says Slurm ended ('' if it does not say)."""
    try:
        with log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return next((state for pattern, state in KILLED if pattern.search(text)), "")
