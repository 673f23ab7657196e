"""Pretrained teachers through the whole workflow: a DeiT and a ViT with register tokens and layer
scale, saved to timm-format files, loaded as teachers, and carried through teacher -> distill ->
student -> evaluate -> report on RGB JPEG ImageFolders at another resolution and label space; the
register ViT as two checkpoints listed as replicates, one per seed; and datasets that cannot fit a
teacher refused in one line before any training."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

from linvit import grid
from linvit.io import file_sha256
from linvit.models import model_variant

from conftest import REPO
from test_workflow import job_counts, snakemake

SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
REG_ARGS = {"embed_dim": 64, "depth": 2, "num_heads": 2, "reg_tokens": 4, "init_values": 1e-5,
            "no_embed_class": True, "img_size": 64}


def imagefolder(root, classes=3, per_class=(12, 6), size=40, seed=0):
    """An ImageFolder of RGB JPEGs: class c is a bright square at its own spot, plus noise."""
    rng = np.random.default_rng(seed)
    for split, n in zip(("train", "val"), per_class):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
                x = 4 + 10 * c
                img[8:20, x:x + 10] = 220
                Image.fromarray(img).save(folder / f"{i}.jpg", quality=90)
    return root


def teacher_files(tmp):
    torch.manual_seed(0)
    deit = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    save_file(deit.state_dict(), str(tmp / "deit.safetensors"))
    reg = timm.create_model("vit_base_patch16_224", pretrained=False, **REG_ARGS)
    torch.save(reg.state_dict(), tmp / "regvit.pth")
    torch.manual_seed(1)  # a second checkpoint of the same architecture: another replicate
    save_file(timm.create_model("vit_base_patch16_224", pretrained=False, **REG_ARGS).state_dict(),
              str(tmp / "regvit1.safetensors"))
    return deit, reg


def config(tmp):
    cfg = {k: SMOKE[k] for k in ("seeds", "student", "distill", "distill_designs", "init_strategies", "evaluation")}
    cfg.update(
        sizes=["deit", "regvit"], variants=["elu"], targets=["jpegs"], seeds=[0, 1],
        inits=["random", "copy_all", "copy_mlp_distill"],
        teachers={"deit": {"model": "deit_tiny_patch16_224", "file": str(tmp / "deit.safetensors")},
                  "regvit": {"model": "vit_base_patch16_224", "model_args": REG_ARGS,
                             "replicates": [{"file": str(tmp / "regvit.pth")},
                                            {"file": str(tmp / "regvit1.safetensors")}]}},
        datasets={"jpegs": {"source": "imagefolder", "path": str(imagefolder(tmp / "jpegs")),
                            "transform": {"input_size": 32, "train": {"scale": [0.5, 1.0]},
                                          "mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}}}},
        shards={"samples_per_shard": 20, "seed": 0},
        student={"train": {"steps": 3, "batch_size": 8, "lr": 1e-3, "eval_samples": 8}},
        distill={"loss": "mse", "train": {"steps": 2, "batch_size": 8, "lr": 1e-3}},
        evaluation={"fidelity_samples": 4, "throughput_batch": 4},
    )
    return cfg


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pretrained")
    teacher_files(tmp)
    cfg = config(tmp)
    (tmp / "grid.yaml").write_text(yaml.safe_dump(cfg))
    out = snakemake(tmp, "--cores", "2", "--configfile", str(tmp / "grid.yaml"))
    return tmp, cfg, out.stdout + out.stderr


def test_file_teachers_run_through_every_rule(ran):
    tmp, cfg, out = ran
    counts = job_counts(out)
    assert counts["teacher_pretrained"] == 1 and counts["teacher_replicate"] == 2 and "teacher" not in counts
    # linvit.grid.jobs (what `linvit status` follows) names these jobs and the files they wrote.
    jobs = grid.jobs(cfg, tmp / "results", tmp / "report")
    assert {j.name for j in jobs if j.rule.startswith("teacher")} == {
        "teacher_pretrained deit", "teacher_replicate regvit/seed0", "teacher_replicate regvit/seed1"}
    assert all(Path(f).exists() for j in jobs for f in (*j.outputs, j.log, *([j.benchmark] if j.benchmark else [])))
    assert counts["student"] == len(grid.student_cells(cfg)) and "evaluate" not in counts
    assert (tmp / "report/README.md").exists()
    for cell in grid.all_cells(cfg):
        ev = json.loads((tmp / cell.run_dir() / "eval.json").read_text())
        assert 0 <= ev["test_acc"] <= 1 and len(ev["fidelity_kl"]) == (12 if cell.size == "deit" else 2)


def test_students_follow_the_teacher_architecture(ran):
    """The student is the teacher's architecture at the dataset's 32 px with a 3-class head: the
    register tokens, layer scale and the DeiT's 12 blocks of width 192 carry over."""
    tmp, cfg, _ = ran
    from linvit.steps import load_model

    for size, blocks, width, prefix in (("deit", 12, 192, 1), ("regvit", 2, 64, 5)):
        run = grid.run_dir("jpegs", size, "elu", "copy_all", 0, "none", 3, tmp / "results")
        student, arch = load_model(run)
        assert model_variant(student) == "elu" and len(student.blocks) == blocks
        assert student.embed_dim == width and student.num_prefix_tokens == prefix
        assert student.head.out_features == 3 and tuple(student.patch_embed.img_size) == (32, 32)
        teacher = json.loads((tmp / grid.teacher_of(cfg, size, 0) / "model.json").read_text())
        assert teacher["source"] == "file" and teacher["timm_model"] in ("deit_tiny_patch16_224", "vit_base_patch16_224")
    reg, _ = load_model(grid.run_dir("jpegs", "regvit", "elu", "copy_all", 0, "none", 3, tmp / "results"))
    assert reg.reg_token.shape[1] == 4 and reg.blocks[0].ls1.gamma.shape == (64,)


