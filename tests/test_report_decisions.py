"""The Decisions section and the claim_tests figure, from a sequential grid whose runs the test writes.

The grid (looks at 3, 6 and 9 seeds) is built as linvit decide would leave it: look 1 is seeds 0-2 for every
role; C1 is undecided in both cells after it, so look 2 adds seeds 3-5 to C1's roles (random, copy_all,
copy_mlp, attn_only) of linA and linB; after look 2 only linA's attn_on_top continues, so look 3 adds 6-8 to
its roles. Accuracies are each role's base plus a fixed draw per seed (Z) times the role's noise, so that:

  attn_alone   holds at look 2 in both cells (early: before the cap)
  attn_on_top  linA reaches the cap (look 3) undecided; linB stops for futility at look 2
  mlp_alone    linA holds at look 1; linB undecided, but C2 failed there, so no look adds seeds for it: once the
               sequence is over it reads "undecided when the sequence ended", never "continues"
  mlp_on_top   fails at look 1 (both cells); matches holds at look 1
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from test_report import CONFIG, STEPS, write_cell
from test_report_cost import tsv

from linvit.claims.judge import evaluate_claims
from linvit.grid import Cell, all_cells, jobs
from linvit.report import collect, load_predictions, write_report
from linvit.report.aggregate import benchmark_jobs
from linvit.report.claims_text import number
from linvit.report.decisions import CAP, ENDED, FAIL, FUTILITY, HOLD, evaluate

INITS = ["random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill"]
LOOKS = [3, 6, 9]
SEQ = {**CONFIG, "targets": ["dsA"], "variants": ["linA", "linB"], "inits": INITS, "seeds": [0, 1, 2],
       "claims": {**CONFIG["claims"], "min_seeds": 3}, "sequential": {"looks": LOOKS}}
FIXED = {k: v for k, v in SEQ.items() if k != "sequential"}
C1_ROLES = ["random", "copy_all", "copy_mlp", "attn_only"]
ADDED = {2: [(v, i, [3, 4, 5]) for v in ("linA", "linB") for i in C1_ROLES],
         3: [("linA", i, [6, 7, 8]) for i in C1_ROLES[:3]]}
BASE = {"random": 0.50, "copy_all": 0.70, "copy_attn": 0.68, "copy_mlp": 0.664, "attn_only": 0.502,
        "mlp_only": 0.66, "copy_mlp_distill": 0.83, "reference": 0.80}
NOISE = {"copy_attn": 0.003, "copy_mlp": 0.015, "attn_only": 0.03, "mlp_only": 0.003, "copy_mlp_distill": 0.003}
LIN_B = ({"copy_mlp": 0.66}, {"copy_mlp": 0.02, "mlp_only": 0.03})  # base and noise where linB differs
Z = {"copy_attn": [0.19, 0.11, 0.13, 0.17, -0.91, -1.49, -0.41, 0.32, 0.02],
     "copy_mlp": [2.04, -1.02, -0.32, -0.92, 1.63, -0.23, -0.72, 0.28, -1.12],
     "attn_only": [-0.65, 0.01, 0.23, -0.97, -0.62, 0.86, 1.61, -1.26, -1.06],
     "mlp_only": [-0.8, -0.71, 1.18, -1.56, -0.46, 1.54, -1.0, 0.78, 0.61],
     "copy_mlp_distill": [1.05, 1.17, 0.72, 0.66, -1.39, 0.78, -1.08, -1.01, 0.12]}
CPU = {"teacher": 360.0, "distill": 180.0, "student": 72.0, "reference": 90.0}  # cpu_time per job kind


def added_seeds(upto: int) -> list[dict]:
    return [{"dataset": "dsA", "size": "tiny", "variant": v, "init": i, "design": "none", "budget": STEPS,
             "seeds": seeds} for look in range(2, upto + 1) for v, i, seeds in ADDED[look]]


def accuracy(cell: Cell) -> float:
    base, noise = dict(BASE), dict(NOISE)
    if cell.variant == "linB":
        base.update(LIN_B[0])
        noise.update(LIN_B[1])
    return base[cell.init] + noise.get(cell.init, 0.0) * (Z[cell.init][cell.seed] if cell.init in Z else 0.0)


def build(root: Path, config: dict, state: bool = True) -> tuple[Path, Path]:
    """Every run of `config`, a benchmark file per training job, and the driver's state after its last look."""
    results = root / "results"
    for cell in all_cells(config):
        write_cell(results, cell, accuracy(cell))
    for job in jobs(config, results):
        if job.benchmark:
            kind = "teacher" if job.rule.startswith("teacher") else job.rule
            tsv(job.benchmark, (CPU[kind] * 1.5, 500.0, CPU[kind]))
    if state:
        looks = [{"look": k + 1, "seeds": n, "finished": f"2026-12-0{k + 1} 10:00:00", "added": added_seeds(k + 1),
                  "tests": {}} for k, n in enumerate(LOOKS)]
        (results / "decide").mkdir(parents=True)
        (results / "decide" / "state.json").write_text(json.dumps({"plan": {"looks": LOOKS}, "looks": looks,
                                                                   "next": None}))
    return results, root / "report"


