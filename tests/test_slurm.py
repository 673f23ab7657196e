"""The Slurm profile (`snakemake --profile slurm`): how it resolves from the project root, what a dry
run submits, the one-line error without an account, and the smoke grid run look by look by `linvit decide`
through a real single-node Slurm cluster started here (munged, slurmctld, slurmd).

The cluster needs root and the Debian packages slurmctld, slurmd, slurm-client and munge (installed
with apt-get when missing; .ci/run installs them up front). Without them the cluster test is skipped,
saying why; under CI (CI=true) it fails instead. It writes /etc/slurm/slurm.conf (the job step's
nested `srun` reads only that file: the Slurm executor plugin drops SLURM_CONF from the job's
environment) and puts back whatever was there; everything else lives in a temporary folder, and it
stops only the daemons it started.
"""

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from linvit import grid
from linvit.config import validate

from conftest import BIN, REPO, patient, run
from test_workflow import expected_jobs, job_counts

SNAKEFILE = str(REPO / "Snakefile")
SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
COMMANDS = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged"]
LOCAL_RULES = {"all", "report", "report_from_results"}
NO_ACCOUNTING = {"LINVIT_SLURM_ACCOUNT": "none", "LINVIT_SLURM_PARTITION": "default"}
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
# The node's GPUs: a `gpu` GRES whose "devices" are plain files (no GPU, no driver), so a job's GPU
# request is granted and shows in its allocation on a machine without a GPU. slurmd reads gres.conf
# beside slurm.conf.
GRES_CONF = SYSTEM_CONF.with_name("gres.conf")
GPUS = 2