def test_copied_groups_are_the_teachers_resampled(ran):
    """copy_all starts from the teacher's MLP weights, and from its position embedding resampled
    from 14x14 (224 px) to the 2x2 patches of 32 px."""
    tmp, _, _ = ran
    from linvit.steps import load_model

    metrics = json.loads((tmp / grid.run_dir("jpegs", "deit", "elu", "copy_all", 0, "none", 3) / "metrics.json")
                         .read_text())
    assert metrics["copied"]["mlp"] > 0 and metrics["copied"]["head"] == 0  # another label space: new head
    teacher, _ = load_model(tmp / "results/teacher/deit", what="teacher")
    assert teacher.pos_embed.shape[1] == 1 + 14 * 14


def test_replicated_checkpoints_give_each_seed_its_own_teacher(ran):
    """teachers.regvit.replicates: seed s's teacher folder holds checkpoint s, and seed s's distillation,
    students and reference copy from it (the sha256 of the teacher weights their fingerprint records);
    the report says the intervals are over the checkpoints, the single DeiT's "for this checkpoint"."""
    tmp, cfg, _ = ran
    weights = {}
    for seed, file in enumerate(("regvit.pth", "regvit1.safetensors")):
        folder = tmp / grid.teacher_of(cfg, "regvit", seed)
        assert folder == tmp / "results/teacher/regvit" / f"seed{seed}"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["seed"] == seed and metrics["file"] == str(tmp / file)
        weights[seed] = file_sha256(folder / "model.safetensors")
    assert weights[0] != weights[1]
    cells = [c for c in grid.all_cells(cfg) if c.size == "regvit" and c.init != "random"]
    assert {c.seed for c in cells} == {0, 1}
    for cell in cells:
        folders = [cell.run_dir()] + ([grid.distill_dir(cell.dataset, cell.size, cell.variant, cell.init,
                                                        cell.design, cell.seed)] if cell.distills else [])
        for folder in folders:
            fingerprint = json.loads((tmp / folder / "config.json").read_text())["fingerprint"]
            assert fingerprint["teacher_weights"] == weights[cell.seed], folder
    claims = json.loads((tmp / "report/claims.json").read_text())
    over = {v["intervals"] for v in claims}
    assert len(over) == 1 and "regvit: over 2 seeds, each with its own checkpoint of vit_base_patch16_224" in next(
        iter(over)) and "deit: over 2 seeds and the test images, for this checkpoint" in next(iter(over))
    scale = (tmp / "report/README.md").read_text()
    assert ("its 2 softmax teachers are pretrained checkpoints of `vit_base_patch16_224`, one per seed "
            "(`teachers.regvit.replicates`)") in scale
    assert "its softmax teacher is the pretrained checkpoint `deit_tiny_patch16_224`" in scale


def test_a_new_replicate_reruns_only_its_seed(ran, tmp_path):
    """Replacing one replicate's checkpoint plans that seed's teacher and the jobs that copy from it again,
    and nothing of the other seed's (each replicate's job reads its own entry, not the list)."""
    tmp, cfg, _ = ran
    torch.manual_seed(2)
    save_file(timm.create_model("vit_base_patch16_224", pretrained=False, **REG_ARGS).state_dict(),
              str(tmp / "regvit2.safetensors"))
    changed = json.loads(json.dumps(cfg))
    changed["teachers"]["regvit"]["replicates"][1] = {"file": str(tmp / "regvit2.safetensors")}
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    out = snakemake(tmp, "-n", "--cores", "2", "--configfile", str(tmp_path / "changed.yaml"))
    planned = set(re.findall(r"^\s+log: (\S+)", out.stdout, re.M))
    assert grid.log_path("teacher", "regvit/seed1") in planned
    assert not any("regvit/seed0" in log or "/deit/" in log or log.endswith("deit.log") for log in planned), planned
    students = {c for c in grid.all_cells(cfg) if c.size == "regvit" and c.seed == 1 and c.init != "random"}
    assert {str(c.log_path()) for c in students} <= planned


