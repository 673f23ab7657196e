"""`linvit status` on a results tree of the smoke grid whose state the test sets: finished jobs with
their benchmarks, a job a process runs, one Slurm runs, one a killed run left, a failed one and those
behind it; Snakemake's own markers of started jobs. (tests/test_workflow.py runs it on the smoke grid
while it trains, once killed and once finished; tests/test_failures.py on failed cells.)"""

import json
import re
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from conftest import REPO, patient, run
from linvit import grid
from linvit.bench import write_stub
from linvit.status import collect, duration, incomplete_markers, render

SMOKE = REPO / "workflow/config/smoke.yaml"
CONFIG = yaml.safe_load(SMOKE.read_text())


def mark(root: Path, output: str, jobid=None, max_len=None):
    """Snakemake's incomplete marker of `output`, written by Snakemake's own naming (FilePersistence._record_path)."""
    from snakemake.persistence.file import FilePersistence

    folder = root / ".snakemake/incomplete"
    folder.mkdir(parents=True, exist_ok=True)
    namer = types.SimpleNamespace(_fetch_max_len=lambda subject: max_len or 255)
    path = Path(FilePersistence._record_path(namer, str(folder), output))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"external_jobid": jobid}))


def finish(root: Path, job: grid.Job, seconds: float | None = None):
    for out in job.outputs:
        path = root / out
        if "." in Path(out).name:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_stub(path)  # whole: status reads a finished job's files (linvit.status.unreadable)
        else:
            path.mkdir(parents=True, exist_ok=True)
    if seconds is not None:
        write(root / job.benchmark, f"s\th:m:s\tmax_rss\tcpu_time\n{seconds}\t0:00:00\t100\t{seconds}\n")


