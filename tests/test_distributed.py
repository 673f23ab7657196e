"""Data parallelism with torchrun, on the CPU (gloo): two processes are one process, split in two.

The end-to-end tests launch the real `linvit` command under `torchrun --standalone --nproc-per-node 2`,
as a rule with `gpu: 2` does (on GPUs the same code uses NCCL); the others start two gloo ranks of
`linvit.train.fit` with torch.multiprocessing (`linvit.dpcheck`, unused parameters), or play one rank
in process.
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

from conftest import BIN, REPO, patient, run

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
    # Phases: the attention alone (the other groups frozen), then every parameter, of which the
    # teacher-forced block_l2 leaves the embedding, final norm and head without a gradient.
    "distill_designs": {"phased": {"phases": [{"losses": ["map_ce"], "fraction": 0.5},
                                              {"losses": ["block_l2"], "freeze": False}]}},
    "init_strategies": {"random": {"copy": [], "distill": False},
                        "copy_mlp_distill": {"copy": ["embed", "mlp", "norm", "head"], "distill": True},
                        "transfer": {"copy": [], "distill": False,
                                     "train_losses": [{"loss": "map_ce", "weight": 3.0, "forced": False}]}},
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
    # One writer of TensorBoard events, as of the log.
    from test_stages import events

    assert len(list((tmp / "two" / "tb").iterdir())) == 1
    assert [e.step for e in events(tmp / "two").Scalars("train/loss")] == steps


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
    latest, deadline = out / "checkpoint" / "LATEST", time.time() + patient(120)
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


def _parity(tmp, cmd, name):
    """`cmd` run by one process and by two (torchrun): the same steps, losses within 1e-4 relative
    (measured: ~2e-7) and weights within 1e-4 (measured: up to 9e-6, AdamW's normalized steps
    carrying the loss's float rounding into the weights)."""
    run(cmd + ["--out", str(tmp / f"{name}-1")], cwd=tmp)
    run(["torchrun", "--standalone", "--nproc-per-node=2", "--no-python", *cmd, "--out", str(tmp / f"{name}-2")],
        cwd=tmp)
    one, two = records(tmp / f"{name}-1"), records(tmp / f"{name}-2")
    assert [(r.get("phase"), r["step"]) for r in one] == [(r.get("phase"), r["step"]) for r in two]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
    a, b = load_file(tmp / f"{name}-1" / "model.safetensors"), load_file(tmp / f"{name}-2" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-4 for k in a)
    return one


@pytest.mark.parametrize("design", ["map_ce", "phased"])
def test_distillation_under_two_processes_is_that_of_one(setup, design):
    # One module (the student, the teacher's views, the terms) in DDP. map_ce: the attention trains,
    # the copied groups are frozen. phased: a second phase is a second DDP, over every parameter,
    # some of which get no gradient (static_graph finds them; AdamW must skip them as alone).
    tmp, _ = setup
    config = {**CONFIG, "distill": {**CONFIG["distill"], "loss": "map_ce"}}
    (tmp / "distill.yaml").write_text(yaml.safe_dump(config))
    cmd = ["linvit", "distill", "--config", str(tmp / "distill.yaml"), "--dataset", "synthetic", "--size", "micro",
           "--variant", "elu", "--init", "copy_mlp_distill", "--design", design, "--seed", "0",
           "--teacher", str(tmp / "one"), "--shards", str(tmp / "shards"), "--threads", "1"]
    one = _parity(tmp, cmd, f"d-{design}")
    assert [r["step"] for r in one] == (list(range(1, 7)) if design == "map_ce" else [1, 2, 3, 1, 2, 3])


def test_a_student_with_a_loss_against_the_teacher_under_two_processes_is_that_of_one(setup):
    # The student task with an objective (end-to-end map_ce against the frozen teacher) beside its
    # cross-entropy: the teacher is a frozen submodule of the one module DDP wraps.
    tmp, _ = setup
    (tmp / "student.yaml").write_text(yaml.safe_dump(CONFIG))
    cmd = ["linvit", "student", "--config", str(tmp / "student.yaml"), "--dataset", "synthetic", "--size", "micro",
           "--variant", "elu", "--init", "transfer", "--seed", "0", "--teacher", str(tmp / "one"),
           "--shards", str(tmp / "shards"), "--threads", "1"]
    one = _parity(tmp, cmd, "s-transfer")
    assert [r["step"] for r in one] == [4]  # student.train: 4 steps, logged at the last


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
           "--snakefile", str(REPO / "Snakefile"), "results/teacher/micro/seed0/metrics.json"]
    run(cmd, cwd=REPO)
    log = (tmp_path / "results/logs/teacher/micro/seed0.log").read_text()
    assert "teacher micro: data parallel over 2 processes (gloo), 16 samples each of every batch of 32" in log
    assert log.count("teacher micro: step 12/12") == 1 and log.count("test accuracy") == 1
    steps = [r["step"] for r in records(tmp_path / "results/teacher/micro/seed0")]
    assert steps == sorted(set(steps)) and steps[-1] == 12
    metrics = json.loads((tmp_path / "results/teacher/micro/seed0/metrics.json").read_text())
    assert metrics["steps"] == 12 and metrics["images_seen"] == 12 * 32


