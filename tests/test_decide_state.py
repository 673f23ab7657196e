"""The sequential driver's state between looks, quickly (no training, no real Snakemake): a fake `snakemake`
on PATH records its arguments and writes the report/claims.json the test gives it, and the runs' files are
small stand-ins. Every setting that decides is recorded at each look and a change is refused before
Snakemake runs, naming the key (issue 55, items 3 and 9); a plan edited after a failed look 1 is no change;
a look whose run failed is read from the report the failure left, and one without a report stops naming the
failed jobs' logs (item 4, the driver's side); after the last look, decide and status check that every run
the looks read is still there and whole, and say what to remake and how (item 10)."""

import gc
import json
import os
import sys
from pathlib import Path

import pytest

from linvit import grid
from linvit.bench import write_stub
from linvit.claims.table import CLAIMS
from linvit.decide import Driver
from linvit.decide_state import DecideError
from linvit.status_decide import status_lines
from linvit.status import WHOLE, collect

from test_decide import TINY

CELL = {"dataset": "synthetic", "size": "micro", "variant": "elu", "budget": 4}
FAKE = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
calls = here / "calls.jsonl"
n = len(calls.read_text().splitlines()) if calls.exists() else 0
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
steps = json.loads((here / "steps.json").read_text())
step = steps[min(n, len(steps) - 1)]
if step.get("claims") is not None:
    out = Path(step["report"]) / "claims.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(step["claims"]))
    tmp.replace(out)
sys.exit(step.get("code", 0))
"""


def claims(outcome: str, looks=(1,)) -> list[dict]:
    """report/claims.json of the tiny grid's one linear cell: every deciding test `outcome` at `looks`."""
    tests = lambda c: [{"name": t.statistic.name, "decides": True, "outcome": outcome,  # noqa: E731
                        "stopped": looks[-1] if looks and outcome != "continues" else 0,
                        "looks": [{"look": k, "outcome": outcome, "statistic": 1.5, "estimate": 0.1, "low": -1.0,
                                   "high": 1.0} for k in looks]} for t in c.deciding]
    return [{"claim": c.name, "cells": [{**CELL, "outcome": outcome, "tests": tests(c)}]} for c in CLAIMS]


class Fake:
    """The fake `snakemake`: `steps` (one per call, the last repeated): its exit code and the claims it writes."""

    def __init__(self, tmp: Path, monkeypatch):
        self.tmp, self.bin = tmp, tmp / "bin"
        self.bin.mkdir()
        exe = self.bin / "snakemake"
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")

    def steps(self, *steps):
        (self.bin / "steps.json").write_text(json.dumps([{**s, "report": str(self.tmp / "report")} for s in steps]))

    @property
    def calls(self) -> list[list[str]]:
        path = self.bin / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return Fake(tmp_path, monkeypatch)


def drive(tmp: Path, config: dict = TINY) -> tuple[str | None, list[str]]:
    """One `linvit decide` on the tiny grid in `tmp`: its one-line refusal (None where it ran through) and what
    it said. The driver's lock goes with its frame (the next drive takes it again)."""
    said: list[str] = []
    try:
        Driver(config, ["tiny.yaml"], tmp / "results", tmp / "report").run(["--cores", "1"], say=said.append)
        return None, said
    except DecideError as err:
        message = str(err)
    gc.collect()
    return message, said


def state(tmp: Path) -> dict:
    return json.loads((tmp / "results/decide/state.json").read_text())


def make_runs(tmp: Path, config: dict = TINY, skip=()) -> list[grid.Cell]:
    """Whole stand-ins of every run's files the report reads (but `skip`'s keys)."""
    cells = grid.all_cells(config)
    for cell in cells:
        if cell.key in skip:
            continue
        folder = cell.run_dir(tmp / "results")
        folder.mkdir(parents=True, exist_ok=True)
        for name in WHOLE:
            write_stub(folder / name)
    return cells