def write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    jobs = {job.name: job for job in grid.jobs(CONFIG)}
    by_rule = lambda rule: [j for j in jobs.values() if j.rule == rule]  # noqa: E731
    for job in by_rule("shards"):
        finish(tmp_path, job)
    finish(tmp_path, jobs["teacher micro/seed0"], 30)
    distills = by_rule("distill")
    finish(tmp_path, distills[0], 10)
    finish(tmp_path, distills[1], 14)
    # A distillation a process of this machine runs (its command names its log), started by Snakemake.
    running = distills[2]
    for out in running.outputs:
        mark(tmp_path, out)
    write(tmp_path / running.log, "distill ...: step 2/4 loss 0.1\n")
    process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({patient(120)})", "linvit", "distill",
                                ">", running.log], cwd=tmp_path)
    # One Slurm runs (squeue, here a script, says so), and one a killed run left behind.
    slurm, killed = distills[3], distills[4]
    for out in slurm.outputs:
        mark(tmp_path, out, jobid="4242")
    # ... at its second attempt: Slurm ended the first for memory (the plugin's Slurm log of each submission).
    slurm_wildcards = "_".join(slurm.key.replace("seed", "").split("/"))
    write(tmp_path / f".snakemake/slurm_logs/rule_distill/{slurm_wildcards}/4000.log", "attempt 1\n")
    write(tmp_path / f".snakemake/slurm_logs/rule_distill/{slurm_wildcards}/4242.log", "attempt 2\n")
    for out in killed.outputs:
        mark(tmp_path, out, max_len=24)  # a long name: folders of at most NAME_MAX characters
    write(tmp_path / killed.log, "distill ...: step 1/4 loss 0.2\ndistill ...: step 3/4 loss 0.1\n")
    # squeue's lines (status asks for "%i|%T|%r|%V|%S|%N|%Z|%k"): the running job, a student still waiting for a
    # node (submitted 10 minutes ago, 2 minutes after the running one started), and another user's grid.
    queued = [j for j in by_rule("student") if j.cell.init == "copy_all"][0]
    for out in queued.outputs:  # a mark Snakemake left without the Slurm id: squeue's comment names the job
        mark(tmp_path, out)
    stamp = lambda ago: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - ago))  # noqa: E731
    bin_dir = tmp_path / "bin"
    write(bin_dir / "squeue", f"#!/bin/sh\necho '4242|RUNNING|None|{stamp(780)}|{stamp(720)}|node3|{tmp_path}'\n"
                              f"echo '5151|PENDING|Resources|{stamp(600)}|{stamp(-3600)}||{tmp_path}|rule_student_"
                              f"wildcards_{queued.key.replace('/steps', '/').replace('/seed', '/').replace('/', '_')}'\n"
                              "echo '99|PENDING|Priority|2026-01-01T00:00:00|N/A||/elsewhere'\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    # One failed: its log's error line.
    failed = distills[5]
    write(tmp_path / failed.log, "distill ...: step 1/4 loss 0.2\nlinvit: error: out of memory in block 3\n")
    # One Slurm ended for its time limit at its second attempt: the plugin's Slurm logs of both submissions
    # (.snakemake/slurm_logs/rule_<rule>/<wildcards>/<jobid>.log), slurmstepd's line in the last; no sacct
    # (a cluster without accounting), scontrol remembers the job.
    timeout = distills[6]
    write(tmp_path / timeout.log, "distill ...: step 2/4 loss 0.2\n")
    wildcards = "_".join(timeout.key.replace("seed", "").split("/"))
    write(tmp_path / f".snakemake/slurm_logs/rule_distill/{wildcards}/700.log", "attempt 1\n")
    write(tmp_path / f".snakemake/slurm_logs/rule_distill/{wildcards}/777.log", "attempt 2\n")
    write(bin_dir / "sacct", "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    write(bin_dir / "scontrol", "#!/bin/sh\necho 'JobId=4000 JobName=x JobState=OUT_OF_MEMORY Reason=OutOfMemory'\n"
                                "echo 'JobId=777 JobName=x JobState=TIMEOUT Reason=TimeLimit NodeList=node3'\n")
    for name in ("sacct", "scontrol"):
        (bin_dir / name).chmod(0o755)
    # Students: two of one group finished (their mean estimates the third), one to run.
    plain = [j for j in by_rule("student") if not j.cell.distills and j.cell.init == "random"]
    finish(tmp_path, plain[0], 20)
    try:
        yield tmp_path, jobs, {"running": running, "slurm": slurm, "killed": killed, "failed": failed,
                               "plain": plain, "queued": queued, "timeout": timeout}
    finally:
        process.kill()
        process.wait()


def test_every_job_has_its_state_its_time_and_what_remains(tree):
    root, jobs, named = tree
    status = {s.job.name: s for s in collect(CONFIG, root).jobs}
    assert [s.job.name for s in status.values()] == list(jobs)  # every job of the grid, in the DAG's order
    assert status["teacher micro/seed0"].state == "finished" and status["teacher micro/seed0"].seconds == 30
    assert status[named["running"].name].state == "running"
    assert status[named["running"].name].detail == "runs here; at step 2/4"
    assert status[named["slurm"].name].state == "running"
    assert status[named["slurm"].name].detail == "Slurm job 4242 running on node3; attempt 2 (the last: Slurm job 4000 " \
        "OUT_OF_MEMORY)"
    killed = status[named["killed"].name]
    assert killed.state == "interrupted"
    assert killed.detail == "stopped at step 3/4; the next snakemake runs it again, from its last checkpoint if it made one"
    failed = status[named["failed"].name]
    assert (failed.state, failed.detail) == ("failed", "linvit: error: out of memory in block 3")
    # Everything behind the failed distillation waits for it: its students (each evaluating its model), the report.
    behind = [s for s in status.values() if s.job.cell is not None and s.job.cell.distills
              and s.job.cell.distill_key == named["failed"].key and s.job.rule == "student"]
    assert behind and all(s.state == "blocked" for s in behind)
    assert status["report all"].state == "blocked"
    # Remaining: the mean of the finished jobs of the same init strategy and design (the killed one: as
    # the first, 10 s), else of its rule and budget (12 s); a running job's less what it ran.
    assert (named["killed"].cell.init, named["killed"].cell.design) == (jobs[next(iter(
        j for j in jobs if j.startswith("distill")))].cell.init, "outputs")
    assert status[named["killed"].name].remaining == 10
    to_run = [s for s in status.values() if s.job.rule == "distill" and s.state == "to run"]
    assert len(to_run) == 1 and all(s.remaining == 12 for s in to_run)
    assert 0 <= status[named["running"].name].remaining <= 12
    assert status[named["plain"][1].name].remaining == 20  # the finished random student of its budget
    assert status[named["failed"].name].remaining != status[named["failed"].name].remaining  # nan: not counted
    # Queued: Slurm holds it, waiting (PENDING): neither running nor in the time so far; its wait apart, its
    # estimate counted (the finished random student of its dataset and budget).
    queued = status[named["queued"].name]
    assert queued.state == "queued" and queued.seconds != queued.seconds and 595 < queued.queued < 700
    assert queued.detail.startswith("Slurm job 5151 pending (Resources) for 10 min") and queued.remaining == 20
    assert 715 < status[named["slurm"].name].seconds < 800  # since Slurm started it, not since submitted
    assert status[named["slurm"].name].queued == 60
    # Slurm ended one for its time limit, at its second attempt: Slurm's state, the attempt, its Slurm log.
    timeout = status[named["timeout"].name]
    assert timeout.state == "failed" and timeout.slurm.state == "TIMEOUT" and timeout.attempt == 2
    assert timeout.detail == (f"Slurm job 777 TIMEOUT; attempt 2; Slurm log {root}/.snakemake/slurm_logs/rule_distill/"
                              f"{timeout.job.key.replace('/seed', '/').replace('/', '_')}/777.log")
    # A job Slurm no longer remembers: its state from slurmstepd's line in its Slurm log.
    log = Path(timeout.slurm_log)
    log.write_text("slurmstepd: error: *** JOB 777 ON node3 CANCELLED AT 2026-12-06T10:00:00 DUE TO TIME LIMIT ***\n")
    (root / "bin/scontrol").write_text("#!/bin/sh\n")
    assert next(s for s in collect(CONFIG, root).jobs if s.job.name == timeout.job.name).slurm.state == "TIMEOUT"


def test_the_text_has_a_table_of_rules_and_the_jobs_to_look_at(tree):
    root, jobs, named = tree
    text = render(collect(CONFIG, root), "smoke.yaml")
    lines = text.splitlines()
    assert lines[0].startswith(f"Grid smoke.yaml in {root}: 56 jobs, ")  # 44 cells, no evaluation jobs
    header = next(line for line in lines if line.startswith("rule "))
    assert header.split()[:9] == ["rule", "jobs", "finished", "running", "queued", "interrupted", "failed", "blocked",
                                  "to"]
    rows = {line.split()[0]: line.split() for line in lines[lines.index(header) + 1:] if line.strip()
            and line.split()[0] in ("shards", "teacher", "distill", "reference", "student", "report")
            and line.split()[1].isdigit()}
    assert rows["distill"][1:9] == ["8", "2", "2", "0", "1", "2", "0", "1"]
    assert rows["teacher"][1:3] == ["1", "1"]
    assert "linvit: error: out of memory in block 3" in text
    assert f"{named['failed'].key}" in text and "Slurm job 4242" in text
    assert "Time so far: 1 min 14 s in finished jobs" in text  # 30 + 10 + 14 + 20 from the benchmarks
    # The students behind the two failed distillations: four, said in one line (each with --all).
    assert (f"\n  4 blocked: waits for distill {named['failed'].key}; waits for distill {named['timeout'].key} "
            "(each: --all)\n") in text
    every = render(collect(CONFIG, root), "smoke.yaml", every=True)
    assert re.search(rf"^  blocked +{named['failed'].cell.dataset}/\S+/maps/steps3/seed0 +- +waits for distill ",
                     every, re.M)
    assert every.count("\n  to run ") == 39 and every.count("\n  finished ") == 6
    # A failed teacher: everything after it waits, said in one line per rule (each job with --all).
    teacher = jobs["teacher micro/seed0"]
    for out in teacher.outputs:
        (root / out).unlink()
    write(root / teacher.log, "linvit: error: teacher micro: diverged: loss became nan at step 3\n")
    text = render(collect(CONFIG, root), "smoke.yaml")
    assert re.search(r"^  failed +micro/seed0 +- +linvit: error: teacher micro: diverged", text, re.M)
    assert "\n  39 blocked: waits for teacher micro/seed0" in text  # the 40th student is in Slurm's queue
    assert "evaluate" not in text  # the training jobs evaluate their models: no evaluation jobs wait


def test_snakemake_s_markers_are_read_back_whatever_their_length():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        long = "results/students/" + "/".join(["x" * 40] * 6) + "/metrics.json"
        mark(Path(tmp), long, jobid="7", max_len=30)
        mark(Path(tmp), "results/data/synthetic")
        found = incomplete_markers(Path(tmp))
        assert set(found) == {long, "results/data/synthetic"}
        assert found[long][0] == "7" and found["results/data/synthetic"][0] is None


def test_the_command_is_torch_and_pandas_free_and_says_a_bad_config_in_one_line(tmp_path):
    out = run([sys.executable, "-X", "importtime", "-m", "linvit.cli", "status", "--configfile", str(SMOKE)],
              cwd=tmp_path)
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "timm", "matplotlib", "seaborn", "pandas"}
    assert "56 jobs, 0 finished" in out.stdout and "56 to run" in out.stdout
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**CONFIG, "variants": ["nope"]}))
    bad = run(["linvit", "status", "--configfile", "bad.yaml"], cwd=tmp_path, check=False)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("linvit: error: config key variants: unknown")
    # The old spelling: --config now takes Snakemake's KEY=VALUE overrides.
    old = run(["linvit", "status", "--config", str(SMOKE)], cwd=tmp_path, check=False)
    assert old.returncode == 1 and old.stderr.strip() == (
        f"linvit: error: --config {SMOKE}: not KEY=VALUE (overrides, as Snakemake's --config takes them); "
        f"a config file is --configfile {SMOKE}")


