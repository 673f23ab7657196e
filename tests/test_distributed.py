"""Data parallelism with torchrun, on the CPU (gloo): two processes are one process, split in two.

Each test launches the real `linvit` command under `torchrun --standalone --nproc-per-node 2`, as a
rule with `gpu: 2` does (on GPUs the same code uses NCCL).
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from conftest import BIN, REPO, run

STEPS, BATCH, TRAIN = 24, 16, 192   # 12 steps per epoch: the run crosses an epoch
# The loss of each logged step of 2 x B/2 against 1 x B. The two differ only in the order floats are
# summed (measured: at most 1.2e-7 over 20 steps); 1e-4 leaves room, and a wrong split or an
# unaveraged gradient is off by 1e-2 or more from the first steps.
LOSS_TOLERANCE = 1e-4

CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"], "inits": ["random"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": TRAIN,
                               "test_samples": 50}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic",
                "train": {"steps": STEPS, "batch_size": BATCH, "lr": 2e-3, "warmup_steps": 4,
                          "label_smoothing": 0.1, "eval_every": 8, "checkpoint_every": 4, "log_every": 1}},
    "student": {"train": {"steps": 4, "batch_size": 16, "lr": 1e-3}},
    "distill": {"loss": "mse", "train": {"steps": 6, "batch_size": 16, "lr": 1e-3, "log_every": 1}},
    "init_strategies": {"random": {"copy": [], "distill": False},
                        "copy_mlp_distill": {"copy": ["embed", "mlp", "norm", "head"], "distill": True}},
}


def teacher(tmp, out, nproc=1, config="c.yaml"):
    cmd = ["linvit", "teacher", "--config", str(tmp / config), "--size", "micro", "--seed", "0",
           "--shards", str(tmp / "shards"), "--out", str(out), "--threads", "1"]
    if nproc > 1:
        cmd = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "--no-python", *cmd]
    return cmd


def records(folder, kind="train"):
    return [r for r in map(json.loads, (folder / "train.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    (tmp / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    run(["linvit", "shards", "--config", str(tmp / "c.yaml"), "--dataset", "synthetic",
         "--out", str(tmp / "shards")], cwd=tmp)
    run(teacher(tmp, tmp / "one"), cwd=tmp)
    two = run(teacher(tmp, tmp / "two", nproc=2), cwd=tmp)
    return tmp, two


@pytest.fixture(autouse=True)
def fixed_revision(monkeypatch, tmp_path):
    # The git revision is in a checkpoint's fingerprint: no repository in sight, so it is the same
    # in a killed run and its rerun even if a commit lands in between.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-repository"))


def test_two_processes_follow_the_loss_curve_of_one(setup):
    tmp, _ = setup
    one, two = records(tmp / "one"), records(tmp / "two")
    # Steps per epoch as the arithmetic says: 192 samples / global batch 16 = 12, on both.
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))
    assert [r["epoch"] for r in two] == [(s - 1) // (TRAIN // BATCH) for s in range(1, STEPS + 1)]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= LOSS_TOLERANCE, (a["step"], a["loss"], b["loss"])
    m1, m2 = (json.loads((tmp / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert m2["steps"] == STEPS and m2["epochs"] == STEPS / (TRAIN // BATCH)
    assert m2["images_seen"] == STEPS * BATCH  # the config's batch is the global batch
    # Evaluation counts are summed over the ranks: every one of the 50 test images, once.
    assert m1["samples"] == m2["samples"] == 50
    assert m1["test_acc"] == m2["test_acc"]
    a, b = load_file(tmp / "one" / "model.safetensors"), load_file(tmp / "two" / "model.safetensors")
    assert all((a[k] - b[k]).abs().max() < 1e-4 for k in a)


def test_only_rank_zero_writes_and_speaks(setup):
    tmp, two = setup
    steps = [r["step"] for r in records(tmp / "two")]
    assert len(steps) == len(set(steps))  # one log, each step once
    assert [r["step"] for r in records(tmp / "two", "eval")] == [0, 8, 16, STEPS]
    assert two.stdout.count("test accuracy") == 1
    assert two.stderr.count("data parallel over 2 processes (gloo), 8 samples each of every batch of 16") == 1
    assert two.stderr.count(f"step {STEPS}/{STEPS}") == 1
    assert not (tmp / "two" / "checkpoint").exists()  # dropped by rank 0 once the outputs are written


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its ranks in sessions of their own, so killing
    torchrun's process group would leave them running)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_after(cmd, cwd, out, step):
    """Start `cmd` and SIGKILL it with every process it started (as Slurm kills a job's processes)
    once a checkpoint at or after `step` exists."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest, deadline = out / "checkpoint" / "LATEST", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() >= f"step{step:08d}":
            for pid in [proc.pid, *_descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    time.sleep(0.5)  # the ranks were killed too; nothing may write after this
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize("resume_with", [2, 1])
def test_a_killed_two_process_job_resumes(setup, resume_with):
    # Killed mid-epoch (step 16 of 24, epoch 1), rerun on 2 processes or on 1 (the batches do not
    # depend on the number of processes, so the world size is not part of the fingerprint).
    tmp, _ = setup
    out = tmp / f"killed-{resume_with}"
    _kill_after(teacher(tmp, out, nproc=2), tmp, out, 16)
    resumed = run(teacher(tmp, out, nproc=resume_with), cwd=tmp)
    assert resumed.stderr.count("resuming from step") == 1, resumed.stderr
    whole, again = (json.loads((d / "metrics.json").read_text()) for d in (tmp / "two", out))
    assert again["steps"] == whole["steps"] and again["images_seen"] == whole["images_seen"]
    assert [r["step"] for r in records(out)] == list(range(1, STEPS + 1))
    for a, b in zip(records(tmp / "two"), records(out)):
        assert abs(a["loss"] - b["loss"]) <= LOSS_TOLERANCE, (a["step"], a["loss"], b["loss"])
    a, b = load_file(tmp / "two" / "model.safetensors"), load_file(out / "model.safetensors")
    assert all((a[k] - b[k]).abs().max() < 1e-4 for k in a)


@pytest.mark.parametrize("loss", ["proj_mse", "map_ce"])
def test_distillation_under_two_processes_is_that_of_one(setup, loss):
    # The teacher-forced distillation calls blocks of two models, not one forward: the gradient
    # all-reduce serves it as it serves classification.
    tmp, _ = setup
    config = {**CONFIG, "distill": {**CONFIG["distill"], "loss": loss}}
    (tmp / f"{loss}.yaml").write_text(yaml.safe_dump(config))

    def distill(out, nproc):
        cmd = ["linvit", "distill", "--config", str(tmp / f"{loss}.yaml"), "--dataset", "synthetic",
               "--size", "micro", "--variant", "elu", "--init", "copy_mlp_distill", "--design", loss,
               "--seed", "0", "--teacher", str(tmp / "one"),
               "--shards", str(tmp / "shards"), "--out", str(out), "--threads", "1"]
        return run(["torchrun", "--standalone", f"--nproc-per-node={nproc}", "--no-python", *cmd]
                   if nproc > 1 else cmd, cwd=tmp)

    distill(tmp / f"d1-{loss}", 1)
    distill(tmp / f"d2-{loss}", 2)
    one, two = records(tmp / f"d1-{loss}"), records(tmp / f"d2-{loss}")
    assert [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):  # relative: the mse loss is ~5e-3 (measured: differences ~1e-7 of it)
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
    a = load_file(tmp / f"d1-{loss}" / "model.safetensors")
    b = load_file(tmp / f"d2-{loss}" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-4 for k in a)


def test_a_batch_that_does_not_split_evenly_is_one_line(setup):
    tmp, _ = setup
    odd = {**CONFIG, "teacher": {**CONFIG["teacher"], "train": {**CONFIG["teacher"]["train"], "batch_size": 15}}}
    (tmp / "odd.yaml").write_text(yaml.safe_dump(odd))
    proc = run(teacher(tmp, tmp / "odd", nproc=2, config="odd.yaml"), cwd=tmp, check=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("linvit: error:")]
    assert errors and all(ln == errors[0] for ln in errors)
    assert "batch_size 15 is not divisible by the 2 processes of this job" in errors[0]
    assert not (tmp / "odd" / "metrics.json").exists()


def test_a_rule_with_two_gpus_runs_under_torchrun(tmp_path):
    # `gpu: 2` in a rule's resources: torchrun starts 2 processes of the same command, each with
    # its share of the job's threads; with 0 or 1 GPU the command runs alone.
    cmd = ["snakemake", "-n", "-p", "--cores", "8", "--configfile", "workflow/config/smoke.yaml",
           "--set-resources", "student:gpu=2", "student:threads=4", "--set-threads", "student=4",
           "--directory", str(tmp_path), "--snakefile", str(REPO / "Snakefile")]
    out = run(cmd, cwd=REPO).stdout
    student = [ln for ln in out.splitlines() if " linvit student " in ln and "--init random" in ln]
    teacher_ = [ln for ln in out.splitlines() if " linvit teacher " in ln]
    assert student and all("torchrun --standalone --nproc-per-node 2 --no-python linvit student" in ln
                           and "--threads 2 " in ln for ln in student)
    assert teacher_ and all("torchrun" not in ln for ln in teacher_)


def test_a_rule_with_two_gpus_trains_under_torchrun(tmp_path):
    # The same, run: on this CPU-only machine the 2 processes use gloo, which is enough to show
    # the rule's command, the ranks' split and rank 0's outputs work through Snakemake.
    cmd = ["snakemake", "--cores", "2", "--configfile", str(REPO / "workflow/config/smoke.yaml"),
           "--set-resources", "teacher:gpu=2", "--directory", str(tmp_path),
           "--snakefile", str(REPO / "Snakefile"), "results/teacher/micro/metrics.json"]
    run(cmd, cwd=REPO)
    log = (tmp_path / "results/logs/teacher/micro.log").read_text()
    assert "teacher micro: data parallel over 2 processes (gloo), 16 samples each of every batch of 32" in log
    assert log.count("teacher micro: step 12/12") == 1 and log.count("test accuracy") == 1
    steps = [r["step"] for r in records(tmp_path / "results/teacher/micro")]
    assert steps == sorted(set(steps)) and steps[-1] == 12
    metrics = json.loads((tmp_path / "results/teacher/micro/metrics.json").read_text())
    assert metrics["steps"] == 12 and metrics["images_seen"] == 12 * 32