# --- items 3 and 9: everything that decides is fixed after look 1 ----------------------------------------
@pytest.mark.parametrize("change, said", [
    ({"claims": {**TINY["claims"], "level": 0.9}}, "claims.level: 0.95 -> 0.9"),
    ({"student": {"train": {**TINY["student"]["train"], "lr": 2.0e-3}}}, "student.train.lr: 0.001 -> 0.002"),
    ({"seeds": [0, 2]}, "seeds: [0, 1] -> [0, 2]"),
    ({"variants": ["relu"]}, 'variants: ["elu"] -> ["relu"]'),  # a cell removed: its decided looks would go
    ({"inits": TINY["inits"][:-1]}, "inits: "),
    # a strategy's description is in its jobs' params: Snakemake would retrain its runs
    ({"init_strategies": {**TINY["init_strategies"], "random": {**TINY["init_strategies"]["random"],
                                                                "description": "other words"}}},
     "init_strategies.random.description: "),
])
def test_a_setting_that_decides_changed_after_look_one_is_refused_before_snakemake(fake, tmp_path, change, said):
    fake.steps({"claims": claims("continues")}, {"code": 2})  # look 1, then look 2 stops with no report
    refused, _ = drive(tmp_path)
    assert "look 2: snakemake exited 2" in refused and [r["look"] for r in state(tmp_path)["looks"]] == [1]
    before = (tmp_path / "results/decide/state.json").read_text()
    refused, _ = drive(tmp_path, {**TINY, **change})
    assert refused is not None and f"the config changed after look 1: {said}" in refused
    assert "move " in refused and "results/decide away" in refused  # how to start a new sequence
    assert len(fake.calls) == 2  # refused before Snakemake could retrain look 1's runs under the change
    assert (tmp_path / "results/decide/state.json").read_text() == before
    if "variants" in change:  # a cell removed: what may change instead
        assert "A cell is added by extending targets, sizes, variants or budgets" in refused


def test_a_cell_added_mid_sequence_gets_every_seed_up_to_the_next_look(fake, tmp_path):
    """A budget added after look 1: look 2's runs give the new cell's roles the seeds up to look 2 (its base
    seeds train as the grid's), the refusal of other changes stays, and a cell added after the end is refused."""
    fake.steps({"claims": claims("continues")}, {"code": 2})
    drive(tmp_path)
    grown = {**TINY, "budgets": [4, 8]}
    refused, said = drive(tmp_path, grown)
    assert "look 2: snakemake exited 2" in refused and len(fake.calls) == 3  # look 2 ran, with the new cell
    assert any("1 cell added before look 2 (synthetic/micro/elu/steps8)" in line for line in said)
    nxt = state(tmp_path)["next"]
    assert nxt["cells_added"] == ["synthetic/micro/elu/steps8"]
    new = {(a["variant"], a["init"], a["design"]): a["seeds"] for a in nxt["added"] if a["budget"] == 8}
    tests = {t.statistic.name for c in CLAIMS for t in c.deciding}
    assert len(tests) > 1 and ("softmax", "reference", "none") in new and ("elu", "random", "none") in new
    assert set(map(tuple, new.values())) == {(2,)}  # seeds 0-1 are the grid's; look 2 has 3 seeds
    old = [a for a in nxt["added"] if a["budget"] == 4]
    assert all(a["seeds"] == [2] for a in old)  # the continuing tests of the first cell, as before
    look = (tmp_path / "results/decide/look.yaml").read_text()
    assert "budget: 8" in look
    refused, _ = drive(tmp_path, grown)  # the change is recorded: the rerun resumes without adding again
    assert state(tmp_path)["next"] == nxt
    refused, _ = drive(tmp_path, {**grown, "budgets": [8]})  # a cell removed is still refused
    assert "budgets: [4, 8] -> [8]" in refused
    decided = claims("holds", looks=(1, 2))
    for test in (t for c in decided for cell in c["cells"] for t in cell["tests"]):
        test["looks"][0]["outcome"] = "continues"  # as recorded at look 1
    fake.steps({"claims": decided})
    make_runs(tmp_path, {**grown, "added_seeds": nxt["added"]})  # look 2's runs, the new cell's included
    refused, _ = drive(tmp_path, grown)
    assert refused is None and state(tmp_path)["looks"][-1]["cells_added"] == ["synthetic/micro/elu/steps8"]
    refused, _ = drive(tmp_path, {**grown, "budgets": [4, 8, 16]})
    assert "cells were added after the sequence ended at look 2" in refused


