"""`bash setup.sh decide` end to end on a tiny sequential grid (two looks): look 2 trains only the roles of
the tests still undecided after look 1 (and those seeds' teachers); killed during look 2 and rerun it
resumes there and retrains nothing finished; `linvit status` shows the look and what waits for it; a
second driver on the same results and a plan changed after look 1 are refused in one line."""

import fcntl
import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from linvit.claims.roles import resolve_roles
from linvit.claims.table import CLAIMS

from conftest import BIN, REPO, patient, run

SLOW = pytest.mark.slow  # the tests of `ran`: two looks of a grid (about 3 minutes on 2 cores)

SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
# C1's and C2's roles, no distilling strategy: C3 is not evaluable, so its role (the softmax reference)
# must never get a look 2 seed. Two seeds at look 1, the cap at 3.
TINY = {
    "description": "a tiny sequential grid (tests/test_decide.py)",
    "seeds": [0, 1], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"],
    "inits": ["random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only"], "budgets": [4],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 160, "test_samples": 96,
                               "seed": 0}},
    "shards": {"samples_per_shard": 100, "seed": 0},
    "teacher": {"dataset": "synthetic", "train": {"steps": 10, "batch_size": 32, "lr": 2.0e-3, "warmup_steps": 2,
                                                 "eval_every": 5, "eval_samples": 32}},
    "student": {"train": {"steps": 4, "batch_size": 32, "lr": 1.0e-3, "warmup_steps": 1, "eval_every": 4,
                          "eval_samples": 32}},
    "distill": {"train": {"steps": 2, "batch_size": 32, "lr": 1.0e-3, "warmup_steps": 1}},
    "init_strategies": {name: spec for name, spec in SMOKE["init_strategies"].items()
                        if name in ("random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only")},
    "evaluation": {"fidelity_samples": 8, "throughput_batch": 8},
    "claims": {"min_seeds": 2},
    "sequential": {"looks": [2, 3]},
    "resources": {"teacher": {"threads": 1}},
}


def decide(tmp, *extra, check=True):
    """`bash setup.sh decide` on the tiny grid in `tmp` (its own results/ and report/)."""
    return run(["bash", "setup.sh", "decide", "--cores", "2", "--directory", str(tmp),
                "--configfile", str(tmp / "tiny.yaml"), *extra], cwd=REPO, check=check)