# ----------------------------------------------------------------------------- streams, process group, buckets

def test_the_data_parallel_check_two_ranks_against_one_process_in_every_precision():
    # Two gloo ranks of the real loop (linvit.train.fit, DDP with several buckets) against one
    # process on the full batch, in fp32, bf16 and fp16 with a GradScaler: every step's gradients
    # and loss within the precision's tolerance (measured here: fp32 1.7e-7, bf16 5.3e-3, fp16 5.2e-4
    # relative), parameters equal to the bit across ranks. With dropout: the ranks' masks differ,
    # rank 0's are those of one process with the per-rank batch.
    from linvit import dpcheck

    result = dpcheck.check("cpu", steps=4, batch=16)
    assert result["backend"] == "gloo"
    assert [p["precision"] for p in result["parity"]] == ["fp32", "bf16", "fp16"]
    for p in result["parity"]:
        assert p["ok"] and p["steps_compared"] == 4 and p["param_max_diff_across_ranks"] == 0.0, p
    assert result["parity"][0]["grad_rel_diff"] < 1e-5, result["parity"][0]
    assert result["params_equal"], result
    assert result["masks_differ"] and 0.3 < result["mask_fraction_differing"] < 0.7, result
    assert result["rank0_masks_are_one_process"], result
    assert result["ok"]


def test_the_data_parallel_check_catches_ranks_that_sum_instead_of_averaging():
    # A sum over the ranks doubles every gradient, which AdamW's normalized step all but hides in the
    # loss and the weights: the check compares the gradients the optimizer sees.
    from linvit import dpcheck

    result = dpcheck.check("cpu", steps=2, batch=8, precisions=("fp32",), fault="sum")
    (p,) = result["parity"]
    assert not p["ok"] and not result["ok"]
    assert abs(p["grad_rel_diff"] - 1.0) < 1e-3, p  # 2g against g
    assert p["param_max_diff_across_ranks"] == 0.0  # the ranks still agree with each other


def test_rank_seeds_keep_rank_zero_and_split_the_others():
    from linvit.distributed import rank_seed

    assert rank_seed(7, 0) == 7  # one process (or rank 0): as before
    seeds = {rank_seed(7, r) for r in range(8)} | {rank_seed(8, r) for r in range(8)}
    assert len(seeds) == 16 and all(0 <= s < 2**63 for s in seeds)
    assert rank_seed(7, 0, step=12) != 7 and rank_seed(7, 1, step=12) != rank_seed(7, 1)


def _cuda_machine(monkeypatch, *, count, local_rank, visible="0"):
    """A process of a 2-rank torchrun job on a machine with `count` GPUs (mocked); joining the group
    records its arguments instead of joining."""
    import torch
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.append(kw))
    return joined


