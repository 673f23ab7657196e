"""Failures are one clear line, lose nothing, and under --keep-going leave the other cells intact."""

import json
import re

import yaml

from conftest import REPO, run

BASE = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"], "inits": ["random", "copy_mlp"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 32},
                 # Images no patch grid fits (22 px, patches of 4): the teacher does not match, so
                 # these cells fail (another multiple of the patch would be resampled and run).
                 "small": {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 32,
                           "image_size": 22}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic", "train": {"steps": 4, "batch_size": 16, "lr": 1e-3}},
    "student": {"train": {"steps": 4, "batch_size": 16, "lr": 1e-3, "eval_every": 2}},
    "distill": {"loss": "mse", "train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
    "init_strategies": {"random": {"copy": [], "distill": False},
                        "copy_mlp": {"copy": ["embed", "mlp", "norm", "head"], "distill": False}},
    "evaluation": {"fidelity_samples": 8, "throughput_batch": 8},
}


def write(tmp, config):
    (tmp / "c.yaml").write_text(yaml.safe_dump(config))
    return str(tmp / "c.yaml")


def test_diverging_run_stops_with_one_line_and_writes_no_metrics(tmp_path):
    config = json.loads(json.dumps(BASE))
    config["teacher"]["train"] = {"steps": 20, "batch_size": 16, "lr": 1e30, "clip_grad": None}
    cfg = write(tmp_path, config)
    run(["linvit", "shards", "--config", cfg, "--dataset", "synthetic", "--out", "shards"], cwd=tmp_path)
    out = run(["linvit", "teacher", "--config", cfg, "--size", "micro", "--seed", "0", "--shards", "shards",
               "--out", "teacher"], cwd=tmp_path, check=False)
    assert out.returncode == 1
    errors = [l for l in out.stderr.splitlines() if l.startswith("linvit: error:")]
    assert len(errors) == 1 and "loss became" in errors[0] and "no metrics written" in errors[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "teacher" / "metrics.json").exists()


def test_missing_shards_is_one_line_naming_the_file(tmp_path):
    cfg = write(tmp_path, BASE)
    out = run(["linvit", "teacher", "--config", cfg, "--size", "micro", "--seed", "0", "--shards", "nowhere",
               "--out", "teacher"], cwd=tmp_path, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "nowhere/_info.json" in out.stderr


def test_keep_going_reports_failed_cells_and_keeps_the_others(tmp_path):
    config = json.loads(json.dumps(BASE))
    config["targets"] = ["synthetic", "small"]
    cfg = write(tmp_path, config)
    out = run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
               "--keep-going", "--configfile", cfg], cwd=tmp_path, check=False)
    assert out.returncode != 0
    steps = config["student"]["train"]["steps"]
    good = tmp_path / "results/students/synthetic/micro/elu"
    for init in ("random", "copy_mlp"):
        assert json.loads((good / init / f"none/steps{steps}/seed0/eval.json").read_text())["test_acc"] >= 0
    assert not (tmp_path / f"results/students/small/micro/elu/random/none/steps{steps}/seed0/metrics.json").exists()
    readme = (tmp_path / "report/README.md").read_text()
    missing = readme.split("## Missing cells", 1)[1]
    assert "small" in missing and "teacher" in missing and "22x22" in missing
    # `linvit status`: per rule (jobs, finished, running, queued, interrupted, failed, blocked, to run), the failed
    # cells with their log's error line, and the report (written from what finished) behind them.
    status = run(["linvit", "status", "--configfile", cfg], cwd=tmp_path).stdout
    for row in ("teacher +1 +1 +0 +0 +0 +0 +0 +0", "reference +2 +1 +0 +0 +0 +1 +0 +0",
                "student +4 +2 +0 +0 +0 +2 +0 +0", "report +1 +0 +0 +0 +0 +0 +1 +0"):
        assert re.search(rf"^{row} ", status, re.M), (row, status)
    failed = re.findall(r"^  failed +(\S+) .*(linvit: error: dataset 'small' gives 22x22 images.*)$", status, re.M)
    assert sorted(key for key, _ in failed) == sorted(
        f"small/micro/{v}/{i}/none/steps{steps}/seed0" for v, i in (("softmax", "reference"), ("elu", "random"),
                                                                    ("elu", "copy_mlp")))
    assert "evaluate" not in status  # each training job evaluates its own model
    assert "Remaining: nothing but the 4 failed and blocked jobs, once fixed" in status
