"""A training job killed with SIGKILL and rerun resumes from its checkpoint to the same result."""

import json
import os
import signal
import subprocess
import time

import yaml
from safetensors.torch import load_file

from conftest import BIN, patient, run

CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"], "inits": ["random"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 256, "test_samples": 64}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic",
                "train": {"steps": 60, "batch_size": 16, "lr": 2e-3, "warmup_steps": 5, "label_smoothing": 0.1,
                          "eval_every": 20, "checkpoint_every": 5, "log_every": 1}},
    "student": {"train": {"steps": 4, "batch_size": 16, "lr": 1e-3}},
    "distill": {"loss": "mse", "train": {"steps": 4, "batch_size": 16, "lr": 1e-3}},
    "init_strategies": {"random": {"copy": [], "distill": False}},
}


def teacher_cmd(tmp, out):
    return ["linvit", "teacher", "--config", str(tmp / "c.yaml"), "--size", "micro", "--seed", "0",
            "--shards", str(tmp / "shards"), "--out", str(out), "--threads", "1"]


def test_killed_job_resumes_to_the_same_metrics(tmp_path, monkeypatch):
    # The git revision is part of a checkpoint's fingerprint; with no repository in sight it is
    # None in both runs, so a commit landing between them cannot turn the resume into a fresh start.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-repository"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    run(["linvit", "shards", "--config", str(tmp_path / "c.yaml"), "--dataset", "synthetic",
         "--out", str(tmp_path / "shards")], cwd=tmp_path)
    run(teacher_cmd(tmp_path, tmp_path / "whole"), cwd=tmp_path)

    killed = tmp_path / "killed"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(teacher_cmd(tmp_path, killed), cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoint" / "LATEST"
    deadline = time.time() + patient(120)
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() >= "step00000020":
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    assert not (killed / "metrics.json").exists()

    resumed = run(teacher_cmd(tmp_path, killed), cwd=tmp_path)
    assert "resuming from step" in resumed.stderr

    whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    again = json.loads((killed / "metrics.json").read_text())
    for key in ("test_acc", "final_loss", "steps", "images_seen"):
        assert whole[key] == again[key], key
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
    # The log of the resumed run holds each step once, as the uninterrupted one does.
    steps = lambda p: [json.loads(l)["step"] for l in p.read_text().splitlines() if '"train"' in l]
    assert steps(killed / "train.jsonl") == steps(tmp_path / "whole" / "train.jsonl")
    # So do its TensorBoard events: the killed attempt's steps after the checkpoint are purged, and the
    # curves are the uninterrupted run's.
    from test_stages import events

    for tag in ("train/loss", "eval/test_acc"):
        a, b = events(tmp_path / "whole").Scalars(tag), events(killed).Scalars(tag)
        assert [(e.step, e.value) for e in b] == [(e.step, e.value) for e in a], tag
    assert [e.step for e in events(killed).Scalars("train/loss")] == list(range(1, 61))
    # Its hparams, written when the killed attempt started, stand once: one row in TensorBoard's HParams
    # view, the uninterrupted run's cell and final numbers.
    from test_stages import hparams_view, hparams_written

    assert hparams_written(killed) == 1
    (row,), (whole_row,) = hparams_view(killed).values(), hparams_view(tmp_path / "whole").values()
    assert row[0] == whole_row[0] == {"rule": "teacher", "dataset": "synthetic", "size": "micro",
                                      "variant": "softmax", "seed": 0}
    assert {k: row[1][k] for k in ("train/loss", "eval/test_acc")} == {k: whole_row[1][k] for k in ("train/loss",
                                                                                                  "eval/test_acc")}