def profile_env(**values):
    """This environment without LINVIT_SLURM_*, plus `values`; linvit and snakemake on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINVIT_SLURM_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **values}


def test_profile_resolves_from_the_project_root():
    """`--profile slurm` from the project root finds ./slurm, a link to workflow/profiles/slurm."""
    link = REPO / "slurm"
    assert link.is_symlink() and os.readlink(link) == "workflow/profiles/slurm"
    assert (link / "config.yaml").resolve() == REPO / "workflow/profiles/slurm/config.yaml"


def test_dry_run_shows_each_rules_sbatch_resources(tmp_path):
    """The default grid through the profile, as a dry run (from the project root, as the README says):
    every non-local job with its threads, mem_mb, runtime and gpu; nothing submitted."""
    proc = subprocess.run(["snakemake", "--profile", "slurm", "-n", "--directory", str(tmp_path)],
                          cwd=REPO, env=profile_env(**NO_ACCOUNTING),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Using profile slurm" in out + proc.stderr
    resources = {}
    for block in re.split(r"^\[.*\d{4}\]$", out, flags=re.M):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        res = re.search(r"^\s*resources: (.+)$", block, re.M)
        if rule and res:
            resources.setdefault(rule.group(1), dict(kv.split("=", 1) for kv in res.group(1).split(", ")))
    # default.yaml's resources (micro, first attempt); the teacher also gets its 2 threads.
    assert resources["teacher"]["mem_mb"] == "3000" and resources["teacher"]["runtime"] == "30"
    assert resources["student"]["mem_mb"] == "2000" and resources["student"]["gpu"] == "0"
    assert re.search(r"rule teacher:(?:\n    .*)*\n    threads: 2", out)
    assert "slurm_account" not in out  # `none`: no -A
    assert not (tmp_path / "results").exists()


def test_without_account_the_profile_says_what_to_set(tmp_path):
    proc = subprocess.run(["snakemake", "--profile", "slurm", "-n", "--directory", str(tmp_path)],
                          cwd=REPO, env=profile_env(),
                          capture_output=True, text=True)
    assert proc.returncode != 0
    text = (proc.stdout + proc.stderr).strip()
    assert text.splitlines()[-1] == ("Error: linvit's Slurm profile needs LINVIT_SLURM_ACCOUNT: export "
                                     "LINVIT_SLURM_ACCOUNT=<your Slurm account> (`none` on a cluster without accounting)")
    assert len(text.splitlines()) <= 2, text  # no argparse usage dump


def test_resources_scale_with_size_and_attempt(tmp_path):
    """A larger model asks for more; a retried job (attempt 2) for twice the memory and runtime."""
    config = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
    config["sizes"] = ["mini"]
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(config))
    out = run(["snakemake", "-s", SNAKEFILE, "--directory", str(tmp_path), "-n", "--cores", "64",
               "--configfile", str(tmp_path / "mini.yaml")], cwd=tmp_path).stdout
    block = next(b for b in re.split(r"^\[.*\d{4}\]$", out, flags=re.M) if re.search(r"^rule teacher:", b, re.M))
    assert "threads: 4" in block and "mem_mb=4500" in block and "runtime=120" in block, block
    text = (REPO / "workflow/rules/common.smk").read_text()
    assert 'GROWS_WITH_ATTEMPT = ("mem_mb", "runtime")' in text


def _missing():
    return [c for c in COMMANDS if not shutil.which(c) and not Path("/usr/sbin", c).exists()]


def _unavailable() -> str | None:
    """Why no cluster can be started here (None: it can)."""
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd/munged needs root"
    if _missing():
        if not shutil.which("apt-get"):
            return f"{', '.join(_missing())} missing and no apt-get to install {' '.join(PACKAGES)}"
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        proc = subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], capture_output=True, text=True,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if proc.returncode != 0 or _missing():
            return f"apt-get install {' '.join(PACKAGES)} failed: {proc.stderr.strip()[-300:]}"
    if not Path("/etc/munge/munge.key").exists():
        return "no /etc/munge/munge.key (the munge package creates it)"
    running = subprocess.run(["pgrep", "-x", "slurmctld|slurmd"], capture_output=True, text=True).stdout.split()
    if running:
        return f"a Slurm daemon already runs here (pids {' '.join(running)}); not touching it"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(pidfile: Path):
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm_cluster():
    why = _unavailable()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the Slurm test, but: {why}")
        print(f"skipping the Slurm cluster test: {why}")
        pytest.skip(why)
    tmp = Path(tempfile.mkdtemp(prefix="linvit-slurm-"))
    tmp.chmod(0o755)
    munge_dir = tmp / "munge"
    munge_dir.mkdir(mode=0o755)
    shutil.chown(munge_dir, "munge", "munge")
    host = socket.gethostname().split(".")[0]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    conf = f"""ClusterName=linvit
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_dir}/munge.socket
CredType=cred/munge
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=86400
ReturnToService=2
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={max(1024, mem - 512)} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    backup, gres_backup = tmp / "slurm.conf.orig", tmp / "gres.conf.orig"
    had_conf, had_gres = SYSTEM_CONF.exists(), GRES_CONF.exists()
    if had_conf:
        shutil.copy2(SYSTEM_CONF, backup)
    if had_gres:
        shutil.copy2(GRES_CONF, gres_backup)
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    pidfiles = [tmp / "slurmd.pid", tmp / "slurmctld.pid", munge_dir / "munged.pid"]
    try:
        SYSTEM_CONF.write_text(conf)
        # Slurm 22.05's gres/gpu counts the node's GPUs from File=, not from Count= alone (a Count-only
        # line registers 0 and the node goes INVAL): plain files stand in for the device files.
        for i in range(GPUS):
            (tmp / f"gpu{i}").touch()
        GRES_CONF.write_text(f"NodeName={host} Name=gpu File={tmp}/gpu[0-{GPUS - 1}]\n")
        for d in ("state", "spool"):
            (tmp / d).mkdir()
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={munge_dir}/munge.socket",
                        f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
                        f"--seed-file={munge_dir}/munged.seed"], check=True)
        subprocess.run(["/usr/sbin/slurmctld"], check=True)
        subprocess.run(["/usr/sbin/slurmd"], check=True)
        for _ in range(round(patient(60))):  # half-seconds
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "".join(p.read_text()[-1500:] for p in (tmp / "slurmctld.log", tmp / "slurmd.log") if p.exists())
            pytest.fail(f"the Slurm node never became idle (sinfo: {state!r}):\n{logs}")
        yield tmp
    finally:
        subprocess.run(["scancel", "--user", "root"], capture_output=True)
        for pidfile in pidfiles:
            _stop(pidfile)
        if had_conf:
            shutil.copy2(backup, SYSTEM_CONF)
        else:
            SYSTEM_CONF.unlink(missing_ok=True)
        if had_gres:
            shutil.copy2(gres_backup, GRES_CONF)
        else:
            GRES_CONF.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _submitted(out: str) -> list[tuple[str, str, str, Path]]:
    """(Slurm job id, rule, the job's own log, its Slurm log) of each job Snakemake submitted in `out`: the
    plugin's line names Snakemake's job id, whose block (`rule X:` ... `log:` ... `jobid: N`) names the log."""
    logs = {}
    for block in re.split(r"^\[.*\d{4}\]$", out, flags=re.M):
        rule, log = re.search(r"^rule (\w+):", block, re.M), re.search(r"^\s+log: (\S+)$", block, re.M)
        jobid = re.search(r"^\s+jobid: (\d+)$", block, re.M)
        if rule and jobid:  # not a localrule's
            logs[jobid.group(1)] = (rule.group(1), log.group(1) if log else None)
    found = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S*/slurm_logs/rule_(\w+)/\S*)\)",
                       out)
    assert all(job in logs and logs[job][0] == rule for job, _, _, rule in found), out[-3000:]
    return [(slurm, rule, logs[job][1], Path(path)) for job, slurm, path, rule in found]


