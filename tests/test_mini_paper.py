"""The mini paper's inputs (`linvit mini-paper-inputs`): RGB JPEG ImageFolders made from
Fashion-MNIST and digits, and a teacher pretrained by the harness and saved as a timm checkpoint that
loads back with the statistics it was trained on; and mini_paper.yaml plans every rule of the paper
grid. (The full mini grid takes about 25 minutes: the README gives its measured run.)"""

import json

import pytest
import yaml
from PIL import Image

from linvit.config import validate
from linvit.data.loader import read_manifest

from conftest import REPO, run
from test_workflow import job_counts, snakemake

MINI = yaml.safe_load((REPO / "workflow/config/mini_paper.yaml").read_text())


def relocated(tmp):
    """mini_paper.yaml with its inputs under tmp and a 3-step pretraining."""
    cfg = json.loads(json.dumps(MINI))
    for name in ("fashion32", "digits32"):
        cfg["datasets"][name]["path"] = str(tmp / "inputs" / name)
    cfg["teachers"]["fashion_vit"]["file"] = str(tmp / "inputs/fashion_vit/model.safetensors")
    cfg["teacher"]["train"] = {"steps": 3, "batch_size": 32, "lr": 1e-3, "eval_samples": 64}
    return validate(cfg)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mini")
    cfg = relocated(tmp)
    (tmp / "mini.yaml").write_text(yaml.safe_dump(cfg))
    out = run(["linvit", "mini-paper-inputs", "--config", str(tmp / "mini.yaml")], cwd=tmp)
    return tmp, cfg, out.stdout + out.stderr


def test_imagefolders_are_rgb_jpeg_at_32px(inputs):
    tmp, cfg, _ = inputs
    for name, classes, train, test in (("fashion32", 10, 500, 100), ("digits32", 10, 130, 30)):
        root = tmp / "inputs" / name
        folders = sorted(p.name for p in (root / "train").iterdir())
        assert len(folders) == classes
        files = list((root / "train" / folders[0]).iterdir())
        assert len(files) == train and len(list((root / "test" / folders[0]).iterdir())) == test
        with Image.open(files[0]) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and im.size == (32, 32)


def test_teacher_file_loads_as_timm_checkpoint_with_its_training_statistics(inputs):
    tmp, cfg, out = inputs
    from linvit.teachers import load_pretrained

    entry = cfg["teachers"]["fashion_vit"]
    assert (tmp / "inputs/fashion_vit/config.json").exists()
    model, arch = load_pretrained(entry["model"], file=entry["file"], model_args=entry["model_args"])
    assert arch["img_size"] == [32, 32] and arch["num_classes"] == 10 and arch["in_chans"] == 3
    assert model.embed_dim == 64 and len(model.blocks) == 4
    # Pretrained on fashion32's shards: normalized by their statistics, which the file now carries.
    from linvit.steps import run_shards

    run_shards(cfg, "fashion32", tmp / "again", workers=1)  # the teacher's were in a temporary folder
    info = read_manifest(tmp / "again/_info.json")
    assert arch["pretrained_cfg"]["mean"] == pytest.approx(info["mean"])
    assert arch["pretrained_cfg"]["std"] == pytest.approx(info["std"])
    assert "test accuracy" in out


def test_mini_paper_plans_every_rule_of_the_paper_path(inputs):
    tmp, cfg, _ = inputs
    out = snakemake(tmp, "-n", "--cores", "2", "--configfile", str(tmp / "mini.yaml"))
    counts = job_counts(out.stdout)
    assert counts["teacher_pretrained"] == 1 and "teacher" not in counts
    assert counts["shards"] == 2 and counts["distill"] == 8 and counts["reference"] == 2
    assert counts["student"] == 32 and "evaluate" not in counts  # each training job evaluates its model


def test_inputs_are_made_once(inputs):
    tmp, cfg, _ = inputs
    before = (tmp / "inputs/fashion_vit/model.safetensors").stat().st_mtime_ns
    run(["linvit", "mini-paper-inputs", "--config", str(tmp / "mini.yaml")], cwd=tmp)
    assert (tmp / "inputs/fashion_vit/model.safetensors").stat().st_mtime_ns == before
