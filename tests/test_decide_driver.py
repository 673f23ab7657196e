"""The sequential driver's own faults (issue 55, items 8, 11 and 12), against a fake `snakemake` first on PATH
(a script that records its arguments, or sleeps with a job until signalled): no training, no grid run.

- a dry run (`linvit decide -n`) records nothing: it runs Snakemake's dry run of the current look and says
  what would follow;
- SIGINT or SIGTERM to the driver alone, or Ctrl-C to its process group, stops its Snakemake as Ctrl-C would
  (one SIGINT to Snakemake's own process group, its jobs included), waits for it to remove its locks, and
  exits non-zero in one line: nothing is orphaned and a plain rerun resumes; a driver killed with SIGKILL
  leaves its Snakemake running, and the refusal names that live holder; `linvit status` advises no
  `snakemake --unlock` while a driver or a job still works in the folder;
- its inputs are checked: the seeds state.json lists against the plan, a --configfile with no file, a plan's
  gamma, a state.json that is not the driver's record (decide and status alike), `--help`, a read-only folder.
"""

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, REPO, patient
from test_decide import TINY

LINVIT = str(BIN / "linvit")
WAIT = patient(15)  # seconds any wait on a subprocess may take (a poll, never a fixed sleep), scaled for the load

# A stand-in for Snakemake: it records its arguments and the look's config file it was given, works in its
# --directory as Snakemake does, and exits 0. With FAKE_SNAKEMAKE=sleep it takes Snakemake's locks, starts a
# "training job" (a sleeping process in its process group), writes both pids, and waits for a signal; then,
# as Snakemake does on SIGINT, it waits for its job (which got the group's signal too), takes a moment to
# clean up and removes its locks.
FAKE = """#!{python}
import json, os, signal, subprocess, sys, time
from pathlib import Path

args = sys.argv[1:]
out = Path(os.environ["FAKE_SNAKEMAKE_OUT"])
looks = [Path(a).read_text() for a in args if a.endswith("look.yaml")]
with (out / "calls.jsonl").open("a") as f:
    f.write(json.dumps({{"argv": args, "looks": looks}}) + "\\n")
if "--directory" in args:
    os.chdir(args[args.index("--directory") + 1])
if os.environ.get("FAKE_SNAKEMAKE") == "sleep":
    got = []

    def handler(signum, frame):
        got.append(signum)
        with (out / "signals").open("a") as f:
            f.write(f"{{signum}}\\n")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    locks = Path(".snakemake/locks")
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (out / "pids").write_text(f"{{os.getpid()}} {{job.pid}}")
    while not got:
        time.sleep(0.05)
    job.wait()
    time.sleep(0.5)
    (locks / "0.input.lock").unlink()
    sys.exit(1)
"""


@pytest.fixture
def grid(tmp_path):
    """A project folder with the tiny grid's config (three looks: 2, 3, 4 seeds) and a fake snakemake."""
    config = {**TINY, "sequential": {"looks": [2, 3, 4]}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "snakemake").write_text(FAKE.format(python=sys.executable))
    (bin_dir / "snakemake").chmod(0o755)
    out = tmp_path / "fake"
    out.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
           "FAKE_SNAKEMAKE_OUT": str(out)}
    return tmp_path, config, env


def decide_cmd(tmp: Path, *extra: str) -> list[str]:
    return [LINVIT, "decide", "--cores", "1", "--directory", str(tmp), "--configfile", str(tmp / "tiny.yaml"), *extra]


def calls(tmp: Path) -> list[dict]:
    path = tmp / "fake/calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("linvit:")]


def at_look_two(tmp: Path, config: dict, added_seeds=(2,)) -> Path:
    """state.json as the driver leaves it after look 1: look 2 next, adding `added_seeds` to one role."""
    from linvit.decide import Driver

    driver = Driver(config, [str(tmp / "tiny.yaml")], tmp / "results", tmp / "report")
    state = driver.load_state()
    added = [{"dataset": "synthetic", "size": "micro", "variant": "elu", "init": "attn_only", "design": "none",
              "budget": 4, "seeds": list(added_seeds)}]
    state["looks"] = [{"look": 1, "seeds": 2, "finished": "2026-01-01 00:00:00", "added": [], "tests": {}}]
    state["next"] = {"look": 2, "added": added, "waiting": ["C1 synthetic/micro/elu/steps4 attn_alone"]}
    driver.save_state(state)
    (tmp / "report").mkdir(exist_ok=True)
    (tmp / "report/claims.json").write_text("[]\n")  # a report with no verdicts: a recorded look would read it
    return tmp / "results/decide/state.json"


