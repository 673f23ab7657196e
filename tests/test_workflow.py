"""The Snakemake workflow: planning the default grid, refusing bad configs, and the smoke grid end to end."""

import re
import shutil

import pandas as pd
import pytest
import yaml

from linvit.attention import available_variants

from conftest import REPO, run

SNAKEFILE = str(REPO / "Snakefile")


def snakemake(tmp, *args, check=True):
    return run(["snakemake", "-s", SNAKEFILE, "--directory", str(tmp), *args], cwd=tmp, check=check)


def job_counts(output: str) -> dict[str, int]:
    counts = {}
    for line in output.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


def test_dry_run_plans_one_student_job_per_cell(tmp_path):
    out = snakemake(tmp_path, "-n", "--cores", "2")
    counts = job_counts(out.stdout)
    # 2 datasets x 1 size x 3 variants x 8 inits x 1 seed
    assert counts["student"] == 48
    assert counts["reference"] == 2 and counts["teacher"] == 1 and counts["shards"] == 2
    assert counts["distill"] == 2 * 3  # shared by the two distilling strategies
    assert counts["evaluate"] == 50
    assert not (tmp_path / "results").exists()


def test_unknown_variant_fails_before_any_job(tmp_path):
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    config["variants"] = ["nope"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "--cores", "1", "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert out.returncode != 0
    known = ", ".join(available_variants())
    assert f"config key variants: unknown variant 'nope'; known variants: {known}" in out.stdout + out.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_smoke_grid_end_to_end(tmp_path):
    before = sorted(p.name for p in (REPO / "report").iterdir()) if (REPO / "report").exists() else []
    snakemake(tmp_path, "--cores", "2", "--configfile", str(REPO / "workflow/config/smoke.yaml"))
    runs = pd.read_csv(tmp_path / "results/runs.csv")
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    expected = len(config["targets"]) * (len(config["variants"]) * len(config["inits"]) + 1)
    assert len(runs) == expected and (runs["status"] == "ok").all()
    assert runs["test_acc"].between(0, 1).all() and runs["fidelity_kl_mean"].notna().all()
    assert (runs["params"] > 0).all() and (runs["throughput_img_s"] > 0).all()
    readme = (tmp_path / "report/README.md").read_text()
    for claim in ("C1", "C2", "C3", "C4"):
        assert claim in readme
    for fig in ("accuracy_by_init.png", "training_curves.png"):
        assert (tmp_path / "report/figures" / fig).stat().st_size > 1000
    # A second run has nothing to do.
    again = snakemake(tmp_path, "--cores", "2", "--configfile", str(REPO / "workflow/config/smoke.yaml"))
    assert "Nothing to be done" in again.stdout + again.stderr
    # The report regenerates from results/ alone, without training anything.
    shutil.rmtree(tmp_path / "report")
    regen = snakemake(tmp_path, "report_from_results", "--cores", "1",
                      "--configfile", str(REPO / "workflow/config/smoke.yaml"))
    counts = job_counts(regen.stdout + regen.stderr)
    assert counts.get("report_from_results") == 1 and "student" not in counts and "teacher" not in counts
    assert (tmp_path / "report/README.md").read_text() == readme
    # The repository's own report/ is never touched by tests.
    after = sorted(p.name for p in (REPO / "report").iterdir()) if (REPO / "report").exists() else []
    assert before == after
