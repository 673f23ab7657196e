"""The pipeline's steps, one function each: shards, teacher, distillation, student, evaluation.

Each step reads what the step before it wrote and writes its own folder; cli.py exposes each as
a `linvit` subcommand, which is what the Snakemake rules call. Each computing step takes a
`linvit.device.Runtime` (device, precision, compile), decided once by the caller before any compute;
models are built and loaded on the CPU, then moved to its device.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .config import get, init_strategy
from .data.loader import ShardSet
from .data.shards import MANIFEST
from .device import Runtime, cpu_runtime
from .distill import DistillTask
from .evaluate import accuracy, attention_fidelity, parameter_counts, throughput
from .io import code_version, file_sha256, provenance, read_json, remove_stale_temps, write_json, write_safetensors
from .models import build_vit
from .registry import SOFTMAX
from .train import TrainSpec, fit, publish_log
from .transfer import GROUPS, attention_state, copy_groups, load_attention_state


# -- model folders: model.safetensors plus model.json describing the architecture ----------------

def save_model(model: nn.Module, folder: Path, arch: dict) -> None:
    write_safetensors(folder / "model.safetensors", model.state_dict())
    write_json(folder / "model.json", arch)


def _load_tensors(path: Path, what: str) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors and torch raise several types for a bad file
        raise ValueError(f"{what} {path} cannot be loaded: {str(err).splitlines()[0]}") from None


def load_model(folder: str | Path, what: str = "model") -> tuple[nn.Module, dict]:
    folder = Path(folder)
    arch = read_json(folder / "model.json", what=f"{what} description")
    model = build_vit(arch["size"], num_classes=arch["num_classes"], img_size=arch["img_size"],
                      in_chans=arch["in_chans"], variant=arch["variant"])
    weights = folder / "model.safetensors"
    state = _load_tensors(weights, f"{what} weights")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # other tensors or shapes than model.json describes
        raise ValueError(f"{what} weights {weights} cannot be loaded: {str(err).splitlines()[0]}") from None
    return model.eval(), arch


def _arch(size, variant, data: ShardSet, dataset: str) -> dict:
    return {"size": size, "variant": variant, "num_classes": data.num_classes,
            "img_size": list(data.image_size), "in_chans": data.channels, "dataset": dataset,
            "classes": list(data.classes)}


class ClassifyTask:
    """Supervised training of every parameter with (label-smoothed) cross-entropy."""

    def __init__(self, model: nn.Module, data: ShardSet, spec: TrainSpec, runtime: Runtime | None = None):
        self.model, self.data, self.spec = model, data, spec
        self.runtime = runtime or cpu_runtime()

    def trainable(self):
        return list(self.model.named_parameters())

    def loss(self, x, y):
        return F.cross_entropy(self.model(x), y, label_smoothing=self.spec.label_smoothing)

    def evaluate(self, final: bool) -> dict:
        return accuracy(self.model, self.data, limit=None if final else self.spec.eval_samples,
                        runtime=self.runtime)


def _spec(config: dict, key: str) -> TrainSpec:
    return TrainSpec.from_dict(get(config, key), key)


def _start(out_dir, runtime: Runtime) -> Path:
    """A step's output folder, without the temporary files an earlier, killed run left in it
    (cleaned by rank 0 only: another rank could remove a file rank 0 is writing)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if runtime.world.main:
        remove_stale_temps(out_dir)
        remove_stale_temps(out_dir / "checkpoint")
    return out_dir


def _data(shards_dir, runtime: Runtime) -> ShardSet:
    """The shards, read as the runtime wants: on a GPU, decoded ahead in the background into pinned
    memory, so the device does not wait; on the CPU, in the loop (its cores are training)."""
    return ShardSet(shards_dir, workers=runtime.workers, prefetch=2 if runtime.cuda else 0,
                    pin_memory=runtime.cuda)


def _fingerprint(config: dict, keys: list[str], seed: int, job: dict, files: dict[str, Path],
                 runtime: Runtime) -> dict:
    """What determines a training step's result, compared before resuming from its checkpoint.

    The config keys the step reads (absent optional keys stay absent), the job's names, the seed,
    the code version, the sha256 of each input file (data manifest, teacher weights, distilled
    attention) and the resolved precision and compile backend: a change in any of them makes an
    old checkpoint unusable. The device is not in it: a checkpoint resumes on another device.
    """
    found = {}
    for key in keys:
        node, target = config, found
        *parents, last = key.split(".")
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
            target = target.setdefault(part, {})
        if isinstance(node, dict) and last in node:
            target[last] = node[last]
    files = {name: file_sha256(path) for name, path in files.items()}
    return {**found, "job": job, "seed": seed, **code_version(), **files, "runtime": runtime.fingerprint()}