def test_a_rank_without_its_gpu_is_one_line_before_joining(monkeypatch):
    from linvit.device import runtime
    from linvit.distributed import World

    joined = _cuda_machine(monkeypatch, count=1, local_rank=1, visible="0")
    with pytest.raises(ValueError) as err:
        runtime({}, "cuda")
    msg = str(err.value)
    assert "\n" not in msg and "LOCAL_RANK=1" in msg and "sees 1 CUDA device(s)" in msg
    assert "CUDA_VISIBLE_DEVICES '0'" in msg and "--nproc-per-node" in msg
    assert joined == []  # the other rank is not left waiting in the group
    joined = _cuda_machine(monkeypatch, count=0, local_rank=0, visible=None)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=0 .* 0 CUDA devices .*CUDA_VISIBLE_DEVICES unset"):
        World.from_env("cuda")
    assert joined == []


def test_a_rank_given_another_rank_s_gpu_is_one_line_before_joining(monkeypatch):
    from linvit.device import runtime

    joined = _cuda_machine(monkeypatch, count=2, local_rank=1, visible="0,1")
    with pytest.raises(ValueError, match=r"^--device: 'cuda:0' names one GPU, but this is one of 2 torchrun"):
        runtime({}, "cuda:0")
    assert joined == []  # the other rank is not left waiting in the group


def test_the_group_is_joined_with_a_timeout_and_this_rank_s_gpu(monkeypatch):
    import datetime

    import torch

    from linvit.distributed import World

    joined = _cuda_machine(monkeypatch, count=2, local_rank=1, visible="2,3")
    assert World.from_env("cuda") == World(rank=1, size=2, local_rank=1)
    assert joined == [{"backend": "nccl", "timeout": datetime.timedelta(minutes=30),
                       "device_id": torch.device("cuda", 1)}]
    joined.clear()
    monkeypatch.setenv("LINVIT_DIST_TIMEOUT_MIN", "90")
    World.from_env("cpu")
    assert joined == [{"backend": "gloo", "timeout": datetime.timedelta(minutes=90)}]
    monkeypatch.setenv("LINVIT_DIST_TIMEOUT_MIN", "soon")
    with pytest.raises(ValueError, match="LINVIT_DIST_TIMEOUT_MIN='soon' is not a positive number"):
        World.from_env("cpu")


def test_a_bad_bucket_size_is_one_line(monkeypatch):
    from linvit.launch import bucket_mb

    assert bucket_mb() is None  # DDP's own default
    monkeypatch.setenv("LINVIT_BUCKET_MB", "0.5")
    assert bucket_mb() == 0.5
    monkeypatch.setenv("LINVIT_BUCKET_MB", "0")
    with pytest.raises(ValueError, match=r"^environment variable LINVIT_BUCKET_MB='0' is not a positive number$"):
        bucket_mb()
    # Compiled modules: dynamo's DDPOptimizer asserts that no bucket is below DDP's first (1 MiB), in
    # every rank, with a long traceback; eager DDP takes any size.
    monkeypatch.setenv("LINVIT_BUCKET_MB", "0.5")
    with pytest.raises(ValueError) as err:
        bucket_mb(compiled=True)
    assert str(err.value) == ("environment variable LINVIT_BUCKET_MB='0.5' is below 1: under runtime.compile, "
                              "dynamo's DDPOptimizer needs buckets of at least DDP's first bucket (1 MiB)")
    monkeypatch.setenv("LINVIT_BUCKET_MB", "1")
    assert bucket_mb(compiled=True) == 1.0


def test_compiled_modules_under_two_ranks_are_one_process_split_in_two():
    # The parity check with the models compiled (aot_eager: dynamo and its DDPOptimizer, cheap to
    # compile), DDP's buckets at the smallest size a compiled step takes.
    from linvit import dpcheck

    result = dpcheck.check("cpu", steps=2, batch=8, precisions=("fp32",), compile="aot_eager")
    (p,) = result["parity"]
    assert p["ok"] and p["steps_compared"] == 2 and p["param_max_diff_across_ranks"] == 0.0, p


