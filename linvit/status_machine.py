"""What this machine and Snakemake's own files say of a run, for `linvit status`: Snakemake's marks of the
jobs it started (.snakemake/incomplete/), its locks, and the processes of this machine working in the
project folder (/proc): Snakemake's, and the jobs' own commands (which name their logs)."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .status_slurm import SlurmJob

SNAKEMAKE = ".snakemake"
LOG_TOKEN = re.compile(r"[^\s'\"<>|;&()]+\.log")  # a path ending in .log in a command line


@dataclass
class Snakemake:
    """What this machine says of Snakemake in the project folder, and the record of its last run."""

    pids: list[int] = field(default_factory=list)  # Snakemake processes working in it, on this machine
    started: float | None = None                   # when the oldest of them started (unix time)
    locked: bool = False                           # .snakemake/locks holds locks
    processes_known: bool = True                   # whether /proc could be read
    record: dict | None = None                     # linvit.runrecord's record of the last run
    head: SlurmJob | None = None                   # the Slurm job the recorded Snakemake runs in, if alive
    alive_jobs: list[str] = field(default_factory=list)  # the run's Slurm jobs Slurm still holds

    @property
    def host(self) -> str:
        return (self.record or {}).get("host") or ""

    @property
    def elsewhere(self) -> bool:
        """The recorded run was started on another machine."""
        return bool(self.host) and self.host != socket.gethostname()

    @property
    def running(self) -> bool | None:
        """True: seen running (a process here, or its Slurm head job); False: seen not running; None:
        this machine cannot tell (started on another host, or no /proc)."""
        if self.pids or (self.head is not None and self.head.alive):
            return True
        if (self.record or {}).get("slurm_head_job") and self.head is not None:
            return False
        if self.elsewhere or not self.processes_known:
            return None
        return False


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


def processes(root: Path) -> tuple[set[str], Snakemake]:
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


def is_snakemake(pid) -> bool:
    try:
        args = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, TypeError, ValueError):
        return False
    return any(Path(a.decode(errors="replace")).name == "snakemake" for a in args[:3])