def _finish(out_dir: Path, metrics: dict, config: dict, fingerprint: dict, tensors: dict[str, dict],
            arch: dict | None, runtime: Runtime) -> dict:
    """Write the outputs of a training step: the tensor files, model.json, config.json, then
    metrics.json last, as the mark of a complete run; then drop the checkpoint. Under torchrun only
    rank 0 writes (every rank holds the same weights and metrics)."""
    if not runtime.world.main:
        return metrics
    for name, values in tensors.items():
        write_safetensors(out_dir / name, {k: v.cpu() for k, v in values.items()})
    if arch is not None:
        write_json(out_dir / "model.json", arch)
    write_json(out_dir / "config.json", provenance(config, fingerprint=fingerprint))
    publish_log(out_dir)
    write_json(out_dir / "metrics.json", metrics)
    shutil.rmtree(out_dir / "checkpoint", ignore_errors=True)
    return metrics


# -- steps ------------------------------------------------------------------------------------

def run_shards(config: dict, dataset: str, out_dir: str | Path) -> dict:
    from .data.shards import write_shards

    spec = get(config, f"datasets.{dataset}")
    shards = config.get("shards", {})
    return write_shards(dataset, spec, out_dir, seed=shards.get("seed", 0),
                        samples_per_shard=shards.get("samples_per_shard", 10000))


def run_teacher(config: dict, size: str, seed: int, shards_dir, out_dir, runtime: Runtime | None = None) -> dict:
    """Pretrain the softmax teacher on the teacher dataset (at paper scale: load timm weights instead)."""
    runtime = runtime or cpu_runtime()
    out_dir, data = _start(out_dir, runtime), _data(shards_dir, runtime)
    dataset = get(config, "teacher.dataset")
    spec = _spec(config, "teacher.train")
    fingerprint = _fingerprint(config, ["teacher"], seed, {"step": "teacher", "size": size},
                               {"data": data.dir / MANIFEST}, runtime)
    torch.manual_seed(seed)
    model = build_vit(size, num_classes=data.num_classes, img_size=data.image_size,
                      in_chans=data.channels).to(runtime.device)
    summary = fit(ClassifyTask(model, data, spec, runtime), spec, data, out_dir, seed=seed,
                  desc=f"teacher {size}", fingerprint=fingerprint, runtime=runtime)
    metrics = {"dataset": dataset, "size": size, "variant": SOFTMAX, "init": "random", "seed": seed, **summary}
    return _finish(out_dir, metrics, config, fingerprint, {"model.safetensors": model.state_dict()},
                   _arch(size, SOFTMAX, data, dataset), runtime)


def _check_teacher(arch: dict, size: str, data: ShardSet, dataset: str, folder) -> None:
    if arch["size"] != size:
        raise ValueError(f"teacher {folder} is size {arch['size']!r}, the student is {size!r}")
    if list(arch["img_size"]) != list(data.image_size) or arch["in_chans"] != data.channels:
        raise ValueError(f"teacher {folder} takes {arch['img_size']} images with {arch['in_chans']} "
                         f"channel(s); dataset {dataset!r} has {list(data.image_size)} with {data.channels}")


def _student(dataset, size, variant, seed, teacher_dir, shards_dir, runtime: Runtime):
    data = _data(shards_dir, runtime)
    teacher, arch = load_model(teacher_dir, what="teacher")
    _check_teacher(arch, size, data, dataset, teacher_dir)
    torch.manual_seed(seed)
    student = build_vit(size, num_classes=data.num_classes, img_size=data.image_size,
                        in_chans=data.channels, variant=variant)
    return data, teacher, arch, student


def run_distill(config: dict, dataset: str, size: str, variant: str, seed: int, teacher_dir, shards_dir,
                out_dir, runtime: Runtime | None = None) -> dict:
    """Distill the teacher's attention into a fresh linear student's attention on `dataset`'s images.

    Progress is measured on a fixed probe batch of `evaluation.fidelity_samples` test images
    (default 64, at most the test split).
    """
    runtime = runtime or cpu_runtime()
    out_dir = _start(out_dir, runtime)
    data, teacher, arch, student = _student(dataset, size, variant, seed, teacher_dir, shards_dir, runtime)
    teacher, student = teacher.to(runtime.device), student.to(runtime.device)
    spec, loss = _spec(config, "distill.train"), get(config, "distill.loss")
    fingerprint = _fingerprint(config, ["distill", "evaluation.fidelity_samples"], seed,
                               {"step": "distill", "dataset": dataset, "size": size, "variant": variant},
                               {"data": data.dir / MANIFEST, "teacher_weights": Path(teacher_dir) / "model.safetensors"},
                               runtime)
    samples = config.get("evaluation", {}).get("fidelity_samples", 64)
    probe = runtime.batch(data.fixed_batch("test", min(samples, data.num_samples("test")))[0])[0]
    task = DistillTask(teacher, student, loss, probe)
    # The loss calls the student's attention modules one by one, never the student's own forward.
    task.compiled_modules = lambda: [block.attn for block in student.blocks]
    summary = fit(task, spec, data, out_dir, seed=seed, desc=f"distill {dataset}/{size}/{variant}",
                  fingerprint=fingerprint, runtime=runtime)
    metrics = {"dataset": dataset, "size": size, "variant": variant, "seed": seed, "loss": loss,
               "probe_samples": len(probe), **summary}
    return _finish(out_dir, metrics, config, fingerprint, {"attention.safetensors": attention_state(student)},
                   None, runtime)