def wait_for(predicate, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout} s for {what}")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (exited, its parent gone or not reaping yet) has ended too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_left(tmp: Path) -> None:
    """End what a failing test left (the fake's process group: the fake and its job)."""
    path = tmp / "fake/pids"
    if path.exists():
        for pid in map(int, path.read_text().split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- 8: a dry run records nothing ----------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["-n", "--dryrun"])  # the other spellings: test_dry_run_flags_as_snakemake_reads_them
def test_a_dry_run_records_nothing_and_runs_snakemakes_dry_run_of_the_look(grid, flag):
    tmp, config, env = grid
    state = at_look_two(tmp, config)
    before = state.read_bytes()
    out = subprocess.run(decide_cmd(tmp, flag), cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert state.read_bytes() == before  # no look recorded
    assert not (tmp / "results/decide/look.yaml").exists() and not (tmp / "results/decide/driver.lock").exists()
    [call] = calls(tmp)
    assert flag in call["argv"]
    assert yaml.safe_load(call["looks"][0])["added_seeds"][0]["seeds"] == [2]  # look 2's runs, from the state
    assert "dry run of look 2 of 3 (3 seeds; 1 added runs so far)" in out.stdout
    assert "nothing is recorded" in out.stdout and "look 3 adds seeds 3-3" in out.stdout


def test_a_dry_run_before_look_one_writes_no_folder(grid):
    tmp, _, env = grid
    out = subprocess.run(decide_cmd(tmp, "-n"), cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert not (tmp / "results").exists()
    assert "dry run of look 1 of 3 (2 seeds; the grid as configured)" in out.stdout
    assert yaml.safe_load(calls(tmp)[0]["looks"][0]) == {"added_seeds": [], "decide_look": 1}


def test_dry_run_flags_as_snakemake_reads_them():
    from linvit.decide_inputs import is_dry_run

    for args in (["-n"], ["--cores", "1", "--dryrun"], ["-np"], ["-pn"], ["-kpn"], ["-nj4"], ["--executor", "dryrun"],
                 ["--executor=dryrun"]):
        assert is_dry_run(args), args
    for args in ([], ["--cores", "1"], ["-j", "4"], ["-jn"], ["-p"], ["--executor", "slurm"], ["--notemp"]):
        assert not is_dry_run(args), args


# --- 11: interrupts -------------------------------------------------------------------------------------------
def start_sleeping_driver(tmp: Path, env: dict) -> tuple[subprocess.Popen, int, int]:
    """`linvit decide` in a session of its own (as at a terminal), its fake snakemake sleeping with a job."""
    log = open(tmp / "driver.err", "w")
    # SIGINT at its default, as at a terminal: a suite started in the background by a non-interactive shell
    # (`bash -c '... &'`) inherits SIGINT ignored, which the driver rightly leaves alone (as under nohup).
    proc = subprocess.Popen(decide_cmd(tmp), cwd=REPO, env={**env, "FAKE_SNAKEMAKE": "sleep"},
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log.close()
    pids = wait_for(lambda: (tmp / "fake/pids").exists() and (tmp / "fake/pids").read_text().split(),
                    "the fake snakemake to start its job")
    return proc, int(pids[0]), int(pids[1])


@pytest.mark.parametrize("how", ["SIGINT to the driver", "SIGTERM to the driver", "Ctrl-C to its process group"])
def test_a_signal_stops_snakemake_and_its_jobs_cleanly(grid, how):
    tmp, config, env = grid
    proc, snakemake, job = start_sleeping_driver(tmp, env)
    try:
        if how.startswith("Ctrl-C"):
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the foreground process group
        else:
            os.kill(proc.pid, signal.SIGTERM if "SIGTERM" in how else signal.SIGINT)
        code = proc.wait(timeout=WAIT)
        wait_for(lambda: gone(snakemake) and gone(job), "the fake snakemake and its job to end")
        err = (tmp / "driver.err").read_text()
        # Snakemake got one SIGINT (as from Ctrl-C), stopped its job and removed its locks; the driver waited.
        assert (tmp / "fake/signals").read_text().split() == [str(int(signal.SIGINT))], err
        assert not list((tmp / ".snakemake/locks").iterdir()), err
        assert code != 0
        [line] = errors(err)
        assert line.startswith("linvit: interrupted: SIG") and f"Snakemake (pid {snakemake}) stopped its jobs" in line
        # A plain rerun resumes: no lock is held (Snakemake's nor the driver's), nothing recorded for the look.
        state = tmp / "results/decide/state.json"
        assert not state.exists() or json.loads(state.read_text())["looks"] == []
        with open(tmp / "results/decide/driver.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        proc.kill()
        kill_left(tmp)


def test_a_driver_killed_with_sigkill_is_refused_naming_the_live_snakemake(grid):
    tmp, _, env = grid
    proc, snakemake, job = start_sleeping_driver(tmp, env)
    try:
        wait_for(lambda: f"snakemake pid {snakemake}" in (tmp / "results/decide/driver.lock").read_text(),
                 "driver.lock to name the running Snakemake")
        proc.kill()  # kill -9 of the driver alone: its Snakemake runs on and holds the lock
        proc.wait(timeout=WAIT)
        out = subprocess.run(decide_cmd(tmp), cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
        assert out.returncode != 0
        [line] = errors(out.stderr)
        assert f"Snakemake pid {snakemake} holds it, left running when linvit decide pid {proc.pid} was killed" in line
        assert len(calls(tmp)) == 1  # no second Snakemake started
        # `linvit status` sees that Snakemake running: no --unlock advice.
        status = subprocess.run([LINVIT, "status", "--configfile", str(tmp / "tiny.yaml"), "--directory", str(tmp)],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
        assert "--unlock` before" not in status.stdout, status.stdout + status.stderr
    finally:
        kill_left(tmp)


def test_status_advises_no_unlock_while_a_job_or_a_driver_still_works(tmp_path, monkeypatch):
    """Snakemake's locks left and no Snakemake here: `snakemake --unlock` is advised only where no job of the
    grid still runs here (a Snakemake killed without stopping its jobs) and no live linvit decide holds the
    folder; otherwise status names them."""
    from linvit import grid as lgrid
    from linvit.status import collect, render

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    job = next(j for j in lgrid.jobs(TINY) if j.rule == "teacher")
    (tmp_path / ".snakemake/locks").mkdir(parents=True)
    (tmp_path / ".snakemake/locks/0.input.lock").write_text("")
    record = {"host": socket.gethostname(), "pid": 1, "started": time.time() - 60, "executor": "local"}
    assert "`snakemake --unlock` before the next run" in render(collect(TINY, tmp_path, record=record))  # control
    (tmp_path / job.log).parent.mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "linvit", "teacher", ">", job.log],
                              cwd=tmp_path)
    driver = None
    try:
        text = wait_for(lambda: (t := render(collect(TINY, tmp_path, record=record))) and "still run here" in t and t,
                        "status to see the job's process")
        assert "--unlock` before" not in text
        assert f"not running, but 1 of its jobs still run here ({job.name}): do not `snakemake --unlock`" in text
        orphan.kill()
        orphan.wait(timeout=WAIT)
        driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "linvit", "decide"])
        (tmp_path / "results/decide").mkdir(parents=True)
        (tmp_path / "results/decide/driver.lock").write_text(
            f"pid {driver.pid} on {socket.gethostname()} since 2026-01-01 00:00:00; snakemake pid 999999999\n")
        text = render(collect(TINY, tmp_path, record=record))
        assert f"not running, but linvit decide (pid {driver.pid}): do not `snakemake --unlock`" in text
    finally:
        orphan.kill()
        if driver is not None:
            driver.kill()


# --- 12: unchecked inputs -------------------------------------------------------------------------------------
def test_seeds_in_the_state_beyond_the_cap_are_refused_before_snakemake_runs(grid):
    tmp, config, env = grid
    state = at_look_two(tmp, config, added_seeds=(2, 99))
    out = subprocess.run(decide_cmd(tmp), cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 1
    [line] = errors(out.stderr)
    assert line.startswith(f"linvit: error: {state}: look 2 lists seed 99 for synthetic/micro/elu/attn_only/none/4, "
                           f"not among the plan's 3 seeds up to look 2 (0, 1, 2)")
    assert calls(tmp) == []  # nothing trained


def test_a_later_looks_seed_in_the_state_is_refused(grid):
    """Seed 3 is within the cap (4 seeds at look 3) but look 3's: look 2 never trains it."""
    from linvit.decide import Driver
    from linvit.decide_state import DecideError

    tmp, config, _ = grid
    state = at_look_two(tmp, config, added_seeds=(3,))
    with pytest.raises(DecideError, match=f"^{state}: look 2 lists seed 3 for .* up to look 2 \\(0, 1, 2\\); "):
        Driver(config, [str(tmp / "tiny.yaml")], tmp / "results", tmp / "report").load_state()


@pytest.mark.parametrize("args", [["--configfile"], ["--configfile", "--cores", "1"], ["--configfile="],
                                  ["--directory"]])
def test_an_option_with_its_value_forgotten_is_one_line(grid, args):
    tmp, _, env = grid
    out = subprocess.run([LINVIT, "decide", *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 1 and calls(tmp) == []  # never the default grid in its place
    [line] = errors(out.stderr)
    assert "names no" in line and "Traceback" not in out.stderr


@pytest.mark.parametrize("gamma", [".nan", ".inf", "-.inf"])
def test_a_gamma_that_is_not_finite_fails_validation_naming_the_key(gamma):
    from linvit.config import ConfigError, validate

    config = yaml.safe_load(yaml.safe_dump({**TINY, "sequential": {"looks": [2, 3]}}) .replace(
        "looks:", f"gamma: {gamma}\n  looks:"))
    with pytest.raises(ConfigError, match=r"sequential\.gamma: (nan|inf|-inf), expected a finite number"):
        validate(config)


BROKEN = {  # what is done to a state at look 2, and the refusal's words
    "a JSON list": (lambda data: [1, 2], "a JSON list, not the driver's record"),
    "no keys": (lambda data: {}, "lacks 'plan', 'looks', 'next'"),
    "a look beyond the plan": (lambda data: {**data, "next": {**data["next"], "look": 4}, "looks": data["looks"] + [
        {**data["looks"][0], "look": 2}, {**data["looks"][0], "look": 3}]}, "it names look 4, beyond the plan's 3 looks"),
    "a look without its tests": (lambda data: {**data, "looks": [{k: v for k, v in data["looks"][0].items()
                                                                  if k != "tests"}]}, "its look 1 lacks 'tests'"),
    "next not a look": (lambda data: {**data, "next": 2}, "its 'next' is not a look"),
    "next out of order": (lambda data: {**data, "next": {**data["next"], "look": 3}}, "its next look is 3, after 1"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_state_that_is_not_the_drivers_record_is_a_decide_error(grid, broken):
    """Driver.load_state (decide) and read_state (status: current_config, status_lines) alike."""
    from linvit.decide import Driver
    from linvit.decide_state import DecideError, current_config
    from linvit.status_decide import status_lines

    tmp, config, _ = grid
    state = at_look_two(tmp, config)
    change, why = BROKEN[broken]
    state.write_text(json.dumps(change(json.loads(state.read_text()))))
    driver = Driver(config, [str(tmp / "tiny.yaml")], tmp / "results", tmp / "report")
    for read in (driver.load_state, lambda: current_config(config, tmp), lambda: status_lines(config, tmp)):
        with pytest.raises(DecideError, match=f"^{state}: {why}"):
            read()


def test_a_broken_state_is_one_line_in_decide_and_status(grid):
    tmp, config, env = grid
    state = at_look_two(tmp, config)
    state.write_text("[1, 2]\n")
    for cmd in (decide_cmd(tmp), [LINVIT, "status", "--configfile", str(tmp / "tiny.yaml"), "--directory", str(tmp)]):
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        [line] = errors(out.stderr)
        assert line.startswith(f"linvit: error: {state}: a JSON list, not the driver's record"), (cmd[1], line)
    assert calls(tmp) == []


def test_decide_help_documents_its_options_and_snakemakes():
    out = subprocess.run([LINVIT, "decide", "--help"], capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0
    for words in ("--configfile FILE", "--directory DIR", "-n, --dry-run, --dryrun", "every other argument goes to "
                  "Snakemake", "--cores", "--profile", "results/decide/state.json"):
        assert words in out.stdout, words


def test_a_read_only_results_folder_names_the_state_file(tmp_path, monkeypatch):
    """A folder the driver cannot write: the error names state.json, not the temporary file it writes first."""
    from linvit import io
    from linvit.decide import Driver

    def read_only(prefix="", suffix="", dir=None, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, f"{prefix}abcd1234{suffix}"))

    driver = Driver({**TINY, "sequential": {"looks": [2, 3]}}, ["tiny.yaml"], tmp_path / "results",
                    tmp_path / "report")
    monkeypatch.setattr(io.tempfile, "mkstemp", read_only)
    with pytest.raises(PermissionError) as err:
        driver.save_state(driver.load_state())
    assert str(err.value) == f"[Errno 13] cannot write {driver.state_path}: Permission denied"
    assert ".tmp" not in str(err.value) and tempfile.mkstemp is read_only


def test_snakemake_missing_from_path_is_one_line(tmp_path, monkeypatch):
    """A driver run outside linvit's environment: one line naming snakemake and how to get it on PATH."""
    from linvit.decide_process import run_snakemake
    from linvit.decide_state import DecideError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DecideError, match=r"^snakemake: not found on PATH .*source \.venv/bin/activate"):
        run_snakemake(["snakemake", "-n"])
