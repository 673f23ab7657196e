"""A user's mistake in a flag, a config file, a manifest or a run folder is one line that names it,
found before any work starts, and nothing already produced is overwritten."""

import json
import shutil

import pytest
import yaml

from linvit.cli import main
from linvit.data.loader import DataError, read_manifest
from linvit.io import read_json

from test_failures import BASE


def errors(capsys, argv):
    """The exit status of `linvit argv` (in this process) and its one error line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("linvit: error:")]
    return code, lines[0] if lines else ""


def config_file(tmp_path, **train):
    config = json.loads(json.dumps(BASE))
    config["teacher"]["train"].update(train)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_negative_thread_count_is_refused(capsys, tmp_path):
    code, line = errors(capsys, ["shards", "--config", config_file(tmp_path), "--dataset", "synthetic",
                                 "--out", str(tmp_path / "s"), "--threads", "-1"])
    assert code == 1 and "--threads -1" in line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("train, key", [({"lr": "fast"}, "teacher.train.lr"),
                                        ({"warmup_steps": "x"}, "teacher.train.warmup_steps"),
                                        ({"lr": -1.0}, "teacher.train.lr"),
                                        ({"eval_every": -1}, "teacher.train.eval_every")])
def test_a_config_file_given_by_hand_is_checked_against_the_schema(capsys, tmp_path, shards, train, key):
    cfg = config_file(tmp_path, **train)
    code, line = errors(capsys, ["teacher", "--config", cfg, "--size", "micro", "--seed", "0",
                                 "--shards", str(shards), "--out", str(tmp_path / "t")])
    assert code == 1 and cfg in line and key in line
    assert not (tmp_path / "t").exists()


def test_a_partial_config_file_still_runs_the_step_it_holds(tmp_path):
    """Only the sections it gives are checked: a shards-only config is not refused for lacking
    the students' settings."""
    from linvit.config import validate_schema

    validate_schema({"datasets": BASE["datasets"], "shards": BASE["shards"]}, partial=True)
    with pytest.raises(ValueError, match="shards.samples_per_shard"):
        validate_schema({"shards": {"samples_per_shard": 0}}, partial=True)
    with pytest.raises(ValueError, match="required"):
        validate_schema({"shards": BASE["shards"]})  # the whole grid's config still needs every section


def test_bad_config_text_and_files_name_themselves(capsys, tmp_path):
    code, line = errors(capsys, ["shards", "--config-json", "{bad", "--dataset", "synthetic", "--out", "x"])
    assert code == 1 and "--config-json" in line
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"seeds: [0]\nname: caf\xe9\n")
    code, line = errors(capsys, ["check-config", str(latin)])
    assert code == 1 and str(latin) in line and "UTF-8" in line
    broken = tmp_path / "broken.yaml"
    broken.write_text("seeds: [0]\nvariants: [elu\n")
    code, line = errors(capsys, ["check-config", str(broken)])
    assert code == 1 and str(broken) in line and "line " in line


