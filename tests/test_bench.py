"""linvit bench: the CSV it keeps per machine, and each benchmark on a tiny setting (no timing asserts)."""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest

from linvit import bench, cli


def _rows(path):
    return pd.read_csv(path, keep_default_na=False)


def test_machine_slug_is_a_safe_file_name_with_the_vector_kernels_and_the_core_count():
    import torch

    slug = bench.machine_slug()
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug)
    assert f"-{torch.backends.cpu.get_cpu_capability().lower()}-{os.cpu_count()}cores" in slug


def test_machine_slug_tells_cpu_generations_of_one_name_apart(monkeypatch):
    from linvit.report import provenance

    fields = {"model name": "AMD EPYC", "cpu family": "25", "model": "17"}
    monkeypatch.setattr(provenance, "cpu_info", lambda field: fields.get(field, ""))
    monkeypatch.setattr(provenance, "cpu_kernels", lambda: "AVX512")
    zen4 = bench.machine_slug()
    assert zen4.startswith("amd-epyc-family-25-model-17-avx512-")
    fields["cpu family"] = "26"
    assert bench.machine_slug() != zen4
    fields.pop("cpu family")  # no family (not x86): the name, kernels and cores only
    assert bench.machine_slug().startswith("amd-epyc-avx512-")
    assert provenance.machine()["cpu generation"] == "unknown"


def test_save_replaces_a_benchmarks_rows_and_keeps_the_others(tmp_path):
    first = [bench.row("train", "fit_over_bare", 0.9, "ratio", ">= 0.95", False)]
    plan = [bench.row("plan", "dry_run_s", 3.0, "s", "<= 15", True), bench.row("plan", "jobs", 100.0, "jobs")]
    bench.save(first, tmp_path, "m")
    path = bench.save(plan, tmp_path, "m")
    again = bench.save([bench.row("train", "fit_over_bare", 0.97, "ratio", ">= 0.95", True)], tmp_path, "m")
    assert path == again == tmp_path / "m.csv"
    df = _rows(path)
    assert list(df.columns) == bench.COLUMNS
    assert sorted(df["metric"]) == ["dry_run_s", "fit_over_bare", "jobs"]
    assert df.set_index("metric").loc["fit_over_bare", "value"] == 0.97
    assert set(df["machine"]) == {"m"}
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*columns"):
        bench.save(first, tmp_path, "bad")


def test_train_and_loader_benchmarks_write_their_rows(shards, tmp_path, quiet_machine, capsys):
    rows = bench.run(["train", "loader"], shards=shards, out_dir=tmp_path, steps=1, repeats=1, images=64,
                     machine="m")
    df = _rows(tmp_path / "m.csv")
    assert set(df["benchmark"]) == {"train", "loader"}
    got = df.set_index("metric")
    for metric in ("bare_loop_images_per_s", "fit_images_per_s", "fit_over_bare", "final_eval_s",
                   "loader_images_per_s", "training_images_per_s", "loader_over_training"):
        assert float(got.loc[metric, "value"]) > 0, metric
    assert got.loc["final_eval_images", "value"] == 32  # the synthetic test split, evaluated whole
    assert got.loc["fit_over_bare", "target"] == ">= 0.95" and got.loc["fit_over_bare", "meets"] in ("True", "False")
    # The loader's consumption is the train benchmark's bare loop when both run.
    assert got.loc["training_images_per_s", "value"] == got.loc["bare_loop_images_per_s", "value"]
    assert len(rows) == len(df)
    out = capsys.readouterr()
    assert "fit_over_bare" in out.out and "bench: train" in out.err


