"""Checkpoints and training faults, in-process on tiny synthetic data.

A job resumes only from a checkpoint made under the same fingerprint (config slice, data,
teacher, seed, code); an unreadable, truncated or hostile checkpoint means one line and a fresh
start; a broken log, a full disk or a diverging loss is one line naming the file or key.
"""

import json
import math
import re

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer

import linvit.io as lio
from linvit import cli, steps
from linvit import checkpoints as checkpoints_mod, train as train_mod
from linvit.grid import MODEL_FILES
from linvit.checkpoints import live_log_path
from linvit.data import write_shards

from conftest import TINY_SYNTHETIC

SYNTH = TINY_SYNTHETIC


def config(**teacher_train):
    train = {"steps": 20, "batch_size": 16, "lr": 2e-3, "warmup_steps": 2, "checkpoint_every": 5, "log_every": 1}
    train.update(teacher_train)
    return {"datasets": {"synthetic": SYNTH}, "shards": {"samples_per_shard": 64},
            "teacher": {"dataset": "synthetic", "train": train},
            "student": {"train": {"steps": 30, "batch_size": 16, "lr": 1e-3, "checkpoint_every": 5}},
            "distill": {"loss": "mse", "train": {"steps": 3, "batch_size": 16, "lr": 1e-3}},
            "init_strategies": {"random": {"copy": [], "distill": False}},
            "evaluation": {"fidelity_samples": 8}}


@pytest.fixture(autouse=True)
def _quiet(quiet_machine):
    yield


class Stop(Exception):
    """Stands for a job killed right after a checkpoint."""


def stop_after(monkeypatch, at):
    """Make training stop (raise Stop) once a checkpoint at step >= `at` is saved; returns an undo."""
    save = checkpoints_mod.Checkpoints.save

    def saving(self, step, *args, **kwargs):
        save(self, step, *args, **kwargs)
        if step >= at:
            raise Stop

    monkeypatch.setattr(checkpoints_mod.Checkpoints, "save", saving)
    return lambda: monkeypatch.setattr(checkpoints_mod.Checkpoints, "save", save)


def stopped_teacher(monkeypatch, cfg, shards, out, at=10):
    undo = stop_after(monkeypatch, at)
    with pytest.raises(Stop):
        steps.run_teacher(cfg, "micro", 0, shards, out)
    undo()
    assert (out / "checkpoint" / "LATEST").exists() and not (out / "metrics.json").exists()


def same_weights(a, b):
    a, b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def cli_run(args, capsys):
    capsys.readouterr()
    rc = cli.main(args)
    return rc, capsys.readouterr().err


def teacher_args(cfg, shards, out):
    return ["teacher", "--config-json", json.dumps(cfg), "--size", "micro", "--seed", "0",
            "--shards", str(shards), "--out", str(out)]


# ----------------------------------------------------------------------------- fingerprint