@pytest.fixture(scope="module")
def sequential_report(tmp_path_factory):
    config = {**SEQ, "added_seeds": added_seeds(3)}
    results, report = build(tmp_path_factory.mktemp("sequential"), config)
    written = write_report(config, results, report)
    return config, results, report, written


@pytest.fixture(scope="module")
def fixed_report(tmp_path_factory):
    results, report = build(tmp_path_factory.mktemp("fixed"), FIXED, state=False)
    written = write_report(FIXED, results, report)
    return results, report, written


def decisions_of(readme: str) -> str:
    return readme.split("## Decisions")[1].split("\n## ")[0]


def block(section: str, variant: str, name: str) -> str:
    """One test's paragraph and table in the section."""
    start = section.index(f"`dsA/tiny/{variant}/steps{STEPS}` · {name}**")
    return re.split(r"\n\n(?=\*\*|###)", section[start:])[0]


def test_each_test_stops_where_and_why(sequential_report):
    config, results, _, _ = sequential_report
    runs, _ = collect(config, results)
    verdicts = evaluate_claims(runs, config, load_predictions(runs))
    d = evaluate(config, verdicts, benchmark_jobs(config, results), results)
    got = {(t.cell.split("/")[2], t.test.name): (t.reason, t.test.stopped, t.seeds) for t in d.tests}
    assert got[("linA", "attn_alone")] == (HOLD, 2, tuple(range(6)))
    assert got[("linA", "attn_on_top")] == (CAP, 3, tuple(range(9)))
    assert got[("linB", "attn_on_top")] == (FUTILITY, 2, tuple(range(6)))
    assert got[("linB", "mlp_alone")] == (ENDED, 0, (0, 1, 2))
    assert got[("linA", "mlp_on_top")] == got[("linB", "mlp_on_top")] == (FAIL, 1, (0, 1, 2))
    assert got[("linA", "matches")] == (HOLD, 1, (0, 1, 2))


def test_the_section_says_each_stop_and_its_repeated_intervals(sequential_report):
    _, _, report, _ = sequential_report
    readme = (report / "README.md").read_text()
    section = decisions_of(readme)
    assert readme.index("## Claims") < readme.index("## Decisions") < readme.index("## Positive control")
    assert ("**Plan:** looks at 3, 6, 9 paired seeds (the cap: 9); each test's error spent across its looks by "
            "`hwang_shih_decani` (gamma 0)") in section
    assert "conditional power at the cap is below 0.1 stops as \"undecided within the cap\" from look 2 on" in section
    assert ("look 1 (3 seeds, the grid as configured, finished 2026-12-01 10:00:00); look 2 (6 seeds, 24 runs added "
            "in all, finished 2026-12-02 10:00:00); look 3 (9 seeds, 33 runs added in all") in section
    assert "point estimate biased away from the threshold" in section and "covers the truth at every look" in section
    assert ("Deciding tests: 10 (5 holds, 2 undecided within the cap, 2 fails, 1 undecided when the sequence "
            "ended).") in section
    verdicts = json.loads((report / "claims.json").read_text())
    tests = {(c["variant"], t["name"]): t for v in verdicts for c in v["cells"] for t in c["tests"] if t["decides"]}
    # Every look of every test: its seeds, estimate, repeated interval, T against both bounds, fraction, outcome.
    for (variant, name), t in tests.items():
        text = block(section, variant, name)
        assert len(t["looks"]) == text.count("\n|") - 2  # a row per look under the header and its rule
        for x in t["looks"]:
            row = (f"| {x['look']} | {x['seeds']} | {number(name, x['estimate'])} | [{number(name, x['low'])}, "
                   f"{number(name, x['high'])}] | {x['statistic']:.2f} | {x['hold_bound']:.2f} | "
                   f"{-x['fail_bound']:.2f} | {x['fraction']:.3f} |")
            assert row in text, (variant, name, row)
    hold = tests[("linA", "attn_alone")]["looks"][-1]
    assert (f"**holds**: crossed the hold boundary at look 2 (6 seeds: T = {hold['statistic']:.2f} ≥ "
            f"{hold['hold_bound']:.2f}) (before the cap: its estimate is biased away from the threshold). "
            "Seeds used: 0-5") in block(section, "linA", "attn_alone")
    assert ("**undecided within the cap**: reached the cap at look 3 (9 seeds) without crossing a boundary. Seeds "
            "used: 0-8") in block(section, "linA", "attn_on_top")
    futile = tests[("linB", "attn_on_top")]["looks"][-1]
    assert futile["power"] < 0.1
    assert (f"**undecided within the cap**: stopped for futility at look 2 (6 seeds: conditional power at the cap "
            f"{futile['power']:.2f} < 0.1). Seeds used: 0-5") in block(section, "linB", "attn_on_top")
    failed = tests[("linA", "mlp_on_top")]["looks"][-1]
    assert (f"**fails**: crossed the fail boundary at look 1 (3 seeds: T = {failed['statistic']:.2f} ≤ "
            f"{-failed['fail_bound']:.2f})") in block(section, "linA", "mlp_on_top")
    assert ("**undecided when the sequence ended**: undecided at look 1 (3 seeds), and no later look added seeds "
            "for it (its claim in this cell: fails). Seeds used: 0-2") in block(section, "linB", "mlp_alone")