def test_plan_benchmark_dry_runs_a_generated_grid(tmp_path):
    config = bench.load(None)
    assert len(bench.plan_config(config, 2000)["seeds"]) > len(bench.plan_config(config, 200)["seeds"])
    assert cli.main(["bench", "plan", "--jobs", "80", "--out-dir", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.csv")
    got = _rows(path).set_index("metric")
    assert got.loc["jobs", "value"] >= 80  # seeds are added until the grid has at least --jobs jobs
    assert got.loc["dry_run_s", "value"] > 0 and got.loc["dry_run_s", "target"] == "<= 15"


def test_jobcost_splits_a_one_step_student_job(shards, tmp_path, quiet_machine):
    rows = bench.bench_jobcost(bench.load(None), shards)
    got = {r["metric"]: r for r in rows}
    parts = ["imports_s", "setup_s", "training_s", "evaluations_s", "exit_s"]
    assert all(p in got for p in parts) and got["imports_s"]["value"] > 0
    assert sum(got[p]["value"] for p in parts) == pytest.approx(got["total_s"]["value"], abs=1e-6)
    assert got["baseline_total_s"]["value"] == bench.RECORDED_JOB_S
    assert got["total_s"]["target"] == f"<= {bench.JOB_FRACTION * bench.RECORDED_JOB_S:.3g}"


def test_an_unknown_benchmark_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        bench.run(["nope"], shards=tmp_path, out_dir=tmp_path)


def test_train_ratio_is_the_median_pair_so_a_slow_spell_hitting_both_runs_drops_out(shards, monkeypatch):
    """Each repeat's fit and bare loop run back to back; a machine slowed for one whole repeat
    slows both, so that pair's ratio is unchanged, where a ratio of medians would shift."""
    import linvit.train

    speeds = iter([100.0, 95.0, 20.0, 19.0, 100.0, 97.0])  # (bare, fit) images/s per repeat; repeat 2 slow
    def bare(config, data, batches, spec, runtime):
        return next(speeds)

    def fit(task, spec, data, out_dir, **kw):
        return {"train_time_s": spec.steps * spec.batch_size / next(speeds), "eval_time_s": 0.5}

    monkeypatch.setattr(bench, "bare_loop", bare)
    monkeypatch.setattr(linvit.train, "fit", fit)
    # The order alternates (bare first, then fit first): the speeds above are consumed in run order.
    rows, _ = bench.bench_train(bench.load(None), shards, steps=1, repeats=3)
    got = {r["metric"]: r["value"] for r in rows}
    pairs = [95 / 100, 20 / 19, 97 / 100]  # repeat 2 ran fit first: its fit is the 20
    assert got["fit_over_bare"] == pytest.approx(sorted(pairs)[1])
    assert got["fit_over_bare_lowest"] == pytest.approx(min(pairs))
    assert got["fit_over_bare_highest"] == pytest.approx(max(pairs))
    assert got["steps"] == 1


def test_shards_benchmark_writes_a_jpeg_folder_and_estimates_imagenet(monkeypatch):
    """`linvit bench shards` on a tiny folder: a rate per worker count, per core, and ImageNet-1k's hours
    at that rate (the estimate docs/paper_scale.md quotes)."""
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    got = {r["metric"]: r["value"] for r in bench.bench_shards(per_class=5, size=32)}
    assert got["images_per_s_1_workers"] > 0 and got["images_per_s_2_workers"] > 0
    assert got["images_per_s_per_core"] == got["images_per_s_1_workers"]
    for n in (8, 32):
        hours = bench.IMAGENET_1K / (got["images_per_s_per_core"] * n) / 3600
        assert got[f"imagenet_1k_hours_{n}_cores"] == pytest.approx(hours)


def test_shards_benchmark_without_a_dataset_says_what_is_missing(monkeypatch, capsys):
    """No Fashion-MNIST (offline, not installed) and no scikit-learn for digits: one line saying both and
    how to get them, not a traceback on the folder that was never made."""
    from linvit.data import images
    from linvit.data.sources import DataError, MissingDataError

    def load_raw(name, spec):
        if name == "fashion_mnist":
            raise MissingDataError("fashion_mnist not found: set the dataset's 'path' key to a directory with the "
                                   "four IDX files, or `apt-get install dataset-fashion-mnist`")
        raise ModuleNotFoundError("No module named 'sklearn'")

    monkeypatch.setattr(images, "load_raw", load_raw)
    # (`linvit bench shards` itself writes ImageNet-size JPEGs it makes, needing no dataset; the
    # upscaled datasets are bench_shards(size=...)'s.)
    with pytest.raises(DataError) as raised:
        bench.bench_shards(per_class=5, size=224)
    error = str(raised.value)
    assert "\n" not in error and error.startswith("shards: no dataset to make the JPEG folder from: fashion_mnist "
                                                  "not found") and error.endswith("pip install scikit-learn"), error


def test_grid_ratio_needs_a_finished_grid(tmp_path):
    """`linvit bench grid` reads a finished grid (tests/test_workflow.py checks it on the smoke grid's
    run); with nothing there it says what to do, in one line naming the folder."""
    with pytest.raises(ValueError, match=f"--results {tmp_path}: no finished job of this grid.*run the grid first"):
        bench.run(["grid"], results=tmp_path, out_dir=tmp_path)