@pytest.mark.parametrize("env", [{"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1"},
                                 {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "WORLD_SIZE": "4",
                                  "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}])
def test_ranks_srun_started_are_refused_in_one_line(monkeypatch, env):
    # `srun --ntasks-per-node 2 linvit student ...` (no torchrun variables: each task would be rank 0 of
    # 1), or `srun -N2 torchrun --standalone ...` (one world per node): N trainings into one --out.
    from linvit.distributed import World

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        World.from_env("cpu")
    tasks, nodes = env["SLURM_STEP_NUM_TASKS"], env["SLURM_STEP_NUM_NODES"]
    assert str(err.value) == (
        f"srun started this command as {tasks} tasks on {nodes} node(s) (SLURM_STEP_NUM_TASKS={tasks}, "
        f"SLURM_STEP_NUM_NODES={nodes}), which would train apart into the same --out: start one task on one node "
        "(srun -N1 -n1) running torchrun --standalone --nproc-per-node N --no-python linvit ..., as the workflow "
        "does for a rule with gpu: N")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # the workflow's jobs: srun -n1, torchrun inside
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert World.from_env("cpu") == World()


def test_a_second_backward_through_one_forward_is_refused_in_one_line(tmp_path):
    # DDP reduces each bucket once per forward: a second backward (retain_graph) would leave that
    # step's gradients unaveraged on each rank. A one-rank gloo group stands for the ranks.
    import torch
    import torch.distributed as dist
    from torch import nn

    from linvit.distributed import DataParallelError, DataParallelStep, World

    class Task:
        model = nn.Linear(4, 2)

        def trainable(self):
            return list(self.model.named_parameters())

        def loss(self, x, y):
            return nn.functional.cross_entropy(self.model(x), y)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        step = DataParallelStep(World(rank=0, size=1), Task())
        x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
        loss = step.loss(x, y)
        step.backward(loss)
        with pytest.raises(DataParallelError) as err:
            step.backward(loss)
        assert str(err.value) == (
            "data parallel step on rank 0: 0 forward(s) before this backward; DDP averages one backward per "
            "forward, so a second backward through one forward (retain_graph) or several forwards per backward "
            "are not supported (linvit.distributed)")
        step.backward(step.loss(x, y))  # the next step's forward and backward go on
    finally:
        dist.destroy_process_group()


def test_a_job_over_several_nodes_is_one_line_before_joining(monkeypatch):
    from linvit.distributed import World

    joined = _cuda_machine(monkeypatch, count=2, local_rank=1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    with pytest.raises(ValueError) as err:
        World.from_env("cpu")
    assert str(err.value) == ("torchrun started this job's 4 processes on several nodes (GROUP_WORLD_SIZE=2, "
                              "LOCAL_WORLD_SIZE=2): linvit trains data-parallel on one node only; use torchrun "
                              "--standalone --nproc-per-node N")
    monkeypatch.delenv("GROUP_WORLD_SIZE")  # the local count alone says so too
    with pytest.raises(ValueError, match="on several nodes"):
        World.from_env("cuda")
    assert joined == []
    monkeypatch.setenv("WORLD_SIZE", "2")  # one node: torchrun --standalone
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert World.from_env("cpu") == World(rank=1, size=2, local_rank=1) and len(joined) == 1


class _Toy:
    """A task whose layer `b` serves the loss on the ranks and steps `uses_b(rank, step)` says."""

    def __init__(self, rank, uses_b):
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.model = nn.ModuleDict({"a": nn.Linear(16, 16), "b": nn.Linear(16, 16), "head": nn.Linear(16, 4)})
        self.rank, self.uses_b, self.calls = rank, uses_b, 0

    def trainable(self):
        return list(self.model.named_parameters())

    def loss(self, x, y):
        import torch.nn.functional as F

        h = self.model["a"](x)
        if self.uses_b(self.rank, self.calls):
            h = self.model["b"](h)
        self.calls += 1
        return F.cross_entropy(self.model["head"](h), y)

    def evaluate(self, final):
        return {}


def _toy_rank(rank, port, out, when):
    """One of two gloo ranks training `_Toy` through fit; `when`: "always" (b unused on rank 1 at
    every step) or "later" (rank 1 stops using b at its third step). Writes out/rank<r>.pt."""
    import os

    import torch

    from linvit.device import runtime
    from linvit.distributed import DataParallelError, shutdown
    from linvit.dpcheck import _Data
    from linvit.train import TrainSpec, fit

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LINVIT_DIST_TIMEOUT_MIN="1")  # a hang would fail, not wait 30 min
    torch.set_num_threads(1)
    uses_b = (lambda r, step: r == 0) if when == "always" else (lambda r, step: r == 0 or step < 2)
    task = _Toy(rank, uses_b)
    try:
        rt = runtime({}, "cpu")
        fit(task, TrainSpec(steps=4, batch_size=8, lr=1e-2), _Data(32, 0), f"{out}/run", seed=0, runtime=rt)
        torch.save({k: v.detach().clone() for k, v in task.model.state_dict().items()}, f"{out}/rank{rank}.pt")
    except DataParallelError as err:
        (Path(out) / f"rank{rank}.err").write_text(str(err))
        raise
    finally:
        shutdown()


def _two_toy_ranks(tmp_path, when):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_toy_rank, args=(port, str(tmp_path), when), nprocs=2, join=True, start_method="spawn")


def test_a_parameter_one_rank_never_uses_is_averaged_over_both(tmp_path):
    # Layer b serves rank 0's loss only: DDP (static_graph) takes rank 1's gradient of b as zero, so
    # both ranks step with the same mean and stay equal to the bit; b trains.
    import torch

    _two_toy_ranks(tmp_path, "always")
    zero, one = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    torch.manual_seed(0)
    start = _Toy(0, None).model.state_dict()
    assert not torch.equal(start["b.weight"], zero["b.weight"])


def test_a_parameter_a_rank_stops_using_is_refused_in_one_line(tmp_path):
    # The graph changes on rank 1 at its third step: refused there, before its optimizer step (DDP
    # would have left that rank's gradients unaveraged); rank 0 is released, nothing hangs.
    import torch.multiprocessing as mp

    with pytest.raises(mp.ProcessRaisedException):
        _two_toy_ranks(tmp_path, "later")
    message = (tmp_path / "rank1.err").read_text()
    assert message == ("data parallel step on rank 1: parameter(s) b.weight, b.bias got no gradient this step but "
                       "did at the first: the loss's graph changed between steps, which DDP's static_graph does "
                       "not average (linvit.distributed)")
    assert not (tmp_path / "rank0.pt").exists() and not (tmp_path / "rank1.pt").exists()


def test_only_rank_zero_says_a_checkpoint_is_unusable(tmp_path, monkeypatch, capsys):
    """Every rank reads the same unusable checkpoint and starts afresh; rank 0 alone says so."""
    import torch

    from linvit.device import Runtime
    from linvit.distributed import World
    from linvit.dpcheck import _Data, _Task
    from linvit.train import TrainSpec, fit

    class Joined(Exception):
        pass

    def stop(*args, **kwargs):  # past the checkpoint: where the ranks would meet in DDP
        raise Joined

    monkeypatch.setattr(World, "train_step", stop, raising=False)
    monkeypatch.setattr(World, "broadcast_module", stop, raising=False)  # before DDP
    monkeypatch.setattr(World, "backend", property(lambda self: "gloo"))  # no process group in this test
    (tmp_path / "checkpoint" / "step00000004").mkdir(parents=True)
    (tmp_path / "checkpoint" / "LATEST").write_text("step00000004")  # no meta.json: unreadable
    said = []
    for rank in (0, 1):
        rt = Runtime(torch.device("cpu"), "fp32", world=World(rank=rank, size=2))
        with pytest.raises(Joined):
            fit(_Task(rt.device, 0.0), TrainSpec(steps=2, batch_size=8, lr=1e-2), _Data(16, 0), tmp_path, seed=0,
                runtime=rt)
        said.append(capsys.readouterr().err.count("starting afresh"))
    assert said == [1, 0]


def test_an_odd_batch_per_process_under_mixup_is_one_line_before_any_compute(tmp_path, monkeypatch):
    """timm's Mixup pairs every image with another of its batch; an odd share fails its assertion in
    every rank. Refused before the data is read or a model built, naming the keys."""
    import torch

    import linvit.steps
    from linvit.device import Runtime
    from linvit.distributed import World

    monkeypatch.setattr(linvit.steps, "_data", lambda *a, **k: pytest.fail("read the data"))
    mixup = {"transform": {"mixup": {"mixup_alpha": 0.8}}}
    config = {**CONFIG, "datasets": {"synthetic": {**CONFIG["datasets"]["synthetic"], **mixup}},
              "teacher": {**CONFIG["teacher"], "train": {**CONFIG["teacher"]["train"], "batch_size": 6}}}
    two = Runtime(torch.device("cpu"), "fp32", world=World(rank=1, size=2))
    with pytest.raises(ValueError) as err:
        linvit.steps.run_teacher(config, "micro", 0, tmp_path, tmp_path / "t", runtime=two)
    assert str(err.value) == ("config key teacher.train.batch_size: 6 gives each of the job's 2 processes 3 images, "
                              "an odd batch, which timm's Mixup (datasets.synthetic.transform.mixup) cannot mix: it "
                              "pairs every image with another of its batch; make the per-process batch even")
    config["student"] = {"train": {"steps": 4, "batch_size": 5, "lr": 1e-3}}
    with pytest.raises(ValueError, match=r"^config key student.train.batch_size: 5 is odd, which timm's Mixup"):
        linvit.steps.run_student(config, "synthetic", "micro", "elu", "random", 0, tmp_path, tmp_path,
                                 tmp_path / "s")
    assert not (tmp_path / "t").exists()


def test_a_pretrained_teacher_is_loaded_and_written_by_rank_zero_alone(tmp_path):
    """A `teachers:` entry under torchrun (a teacher rule with `gpu: 2`): rank 0 loads the file and
    writes the folder, the other rank waits for it and reads its metrics; one message, one writer."""
    import timm
    import torch
    from safetensors.torch import save_file

    args = {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2, "img_size": 16, "num_classes": 4}
    torch.manual_seed(0)
    save_file(timm.create_model("vit_tiny_patch16_224", **args).state_dict(), str(tmp_path / "t.safetensors"))
    config = {**CONFIG, "teachers": {"micro": {"model": "vit_tiny_patch16_224", "model_args": args,
                                               "file": str(tmp_path / "t.safetensors")}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cmd = ["torchrun", "--standalone", "--nproc-per-node=2", "--no-python", "linvit", "teacher", "--config",
           str(tmp_path / "c.yaml"), "--size", "micro", "--out", str(tmp_path / "t"), "--threads", "1"]
    out = run(cmd, cwd=tmp_path)
    assert out.stdout.count("loaded from") == 1
    written = {p.name for p in (tmp_path / "t").iterdir()}
    assert {"model.safetensors", "model.json", "metrics.json", "config.json"} <= written
    assert not [n for n in written if "tmp" in n or n.startswith(".")]  # no rank's half-written file left
    assert json.loads((tmp_path / "t" / "metrics.json").read_text())["source"] == "file"


def test_a_rank_other_than_zero_waits_for_the_pretrained_teacher_and_loads_nothing(tmp_path, monkeypatch):
    """In process, as rank 1 of 2: no load, no write, one barrier, and rank 0's metrics returned."""
    import torch

    import linvit.steps
    from linvit.device import Runtime
    from linvit.distributed import World

    waited = []
    monkeypatch.setattr(World, "barrier", lambda self: waited.append(self.rank))
    monkeypatch.setattr(linvit.steps, "load_pretrained", lambda *a, **k: pytest.fail("rank 1 loaded the teacher"))
    (tmp_path / "t").mkdir()
    written = {"size": "micro", "source": "file", "model": "vit_tiny_patch16_224", "file": "t.safetensors", "params": 1}
    (tmp_path / "t" / "metrics.json").write_text(json.dumps(written))
    config = {**CONFIG, "teachers": {"micro": {"model": "vit_tiny_patch16_224", "file": "t.safetensors"}}}
    rt = Runtime(device=torch.device("cpu"), precision="fp32", world=World(rank=1, size=2))
    assert linvit.steps.run_teacher(config, "micro", None, None, tmp_path / "t", runtime=rt) == written
    assert waited == [1] and [p.name for p in (tmp_path / "t").iterdir()] == ["metrics.json"]