def test_a_replicate_file_replaced_by_an_older_copy_reruns_its_teacher(ran, tmp_path):
    """The teacher folder records the file it was built from (resolved path, size, mtime in config.json;
    sha256 in model.json), and its job's params hold them: a checkpoint replaced by another file with an
    older mtime, which Snakemake's own mtime check misses, plans that seed's teacher again."""
    tmp, cfg, _ = ran
    folder = tmp / grid.teacher_of(cfg, "regvit", 1)
    record = json.loads((folder / "config.json").read_text())["config"]["teacher_file"]
    file = tmp / "regvit1.safetensors"
    assert record["path"] == str(file.resolve()) and record["size"] == file.stat().st_size
    assert json.loads((folder / "model.json").read_text())["sha256"] == file_sha256(file)
    kept, stat = file.read_bytes(), file.stat()
    try:
        torch.manual_seed(3)
        save_file(timm.create_model("vit_base_patch16_224", pretrained=False, **REG_ARGS).state_dict(), str(file))
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))  # older than every output
        out = snakemake(tmp, "-n", "--cores", "2", "--configfile", str(tmp / "grid.yaml"))
        planned = set(re.findall(r"^\s+log: (\S+)", out.stdout, re.M))
        assert grid.log_path("teacher", "regvit/seed1") in planned, out.stdout[-2000:]
        assert grid.log_path("teacher", "regvit/seed0") not in planned
    finally:
        file.write_bytes(kept)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_missing_replicate_file_stops_the_workflow_before_any_job(ran, tmp_path):
    """A replicate naming a file that does not exist, where an earlier config built every teacher folder:
    the workflow refuses in one line naming the key (Snakemake alone plans no teacher job and lets the
    students read the folder the earlier file made)."""
    tmp, cfg, _ = ran
    changed = json.loads(json.dumps(cfg))
    changed["teachers"]["regvit"]["replicates"][1] = {"file": str(tmp / "gone.safetensors")}
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    out = snakemake(tmp, "-n", "--cores", "2", "--configfile", str(tmp_path / "changed.yaml"), check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Job stats" not in text
    key = f"config key teachers.regvit.replicates[1].file: {tmp / 'gone.safetensors'} does not exist"
    assert len([line for line in text.splitlines() if key in line]) == 1, text


def test_a_student_refuses_a_teacher_folder_its_file_no_longer_matches(ran, tmp_path):
    """The folder records the file it was built from: a distillation reading it after the file was replaced
    by other weights, or removed, is one line naming both (run by hand, or by Snakemake, which plans no
    teacher job for a missing file); a file only touched still matches (its sha256 is model.json's)."""
    from linvit.device import cpu_runtime
    from linvit.steps import run_distill
    from linvit.teachers import TeacherError, check_built_from

    tmp, cfg, _ = ran
    folder, file = tmp / grid.teacher_of(cfg, "deit", 0), tmp / "deit.safetensors"
    arch = json.loads((folder / "model.json").read_text())
    distill = lambda: run_distill(cfg, "jpegs", "deit", "elu", "copy_mlp_distill", "mse", 0, folder,
                                  tmp / grid.shards_dir("jpegs"), tmp_path / "out", runtime=cpu_runtime())
    kept, stat = file.read_bytes(), file.stat()
    try:
        os.utime(file)
        check_built_from(folder, arch)
        torch.manual_seed(5)
        save_file(timm.create_model("deit_tiny_patch16_224", pretrained=False).state_dict(), str(file))
        with pytest.raises(TeacherError, match=f"^teacher folder {re.escape(str(folder))} was built from another "
                                               f"version of {re.escape(str(file))} "):
            distill()
        file.unlink()
        with pytest.raises(TeacherError, match=f"was built from {re.escape(str(file))}, which no longer exists"):
            distill()
        assert not (tmp_path / "out" / "metrics.json").exists()
    finally:
        file.write_bytes(kept)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _run_step(tmp, cfg, dataset_spec, size="deit"):
    from linvit.device import cpu_runtime
    from linvit.steps import run_distill

    cfg = {**cfg, "datasets": {**cfg["datasets"], "bad": dataset_spec}}
    from linvit.steps import run_shards

    run_shards(cfg, "bad", tmp / "bad_shards", workers=1)
    return lambda: run_distill(cfg, "bad", size, "elu", "copy_mlp_distill", "mse", 0, tmp / "results/teacher" / size,
                               tmp / "bad_shards", tmp / "bad_out", runtime=cpu_runtime())


@pytest.mark.parametrize("spec, message", [
    ({"transform": {"input_size": 40}}, r"40.*patch.*16"),
    ({"channels": 1, "transform": {"input_size": 32}}, r"1 channel"),
    ({"labels": "teacher", "transform": {"input_size": 32}}, r"3 classes|1000"),
])
def test_a_dataset_that_does_not_fit_the_teacher_is_one_line(ran, spec, message):
    tmp, cfg, _ = ran
    step = _run_step(tmp, cfg, {"source": "imagefolder", "path": str(tmp / "jpegs"), **spec})
    with pytest.raises(ValueError, match=message) as err:
        step()
    text = str(err.value)
    assert "\n" not in text and "'bad'" in text and "deit" in text
    assert not (tmp / "bad_out" / "metrics.json").exists()