def test_jobs_and_cpu_hours_against_a_fixed_design_at_the_cap(sequential_report):
    _, _, report, _ = sequential_report
    section = decisions_of((report / "README.md").read_text())
    # So far: 9 teachers (seeds 0-8), 2 x 3 distillations, 42 + 24 + 9 students, 3 references; at the cap (9
    # seeds, every role): 9 teachers, 2 x 9 distillations, 2 x 7 x 9 students, 9 references.
    spent = {"teacher": 9, "distill": 6, "student": 75, "reference": 3}
    fixed = {"teacher": 9, "distill": 18, "student": 126, "reference": 9}
    # CPU-hours: jobs x CPU[kind] / 3600 (three significant digits below an hour).
    for row in ("| teacher | 9 | 9 | 0.9 | 0.1 | 9 | 0.9 |", "| distill | 6 | 6 | 0.3 | 0.05 | 18 | 0.9 |",
                "| student | 75 | 75 | 1.50 | 0.02 | 126 | 2.52 |", "| reference | 3 | 3 | 0.075 | 0.025 | 9 | 0.225 |",
                "| total | 93 | 93 | 2.77 | | 162 | 4.54 |"):
        assert row in section, row
    cpu_spent, cpu_fixed = (sum(n[k] * CPU[k] for k in CPU) for n in (spent, fixed))
    jobs_saving = 100 * (1 - sum(spent.values()) / sum(fixed.values()))
    assert f"Jobs: 93 so far against 162 for the fixed design, a saving of {jobs_saving:.0f}%." in section
    assert (f"CPU-hours: {cpu_spent / 3600:,.2f} so far against {cpu_fixed / 3600:,.2f} for the fixed design, a saving "
            f"of {100 * (1 - cpu_spent / cpu_fixed):.0f}%.") in section
    assert "GPU-hours: not recorded" in section


def test_gpu_hours_where_the_benchmark_files_have_them(tmp_path):
    config = {**SEQ, "added_seeds": added_seeds(3)}
    results, _ = build(tmp_path, config, state=False)
    for job in jobs(config, results):  # one GPU second per teacher job, none elsewhere
        if job.benchmark and job.rule.startswith("teacher"):
            Path(job.benchmark).write_text("s\tcpu_time\tgpu_time\n2.0\t1.0\t1.0\n")
    runs, _ = collect(config, results)
    verdicts = evaluate_claims(runs, config, load_predictions(runs))
    d = evaluate(config, verdicts, benchmark_jobs(config, results), results)
    assert d.spending.gpu_s == pytest.approx(9.0) and d.spending.gpu_fixed_s == pytest.approx(9.0)
    assert d.looks_run is None  # no state file: the section says the looks were not run by the driver


def test_the_claim_tests_figure_and_the_intervals_phrase(sequential_report, fixed_report):
    _, _, report, written = sequential_report
    readme = (report / "README.md").read_text()
    for fmt in ("png", "svg"):
        assert report / "figures" / f"claim_tests.{fmt}" in written
    assert (report / "figures" / "claim_tests.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](figures/claim_tests.png)" in readme and "the stopping look ringed" in readme
    assert ("Intervals over the seeds of each look (3 to 9, a sequential plan), each with its own teacher, and the "
            "test images.") in readme
    _, fixed, written = fixed_report
    assert fixed / "figures" / "claim_tests.svg" in written
    assert b"<svg" in (fixed / "figures" / "claim_tests.svg").read_bytes()[:2000]
    assert "](figures/claim_tests.png)" in (fixed / "README.md").read_text()


def test_a_fixed_design_has_no_decisions_section(fixed_report):
    _, report, _ = fixed_report
    readme = (report / "README.md").read_text()
    assert "## Decisions" not in readme and "against a fixed design at the cap" not in readme
    assert "Intervals over 3 seeds, each with its own teacher, and the test images." in readme
    verdicts = json.loads((report / "claims.json").read_text())
    assert all(not t["looks"] and t["stopped"] == 0 for v in verdicts for c in v["cells"] for t in c["tests"])
    assert not any(math.isnan(t["estimate"]) for v in verdicts for c in v["cells"] for t in c["tests"]
                   if t["decides"] and t["outcome"] != "not evaluable")