def test_durations_read_as_a_person_would():
    assert [duration(s) for s in (4.4, 65, 3600 * 2 + 7 * 60, 86400 * 3 + 3600 * 4)] == [
        "4 s", "1 min 05 s", "2 h 07 min", "3 d 4 h"]
    assert duration(float("nan")) == "-"


SMALL = {**CONFIG, "targets": ["synthetic"], "inits": ["random", "copy_mlp_distill"], "distills": ["outputs"],
         "budgets": [3]}


def test_upstream_comes_before_a_job_s_own_log(tmp_path):
    """A job whose upstream lost outputs it made is blocked, not failed for an old log of its own; the job that
    lost them is to run (its log names no error: the next snakemake makes them again)."""
    jobs = {job.name: job for job in grid.jobs(SMALL)}
    for job in jobs.values():
        finish(tmp_path, job, 5 if job.benchmark else None)
        write(tmp_path / job.log, "done\n")
    random = next(j for j in jobs.values() if j.rule == "student" and j.cell.init == "random")
    distill = next(j for j in jobs.values() if j.rule == "distill")
    student = next(j for j in jobs.values() if j.rule == "student" and j.cell.distills)
    (tmp_path / random.outputs[-1]).unlink()  # eval.json, deleted after the grid finished
    (tmp_path / f"{distill.folder}/model.safetensors").unlink()
    for out in student.outputs:  # an old failure of the student, before its distillation went
        (tmp_path / out).unlink()
    write(tmp_path / student.log, "linvit: error: out of memory\n")
    status = {s.job.name: s for s in collect(SMALL, tmp_path).jobs}
    assert (status[random.name].state, status[random.name].detail) == (
        "to run", "lost eval.json (its log names no error): the next snakemake makes them again")
    assert status[distill.name].state == "to run" and status[distill.name].detail.startswith("lost model.safetensors")
    assert (status[student.name].state, status[student.name].detail) == (
        "blocked", f"waits for {distill.name} (lost model.safetensors)")
    assert status["report all"].state == "blocked"
    assert status["report all"].detail.startswith(f"waits for {distill.name} (lost model.safetensors), ")