def test_same_config_resumes_from_its_checkpoint(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    capsys.readouterr()
    m = steps.run_teacher(config(), "micro", 0, shards, out)
    assert "resuming from step 10" in capsys.readouterr().err
    assert m["steps"] == 20 and not (out / "checkpoint").exists()


def test_teacher_with_a_changed_lr_starts_afresh(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    capsys.readouterr()
    m = steps.run_teacher(config(lr=1e-3), "micro", 0, shards, out)
    err = capsys.readouterr().err
    assert "resuming" not in err
    lines = [line for line in err.splitlines() if "another config" in line]
    assert len(lines) == 1, err
    assert "changed: teacher.train.lr" in lines[0] and "starting afresh" in lines[0]
    assert str(out / "checkpoint") in lines[0]
    clean = steps.run_teacher(config(lr=1e-3), "micro", 0, shards, tmp_path / "clean")
    assert m["steps"] == 20 and m["final_loss"] == clean["final_loss"] and m["test_acc"] == clean["test_acc"]
    assert same_weights(out, tmp_path / "clean")
    logged = [json.loads(line)["step"] for line in (out / "train.jsonl").read_text().splitlines() if '"train"' in line]
    assert logged == list(range(1, 21))


def test_other_code_starts_afresh(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    monkeypatch.setattr(lio, "git_revision", lambda: "a-later-commit")
    capsys.readouterr()
    steps.run_teacher(config(), "micro", 0, shards, out)
    err = capsys.readouterr().err
    assert "resuming" not in err and "(changed: git_revision)" in err


def test_student_whose_steps_shrank_starts_afresh(shards, tmp_path, monkeypatch, capsys):
    cfg = config(steps=2)
    teacher = tmp_path / "teacher"
    steps.run_teacher(cfg, "micro", 0, shards, teacher)
    out = tmp_path / "student"
    args = ("synthetic", "micro", "elu", "random", 0, teacher, shards, out)
    undo = stop_after(monkeypatch, 15)
    with pytest.raises(Stop):
        steps.run_student(cfg, *args)
    undo()
    cfg["student"]["train"]["steps"] = 10
    capsys.readouterr()
    m = steps.run_student(cfg, *args)
    err = capsys.readouterr().err
    assert "resuming" not in err and "changed: student.train.steps" in err
    assert m["steps"] == 10 and m["images_seen"] == 160


def test_dataset_with_other_classes_starts_afresh_in_one_line(tmp_path, monkeypatch, capsys):
    data = tmp_path / "shards"
    write_shards("synthetic", SYNTH, data, samples_per_shard=64)
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), data, out)
    write_shards("synthetic", dict(SYNTH, num_classes=5), data, samples_per_shard=64)
    rc, err = cli_run(teacher_args(config(), data, out), capsys)
    assert rc == 0, err
    assert "Traceback" not in err and "changed: data" in err and "starting afresh" in err
    assert json.loads((out / "model.json").read_text())["num_classes"] == 5


# ----------------------------------------------------------------------------- unreadable checkpoints


def latest(out):
    return out / "checkpoint" / (out / "checkpoint" / "LATEST").read_text().strip()


class Hostile:
    """Unpickling this creates a file: what a planted state.pt could do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_hostile_state_pt_is_not_executed(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    marker = tmp_path / "pwned"
    torch.save({"step": Hostile(marker)}, latest(out) / "state.pt")
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert not marker.exists(), "loading the checkpoint ran code from state.pt"
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "state.pt" in line]
    assert len(lines) == 1 and "starting afresh" in lines[0] and "Traceback" not in err
    assert json.loads((out / "metrics.json").read_text())["steps"] == 20


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt", "meta.json"])
def test_a_truncated_checkpoint_file_is_one_line_and_a_fresh_start(name, shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    path = latest(out) / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 0, err
    assert "Traceback" not in err and "resuming" not in err
    lines = [line for line in err.splitlines() if str(path) in line]
    assert len(lines) == 1 and "starting afresh" in lines[0], err
    steps.run_teacher(config(), "micro", 0, shards, tmp_path / "clean")
    assert same_weights(out, tmp_path / "clean")


def test_stale_temporary_files_do_not_outlive_a_rerun(shards, tmp_path, monkeypatch):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    stale = [out / ".model.safetensors.k3j_x9.tmp", out / ".metrics.json.abc123.tmp",
             out / "checkpoint" / ".LATEST.q1w2e3.tmp"]
    for path in stale:
        path.write_text("half")
    (out / "notes.tmp").write_text("mine")  # not one of ours: kept
    steps.run_teacher(config(), "micro", 0, shards, out)
    assert not [p for p in stale if p.exists()]
    assert (out / "notes.tmp").read_text() == "mine"


# ----------------------------------------------------------------------------- the log


def test_the_log_survives_snakemake_removing_the_declared_outputs(shards, tmp_path, monkeypatch):
    # Snakemake deletes a rerun job's declared outputs (train.jsonl is one) but not its checkpoint.
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    for name in MODEL_FILES:
        (out / name).unlink(missing_ok=True)
    steps.run_teacher(config(), "micro", 0, shards, out)
    records = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 21))


def test_a_half_written_last_log_line_is_dropped_on_resume(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    with live_log_path(out).open("a") as f:
        f.write('{"kind": "train", "step": 11, "epo')  # the write the kill interrupted
    m = steps.run_teacher(config(), "micro", 0, shards, out)
    assert m["steps"] == 20
    records = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 21))


def test_a_malformed_log_line_elsewhere_names_file_and_line(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    log = live_log_path(out)
    lines = log.read_text().splitlines(keepends=True)
    lines[2] = "not json\n"
    log.write_text("".join(lines))
    before = log.read_text()
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 1
    errors = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    assert len(errors) == 1 and f"{log}:3" in errors[0] and "Traceback" not in err
    assert log.read_text() == before and (out / "checkpoint" / "LATEST").exists()


# ----------------------------------------------------------------------------- full disk


def full_disk_at(monkeypatch, folder_name):
    """save_file half-writes and fails, as on a full disk, for files written into `folder_name`."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        if folder_name(filename):
            with open(filename, "wb") as f:
                f.write(b"\0" * 100)
            raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")
        return real(tensors, filename, metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    for module in (steps, train_mod, checkpoints_mod):  # where the writer was imported by name, if it still is
        monkeypatch.setattr(module, "save_file", save_file, raising=False)


def test_full_disk_at_the_final_save_is_one_line_and_leaves_nothing_half_written(shards, tmp_path, monkeypatch,
                                                                                 capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out)
    full_disk_at(monkeypatch, lambda f: str(f).startswith(str(out / ".model.safetensors")))
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    assert len(errors) == 1 and str(out / "model.safetensors") in errors[0], err
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()
    assert not list(out.glob(".*.tmp"))


def test_full_disk_at_a_checkpoint_keeps_the_previous_one(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out, at=5)
    kept = latest(out)
    full_disk_at(monkeypatch, lambda f: "step00000008" in str(f))
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    assert len(errors) == 1 and "step00000008" in errors[0] and "model.safetensors" in errors[0], err
    assert latest(out) == kept and (kept / "state.pt").exists()
    assert not (out / "checkpoint" / "step00000008").exists()


def test_full_disk_while_saving_state_pt_says_so_and_keeps_the_previous_checkpoint(shards, tmp_path, monkeypatch,
                                                                                  capsys):
    """The disk fills while state.pt (the optimizer state, the largest file) is written: as the kernel
    says it, ENOSPC on write (here /dev/full takes the bytes, opened where state.pt's temporary file
    is). One line naming the file and saying no space is left, not torch's "enforce fail ...
    unexpected pos"; the previous checkpoint stays and a rerun resumes from it."""
    import builtins
    import os
    from pathlib import Path

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    out = tmp_path / "teacher"
    stopped_teacher(monkeypatch, config(), shards, out, at=5)
    kept = latest(out)

    def full_disk(file, mode="r", *args, **kwargs):
        if Path(str(file)).name.startswith(".state.pt.") and "w" in mode:  # only state.pt's temporary file
            return builtins.open("/dev/full", mode, *args, **kwargs)
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoints_mod, "open", full_disk, raising=False)
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    assert len(errors) == 1, err
    assert re.search(rf"{re.escape(str(out / 'checkpoint'))}/step\d{{8}}/state\.pt", errors[0]), errors[0]
    assert "no space left on device" in errors[0].lower(), errors[0]
    assert "enforce fail" not in errors[0] and "unexpected pos" not in errors[0], errors[0]
    assert latest(out) == kept and [p.name for p in (out / "checkpoint").glob("step*")] == [kept.name]
    assert not list((out / "checkpoint").rglob(".*.tmp"))
    torch.load(kept / "state.pt", weights_only=True)  # intact
    monkeypatch.delattr(checkpoints_mod, "open")
    rc, err = cli_run(teacher_args(config(), shards, out), capsys)
    assert rc == 0 and "resuming from step 5" in err, err


def test_a_real_full_disk_while_saving_state_pt(tmp_path):
    """On a real full file system (a 1 MiB tmpfs; mounting needs root): the kernel takes part of the
    write, then refuses with ENOSPC, and torch's writer swallows that error into "enforce fail ...
    unexpected pos". The save says "No space left on device" naming state.pt, and the previous
    checkpoint is whole."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (root only)")
    try:
        saver = checkpoints_mod.Checkpoints(disk / "checkpoint")
        model = torch.nn.Linear(4, 4)
        saver.save(1, model, {"step": torch.arange(3)}, {"step": 1})
        with pytest.raises(OSError) as err:
            saver.save(2, model, {"moments": torch.zeros(1 << 19)}, {"step": 2})  # 2 MiB: more than the disk
        text = str(err.value)
        assert "\n" not in text and f"cannot write {disk}/checkpoint/step00000002/state.pt: No space left on device" in text
        assert "enforce fail" not in text
        assert saver.latest().name == "step00000001" and not (disk / "checkpoint/step00000002").exists()
        assert torch.equal(torch.load(saver.latest() / "state.pt", weights_only=True)["step"], torch.arange(3))
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# ----------------------------------------------------------------------------- budgets, progress, divergence


def test_absurd_steps_are_rejected_naming_the_key():
    with pytest.raises(ValueError, match=r"teacher\.train\.steps.*10\*\*8|teacher\.train\.steps.*100000000"):
        train_mod.TrainSpec.from_dict({"steps": 10**12, "batch_size": 16, "lr": 1e-3}, "teacher.train")
    assert train_mod.TrainSpec.from_dict({"steps": 10**8, "batch_size": 16, "lr": 1e-3}).steps == 10**8


def test_progress_prints_every_30_seconds_as_well_as_every_tenth(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(train_mod.time, "monotonic", lambda: now[0])
    bar = train_mod._progress(10**8, 0, "teacher micro")
    capsys.readouterr()
    for step in range(1, 200):
        now[0] = step * 1.0  # one step a second: 10% of the run is years away
        bar.update(step, 1.0)
    lines = capsys.readouterr().err.splitlines()
    assert 5 <= len(lines) <= 8, lines  # step 1, then about every 30 s
    assert all(line.startswith("teacher micro: step ") for line in lines)


def test_an_exploding_but_finite_loss_is_diverged(shards, tmp_path, capsys):
    cfg = config(lr=30.0, clip_grad=None, weight_decay=0.0, checkpoint_every=0)
    rc, err = cli_run(teacher_args(cfg, shards, tmp_path / "teacher"), capsys)
    assert rc == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    assert len(errors) == 1 and "diverged" in errors[0] and "no metrics written" in errors[0], err
    assert not (tmp_path / "teacher" / "metrics.json").exists()


def test_divergence_rule_is_a_factor_of_the_first_loss():
    spec = train_mod.TrainSpec(steps=10, batch_size=1, lr=1.0)
    assert spec.diverge_factor == 100.0
    assert not train_mod.diverged(spec, 150.0, start_loss=2.0)
    assert train_mod.diverged(spec, 201.0, start_loss=2.0)
    assert not train_mod.diverged(spec, 99.0, start_loss=0.01)  # the floor: a start near 0 is not a hair trigger
    assert train_mod.diverged(spec, math.nan, start_loss=2.0)
    assert not train_mod.diverged(train_mod.TrainSpec(steps=10, batch_size=1, lr=1.0, diverge_factor=None),
                                  1e30, start_loss=1.0)


class _SpikeTask:
    """linvit.dpcheck's MLP task whose loss is multiplied by 10**4 at the steps in `spikes` (counted
    from 1): a finite blow-up that the next batch no longer shows."""

    def __init__(self, spikes):
        from linvit.dpcheck import _Task

        self.inner, self.spikes, self.calls = _Task(torch.device("cpu"), 0.0), set(spikes), 0
        self.model = self.inner.model

    def trainable(self):
        return self.inner.trainable()

    def loss(self, x, y):
        self.calls += 1
        return self.inner.loss(x, y) * (1e4 if self.calls in self.spikes else 1.0)

    def evaluate(self, final):
        return {}


def _spiky_fit(tmp_path, spikes, **spec):
    from linvit.dpcheck import _Data

    torch.manual_seed(0)
    task = _SpikeTask(spikes)
    spec = train_mod.TrainSpec(**{"steps": 20, "batch_size": 8, "lr": 1e-3, "log_every": 5, **spec})
    return task, train_mod.fit(task, spec, _Data(8 * 20, 0), tmp_path, seed=0, desc="spiky")


def test_divergence_is_checked_every_log_every_steps_on_the_highest_loss_since(tmp_path):
    # A spike at step 3 of a run logging every 5 steps: not read on the host at step 3, but the
    # check at step 5 sees the highest loss since step 2 and stops before step 5's update.
    with pytest.raises(train_mod.TrainingDiverged) as err:
        _spiky_fit(tmp_path, spikes=[3])
    assert "spiky: diverged: loss" in str(err.value) and "in steps 2-5 (checked every few steps)" in str(err.value)
    # At a step that checks, as before: named as that step.
    with pytest.raises(train_mod.TrainingDiverged, match="at step 5 is over 100x the start"):
        _spiky_fit(tmp_path / "b", spikes=[5])


def test_the_loss_is_read_on_the_host_only_at_the_checked_steps(tmp_path, monkeypatch):
    reads = []
    item, to_float = torch.Tensor.item, torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(t) or item(t))
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(t) or to_float(t))
    task, summary = _spiky_fit(tmp_path, spikes=[], checkpoint_every=8)
    assert summary["steps"] == 20 and math.isfinite(summary["final_loss"])
    checked = [s for s in range(1, 21) if train_mod._check_due(train_mod.TrainSpec(
        steps=20, batch_size=8, lr=1e-3, log_every=5, checkpoint_every=8), s, 20)]
    assert checked == [1, 5, 8, 10, 15, 16, 20]
    # The loss and the highest loss since the last check, at each checked step; the progress
    # lines (every tenth of the run: steps 1, 3, 5, ..., 19) read theirs when they print.
    progress = [s for s in range(1, 21, 2) if s not in checked]
    assert len(reads) == 2 * len(checked) + len(progress), len(reads)


# ----------------------------------------------------------------------------- weight decay, probe


def test_registers_and_distillation_token_get_no_weight_decay():
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3,
                              reg_tokens=2)
    named = list(model.named_parameters())
    decay, no_decay = train_mod.param_groups(model, named, 0.05)
    ids = {id(p) for p in no_decay["params"]}
    for name in ("reg_token", "cls_token", "pos_embed"):
        assert id(getattr(model, name)) in ids, name
    assert id(model.blocks[0].attn.qkv.weight) not in ids and decay["weight_decay"] == 0.05
    assert no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(named)


def test_the_optimizer_is_fused_on_the_cpu_and_takes_the_foreach_step():
    """make_optimizer's fused AdamW keeps the groups, and its updates are the foreach form's up to
    float rounding (the same model, gradients and settings, ten steps)."""
    spec = train_mod.TrainSpec(steps=10, batch_size=4, lr=1e-2, weight_decay=0.05)
    models = [VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    start = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    fused = train_mod.make_optimizer(models[0], list(models[0].named_parameters()), spec)
    plain = torch.optim.AdamW(train_mod.param_groups(models[1], list(models[1].named_parameters()), 0.05),
                              lr=1e-2, foreach=True)
    assert fused.defaults["fused"] and [g["weight_decay"] for g in fused.param_groups] == [0.05, 0.0]
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16, 16)
    for _ in range(10):
        for model, opt in ((models[0], fused), (models[1], plain)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        # Adam divides by sqrt(v): rounding in a near-zero gradient moves an update by up to ~1e-5
        # here, against 0.1 that ten steps at lr 1e-2 can move a weight.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert [n for n, a in models[0].named_parameters() if torch.equal(a, start[n])] == []  # every one moved


def test_a_foreach_checkpoint_resumes_into_the_fused_optimizer_under_a_grad_scaler():
    """A checkpoint's optimizer state written by the foreach form (before make_optimizer fused
    AdamW) loads with the fused kernel kept, so an fp16 run's GradScaler can still step it."""
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    named = list(model.named_parameters())
    spec = train_mod.TrainSpec(steps=2, batch_size=4, lr=1e-3)
    x = torch.randn(4, 3, 16, 16)
    old = torch.optim.AdamW(train_mod.param_groups(model, named, 0.05), lr=1e-3, foreach=True)
    model(x).sum().backward()
    old.step()
    fused = train_mod.make_optimizer(model, named, spec)
    train_mod.load_optimizer_state(fused, old.state_dict())
    assert [g["fused"] for g in fused.param_groups] == [True, True]
    assert fused.state[model.head.weight]["step"].item() == 1  # the moments came along
    scaler = torch.amp.GradScaler("cpu")
    fused.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.step(fused)  # the foreach kernel would refuse the scaler's grad_scale here
    scaler.update()
    assert fused.state[model.head.weight]["step"].item() == 2


def test_distillation_probe_size_comes_from_the_config(shards, tmp_path):
    cfg = config(steps=2)
    steps.run_teacher(cfg, "micro", 0, shards, tmp_path / "teacher")
    cfg["init_strategies"]["copy_mlp_distill"] = {"copy": ["embed", "mlp", "norm", "head"], "distill": True}
    m = steps.run_distill(cfg, "synthetic", "micro", "elu", "copy_mlp_distill", "mse", 0, tmp_path / "teacher",
                          shards, tmp_path / "d8")
    assert m["probe_samples"] == 8
    del cfg["evaluation"]
    m = steps.run_distill(cfg, "synthetic", "micro", "elu", "copy_mlp_distill", "mse", 0, tmp_path / "teacher",
                          shards, tmp_path / "d")
    assert m["probe_samples"] == 32  # the default 64, capped by the 32 test images
    assert (tmp_path / "d" / "model.safetensors").exists() and not (tmp_path / "d" / "checkpoint").exists()