@pytest.mark.slurm
def test_decide_runs_the_smoke_grid_through_sbatch(slurm_cluster, tmp_path):
    """`linvit decide --profile slurm` on the smoke grid's settings (one target, five inits: every non-local
    rule: shards, teacher, distill, reference, student, each training job evaluating its model), two looks
    at 2 and 3 seeds: look 1 submits the grid, look 2 only the runs of seed 2 that the undecided tests' roles
    (results/decide/state.json's `added`) and their teacher need, each with sbatch. The students ask for a GPU
    (`--set-resources student:gpu=1`, as paper.yaml's do): the plugin submits `--gpus=1`, the cluster's `gpu`
    GRES (plain files for devices) grants it and `scontrol -d show job` shows it in the job's allocation; the
    jobs that do not ask get none. (No device: the job still trains on the CPU.)"""
    # C1's roles (copy_mlp, attn_only): its tests stay undecided at 2 seeds. So does C3's: at these few steps
    # every model predicts one class, so its contrast has no variance, which is no test (the softmax reference
    # then gets seed 2 too, though `variants` lists no softmax control).
    inits = ["random", "copy_all", "copy_mlp", "attn_only", "copy_mlp_distill"]
    config = dict(SMOKE, targets=["synthetic"], inits=inits, seeds=[0, 1], claims={"min_seeds": 2},
                  sequential={"looks": [2, 3]})
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    os.symlink(REPO / "slurm", tmp_path / "slurm")  # the repository's link, as at the project root
    # Unbuffered: the driver's "decide: look 2" line comes before look 2's Snakemake output.
    env = profile_env(**NO_ACCOUNTING, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    with open(tmp_path / "decide.out", "w") as sink:  # a file: an unread pipe would stall the driver
        proc = subprocess.Popen(["linvit", "decide", "--profile", "slurm", "-s", SNAKEFILE, "--configfile", "grid.yaml",
                                 "--slurm-init-seconds-before-status-checks", "2", "--retries", "0",
                                 "--set-resources", "student:gpu=1"],
                                cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=patient(900))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the driver and its Snakemake, which cancels its jobs
            proc.wait(timeout=patient(120))
    out = (tmp_path / "decide.out").read_text()
    logs = sorted((tmp_path / "results/logs").rglob("*.log")) if (tmp_path / "results/logs").exists() else []
    assert proc.returncode == 0, out[-4000:] + "".join(p.read_text()[-800:] for p in logs[:3])
    state = json.loads((tmp_path / "results/decide/state.json").read_text())
    assert [look["look"] for look in state["looks"]] == [1, 2] and state["next"] is None, out[-3000:]
    added = state["looks"][1]["added"]
    assert added and all(a["seeds"] == [2] for a in added), added
    finished = [time.mktime(time.strptime(look["finished"], "%Y-%m-%d %H:%M:%S")) for look in state["looks"]]
    print(f"decide on the smoke grid through Slurm: {time.monotonic() - started:.0f} s "
          f"(look 2: {finished[1] - finished[0]:.0f} s)")
    assert out.count("decide: look 2 of 2") == 1
    looks = out.split("decide: look 2 of 2")
    # Look 1: the whole grid at 2 seeds. Look 2: the jobs of its added runs alone (seed 2's teacher among them).
    base = validate(copy.deepcopy(config))
    before = {j.name: j for j in grid.jobs(base)}
    extra = [j for j in grid.jobs({**base, "added_seeds": added}) if j.name not in before]
    assert {j.rule for j in extra} >= {"teacher", "student"} and all(j.key.endswith("seed2") for j in extra), extra
    expected = [{rule: n for rule, n in expected_jobs(config).items() if rule not in LOCAL_RULES},
                {rule: sum(j.rule == rule for j in extra) for rule in {j.rule for j in extra}}]
    submitted = [_submitted(text) for text in looks]
    for look, (jobs, want, text) in enumerate(zip(submitted, expected, looks), 1):
        by_rule = {}
        for _, rule, _, _ in jobs:
            by_rule[rule] = by_rule.get(rule, 0) + 1
        assert by_rule == want, (look, text[-3000:])
        assert {r for r, n in job_counts(text).items()} - {"total"} == set(want) | {"report", "all"}, look
    # Look 2's jobs, each through sbatch (its Slurm log kept), are exactly the added runs' and their teacher's.
    assert {log for _, _, log, _ in submitted[1]} == {j.log for j in extra}, submitted[1]
    assert all(path.is_file() and path.name == f"{slurm}.log" for slurm, _, _, path in submitted[1])
    # Nothing ran at seed 2 for a role look 2 did not add.
    runs = {str(p.parent.relative_to(tmp_path)) for p in (tmp_path / "results/students").rglob("seed2/eval.json")}
    assert runs == {str(j.cell.run_dir()) for j in extra if j.rule in ("student", "reference")}, runs
    for jobid, rule, _, _ in submitted[0] + submitted[1]:
        show = subprocess.run(["scontrol", "-d", "show", "job", jobid], capture_output=True, text=True).stdout
        assert "JobState=COMPLETED" in show, show
        assert f"Comment=rule_{rule}" in show, show
        # Asked for (TresPerJob, from the plugin's --gpus=1) and granted (`scontrol -d`'s JOB_GRES, what
        # the job was allocated; its TRES would count gres/gpu only with slurmdbd's
        # AccountingStorageTRES): a student one GPU, every other job none (JOB_GRES=(null)).
        asked = re.search(r"TresPerJob=gres:gpu:(\d+)", show)
        granted = re.search(r"JOB_GRES=gpu(?::[A-Za-z]\w*)*:(\d+)", show)
        gpus = 1 if rule == "student" else 0
        assert (int(asked.group(1)) if asked else 0) == gpus and (int(granted.group(1)) if granted else 0) == gpus, show
    # The report ran here (at each look); the shards were a Slurm job.
    assert not ({r for _, r, _, _ in submitted[0] + submitted[1]} & LOCAL_RULES)
    readme = (tmp_path / "report/README.md").read_text()
    assert "C1" in readme and "C3" in readme


@pytest.mark.slurm
def test_a_job_slurm_kills_is_resubmitted_and_resumes(slurm_cluster, tmp_path):
    """scancel a training job once it has checkpointed: Snakemake resubmits it (attempt 2, with twice
    the memory and runtime) and the training resumes from its checkpoint/, which Snakemake left."""
    config = dict(SMOKE, targets=["synthetic"], inits=["random"])
    config["teacher"] = dict(SMOKE["teacher"], train=dict(SMOKE["teacher"]["train"], steps=300,
                                                          checkpoint_every=20, eval_every=0))
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    os.symlink(REPO / "slurm", tmp_path / "slurm")
    teacher = tmp_path / "results/teacher/micro/seed0"  # seed 0's own teacher (teacher.seed: per_seed)
    with open(tmp_path / "snakemake.out", "w") as sink:
        proc = subprocess.Popen(["snakemake", "--profile", "slurm", "-s", SNAKEFILE, "--configfile", "grid.yaml",
                                 "--slurm-init-seconds-before-status-checks", "2", "--retries", "1",
                                 "results/teacher/micro/seed0/model.json"],
                                cwd=tmp_path, env=profile_env(**NO_ACCOUNTING), stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + patient(120)
            # LATEST points at a complete checkpoint (linvit.checkpoints.Checkpoints writes it last).
            while not (teacher / "checkpoint/LATEST").exists() and time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "snakemake.out").read_text()[-3000:]
                time.sleep(0.5)
            running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"],
                                     capture_output=True, text=True).stdout.split("\n")
            killed = [line.split()[0] for line in running if "rule_teacher" in line]
            assert len(killed) == 1, (running, (tmp_path / "snakemake.out").read_text()[-3000:])
            subprocess.run(["scancel", killed[0]], check=True)
            proc.wait(timeout=patient(240))
        finally:
            if proc.poll() is None:
                proc.kill()
    out = (tmp_path / "snakemake.out").read_text()
    assert proc.returncode == 0, out[-4000:]
    show = subprocess.run(["scontrol", "show", "job", killed[0]], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in show, show
    jobs = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_teacher/", out)
    assert len(jobs) == 2 and jobs[0] == killed[0], out[-3000:]
    assert re.search(r"mem_mb=8000\b.*runtime=120\b|runtime=120\b.*mem_mb=8000\b", out), out[-3000:]  # attempt 2
    log = (tmp_path / "results/logs/teacher/micro/seed0.log").read_text()
    resumed = re.search(r"^teacher micro\S*: resuming from step (\d+)$", log, re.M)
    assert resumed, log[:3000]
    step = int(resumed.group(1))
    assert 0 < step < 300, log  # a checkpoint every 20 steps and at each epoch's end (6 steps)
    assert "step 300/300" in log
    assert (teacher / "model.safetensors").exists()


@pytest.mark.slurm
def test_ranks_srun_starts_are_refused_before_any_work(slurm_cluster, tmp_path):
    """`srun -n 2 linvit teacher ...`, Slurm's own way to start ranks: without torchrun's variables each
    task would train alone as rank 0 into the same --out. Each task refuses in one line (read from the
    variables srun really sets) before reading the shards or writing anything."""
    out = subprocess.run(["srun", "-n", "2", "--chdir", str(tmp_path), str(BIN / "linvit"), "teacher", "--config",
                          str(REPO / "workflow/config/smoke.yaml"), "--size", "micro", "--seed", "0", "--shards",
                          str(tmp_path / "shards"), "--out", str(tmp_path / "out"), "--threads", "1"],
                         capture_output=True, text=True, timeout=patient(300), env=profile_env())
    said = [line for line in out.stderr.splitlines() if line.startswith("linvit: error:")]
    assert out.returncode != 0 and len(said) == 2, out.stderr[-3000:]
    assert said[0] == said[1] == (
        "linvit: error: srun started this command as 2 tasks on 1 node(s) (SLURM_STEP_NUM_TASKS=2, "
        "SLURM_STEP_NUM_NODES=1), which would train apart into the same --out: start one task on one node "
        "(srun -N1 -n1) running torchrun --standalone --nproc-per-node N --no-python linvit ..., as the workflow "
        "does for a rule with gpu: N"), out.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def _kill_processes_in(folder: Path, wait: float = 10.0) -> None:
    """Processes working in `folder`: the head job's Snakemake, which outlives its cancelled job (seen on
    the test cluster: proctrack/linuxproc leaves it, writing into a deleted log), killed once `wait`
    seconds have not ended them, so no run outlives its test."""
    folder = folder.resolve()
    deadline = time.monotonic() + wait
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder:
                    left.append(int(entry.name))
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _status(root: Path) -> str:
    """`linvit status` from a second shell: the project folder's run, as its record says."""
    return run(["linvit", "status", "--directory", str(root)], cwd=REPO).stdout


def _status_when(root: Path, ready, seconds: float, step: float = 2.0) -> str:
    """`linvit status` once `ready(text)` holds (asked every `step` s); '' if it never does within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        text = _status(root)
        if ready(text):
            return text
        if time.monotonic() > deadline:
            return ""
        time.sleep(step)


@pytest.mark.slurm
def test_status_from_a_second_shell_while_snakemake_runs_in_a_head_job(slurm_cluster, tmp_path):
    """Snakemake itself in an sbatch head job (one CPU), the rest of the node taken by another job: the shards
    job waits in the queue, and `linvit status` (the test's own shell) says so: queued, not running, its wait
    apart, Snakemake running in its head job, no `--unlock`. Then the node is freed; the teacher, given a
    one-minute time limit it cannot meet, is ended by Slurm (TIMEOUT) and resubmitted (--retries 1): status
    shows attempt 2 and how attempt 1 ended. That one is cancelled: status shows it failed, with Slurm's
    state, the attempt and its Slurm log, while Snakemake is still in its head job."""
    config = dict(SMOKE, targets=["synthetic"], inits=["random"], budgets=[3],
                  resources={"teacher": {"threads": 1, "runtime": 1}})
    config["teacher"] = dict(SMOKE["teacher"], train=dict(SMOKE["teacher"]["train"], steps=100000,
                                                          checkpoint_every=50, eval_every=0))
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    os.symlink(REPO / "slurm", tmp_path / "slurm")
    env = profile_env(**NO_ACCOUNTING)
    command = (f"snakemake --profile slurm -s {SNAKEFILE} --configfile grid.yaml --retries 1 "
               "--slurm-init-seconds-before-status-checks 2 results/teacher/micro/seed0/model.json")
    sbatch = ["sbatch", "--parsable", "--mem", "1000", "--chdir", str(tmp_path)]
    head = subprocess.run([*sbatch, "-c", "1", "-o", "head.out", "--wrap", command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    blocker = None
    try:
        state = lambda job: subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,  # noqa: E731
                                           text=True).stdout.strip()
        for _ in range(round(patient(60))):  # seconds
            if state(head) == "RUNNING":
                break
            time.sleep(1)
        assert state(head) == "RUNNING", state(head)
        blocker = run([*sbatch, "-c", str(os.cpu_count() - 1), "--wrap", f"sleep {round(patient(600))}"],
                      cwd=tmp_path).stdout.strip()
        out = _status_when(tmp_path, lambda text: ", 1 queued, " in text.splitlines()[0], patient(90))
        assert out, (tmp_path / "head.out").read_text()[-3000:]
        lines = out.splitlines()
        assert ", 0 running, 1 queued, " in lines[0] and "(as its run recorded)" in lines[0]
        assert f"in Slurm job {head} (running on " in lines[1] and lines[1].startswith("Snakemake: running"), out
        queued = r"^  queued +synthetic +- +Slurm job \d+ pending \((?:Resources|Priority)\) for \d+ s"
        assert re.search(queued, out, re.M), out
        assert "Queue: 1 job waiting in Slurm's queue" in out and "Time so far: - in finished jobs" in out
        assert "--unlock" not in out and "interrupted" not in out.split("\n\n")[-1]
        subprocess.run(["scancel", blocker], check=True)
        # The teacher past its limit: Slurm ends it, Snakemake resubmits it.
        retried = re.compile(r"^  (?:running|queued) +micro/seed0 .*attempt 2 \(the last: Slurm job (\d+) TIMEOUT\)", re.M)
        out = _status_when(tmp_path, retried.search, patient(480), 5)  # Slurm checks time limits about every 30-60 s
        assert out, _status(tmp_path) + (tmp_path / "head.out").read_text()[-3000:]
        first = retried.search(out).group(1)
        assert "--unlock" not in out and " 0 interrupted, " in out.splitlines()[0]
        assert (tmp_path / f".snakemake/slurm_logs/rule_teacher/micro_0/{first}.log").is_file()
        second = next(line.split("|")[0] for line in subprocess.run(
            ["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True).stdout.splitlines()
            if line.endswith("|rule_teacher_wildcards_micro_0"))
        subprocess.run(["scancel", second], check=True)
        failed = (f"Slurm job {second} CANCELLED; attempt 2; Slurm log "
                  f"{tmp_path}/.snakemake/slurm_logs/rule_teacher/micro_0/{second}.log")
        out = _status_when(tmp_path, lambda text: failed in text, patient(120))
        assert re.search(rf"^  failed +micro/seed0 +- +{re.escape(failed)}", out, re.M), _status(tmp_path)
    finally:
        subprocess.run(["scancel", head, *([blocker] if blocker else [])], capture_output=True)
        _kill_processes_in(tmp_path)