def test_estimates_follow_the_job_s_kind_and_scale_across_sizes(tmp_path):
    """Per rule, size and cell (init strategy ...): a student of a size none finished is estimated from
    another size's of its kind times the runtime factors (linvit.sizes.SIZE_SCALE, or resources.scale);
    GPU-hours from each job's gpu resource (the config's, or the run's --set-resources)."""
    config = {**SMALL, "sizes": ["micro", "mini"], "seeds": [0, 1], "resources": {"student": {"gpu": 1}}}
    jobs = [j for j in grid.jobs(config) if j.rule == "student"]
    for job in grid.jobs(config):
        if job.rule not in ("student", "reference", "report"):
            finish(tmp_path, job)
    kind = lambda size, init, seed: next(j for j in jobs if (j.cell.size, j.cell.init, j.cell.seed) == (  # noqa: E731
        size, init, seed))
    finish(tmp_path, kind("micro", "random", 0), 3600)
    finish(tmp_path, kind("micro", "copy_mlp_distill", 0), 7200)
    status = {s.job.name: s for s in collect(config, tmp_path).jobs}
    assert status[kind("micro", "random", 1).name].remaining == 3600  # its kind, its size
    assert not status[kind("micro", "random", 1).name].scaled
    assert status[kind("mini", "random", 0).name].remaining == 3600 * 4  # micro's, times mini's factor 4 over 1
    assert status[kind("mini", "random", 0).name].scaled
    assert status[kind("mini", "copy_mlp_distill", 1).name].remaining == 7200 * 4  # its own kind's, not random's
    text = render(collect(config, tmp_path))
    assert "GPU-hours (wall-clock x each job's gpu resource): 3.0 in finished jobs, about 27.0 to come" in text
    assert "(4 from finished jobs of another size, by the size factors; 5 not estimated" in text
    # The config's own factors (resources.scale); the run's --set-resources student:gpu=2.
    config["resources"]["scale"] = {"mini": {"runtime": 2}}
    status = {s.job.name: s for s in collect(config, tmp_path).jobs}
    assert status[kind("mini", "random", 0).name].remaining == 3600 * 2
    text = render(collect(config, tmp_path, record={"set_resources": {"student": {"gpu": 2}}}))
    assert "GPU-hours (wall-clock x each job's gpu resource): 6.0 in finished jobs" in text
    # A size finished: its own jobs, no longer scaled.
    finish(tmp_path, kind("mini", "random", 0), 1000)
    status = {s.job.name: s for s in collect(config, tmp_path).jobs}
    assert status[kind("mini", "random", 1).name].remaining == 1000 and not status[kind("mini", "random", 1).name].scaled


