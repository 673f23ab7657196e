"""The paper's grid (workflow/config/paper.yaml): planned by a dry run once the user gives the
datasets' folders, with every rule's resources scaled by teacher size; refused in one line without them."""

import re

import pytest
import yaml
from PIL import Image

from linvit import grid

from conftest import REPO
from test_workflow import job_blocks, job_counts, snakemake

PAPER = REPO / "workflow/config/paper.yaml"
CONFIG = yaml.safe_load(PAPER.read_text())


def tiny_imagefolder(root, classes=("a", "b"), split_dirs=("train", "val")):
    for split in split_dirs:
        for i, cls in enumerate(classes):
            folder = root / split / cls
            folder.mkdir(parents=True)
            Image.new("RGB", (40, 30), (40 * i, 100, 200)).save(folder / "0.JPEG", quality=90)
    return root


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper")
    paths = {name: {"path": str(tiny_imagefolder(tmp / name))} for name in CONFIG["datasets"]}
    (tmp / "paths.yaml").write_text(yaml.safe_dump({"datasets": paths}))
    out = snakemake(tmp, "-n", "--cores", "8", "--configfile", str(PAPER), str(tmp / "paths.yaml"))
    return out.stdout + out.stderr


def test_paper_grid_plans_every_cell(planned):
    students, references = grid.student_cells(CONFIG), grid.reference_cells(CONFIG)
    distilling = grid.distill_cells(CONFIG)
    counts = job_counts(planned)
    assert counts["teacher_pretrained"] == 3 and "teacher" not in counts  # loaded, none trained
    assert counts["shards"] == len(CONFIG["targets"])
    assert counts["student"] == len(students) == 3168
    assert counts["reference"] == len(references) == 36
    assert counts["distill"] == len(distilling) == 792  # per (target, size, variant, init, design, seed)
    assert "evaluate" not in counts  # each training job evaluates its model (eval.json)


def _resources(block: str) -> dict[str, str]:
    line = re.search(r"^\s*resources: (.+)$", block, re.M).group(1)
    return dict(item.strip().split("=", 1) for item in line.split(","))


def test_paper_grid_resources_scale_with_the_teacher(planned):
    """Each training job asks for a GPU, and its memory and time grow with the teacher's size by
    the factors paper.yaml gives (resources.scale)."""
    rules = {}
    for block in job_blocks(planned):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M).group(1)
        wildcards = re.search(r"^\s*wildcards: (.+)$", block, re.M)
        size = re.search(r"size=(\w+)", wildcards.group(1)).group(1) if wildcards and "size=" in wildcards.group(1) else None
        rules.setdefault((rule, size), _resources(block))
    res, scale = CONFIG["resources"], CONFIG["resources"]["scale"]
    for rule in ("student", "reference", "distill"):
        base = res["student" if rule == "reference" else rule]
        for size in CONFIG["sizes"]:
            got = rules[(rule, size)]
            assert int(got["gpu"]) == base["gpu"], (rule, size)
            assert int(got["mem_mb"]) == round(base["mem_mb"] * scale[size]["mem_mb"]), (rule, size)
            assert int(got["runtime"]) == round(base["runtime"] * scale[size]["runtime"]), (rule, size)


def test_paper_grid_without_dataset_paths_is_one_line(tmp_path):
    out = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(PAPER), check=False)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "config key datasets.imagenet.path" in text
    assert "Traceback" not in text


def test_paper_grid_is_grid_jobs(planned):
    """linvit.grid.jobs is the paper grid's plan, job by job (the dry run's inputs, outputs, logs, benchmarks)."""
    from test_workflow import assert_plan_is_grid_jobs

    assert_plan_is_grid_jobs(planned, CONFIG)