def test_settings_that_decide_nothing_may_change_and_a_default_written_out_is_no_change(fake, tmp_path):
    fake.steps({"claims": claims("continues")}, {"code": 2})
    drive(tmp_path)
    same = {**TINY, "resources": {"teacher": {"threads": 2}}, "description": "another description",
            "claims": {**TINY["claims"], "level": 0.95, "negligible": 0.25}}
    refused, _ = drive(tmp_path, same)
    assert "look 2: snakemake exited 2" in refused and len(fake.calls) == 3  # look 2 ran again
    refused, _ = drive(tmp_path, {**same, "claims": {**TINY["claims"], "margin": 0.02}})
    assert "claims.margin: 0.01 -> 0.02" in refused and len(fake.calls) == 3


def test_a_plan_edited_after_a_failed_look_one_is_no_change(fake, tmp_path):
    """Nothing is decided before look 1 is recorded: its plan may still change (not "changed after look 1")."""
    fake.steps({"code": 1})  # look 1 fails, and no report is made
    refused, _ = drive(tmp_path)
    assert "look 1: snakemake exited 1 and made no report for this look" in refused
    fake.steps({"claims": claims("continues")}, {"code": 2})
    (fake.bin / "calls.jsonl").unlink()
    refused, _ = drive(tmp_path, {**TINY, "sequential": {"looks": [2, 4]}, "claims": {"min_seeds": 2, "level": 0.9}})
    assert "look 2: snakemake exited 2" in refused
    assert state(tmp_path)["plan"]["looks"] == [2, 4] and [r["look"] for r in state(tmp_path)["looks"]] == [1]
    assert json.loads(state(tmp_path)["decides"]["claims.level"]) == 0.9


# --- item 4, the driver's side: a failed run never stops the sequence for good -----------------------------
def test_a_look_with_a_failed_run_is_read_from_the_report_the_failure_left(fake, tmp_path):
    cells = make_runs(tmp_path)
    lost = next(c for c in cells if c.init == "attn_only" and c.seed == 1)
    for name in WHOLE:
        (lost.run_dir(tmp_path / "results") / name).unlink()
    # Snakemake exits 1 (--keep-going), and its onerror made the report from the runs that finished.
    fake.steps({"code": 1, "claims": claims("continues")}, {"code": 2})
    refused, said = drive(tmp_path)
    assert "--keep-going" in fake.calls[0]
    record = state(tmp_path)["looks"][0]
    assert record["look"] == 1 and record["failed"] == [lost.key] and record["tests"]
    assert any("look 1: snakemake exited 1" in line and lost.key in line for line in said)
    assert "look 2: snakemake exited 2" in refused  # the sequence went on to look 2


def test_a_look_whose_report_was_not_made_stops_naming_the_failed_jobs_logs(fake, tmp_path):
    cells = make_runs(tmp_path)
    lost = next(c for c in cells if c.init == "copy_mlp" and c.seed == 0)
    for name in WHOLE:
        (lost.run_dir(tmp_path / "results") / name).unlink()
    log = tmp_path / "results/logs/students" / f"{lost.key}.log"
    log.parent.mkdir(parents=True)
    log.write_text("linvit: error: out of memory\n")
    fake.steps({"code": 1})
    refused, _ = drive(tmp_path)
    assert refused.startswith("look 1: snakemake exited 1 and made no report for this look; the failed jobs' logs: ")
    assert str(log) in refused and "\n" not in refused
    assert not state(tmp_path)["looks"]


def test_the_look_file_names_the_look_and_the_runs_earlier_looks_were_read_without(tmp_path):
    """The report reads the driver's look with the runs it has and keeps each recorded look's failed runs out
    of it when it reads it again (claims.Design: decide_look, dropped_runs), so check_past stays strict: a
    recorded look that reads differently now is refused, failed runs or not."""
    import yaml

    driver = Driver({**TINY, "sequential": {"looks": [2, 3]}}, ["tiny.yaml"], tmp_path / "results", "report")
    failed = grid.run_key("synthetic", "micro", "elu", "attn_only", 1, "none", 4)
    added = [{**CELL, "variant": "elu", "init": "attn_only", "design": "none", "seeds": [2]}]
    state = {"looks": [{"look": 1, "tests": {}, "failed": [failed]}], "next": {"look": 2, "added": added}}
    driver.write_look(state)
    look = yaml.safe_load(driver.look_path.read_text())
    assert look == {"added_seeds": added, "decide_look": 2, "dropped_runs": [{"look": 1, "runs": [failed]}]}
    now = {"C1 a attn_alone": {"cell": CELL, "roles": [("elu", "attn_only", "none"), ("elu", "random", "none")],
                               "looks": [{"look": 1, "outcome": "continues", "statistic": 2.0}]}}
    past = {"C1 a attn_alone": {"outcome": "continues", "statistic": 1.25}}
    with pytest.raises(DecideError, match="runs of its seeds changed after it was decided"):
        driver.check_past({"looks": [{"look": 1, "tests": past, "failed": [failed]}]}, now)