def test_status_reads_the_config_the_run_recorded(tmp_path):
    """Snakemake with two config files and a --config override (run as far as its first job, the shards, so
    that onstart fires): `linvit status` with no config reads the merged config from the run's record."""
    (tmp_path / "extra.yaml").write_text("targets: [synthetic]\ndistills: [outputs]\n")
    run(["snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1", "--configfile", str(SMOKE), "extra.yaml",
         "--config", "inits=[random,copy_all]", "--until", "shards"], cwd=tmp_path)
    from linvit.runrecord import read_record

    record = read_record(tmp_path)
    assert record["executor"] == "local" and record["overrides"] == {"inits": ["random", "copy_all"]}
    assert record["configfiles"] == [str(SMOKE), str(tmp_path / "extra.yaml")]
    merged = {**CONFIG, "targets": ["synthetic"], "distills": ["outputs"], "inits": ["random", "copy_all"]}
    assert record["config"]["inits"] == merged["inits"] and record["config"]["targets"] == ["synthetic"]
    out = run(["linvit", "status"], cwd=tmp_path).stdout
    count = len(grid.jobs(merged))
    assert count != len(grid.jobs(CONFIG))
    assert out.splitlines()[0].startswith(f'Grid smoke.yaml + extra.yaml + inits=["random", "copy_all"] (as its run '
                                          f"recorded) in {tmp_path}: {count} jobs, 1 finished, ")
    assert "Snakemake: not running; the last run started " in out and f"(process {record['pid']}, executor local)" in out
    # The same grid given by hand, as Snakemake merges it: one file over the other, then the override.
    by_hand = run(["linvit", "status", "--configfile", str(SMOKE), "extra.yaml", "--config", "inits=[random,copy_all]"],
                  cwd=tmp_path).stdout
    assert f": {count} jobs, 1 finished, " in by_hand.splitlines()[0]