def run_student(config: dict, dataset: str, size: str, variant: str, init: str, seed: int, teacher_dir,
                shards_dir, out_dir, distilled_dir=None, runtime: Runtime | None = None) -> dict:
    """Initialize a student from the teacher by strategy `init`, then train it on `dataset`.

    variant 'softmax' with init 'reference' is the softmax reference: the teacher trained on the
    target with the students' budget.
    """
    runtime = runtime or cpu_runtime()
    out_dir = _start(out_dir, runtime)
    strategy = init_strategy(config, init)
    spec = _spec(config, "student.train")
    data, teacher, arch, student = _student(dataset, size, variant, seed, teacher_dir, shards_dir, runtime)
    inputs = {"data": data.dir / MANIFEST, "teacher_weights": Path(teacher_dir) / "model.safetensors"}
    same_labels = arch["dataset"] == dataset and arch["num_classes"] == data.num_classes
    copied = copy_groups(student, teacher, strategy["copy"], copy_head=same_labels)
    distill = None
    if strategy.get("distill"):
        if distilled_dir is None:
            raise ValueError(f"init strategy {init!r} distills attention: pass the distillation folder")
        distilled_dir = Path(distilled_dir)
        info = read_json(distilled_dir / "metrics.json", what="distillation metrics")
        inputs["distilled_attention"] = distilled_dir / "attention.safetensors"
        load_attention_state(student, _load_tensors(inputs["distilled_attention"], "distilled attention"))
        distill = {"loss": info["loss"], "steps": info["steps"], "time_s": info["train_time_s"],
                   "final_loss": info["final_loss"]}
    fingerprint = _fingerprint({"student": get(config, "student"), "init_strategy": strategy},
                               ["student", "init_strategy"], seed,
                               {"step": "student", "dataset": dataset, "size": size, "variant": variant,
                                "init": init}, inputs, runtime)
    if runtime.world.main:
        print(f"student {dataset}/{size}/{variant}/{init}/seed{seed}: copied "
              + ", ".join(f"{g}={copied[g]}" for g in GROUPS) + (" + distilled attention" if distill else ""),
              file=sys.stderr)
    del teacher  # copied from; the student alone goes to the device
    student = student.to(runtime.device)
    summary = fit(ClassifyTask(student, data, spec, runtime), spec, data, out_dir, seed=seed,
                  desc=f"student {dataset}/{size}/{variant}/{init}", fingerprint=fingerprint, runtime=runtime)
    metrics = {"dataset": dataset, "size": size, "variant": variant, "init": init, "seed": seed,
               "copied": copied, "head_copied": same_labels and "head" in strategy["copy"],
               "distill": distill, "test_samples": summary.pop("samples"), **summary}
    return _finish(out_dir, metrics, config, fingerprint, {"model.safetensors": student.state_dict()},
                   _arch(size, variant, data, dataset), runtime)


def run_evaluate(config: dict, run_dir, teacher_dir, shards_dir, out_path, runtime: Runtime | None = None) -> dict:
    """Fidelity to the teacher's attention, parameter counts and throughput of a trained run.

    Fidelity is computed in fp32 (the KL of small probabilities); throughput under the runtime's
    precision on its device, and eval.json records both with the batch size.
    """
    runtime = runtime or cpu_runtime()
    run_dir, data = Path(run_dir), ShardSet(shards_dir)
    remove_stale_temps(Path(out_path).parent, Path(out_path).name)
    metrics = read_json(run_dir / "metrics.json", what="run metrics")
    model, _ = load_model(run_dir)
    teacher, _ = load_model(teacher_dir, what="teacher")
    model, teacher = model.to(runtime.device), teacher.to(runtime.device)
    settings = config.get("evaluation", {})
    x, _ = data.fixed_batch("test", min(settings.get("fidelity_samples", 64), data.num_samples("test")))
    x = runtime.batch(x)[0]
    kl = attention_fidelity(teacher, model, x)
    batch = settings.get("throughput_batch", 64)
    result = {k: metrics[k] for k in ("dataset", "size", "variant", "init", "seed")}
    result.update(test_acc=metrics["test_acc"], fidelity_kl=kl, fidelity_kl_mean=sum(kl) / len(kl),
                  fidelity_samples=len(x), **parameter_counts(model),
                  throughput_img_s=throughput(model, x, batch_size=batch, runtime=runtime),
                  throughput_batch=batch, **runtime.describe(), threads=torch.get_num_threads())
    write_json(out_path, result)
    return result