# --- item 10: after the last look, every run the looks read is there and whole ----------------------------
@pytest.fixture
def done(fake, tmp_path):
    """A sequence decided at look 1 (every test holds), with every run's files whole."""
    cells = make_runs(tmp_path)
    fake.steps({"claims": claims("holds")})
    refused, said = drive(tmp_path)
    assert refused is None and said[-1].startswith("decide: done after look 1"), (refused, said)
    return cells


def test_after_the_last_look_decide_checks_every_run_the_looks_read(fake, tmp_path, done):
    results = tmp_path / "results"
    cut = next(c for c in done if c.init == "copy_all" and c.seed == 0).run_dir(results) / "eval.json"
    cut.write_text(cut.read_text()[:1])
    gone = next(c for c in done if c.is_reference and c.seed == 1)
    for name in WHOLE:
        (gone.run_dir(results) / name).unlink()
    refused, said = drive(tmp_path)
    assert len(fake.calls) == 1  # nothing was run: it says what to remake
    runs = [line for line in said if line.startswith("decide: run ")]
    assert len(runs) == 2 and any(gone.key in line and "missing" in line for line in runs)
    assert any(f"{cut} is not valid JSON" in line for line in runs)
    assert "2 runs the recorded looks read are missing or broken" in refused and f"rm {cut}" in refused
    assert "results/decide/look.yaml" in refused and "--keep-going" in refused and "\n" not in refused
    # Remade, but the report made again without the looks' runs (a plain snakemake: look 1's seeds only here,
    # so its tests' looks are gone): decide says so, and how to make it again.
    make_runs(tmp_path)
    (tmp_path / "report/claims.json").write_text(json.dumps(claims("holds", looks=())))
    refused, _ = drive(tmp_path)
    assert "no longer give it" in refused and "results/decide/look.yaml" in refused
    (tmp_path / "report/claims.json").write_text(json.dumps(claims("holds")))
    refused, said = drive(tmp_path)
    assert refused is None and said[-1].startswith("decide: done after look 1")


def test_after_the_last_look_status_says_which_runs_went_and_the_command(tmp_path, done):
    results = tmp_path / "results"
    model = next(c for c in done if c.init == "random" and c.seed == 1).run_dir(results) / "model.safetensors"
    model.write_bytes(model.read_bytes()[:5])
    lines = status_lines(TINY, tmp_path)
    assert lines[1].startswith("Decided after look 1, but 1 run its looks read is missing or broken")
    assert f"{model} is cut short" in lines[2]
    assert f"rm {model}" in lines[3] and "results/decide/look.yaml" in lines[3]
    make_runs(tmp_path)
    assert status_lines(TINY, tmp_path)[1].startswith("Decided: the driver finished after look 1")


def test_status_catches_a_truncated_eval_json_and_model_safetensors(tmp_path):
    jobs = grid.jobs(TINY)
    for job in jobs:
        for out in job.outputs:
            path = tmp_path / out
            path.parent.mkdir(parents=True, exist_ok=True)
            if "." in path.name:
                write_stub(path)
            else:
                path.mkdir(exist_ok=True)
    student = next(j for j in jobs if j.rule == "student" and j.cell.seed == 1)
    teacher = next(j for j in jobs if j.rule == "teacher" and j.key.endswith("seed0"))
    (tmp_path / student.folder / "eval.json").write_text('{"fidelity": ')
    (tmp_path / teacher.folder / "model.safetensors").write_bytes(b"\x10")
    status = {s.job.name: s for s in collect(TINY, tmp_path, slurm=False).jobs}
    assert status[student.name].state == "failed"
    assert status[student.name].detail == (f"eval.json is not valid JSON (cut short?): rm {student.folder}/eval.json, "
                                           f"and the next snakemake makes it again")
    assert status[teacher.name].state == "failed" and status[teacher.name].detail.startswith(
        "model.safetensors is cut short (1 bytes, no whole header)")
    assert status["report all"].state == "blocked"
    assert sum(s.state == "finished" for s in status.values()) == len(jobs) - 2 - sum(
        s.state == "blocked" for s in status.values())