def test_no_unlock_advice_while_the_run_may_live(tmp_path, monkeypatch):
    """Snakemake's locks left and no Snakemake on this machine: `--unlock` is advised only when no Slurm job of
    the run is alive and the run was started here; otherwise status says what it saw and what to check."""
    job = next(j for j in grid.jobs(SMALL) if j.rule == "teacher")
    (tmp_path / ".snakemake/locks").mkdir(parents=True)
    (tmp_path / ".snakemake/locks/0.input.lock").write_text("")
    for out in job.outputs:
        mark(tmp_path, out)
    bin_dir = tmp_path / "bin"
    write(bin_dir / "squeue", "#!/bin/sh\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    here = {"host": socket.gethostname(), "pid": 1, "started": time.time() - 60, "executor": "slurm"}
    text = render(collect(SMALL, tmp_path, record=here))
    assert "`snakemake --unlock` before the next run" in text  # the control: nothing can be running
    # Started on another login node: this machine cannot see it. Its marked job may run there.
    elsewhere = render(collect(SMALL, tmp_path, record={**here, "host": "login2"}))
    assert "--unlock` before" not in elsewhere
    assert "cannot see login2's processes: check there (ssh login2 ps -p 1)" in elsewhere
    assert "do not `snakemake --unlock` while it may run" in elsewhere
    assert re.search(r"^  running +micro/seed0 .* its Slurm job ended; Snakemake, on login2, collects it if it runs$",
                     elsewhere, re.M)  # squeue lists no job of it (its mark holds no Slurm id)
    local = render(collect(SMALL, tmp_path, record={**here, "host": "login2", "executor": "local"}))
    assert re.search(r"^  running +micro/seed0 .* started by Snakemake on login2, whose processes this machine cannot see$",
                     local, re.M)
    # A Slurm job of the run (its working directory is this folder) still alive: no unlock.
    write(bin_dir / "squeue", f"#!/bin/sh\necho '31|RUNNING|None|N/A|N/A|node1|{tmp_path}'\n")
    alive = render(collect(SMALL, tmp_path, record=here))
    assert "--unlock` before" not in alive and "Do not `snakemake --unlock` while they run" in alive
    assert "1 of its Slurm jobs alive (squeue: 31)" in alive
    # Snakemake inside a Slurm head job (the record names it): running, and its jobs with it.
    write(bin_dir / "squeue", f"#!/bin/sh\necho '31|RUNNING|None|N/A|N/A|node1|{tmp_path}'\n")
    head = collect(SMALL, tmp_path, record={**here, "host": "node1", "slurm_head_job": "31"})
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(here["started"]))
    assert head.snakemake.running and render(head).splitlines()[1] == (
        f"Snakemake: running in Slurm job 31 (running on node1); the last run started {started} on node1 "
        "(process 1, executor slurm)")
    assert next(s for s in head.jobs if s.job.name == job.name).state == "running"


def test_the_status_benchmark_times_status_on_a_generated_tree():
    """`linvit bench status`'s tree and timing, on the smoke grid (the paper grid's 4,004 jobs are the
    benchmark's own; docs/benchmarks.md): the tree's jobs read back in the states it made them."""
    from linvit.bench import bench_status

    rows = {r["metric"]: r for r in bench_status(SMOKE, repeats=1)}
    assert rows["jobs"]["value"] == len(grid.jobs(CONFIG))
    assert 0 < rows["seconds"]["value"] < 60 and rows["seconds"]["target"] == "<= 5"
    students = sum(j.rule == "student" for j in grid.jobs(CONFIG))
    assert rows["finished_jobs"]["value"] == len(grid.jobs(CONFIG)) - students - 1 + int(students * 0.6)


def test_slurm_s_accounting_is_read_where_the_cluster_keeps_it(tmp_path, monkeypatch):
    # The test cluster keeps no accounting, so sacct's path is read here from its parsable output (-P) as
    # a cluster with accounting prints it; scontrol (which fails here) is not needed then.
    from linvit.status_slurm import ended

    bin_dir = tmp_path / "bin"
    write(bin_dir / "sacct", "#!/bin/sh\n"
                             "echo '700|TIMEOUT|None|2026-12-06T10:00:00|2026-12-06T10:05:00|2026-12-06T11:05:00|node3|/w'\n"
                             "echo '701|CANCELLED by 0|None|2026-12-06T10:00:00|2026-12-06T10:06:00|"
                             "2026-12-06T10:07:00|node4|/w'\n")
    write(bin_dir / "scontrol", "#!/bin/sh\nexit 1\n")
    for name in ("sacct", "scontrol"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    found = ended({"700", "701", "702"})
    assert set(found) == {"700", "701"}
    assert (found["700"].state, found["700"].node, found["700"].workdir) == ("TIMEOUT", "node3", "/w")
    assert found["700"].queue_wait == 300 and found["700"].ended - found["700"].started == 3600
    assert found["701"].state == "CANCELLED"  # sacct's "CANCELLED by <uid>"


def test_config_files_merge_key_by_key_as_snakemake_merges_them():
    # A second --configfile (or --config override) replaces only the keys it names, nested ones too, as
    # snakemake.utils.update_config does; the decide driver merges its files the same way.
    from snakemake.utils import update_config

    from linvit.runrecord import merge_config

    base = {"teacher": {"train": {"steps": 10, "lr": 1e-3}, "dataset": "a"}, "seeds": [0, 1]}
    over = {"teacher": {"train": {"steps": 20}}, "seeds": [2]}
    expected = json.loads(json.dumps(base))
    update_config(expected, over)  # in place
    ours = merge_config(json.loads(json.dumps(base)), over)
    assert ours == expected == {"teacher": {"train": {"steps": 20, "lr": 1e-3}, "dataset": "a"}, "seeds": [2]}
