"""`linvit convert` end to end on real (tiny) data: synthetic shards, a micro teacher trained here, a
conversion with tiny budgets; the exported checkpoint loads through timm exactly as the summary says and
scores on the test split exactly what the summary reports; a rerun skips finished steps; a teacher file
whose labels are not the target's is compared with the softmax reference; mistakes are one line
before anything runs."""

import json

import pytest
import timm
import torch
import yaml

from linvit import inputs
from linvit.convert import main
from linvit.data.loader import ShardSet, read_manifest
from linvit.data.shards import MANIFEST
from linvit.evaluate import accuracy
from linvit.steps import load_model, run_shards, run_teacher
from linvit.teachers import save_timm_checkpoint

from conftest import REPO

SMOKE = REPO / "workflow" / "config" / "smoke.yaml"
FAST = ["--config", str(SMOKE), "--distill-steps", "2", "--steps", "3", "--threads", "1", "--device", "cpu",
        "--bench-batch", "4", "--bench-seconds", "0.01"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Shards of the smoke config's synthetic dataset and a micro teacher trained on them (12 steps)."""
    tmp = tmp_path_factory.mktemp("convert")
    config = yaml.safe_load(SMOKE.read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_shards(config, "synthetic", tmp / "shards", workers=1)
        run_teacher(config, "micro", 0, tmp / "shards", tmp / "teacher")
    finally:
        torch.set_num_threads(threads)
    return tmp


def convert(capsys, *argv):
    code = main([*argv, *FAST])
    out, err = capsys.readouterr()
    return code, out, err


def load_as_summarized(summary):
    """The converted model built by running the code the summary prints, as a user would."""
    scope = {}
    exec(summary["timm"]["code"], scope)
    return scope["model"].eval()


def test_convert_a_teacher_folder_then_rerun(made, capsys, quiet_machine):
    out = made / "out"
    code, stdout, err = convert(capsys, "--teacher", str(made / "teacher"), "--variant", "elu",
                                "--shards", str(made / "shards"), "--out", str(out))
    assert code == 0, err
    stages = [line for line in stdout.splitlines() if line.startswith("[")]
    assert [s.split(":")[0] for s in stages] == ["[1/4] teacher", "[2/4] distill", "[3/4] student", "[4/4] evaluate"]
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "summary.md").read_text().startswith("# Conversion: linvit_micro_softmax -> linvit_micro_elu")

    # The checkpoint loads through timm exactly as printed, and equals the trained student.
    assert summary["timm"]["code"].splitlines()[1] in stdout
    model = load_as_summarized(summary)
    assert model.pretrained_cfg["file"] == str(out / "model.safetensors")
    student, _ = load_model(out / "student")
    for key, value in student.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    again = timm.create_model(summary["timm"]["model_name"], **summary["timm"]["kwargs"])
    assert torch.equal(again.head.weight, model.head.weight)

    # Its accuracy on the test split is exactly the reported one; so is the teacher's.
    data = ShardSet(made / "shards")
    acc = summary["accuracy"]
    assert accuracy(model, data)["test_acc"] == acc["converted"]
    teacher, _ = load_model(made / "teacher")
    assert acc["baseline"] == "teacher" and acc["same_labels"]
    assert accuracy(teacher, data)["test_acc"] == acc["baseline_acc"] == acc["teacher"]
    assert acc["samples"] == data.num_samples("test")

    # What was copied, distilled and trained, and the speed figures.
    copied = summary["copied"]
    assert copied["strategy_groups"] == ["embed", "mlp", "norm", "head"] and copied["head_copied"]
    assert copied["groups"]["attn"] == 0 and copied["groups"]["mlp"] > 0
    assert copied["params"] == sum(copied["groups"].values()) < copied["of_params"]
    assert summary["distilled"]["steps"] == 2 and summary["distilled"]["design"] == summary["student"]["design"]
    assert summary["trained"]["steps"] == 3
    rows = summary["speed"]
    assert {(r["model"], r["resolution"], r["batch"]) for r in rows} == {
        (m, res, b) for m in ("baseline", "converted") for res in ("native", "4x_tokens") for b in (1, 4)}
    for r in rows:
        assert r["ms_per_image"] > 0 and r["peak_mib"] is not None and r["peak_mib"] >= 0, r
        assert r["tokens"] == (49 if r["resolution"] == "native" else 196)
    assert "clear_refs" in summary["memory_method"] and summary["device"].startswith("cpu")

    # A rerun skips every finished step and reports the same.
    stamp = (out / "student" / "model.safetensors").stat().st_mtime_ns
    code, stdout, err = convert(capsys, "--teacher", str(made / "teacher"), "--variant", "elu",
                                "--shards", str(made / "shards"), "--out", str(out))
    assert code == 0, err
    assert all("skipped" in line for line in stdout.splitlines() if line.startswith(("[2/", "[3/", "[4/")))
    assert "step 1/" not in err
    assert (out / "student" / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((out / "summary.json").read_text())["accuracy"] == acc

    # Another --bench-batch measures again: only the evaluation runs, the trained steps are kept.
    code = main(["--teacher", str(made / "teacher"), "--variant", "elu", "--shards", str(made / "shards"),
                 "--out", str(out), *FAST[:-4], "--bench-batch", "2", "--bench-seconds", "0.01"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "[4/4] evaluate" in stdout and "again: bench_batch changed" in stdout
    assert all("skipped" in line for line in stdout.splitlines() if line.startswith(("[2/", "[3/")))
    assert {r["batch"] for r in json.loads((out / "summary.json").read_text())["speed"]} == {1, 2}
    assert (out / "student" / "model.safetensors").stat().st_mtime_ns == stamp

    # Other settings into the same folder: refused, naming the folder, before anything runs.
    code = main(["--teacher", str(made / "teacher"), "--variant", "elu", "--shards", str(made / "shards"),
                 "--out", str(out), *FAST[:4], "--steps", "5"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert str(out) in err and "other settings (steps: 3, now 5)" in err
    assert (out / "student" / "model.safetensors").stat().st_mtime_ns == stamp


def test_convert_a_teacher_file_against_the_softmax_reference(made, capsys, quiet_machine):
    """A weights file (timm's layout, its architecture named by the config.json beside it) on a target
    it was not trained for: the teacher's head does not apply, so the reference is trained and compared."""
    teacher, arch = load_model(made / "teacher")
    save_timm_checkpoint(teacher, arch, made / "file")
    out = made / "out_file"
    code, stdout, err = convert(capsys, "--teacher", str(made / "file" / "model.safetensors"), "--variant",
                                "focused", "--init", "copy_mlp", "--shards", str(made / "shards"), "--out", str(out))
    assert code == 0, err
    stages = [line.split(":")[0] for line in stdout.splitlines() if line.startswith("[")]
    assert stages == ["[1/4] teacher", "[2/4] reference", "[3/4] student", "[4/4] evaluate"]
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["accuracy"]
    assert acc["baseline"] == "reference" and acc["teacher"] is None and not acc["same_labels"]
    assert any(line.startswith("converted ") and "reference" in line and "head does not apply" in line
               for line in stdout.splitlines())
    assert summary["distilled"] is None and not summary["copied"]["head_copied"]
    # A loaded teacher's inputs go through timm's transforms: read the split as the steps did.
    teacher_arch = json.loads((out / "teacher" / "model.json").read_text())
    data = ShardSet(made / "shards", pipeline=inputs.pipeline({}, teacher_arch, read_manifest(made / "shards" / MANIFEST)))
    assert accuracy(load_as_summarized(summary), data)["test_acc"] == acc["converted"]
    reference, _ = load_model(out / "reference")
    assert accuracy(reference, data)["test_acc"] == acc["baseline_acc"]
    # focused's operator parameters follow the patch grid: at 4x the tokens it is timed as rebuilt.
    big = [r for r in summary["speed"] if r["model"] == "converted" and r["resolution"] == "4x_tokens"]
    assert big and all("fresh weights" in r["note"] and r["ms_per_image"] > 0 for r in big)


@pytest.mark.parametrize("teacher,extra,words", [
    ("teacher", ["--size", "mini"],
     ["embed dim 64, depth 4, 4 heads, patch 4", "linvit_mini_elu", "embed dim 128, depth 6, 4 heads, patch 4"]),
    # A micro file named as timm's vit_tiny (width 192) without its options: its tensors do not fit.
    ("file/model.safetensors", ["--model", "vit_tiny_patch16_224", "--size", "micro"],
     ["model.safetensors does not fit timm model 'vit_tiny_patch16_224'", "'cls_token' is (1, 1, 64) in the file"]),
    ("missing/weights.safetensors", [], ["missing/weights.safetensors", "does not exist"]),
    ("no_such_timm_model", [], ["'no_such_timm_model'", "does not exist"]),
    ("shards", [], ["has no model.json"]),
])
def test_mistakes_are_one_line_before_anything_runs(made, capsys, teacher, extra, words):
    if teacher.startswith("file/") and not (made / "file").exists():
        model, arch = load_model(made / "teacher")
        save_timm_checkpoint(model, arch, made / "file")
    path = teacher if teacher == "no_such_timm_model" else str(made / teacher)
    out = made / f"refused_{teacher.replace('/', '_')}"
    code, stdout, err = convert(capsys, "--teacher", path, "--variant", "elu", *extra,
                                "--shards", str(made / "shards"), "--out", str(out))
    assert code == 1 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("linvit convert: error: "), err
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()  # nothing was made, nothing ran


def test_convert_a_grayscale_teacher_file(made, capsys, quiet_machine):
    """A one-channel weights file of a timm ViT whose architecture defaults to three channels: the
    fit check takes its channels from the file (as the `teachers:` loader does), so it converts."""
    from safetensors.torch import save_file

    shape = {"embed_dim": 64, "depth": 4, "num_heads": 4, "patch_size": 4}  # micro's shape
    torch.manual_seed(0)
    gray = timm.create_model("vit_tiny_patch16_224", **shape, img_size=28, in_chans=1, num_classes=4)
    (made / "gray").mkdir(exist_ok=True)
    save_file(gray.state_dict(), str(made / "gray" / "vit.safetensors"))
    for args in ({**shape, "img_size": 28, "in_chans": 1}, {**shape, "img_size": 28}):  # in_chans given, or not
        out = made / f"out_gray_{len(args)}"
        code, stdout, err = convert(capsys, "--teacher", str(made / "gray" / "vit.safetensors"),
                                    "--model", "vit_tiny_patch16_224", "--model-args", json.dumps(args),
                                    "--variant", "elu", "--init", "copy_mlp", "--shards", str(made / "shards"),
                                    "--out", str(out))
        assert code == 0, err
        assert json.loads((out / "teacher" / "model.json").read_text())["in_chans"] == 1
        assert json.loads((out / "summary.json").read_text())["accuracy"]["converted"] is not None


def test_a_teacher_file_that_does_not_fit_writes_nothing_so_the_fixed_file_converts(made, capsys, quiet_machine):
    """Its keys are checked before --out is written: a file missing a tensor is one line and leaves no
    request.json behind, so the rerun with the fixed file and the same --out converts (it was refused as
    "a conversion made with other settings")."""
    from safetensors.torch import save_file

    shape = {"embed_dim": 64, "depth": 4, "num_heads": 4, "patch_size": 4}  # micro's shape
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", **shape, img_size=28, in_chans=1, num_classes=4)
    file, out = made / "unfit" / "vit.safetensors", made / "out_unfit"
    file.parent.mkdir(exist_ok=True)
    state = vit.state_dict()
    save_file({k: v for k, v in state.items() if k != "norm.weight"}, str(file))
    argv = ["--teacher", str(file), "--model", "vit_tiny_patch16_224", "--model-args",
            json.dumps({**shape, "img_size": 28, "in_chans": 1}), "--variant", "elu", "--init", "copy_mlp",
            "--shards", str(made / "shards"), "--out", str(out)]
    code, stdout, err = convert(capsys, *argv)
    assert code == 1 and stdout == "" and err.strip() == (
        f"linvit convert: error: weights file {file} does not fit timm model 'vit_tiny_patch16_224': missing 'norm.weight'")
    assert not out.exists()
    save_file(state, str(file))
    code, stdout, err = convert(capsys, *argv)
    assert code == 0, err