def test_a_report_from_a_missing_results_folder_writes_nothing(capsys, tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    (report / "README.md").write_text("a good report")
    code, line = errors(capsys, ["report", "--config", config_file(tmp_path), "--results", str(tmp_path / "reslts"),
                                 "--out", str(report)])
    assert code == 1 and "reslts" in line
    assert (report / "README.md").read_text() == "a good report" and not (tmp_path / "reslts").exists()


@pytest.mark.parametrize("flags, says", [(["--variants", "focussed"], "--variants: unknown operator(s) focussed"),
                                         (["--tokens", "abc"], "--tokens 'abc'"),
                                         (["--tokens", "16,0"], "square patch grids; 0 is not"),
                                         (["--batch", "0"], "--batch must be 1 or more"),
                                         (["--heads", "0"], "--heads must be 1 or more"),
                                         (["--compile", "bogus"], "--compile: unknown torch.compile backend"),
                                         (["--rounds", "0"], "--rounds must be 1 or more")])
def test_the_operator_benchmark_refuses_bad_flags_before_timing(capsys, tmp_path, flags, says):
    out = tmp_path / "attention.csv"
    code, line = errors(capsys, ["benchmark", "--tokens", "16", "--variants", "elu", "--out", str(out), *flags])
    assert code == 1 and says in line
    assert not out.exists()


def test_the_operator_benchmark_refuses_an_output_it_could_not_write(capsys, tmp_path):
    code, line = errors(capsys, ["benchmark", "--tokens", "16", "--variants", "elu", "--out", str(tmp_path)])
    assert code == 1 and "is a folder" in line


@pytest.mark.parametrize("flags, says", [(["loader", "--images", "0"], "--images must be 1 or more"),
                                         (["train", "--repeats", "0"], "--repeats must be 1 or more"),
                                         (["train", "--steps", "-1"], "--steps must be 1 or more"),
                                         (["jobcost", "--baseline", "/nonexistent/old"], "--baseline /nonexistent/old"),
                                         (["nope"], "invalid choice")])
def test_the_harness_benchmarks_refuse_bad_settings_before_saving_a_row(capsys, tmp_path, shards, flags, says):
    out = tmp_path / "bench"
    if flags == ["nope"]:  # argparse's own message
        with pytest.raises(SystemExit):
            main(["bench", "nope"])
        assert says in capsys.readouterr().err
        return
    code, line = errors(capsys, ["bench", *flags, "--shards", str(shards), "--out-dir", str(out)])
    assert code == 1 and says in line
    assert not out.exists()


@pytest.mark.parametrize("key, value, says", [("num_classes", "x", "'num_classes' is 'x'"),
                                              ("classes", ["a"], "'classes' is not a list of its 4"),
                                              ("channels", 2, "'channels' is 2"),
                                              ("image_size", [28], "'image_size' is [28]"),
                                              ("mean", "abc", "'mean' is 'abc'"),
                                              ("std", [0.1, 0.2], "'std' is [0.1, 0.2]"),
                                              ("splits", [], "'splits' is not a mapping")])
def test_a_manifest_with_a_wrongly_typed_field_names_the_file_and_key(tmp_path, shards, key, value, says):
    info = json.loads((shards / "_info.json").read_text())
    info[key] = value
    path = tmp_path / "_info.json"
    path.write_text(json.dumps(info))
    with pytest.raises(DataError) as err:
        read_manifest(path)
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_manifest_of_mixed_image_sizes_is_still_read(tmp_path, shards):
    info = json.loads((shards / "_info.json").read_text())
    info["image_size"] = None  # an ImageFolder of mixed sizes, read through a transform
    path = tmp_path / "_info.json"
    path.write_text(json.dumps(info))
    assert read_manifest(path)["image_size"] is None


def test_a_run_folder_with_a_bad_metrics_file_is_named(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("[1]")
    with pytest.raises(ValueError, match=f"{path} does not hold a JSON object"):
        read_json(path, what="run metrics", keys=("dataset",))
    path.write_text(json.dumps({"dataset": "synthetic", "size": "micro"}))
    with pytest.raises(ValueError, match=f"{path} lacks key\\(s\\) 'design'"):
        read_json(path, what="run metrics", keys=("dataset", "size", "design"))


def test_shards_of_another_dataset_are_refused_before_a_run_is_filed_under_the_wrong_name(tmp_path, shards):
    from linvit.device import cpu_runtime
    from linvit.steps import _teacher

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "model.json").write_text(json.dumps({"size": "micro"}))
    with pytest.raises(ValueError, match=f"shards {shards} hold dataset 'synthetic', not 'nope'"):
        _teacher(BASE, "nope", "micro", teacher, shards, cpu_runtime())


@pytest.mark.parametrize("flag, value, says", [("--bench-batch", "-5", "--bench-batch -5"),
                                               ("--bench-seconds", "-1", "--bench-seconds -1"),
                                               ("--threads", "-2", "--threads -2")])
def test_convert_refuses_bad_benchmark_settings_before_any_step(capsys, tmp_path, shards, flag, value, says):
    from linvit.convert import main as convert

    out = tmp_path / "conv"
    code = convert(["--teacher", str(tmp_path / "no-teacher"), "--variant", "elu", "--shards", str(shards),
                    "--out", str(out), flag, value])
    err = capsys.readouterr().err
    assert code == 1 and says in err and "Traceback" not in err
    assert not out.exists()


def test_a_bench_row_file_keeps_its_rows_when_a_later_run_is_refused(capsys, tmp_path, shards):
    out = tmp_path / "bench"
    out.mkdir()
    kept = out / "machine.csv"
    kept.write_text("benchmark,metric,value\nloader,images_per_s,100\n")
    shutil.copy(kept, tmp_path / "before.csv")
    code, _ = errors(capsys, ["bench", "loader", "--images", "0", "--shards", str(shards), "--out-dir", str(out)])
    assert code == 1 and kept.read_text() == (tmp_path / "before.csv").read_text()


def test_shards_refuse_a_misspelt_dataset_option(capsys, tmp_path):
    config = json.loads(json.dumps(BASE))
    config["datasets"]["synthetic"]["train_sample"] = 192  # train_samples
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    code, line = errors(capsys, ["shards", "--config", str(path), "--dataset", "synthetic", "--out", str(tmp_path / "s")])
    assert code == 1 and "datasets.synthetic: unknown option(s) 'train_sample'" in line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("budget", ["0", "-3"])
def test_a_student_budget_below_one_names_the_flag(capsys, tmp_path, shards, budget):
    """--budget is the flag the user typed: its error names it (not the config's student.train.steps),
    before the run folder is made."""
    code, line = errors(capsys, ["student", "--config", config_file(tmp_path), "--dataset", "synthetic",
                                 "--size", "micro", "--variant", "elu", "--init", "random", "--seed", "0",
                                 "--budget", budget, "--teacher", str(tmp_path / "teacher"),
                                 "--shards", str(shards), "--out", str(tmp_path / "s")])
    assert code == 1 and line.startswith(f"linvit: error: --budget {budget}: must be at least 1"), line
    assert "student.train.steps" not in line
    assert not (tmp_path / "s").exists()
