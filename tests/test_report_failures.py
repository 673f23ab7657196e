"""One bad cell never prevents the report: it is listed with its status and a reason naming the file.

Statuses: "ok", "missing" (no result, or not evaluated), "diverged" (the job's log says so),
"invalid" (a result file that cannot be read or breaks the contract).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import CONFIG, DESIGN, STEPS, accuracy, write_cell, write_log

from linvit.config import NO_DESIGN
from linvit.grid import Cell, all_cells, distill_key, log_path
from linvit.report import ResultsError, collect, write_report

SMALL = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0],
         "inits": ["random", "copy_all", "copy_mlp", "attn_only", "copy_mlp_distill"]}


def cell(init: str) -> Cell:
    return Cell("dsA", "tiny", "softmax" if init == "reference" else "linA", init, 0,
                DESIGN if "distill" in init else NO_DESIGN, STEPS)


def full_tree(results):
    # With per-image predictions, as the student step writes them: one seed still gives an interval.
    for c in all_cells(SMALL):
        write_cell(results, c, accuracy(c), predictions=True)


def report(config, results, out):
    write_report(config, results, out)
    runs = collect(config, results)[0].set_index("init")
    return runs, (out / "README.md").read_text()


def test_half_written_train_jsonl_line_lists_the_cell(tmp_path):
    full_tree(tmp_path)
    path = cell("attn_only").run_dir(tmp_path) / "train.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = '{"kind": "eval", "step": '  # an interrupted append
    path.write_text("\n".join(lines) + "\n")
    runs, readme = report(SMALL, tmp_path, tmp_path / "report")
    assert runs.loc["attn_only", "status"] == "invalid"
    assert runs.loc["attn_only", "reason"].startswith(f"{path}:3: not valid JSON")
    assert f"`{cell('attn_only').key}` (invalid): {path}:3: not valid JSON" in readme
    assert (runs.drop(index="attn_only")["status"] == "ok").all()
    # The other cells still make the verdicts (one seed: too few to decide); C1's tests that need
    # attn_only say which results are missing.
    assert "**Verdict: too few seeds.**" in readme  # C3
    assert "no finished run of attn_only" in readme


def test_unreadable_metrics_or_eval_name_the_file(tmp_path):
    full_tree(tmp_path)
    metrics = cell("copy_mlp").run_dir(tmp_path) / "metrics.json"
    metrics.write_text('{"test_acc": 0.5, ')
    evaluation = cell("random").run_dir(tmp_path) / "eval.json"
    evaluation.write_text("[1, 2]")
    wrong = cell("copy_all").run_dir(tmp_path) / "metrics.json"
    wrong.write_text(json.dumps({**json.loads(wrong.read_text()), "variant": "linB"}))
    bad_value = cell("reference").run_dir(tmp_path) / "metrics.json"
    bad_value.write_text(json.dumps({**json.loads(bad_value.read_text()), "test_acc": 1.5}))
    runs, readme = report(SMALL, tmp_path, tmp_path / "report")
    reasons = runs["reason"]
    assert set(runs.loc[["copy_mlp", "random", "copy_all", "reference"], "status"]) == {"invalid"}
    assert reasons["copy_mlp"].startswith(f"{metrics}: not valid JSON")
    assert reasons["random"] == f"{evaluation}: expected a JSON object, got list"
    assert reasons["copy_all"] == f"{wrong}: 'variant' is 'linB' but the file lies in cell {cell('copy_all').key}"
    assert reasons["reference"] == f"{bad_value}: 'test_acc' is 1.5, expected a fraction in 0..1"
    assert runs.loc["attn_only", "status"] == "ok"
    for c in ("copy_mlp", "random", "copy_all", "reference"):
        assert f"`{cell(c).key}` (invalid): " in readme


def test_the_config_itself_still_raises(tmp_path):
    with pytest.raises(ResultsError, match="config: missing key 'inits'"):
        collect({k: v for k, v in SMALL.items() if k != "inits"}, tmp_path)


def test_diverged_runs_get_their_own_status_and_the_log_line(tmp_path):
    full_tree(tmp_path)
    line = ("linvit: error: dsA/tiny/linA/attn_only/seed0: training diverged: loss became nan at step 37; "
            "stopped, no metrics written")
    diverged = cell("attn_only")
    for name in ("metrics.json", "eval.json"):
        (diverged.run_dir(tmp_path) / name).unlink()
    write_log(tmp_path, diverged, ["step 10 loss 2.1", "step 30 loss 9e9", line])
    # A distillation that diverged: the student never ran, so its only trace is the distill job's log.
    student = cell("copy_mlp_distill")
    for name in ("metrics.json", "eval.json"):
        (student.run_dir(tmp_path) / name).unlink()
    distill_log = Path(log_path("distill", distill_key("dsA", "tiny", "linA", "copy_mlp_distill", DESIGN, 0), tmp_path))
    distill_log.parent.mkdir(parents=True, exist_ok=True)
    distill_log.write_text("linvit: error: distill dsA/tiny/linA/copy_mlp_distill/proj_mse: attention distillation "
                           "diverged (loss inf)\n")
    # A run that failed otherwise stays "missing".
    failed = cell("copy_mlp")
    (failed.run_dir(tmp_path) / "metrics.json").unlink()
    write_log(tmp_path, failed, ["linvit: error: out of memory"])
    runs, readme = report(SMALL, tmp_path, tmp_path / "report")
    assert runs.loc["attn_only", ["status", "reason"]].tolist() == ["diverged", line]
    assert runs.loc["copy_mlp_distill", "status"] == "diverged"
    assert runs.loc["copy_mlp_distill", "reason"] == (
        f"distillation diverged ({distill_log}): linvit: error: distill dsA/tiny/linA/copy_mlp_distill/proj_mse: "
        "attention distillation diverged (loss inf)")
    assert runs.loc["copy_mlp", ["status", "reason"]].tolist() == ["missing", "linvit: error: out of memory"]
    with open(tmp_path / "runs.csv") as fh:
        assert sum(",diverged," in row for row in fh) == 2
    assert "## Missing cells and failed runs" in readme
    assert f"`{diverged.key}` (diverged): {line}" in readme
    assert "- Cells: 6 expected (students and softmax references), 3 finished, 2 diverged, 1 missing" in readme


def test_a_failed_shards_job_explains_the_cells_that_waited_for_it(tmp_path):
    """The reasons follow grid.jobs's `needs`: shards of a target that failed stop its cells (their teacher
    ran); shards of the teacher's dataset that failed stop the teacher, and through it every cell."""
    config = {**SMALL, "targets": ["dsA", "dsB"]}
    for c in all_cells(config):
        if c.dataset == "dsA":
            write_cell(tmp_path, c, accuracy(c))
    shards = Path(log_path("shards", "dsB", tmp_path))
    shards.parent.mkdir(parents=True)
    shards.write_text("linvit: error: datasets.dsB.path: /data/dsB does not exist\n")
    runs = collect(config, tmp_path)[0]
    missing = runs[runs["dataset"] == "dsB"]
    assert len(missing) == len(all_cells(config)) // 2 and (missing["status"] == "missing").all()
    assert set(missing["reason"]) == {f"shards dsB failed ({shards}): linvit: error: datasets.dsB.path: /data/dsB "
                                      "does not exist"}
    assert (runs.loc[runs["dataset"] == "dsA", "status"] == "ok").all()
    # Nothing trained: the teacher's shards failed, the teacher and everything after it never started.
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:
        path.unlink()
    teacher_shards = Path(log_path("shards", config["teacher"]["dataset"], tmp_path))
    teacher_shards.parent.mkdir(parents=True, exist_ok=True)
    teacher_shards.write_text("Traceback ...\nOSError: [Errno 28] No space left on device\n")
    runs = collect(config, tmp_path)[0]
    assert set(runs["reason"]) == {f"shards {config['teacher']['dataset']} failed ({teacher_shards}): OSError: "
                                   "[Errno 28] No space left on device"}
