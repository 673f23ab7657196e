"""The inputs of workflow/config/mini_paper.yaml, made from data available offline.

The paper starts from a downloaded checkpoint and real image folders; a machine without a network
has neither. This makes both, once, so the mini grid exercises exactly the paper's path:

1. JPEG ImageFolders (`train/<class>/*.jpg`, `test/<class>/*.jpg`, RGB) from Fashion-MNIST and
   scikit-learn's digits, resized, one per dataset of the config whose folder is missing.
2. The teacher file: the harness's own teacher step (linvit.steps.run_teacher, the config's
   `teacher:` section) pretrains a ViT on the teacher dataset's shards; the result is saved as a
   timm checkpoint (model.safetensors and timm's config.json) under the timm name and options the
   config's `teachers:` entry gives, so the grid loads it like any downloaded file.

Each part is skipped when its output exists; `linvit mini-paper-inputs` runs it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .config import get
from .io import read_json

# Where each dataset of mini_paper.yaml comes from: a source linvit.data.sources loads, and how many
# images per class go into each split (digits' stratified 80/20 split leaves 35 to 37 test images per class).
ORIGINS = {
    "fashion32": ({"source": "fashion_mnist"}, 500, 100),
    "digits32": ({"source": "digits"}, 130, 30),
}
IMAGE_SIZE = 32


def make_imagefolders(config: dict) -> list[Path]:
    """The ImageFolder of every dataset of the config that ORIGINS knows, where its `path` says."""
    from .data.images import make_imagefolder

    made = []
    for name, (source, train, test) in ORIGINS.items():
        spec = get(config, f"datasets.{name}")
        made.append(make_imagefolder(source, Path(spec["path"]), size=IMAGE_SIZE, per_class_train=train,
                                     per_class_test=test, seed=0, rgb=True))
        print(f"mini paper: {name} in {spec['path']}", file=sys.stderr)
    return made


def make_teacher_file(config: dict, size: str) -> Path:
    """Pretrain the teacher `size` of config.teachers on config.teacher.dataset and save it as the
    timm checkpoint file the entry names (the shards and the training run live in a temporary
    folder). Returns the file."""
    entry = get(config, f"teachers.{size}")
    target = Path(entry["file"])
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="linvit-mini-paper-") as work:
        return _pretrain(config, size, entry, Path(work), target)


def _pretrain(config: dict, size: str, entry: dict, work: Path, target: Path) -> Path:
    from .device import cpu_runtime
    from .steps import load_model, run_shards, run_teacher
    from .teachers import describe, save_timm_checkpoint

    dataset = get(config, "teacher.dataset")
    shards = work / "data" / dataset
    run_shards(config, dataset, shards)
    # The harness trains a size of linvit.sizes; the entry's timm builder with the same dimensions
    # names the same VisionTransformer, which is what the file says it holds.
    args = dict(entry.get("model_args", {}))
    trained = _size_with(args)
    folder = work / "teacher" / trained
    # One file, one teacher: the mini paper grid's verdicts are about this checkpoint.
    seed = config["teacher"].get("seed", 0)
    run_teacher(config, trained, seed if isinstance(seed, int) else 0, shards, folder, runtime=cpu_runtime())
    model, arch = load_model(folder, what="teacher")
    timm_arch = describe(model, timm_model=entry["model"], model_args=args, source="trained")
    timm_arch["pretrained_cfg"].update(arch["pretrained_cfg"])  # the input it was trained on
    accuracy = read_json(folder / "metrics.json", what="teacher metrics")["test_acc"]
    print(f"mini paper: teacher {size} pretrained on {dataset}: test accuracy {accuracy:.4f}", file=sys.stderr)
    return save_timm_checkpoint(model, timm_arch, target.parent)


def _size_with(model_args: dict) -> str:
    """The linvit size whose shape the timm options give (patch, width, depth, heads)."""
    from .sizes import SIZES

    keys = ("patch_size", "embed_dim", "depth", "num_heads")
    for name, spec in SIZES.items():
        if all(model_args.get(k) == spec[k] for k in keys):
            return name
    raise ValueError(f"teachers entry model_args {model_args}: no linvit size has these "
                     f"{', '.join(keys)}; the harness can only pretrain one of {', '.join(SIZES)}")


def make_inputs(config: dict) -> None:
    make_imagefolders(config)
    for size, entry in config.get("teachers", {}).items():
        if "file" in entry:
            path = make_teacher_file(config, size)
            print(f"mini paper: teacher {size} in {path}", file=sys.stderr)