def state(tmp):
    return json.loads((tmp / "results/decide/state.json").read_text())


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Look 1 to the end, then look 2 killed once while it trains, its status read, then the rerun."""
    tmp = tmp_path_factory.mktemp("decide")
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "CORES": "2"}
    cmd = ["linvit", "decide", "--cores", "2", "--directory", str(tmp), "--configfile", str(tmp / "tiny.yaml")]
    log = open(tmp / "driver.log", "w")  # a file, not a pipe: an unread pipe would stall the driver
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + patient(600)
    killed = False
    while proc.poll() is None and time.time() < deadline:
        path = tmp / "results/decide/state.json"
        if path.exists() and state(tmp)["looks"] and list((tmp / "results/logs/students").rglob("seed2.log")):
            os.killpg(proc.pid, signal.SIGTERM)  # as a terminal's Ctrl-C or a scheduler's kill would
            killed = True
            break
        time.sleep(0.5)
    proc.wait(timeout=patient(120))
    log.close()
    # The Snakemake the driver ran holds the driver's lock too, until it has stopped its jobs and exited.
    with open(tmp / "results/decide/driver.lock", "a+") as lock:
        for _ in range(round(patient(240))):  # half-seconds
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.5)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert killed, f"look 2 never started:\n{(tmp / 'driver.log').read_text()[-3000:]}"
    after_kill = state(tmp)
    status = run(["linvit", "status", "--configfile", str(tmp / "tiny.yaml"), "--directory", str(tmp)], cwd=REPO).stdout
    look1 = {p: p.stat().st_mtime_ns for p in (tmp / "results/students").rglob("seed[01]/metrics.json")}
    rerun = decide(tmp)
    return tmp, after_kill, status, look1, rerun


@SLOW
def test_look_two_trains_only_what_undecided_tests_need(ran):
    tmp, _, _, _, _ = ran
    final = state(tmp)
    assert [look["look"] for look in final["looks"]] == [1, 2] and final["next"] is None
    continuing = [t for t, d in final["looks"][0]["tests"].items() if d["outcome"] == "continues"]
    assert continuing, "no test continued after look 1: the tiny grid tests nothing"
    matches = resolve_roles(TINY)
    statistics = {t.statistic.name: t.statistic for c in CLAIMS for t in c.deciding}
    needed = {matches[role].strategy for t in continuing for role in statistics[t.split()[-1]].roles}
    added = {a["init"] for a in final["looks"][1]["added"]}
    assert added == needed
    assert all(a["seeds"] == [2] for a in final["looks"][1]["added"])
    trained = {p.parent.parent.parent.parent.name for p in (tmp / "results/students").rglob("seed2/metrics.json")}
    assert trained == needed
    # The softmax reference is C3's role alone, and C3 is not evaluable here: it stays at look 1's seeds.
    assert not list((tmp / "results/students").glob("*/*/softmax/reference/*/*/seed2"))
    assert (tmp / "results/teacher/micro/seed2/model.safetensors").exists()  # the added seed's own teacher


@SLOW
def test_a_killed_look_resumes_and_retrains_nothing_finished(ran):
    tmp, after_kill, _, look1, rerun = ran
    assert [look["look"] for look in after_kill["looks"]] == [1] and after_kill["next"]["look"] == 2
    assert "decide: look 2 of 2" in rerun.stdout and "decide: look 1 of 2" not in rerun.stdout
    assert {p: p.stat().st_mtime_ns for p in look1} == look1
    final = state(tmp)
    assert final["looks"][0] == after_kill["looks"][0]  # look 1's record is never rewritten
    claims = json.loads((tmp / "report/claims.json").read_text())
    tests = [t for v in claims for c in v["cells"] for t in c["tests"] if t["decides"] and t.get("looks")]
    assert tests and all(t["outcome"] != "continues" for t in tests if len(t["looks"]) == 2)


@SLOW
def test_status_shows_the_look_and_what_waits_for_it(ran):
    _, after_kill, status, _, _ = ran
    assert "Sequential plan: looks at 2, 3 seeds" in status
    assert "Look 2 of 2 (3 seeds): adds" in status
    for test_id in after_kill["next"]["waiting"]:
        assert f"{test_id}: waits for seeds 2-2 of its roles" in status
    assert "interrupted" in status


@SLOW
def test_a_second_driver_is_refused_in_one_line(ran):
    tmp = ran[0]
    with open(tmp / "results/decide/driver.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = decide(tmp, check=False)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.startswith("linvit: error")]
    assert len(lines) == 1 and "another linvit decide runs on this results folder" in lines[0]


@SLOW
def test_a_plan_changed_after_look_one_is_refused(ran):
    tmp = ran[0]
    before = (tmp / "results/decide/state.json").read_text()
    changed = {**TINY, "sequential": {"looks": [2, 3], "futility": 0.2}}
    (tmp / "changed.yaml").write_text(yaml.safe_dump(changed))
    out = run(["linvit", "decide", "--cores", "2", "--directory", str(tmp), "--configfile", str(tmp / "changed.yaml")],
              cwd=REPO, check=False)
    assert out.returncode != 0 and "the plan changed after look 1" in out.stderr
    assert (tmp / "results/decide/state.json").read_text() == before  # nothing recorded is lost


def test_the_next_look_adds_seeds_only_to_undecided_tests_of_undecided_claims(tmp_path):
    """Driver.next_added on the decisions of a look: a continuing test of a continuing claim gets the next
    seeds for each of its roles (the softmax reference as its own variant); a continuing test of a claim
    that failed, a decided test and a futile one get none; runs added before keep their seeds."""
    from linvit.decide import Driver

    config = {**TINY, "seeds": [0, 1], "sequential": {"looks": [2, 4, 6]}}
    driver = Driver(config, ["tiny.yaml"], tmp_path / "results", tmp_path / "report")
    cell = {"dataset": "synthetic", "size": "micro", "variant": "elu", "budget": 4}
    elu = lambda *inits: [("elu", i, "none") for i in inits]  # noqa: E731
    decisions = {
        "C1 a attn_alone": {"outcome": "continues", "claim_outcome": "continues", "cell": cell,
                            "roles": elu("attn_only", "random", "copy_all")},
        "C1 a attn_on_top": {"outcome": "holds", "claim_outcome": "continues", "cell": cell,
                             "roles": elu("copy_all", "copy_mlp", "random")},
        "C2 a mlp_alone": {"outcome": "continues", "claim_outcome": "fails", "cell": cell,
                           "roles": elu("mlp_only", "random", "copy_all")},
        "C2 a mlp_on_top": {"outcome": "fails", "claim_outcome": "fails", "cell": cell,
                            "roles": elu("copy_all", "copy_attn", "random")},
        "C3 a matches": {"outcome": "continues", "claim_outcome": "continues", "cell": cell,
                         "roles": [("elu", "copy_mlp_distill", "proj_mse"), ("softmax", "reference", "none")]},
    }
    before = [{**cell, "variant": "elu", "init": "random", "design": "none", "seeds": [2, 3]}]
    added, waiting = driver.next_added(decisions, 2, before)
    got = {(a["variant"], a["init"], a["design"]): a["seeds"] for a in added}
    assert got == {("elu", "random", "none"): [2, 3, 4, 5], ("elu", "attn_only", "none"): [4, 5],
                   ("elu", "copy_all", "none"): [4, 5], ("elu", "copy_mlp_distill", "proj_mse"): [4, 5],
                   ("softmax", "reference", "none"): [4, 5]}
    assert waiting == ["C1 a attn_alone", "C3 a matches"]


def test_a_recorded_look_that_reads_differently_now_is_refused(tmp_path):
    """check_past: a look is never re-decided. If the runs of its seeds changed after it was decided (its
    statistic or outcome reads differently from the results now), the driver stops in one line."""
    from linvit.decide import Driver
    from linvit.decide_state import DecideError

    driver = Driver({**TINY, "sequential": {"looks": [2, 3]}}, ["tiny.yaml"], tmp_path / "results",
                    tmp_path / "report")
    look = {"look": 1, "outcome": "continues", "statistic": 1.25, "estimate": 0.1, "low": -1.0, "high": 1.0}
    state = {"looks": [{"look": 1, "tests": {"C1 a attn_alone": {"outcome": "continues", "statistic": 1.25}}}]}
    driver.check_past(state, {"C1 a attn_alone": {"looks": [look]}})  # the same reading: nothing to say
    for changed in ({"statistic": 1.2500001}, {"outcome": "holds"}):
        with pytest.raises(DecideError, match="look 1 of C1 a attn_alone was decided continues"):
            driver.check_past(state, {"C1 a attn_alone": {"looks": [{**look, **changed}]}})
    with pytest.raises(DecideError, match="no longer give it"):
        driver.check_past(state, {"C1 a attn_alone": {"looks": []}})


def test_a_continuing_test_of_a_blocked_claim_still_gets_seeds(tmp_path):
    """Issue 55, item 5: a claim that is not evaluable in a cell only because one of its tests is blocked (a
    role the grid lacks) can still fail there by its other test (claims._judge), so that test gets the next
    look's seeds; before, it got none and 'a failure stands' was dead after look 1."""
    from linvit.decide import Driver

    driver = Driver({**TINY, "sequential": {"looks": [2, 3]}}, ["tiny.yaml"], tmp_path / "results",
                    tmp_path / "report")
    cell = {"dataset": "synthetic", "size": "micro", "variant": "elu", "budget": 4}
    decisions = {"C1 a attn_on_top": {"outcome": "continues", "claim_outcome": "not evaluable", "cell": cell,
                                      "roles": [("elu", i, "none") for i in ("copy_all", "copy_mlp", "random")]}}
    added, waiting = driver.next_added(decisions, 1, [])
    assert waiting == ["C1 a attn_on_top"]
    assert {a["init"]: a["seeds"] for a in added} == {"copy_all": [2], "copy_mlp": [2], "random": [2]}


def test_setup_decide_runs_a_config_under_its_own_plan_or_the_shipped_one(tmp_path):
    """`bash setup.sh decide CONFIG` (issue 57): a config with a `sequential:` plan runs under it; one without
    gets workflow/config/decide.yaml's laid over it (here refused in one line: its first look is 5 seeds, the
    config has 2). Dry runs: nothing trains or is recorded."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "sequential"}))
    out = run(["bash", "setup.sh", "decide", str(tmp_path / "tiny.yaml"), "-n", "--directory", str(tmp_path)],
              cwd=REPO)
    assert "dry run of look 1 of 2 (2 seeds; the grid as configured)" in out.stdout
    assert not (tmp_path / "results/decide/state.json").exists()
    out = run(["bash", "setup.sh", "decide", str(tmp_path / "plain.yaml"), "-n", "--directory", str(tmp_path)],
              cwd=REPO, check=False)
    assert out.returncode != 0
    assert f"{tmp_path / 'plain.yaml'} + workflow/config/decide.yaml: config key sequential.looks: starts at 5" \
        in out.stderr
