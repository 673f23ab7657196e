"""The Snakemake a look runs: in a process group of its own, signals to the driver forwarded to it as one
Ctrl-C, waited for until it has stopped its jobs and removed its locks; its pid added to driver.lock's line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from .decide_state import DecideError


class Interrupted(KeyboardInterrupt):
    """The driver was stopped by a signal, after its Snakemake stopped (linvit's CLI prints it in one line)."""


def run_snakemake(cmd: list[str], lock=None, started=None) -> int:
    """Run Snakemake in a process group of its own (its jobs join it) and wait for it; its exit code.

    SIGINT, SIGTERM or SIGHUP to the driver (Ctrl-C at its terminal, a scheduler, a closed terminal) goes
    to that group as one SIGINT, as Ctrl-C would to a Snakemake run by hand: Snakemake stops its jobs and
    removes its locks, and the driver waits for it to exit, then raises Interrupted. (Snakemake in the
    driver's own group would get a terminal's Ctrl-C twice; a SIGTERM makes it wait for its running jobs.)
    A second signal kills the group. `lock`: a file Snakemake holds open too; `started(pid)` is called
    once it runs."""
    if shutil.which(cmd[0]) is None:  # else a bare "No such file or directory"
        raise DecideError(f"{cmd[0]}: not found on PATH (linvit's environment puts it there: `source .venv/bin/activate`, "
                          f"or run `bash setup.sh decide`)")
    child: subprocess.Popen | None = None
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        if child is not None:
            _stop(child, len(got))

    watched = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, forward) for s in watched}
    try:
        child = subprocess.Popen(cmd, pass_fds=(lock.fileno(),) if lock is not None else (), process_group=0)
        if got:  # a signal came while it started
            _stop(child, len(got))
        elif started is not None:
            started(child.pid)
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    if got:
        name = signal.Signals(got[0]).name
        if len(got) > 1:
            raise Interrupted(f"{name} twice: killed Snakemake (pid {child.pid}) and its jobs; its locks may be "
                              f"left in .snakemake/locks (`linvit status` says), then rerun linvit decide")
        raise Interrupted(f"{name}: Snakemake (pid {child.pid}) stopped its jobs and exited {code}; rerun "
                          f"linvit decide to resume")
    return code


def _stop(child: subprocess.Popen, times: int) -> None:
    sig = signal.SIGINT if times == 1 else signal.SIGKILL
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        return
    # (os.write: a signal handler may run while the main thread is inside print)
    os.write(2, (f"decide: stopping Snakemake (pid {child.pid}) and its jobs, waiting for it to remove its locks "
                 f"(a second signal kills them)\n" if times == 1 else
                 f"decide: killed Snakemake (pid {child.pid}) and its jobs\n").encode())


def record_snakemake(lock, pid: int) -> None:
    """Add the running Snakemake's pid to driver.lock's line, so that a refusal names it if the driver is
    killed and it runs on, holding the lock."""
    lock.seek(0)
    line = lock.readline().split(";")[0].strip()
    lock.truncate(0)
    lock.write(f"{line}; snakemake pid {pid}\n")
    lock.flush()
