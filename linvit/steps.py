"""The pipeline's steps, one function each: shards, teacher, distillation, student, evaluation.

Each step reads what the step before it wrote and writes its own folder; cli.py exposes each as
a `linvit` subcommand, which is what the Snakemake rules call. Each computing step takes a
`linvit.device.Runtime` (device, precision, compile), decided once by the caller before any compute;
models are built and loaded on the CPU, then moved to its device.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from . import inputs
from .config import NO_DESIGN, REFERENCE_INIT, checkpoint, design_spec, get, init_strategy, pretrained
from .data.loader import ShardSet, read_manifest
from .data.shards import MANIFEST
from .device import Runtime, cpu_runtime
from .distill import DistillTask
from .losses import Objective, parse_terms
from .evaluate import accuracy, attention_report, parameter_counts, throughput
from .events import cell_hparams, events_dir as run_events_dir, scalars, write_evaluation
from .io import code_version, file_sha256, provenance, read_json, remove_stale_temps, write_json, write_safetensors
from .models import build_vit, model_name
from .predictions import PREDICTIONS, split_digest, write_predictions
from .registry import SOFTMAX
from .checkpoints import live_log_path, publish_log
from .train import TrainSpec, fit
from .teachers import adapt, build_model, check_built_from, check_fit, describe, load_pretrained
from .transfer import GROUPS, copy_groups


# -- model folders: model.safetensors plus model.json describing the architecture ----------------

def _load_tensors(path: Path, what: str) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors and torch raise several types for a bad file
        raise ValueError(f"{what} {path} cannot be loaded: {str(err).splitlines()[0]}") from None


def load_model(folder: str | Path, what: str = "model") -> tuple[nn.Module, dict]:
    """The model a step wrote: model.json (its architecture, see linvit.teachers) and its weights."""
    folder = Path(folder)
    arch = read_json(folder / "model.json", what=f"{what} description")
    model = build_model(arch)
    weights = folder / "model.safetensors"
    state = _load_tensors(weights, f"{what} weights")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # other tensors or shapes than model.json describes
        raise ValueError(f"{what} weights {weights} cannot be loaded: {str(err).splitlines()[0]}") from None
    return model.eval(), arch


def _arch(model: nn.Module, base: dict, size: str, variant: str, data: ShardSet, dataset: str) -> dict:
    """model.json of a model trained on `dataset`, of the architecture `base` describes."""
    arch = describe(model, timm_model=base["timm_model"], model_args=base.get("model_args", {}),
                    source="trained", size=size, variant=variant, dataset=dataset,
                    classes=list(data.classes))
    # How its images were prepared, so that whoever loads it (as a timm checkpoint) feeds it the same.
    p = data.pipeline
    arch["pretrained_cfg"].update(
        {"input_size": [data.channels, *data.input_size], "mean": list(data.mean), "std": list(data.std),
         "crop_pct": 1.0, "interpolation": "bilinear"} if p is None else
        {"input_size": [p.channels, *p.input_size], "mean": list(p.mean), "std": list(p.std),
         "crop_pct": p.crop_pct, "interpolation": p.interpolation})
    return arch


class ClassifyTask:
    """Supervised training of every parameter with (label-smoothed) cross-entropy; with `mixup`
    (timm.data.Mixup options), on mixed or cut-and-pasted batches against their soft labels.

    With an `objective` (linvit.losses.Objective: logit KD, attention distillation as an auxiliary
    loss), the loss is task_weight x cross-entropy plus the objective's weighted terms, on the same
    (mixed) batch and from one forward pass of the student."""

    def __init__(self, model: nn.Module, data: ShardSet, spec: TrainSpec, runtime: Runtime | None = None,
                 mixup: dict | None = None, objective=None, task_weight: float = 1.0):
        self.model, self.data, self.spec = model, data, spec
        self.runtime = runtime or cpu_runtime()
        self.objective, self.task_weight = objective, task_weight
        self.final_predictions: dict | None = None  # filled by the final evaluation
        self.mixup = None
        if mixup:
            from timm.data import Mixup

            self.mixup = Mixup(**{"label_smoothing": spec.label_smoothing, **mixup},
                               num_classes=data.num_classes)

    def trainable(self):
        return list(self.model.named_parameters())

    def loss(self, x, y):
        if self.mixup is not None:
            # timm's Mixup draws from numpy's global generator: seed it from torch's, which the loop
            # seeds and checkpoints, so a resumed run mixes exactly as the uninterrupted one.
            np.random.seed(int(torch.randint(0, 2**31 - 1, ())))
            x, y = self.mixup(x, y)
        if self.objective is None:
            return self._task_loss(self.model(x), y)
        result = self.objective(x, student_logits=True)
        return self.task_weight * self._task_loss(result.student_logits, y) + result.total

    def _task_loss(self, logits, y):
        if self.mixup is None:
            return F.cross_entropy(logits, y, label_smoothing=self.spec.label_smoothing)
        return torch.sum(-y * F.log_softmax(logits, dim=-1), dim=-1).mean()  # y: mixup's soft labels

    def evaluate(self, final: bool) -> dict:
        # The final evaluation keeps every test image's prediction (run_student writes them).
        self.final_predictions = {} if final else None
        return accuracy(self.model, self.data, limit=None if final else self.spec.eval_samples,
                        runtime=self.runtime, record=self.final_predictions)


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


def _data(shards_dir, runtime: Runtime, spec: dict, arch: dict | None) -> ShardSet:
    """The shards, read as the runtime wants through the input pipeline of this dataset (config
    entry `spec`) and teacher (`arch`; see linvit.inputs): decoded ahead in a forked process (on a
    GPU into pinned memory), so a training step does not wait for its batch. On the CPU a
    pipeline's batches are transformed in the loop: ahead, they would need a worker process per
    iterator (see linvit.data.loader), whose start costs more than it saves on a small job."""
    info = read_manifest(Path(shards_dir) / MANIFEST)
    pipeline = inputs.pipeline(spec, arch, info)
    return ShardSet(shards_dir, workers=runtime.workers, prefetch=2 if runtime.cuda or pipeline is None else 0,
                    pin_memory=runtime.cuda, pipeline=pipeline)


def _input_keys(dataset: str) -> list[str]:
    """The config keys of what a model sees of `dataset` (they are in a training step's fingerprint)."""
    return [f"datasets.{dataset}.transform", f"datasets.{dataset}.labels"]


def _dataset_spec(config: dict, dataset: str) -> dict:
    """A dataset's config entry as a job sees it (its job config holds only what it reads)."""
    return config.get("datasets", {}).get(dataset, {})


def _mixup(config: dict, dataset: str, spec: TrainSpec, key: str, runtime: Runtime) -> dict | None:
    """The timm Mixup options of training on `dataset` (None: no mixing), checked against the batch
    each process mixes: timm's Mixup pairs every image with another of its batch (it asserts an even
    batch), so an odd per-process batch is one line here, before any compute, on every rank alike."""
    mixup = (_dataset_spec(config, dataset).get("transform") or {}).get("mixup")
    world, batch = runtime.world, spec.batch_size
    if mixup and batch % world.size == 0 and (batch // world.size) % 2:
        share = (f"gives each of the job's {world.size} processes {batch // world.size} images, an odd batch"
                 if world.parallel else "is odd")
        raise ValueError(f"config key {key}.batch_size: {batch} {share}, which timm's Mixup "
                         f"(datasets.{dataset}.transform.mixup) cannot mix: it pairs every image with another "
                         f"of its batch; make the per-process batch even")
    return mixup


def _fingerprint(config: dict, keys: list[str], seed: int, job: dict, files: dict[str, Path],
                 runtime: Runtime) -> dict:
    """What determines a training step's result, compared before resuming from its checkpoint.

    The config keys the step reads (absent optional keys stay absent), the job's names, the seed,
    the code version, the sha256 of each input file (data manifest, teacher weights, distilled
    attention) and the resolved precision, compile backend and CPU linear kernels: a change in
    any of them makes an old checkpoint unusable. The device is not in it: a checkpoint resumes
    on another device.
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
    rank 0 writes (every rank holds the same weights and metrics), and every rank waits for it at a
    barrier: no rank returns from the step before its outputs exist."""
    if not runtime.world.main:
        runtime.world.barrier()
        return metrics
    for name, values in tensors.items():
        write_safetensors(out_dir / name, {k: v.cpu() for k, v in values.items()})
    if arch is not None:
        write_json(out_dir / "model.json", arch)
    write_json(out_dir / "config.json", provenance(config, fingerprint=fingerprint))
    publish_log(out_dir)
    write_json(out_dir / "metrics.json", metrics)
    shutil.rmtree(out_dir / "checkpoint", ignore_errors=True)
    runtime.world.barrier()
    return metrics


# -- steps ------------------------------------------------------------------------------------

def run_shards(config: dict, dataset: str, out_dir: str | Path, workers: int | None = None) -> dict:
    """Write `dataset`'s shards with `workers` processes (default: min(4, CPUs))."""
    from .config import check_source_options
    from .data.shards import write_shards

    spec = get(config, f"datasets.{dataset}")
    check_source_options(dataset, spec)  # a misspelt option would be ignored, not refused
    shards = config.get("shards", {})
    return write_shards(dataset, spec, out_dir, seed=shards.get("seed", 0),
                        samples_per_shard=shards.get("samples_per_shard", 10000), workers=workers)


def run_teacher(config: dict, size: str, seed: int | None, shards_dir, out_dir,
                runtime: Runtime | None = None) -> dict:
    """The softmax teacher of `size`: loaded when config.teachers names it (timm's hub, its cache, or
    a file; with `replicates`, the checkpoint of student seed `seed`), else pretrained here on
    config.teacher.dataset with `seed`."""
    runtime = runtime or cpu_runtime()
    if pretrained(config, size) is not None:
        # The job of a replicate gets its checkpoint alone (workflow: checkpoint_config) and its --seed.
        return _load_teacher(config, size, checkpoint(config, size, seed), out_dir, runtime, seed)
    dataset = get(config, "teacher.dataset")
    if seed is None or shards_dir is None:
        raise ValueError(f"teacher {size!r} is trained on {dataset!r}: give --seed and --shards")
    spec = _spec(config, "teacher.train")
    mixup = _mixup(config, dataset, spec, "teacher.train", runtime)
    out_dir, data = _start(out_dir, runtime), _data(shards_dir, runtime, _dataset_spec(config, dataset), None)
    fingerprint = _fingerprint(config, ["teacher", f"datasets.{dataset}.transform"], seed,
                               {"step": "teacher", "size": size}, {"data": data.dir / MANIFEST}, runtime)
    torch.manual_seed(seed)
    model = build_vit(size, num_classes=data.num_classes, img_size=data.input_size,
                      in_chans=data.channels)
    model = runtime.place(model)
    task = ClassifyTask(model, data, spec, runtime, mixup)
    summary = fit(task, spec, data, out_dir, seed=seed,
                  desc=f"teacher {size}", fingerprint=fingerprint, runtime=runtime,
                  hparams=cell_hparams("teacher", dataset=dataset, size=size, variant=SOFTMAX, seed=seed))
    metrics = {"dataset": dataset, "size": size, "variant": SOFTMAX, "init": "random", "seed": seed, **summary}
    arch = _arch(model, {"timm_model": model_name(size, SOFTMAX)}, size, SOFTMAX, data, dataset)
    return _finish(out_dir, metrics, config, fingerprint, {"model.safetensors": model.state_dict()}, arch,
                   runtime)


def _load_teacher(config: dict, size: str, entry: dict, out_dir, runtime: Runtime, replicate=None) -> dict:
    """A pretrained teacher into the teacher folder: its weights, as timm names them, and model.json
    (`replicate`: the student seed whose checkpoint it is, where one was given).
    Under torchrun rank 0 alone loads and writes; the other ranks wait for it at a barrier and read its
    metrics (ranks writing the same files at once could leave a torn one)."""
    out_dir = _start(out_dir, runtime)
    if not runtime.world.main:
        runtime.world.barrier()
        return read_json(out_dir / "metrics.json", what="teacher metrics")
    start = time.perf_counter()
    model, arch = load_pretrained(entry["model"], file=entry.get("file"), model_args=entry.get("model_args"))
    arch.update(size=size, dataset=None, classes=None)
    write_safetensors(out_dir / "model.safetensors", model.state_dict())
    write_json(out_dir / "model.json", arch)
    write_json(out_dir / "config.json", provenance(config))
    metrics = {"size": size, "variant": SOFTMAX, "model": entry["model"], "source": arch["source"],
               "file": entry.get("file"), "params": sum(p.numel() for p in model.parameters()),
               "load_time_s": round(time.perf_counter() - start, 3),
               **({"seed": int(replicate)} if replicate is not None else {})}
    write_json(out_dir / "metrics.json", metrics)
    runtime.world.barrier()
    return metrics


def _teacher(config: dict, dataset: str, size: str, teacher_dir, shards_dir, runtime: Runtime):
    """The data of `dataset` as the teacher of `teacher_dir` sees it, and the teacher at the
    dataset's geometry (position embeddings resampled to its input size; for another label space,
    a new head). A dataset that cannot fit the teacher is one line before any compute."""
    teacher_dir = Path(teacher_dir)
    arch = read_json(teacher_dir / "model.json", what="teacher description")
    if arch.get("size") != size:
        raise ValueError(f"teacher {teacher_dir} is size {arch.get('size')!r}, the student is {size!r}")
    check_built_from(teacher_dir, arch)
    spec = _dataset_spec(config, dataset)
    info = read_manifest(Path(shards_dir) / MANIFEST)
    if info.get("dataset", dataset) != dataset:  # else a run of one dataset is filed under another's name
        raise ValueError(f"shards {shards_dir} hold dataset {info['dataset']!r}, not {dataset!r}")
    image_size, channels = inputs.geometry(spec, arch, info)
    same_labels = spec.get("labels") == "teacher" or arch.get("dataset") == dataset
    check_fit(arch, teacher=f"{size} ({teacher_dir})", dataset=dataset, image_size=image_size,
              channels=channels, num_classes=int(info["num_classes"]), same_labels=same_labels)
    data = _data(shards_dir, runtime, spec, arch)
    teacher, _ = load_model(teacher_dir, what="teacher")
    teacher, _ = adapt(teacher, arch, img_size=tuple(data.input_size), num_classes=data.num_classes)
    return data, teacher.eval(), arch, same_labels


def _student(config, dataset, size, variant, seed, teacher_dir, shards_dir, runtime: Runtime):
    data, teacher, arch, same_labels = _teacher(config, dataset, size, teacher_dir, shards_dir, runtime)
    torch.manual_seed(seed)
    student = build_model(arch, variant=variant, num_classes=data.num_classes, img_size=tuple(data.input_size))
    return data, teacher, arch, student, same_labels


def _phases(design: dict, spec: TrainSpec, key: str) -> list[tuple[dict, TrainSpec]]:
    """A design's stage-1 phases with their share of the distillation budget `spec`: a phase's
    `fraction` of spec.steps, the phases without one sharing the rest equally (at least 1 step)."""
    phases = design.get("phases") or [{k: v for k, v in design.items() if k in ("losses", "freeze")}]
    fixed = sum(p.get("fraction", 0.0) for p in phases)
    free = [p for p in phases if "fraction" not in p]
    if fixed > 1 + 1e-9 or (fixed >= 1 - 1e-9 and free):
        raise ValueError(f"config key {key}.phases: the fractions add up to {fixed:g}, leaving nothing for the rest")
    out = []
    for phase in phases:
        share = phase.get("fraction", (1 - fixed) / len(free) if free else 0.0)
        steps = max(1, round(spec.steps * share))
        out.append((phase, TrainSpec(**{**vars(spec), "steps": steps,
                                        "warmup_steps": min(spec.warmup_steps, steps)})))
    return out


def run_distill(config: dict, dataset: str, size: str, variant: str, init: str, design: str, seed: int,
                teacher_dir, shards_dir, out_dir, runtime: Runtime | None = None) -> dict:
    """Stage 1: the student as init strategy `init` initializes it (its copied groups), trained by the
    distillation design `design` (linvit.losses terms; by default only its attention trains) for
    distill.train.steps, split over the design's phases. Writes the whole student (model.json,
    model.safetensors), which every budget's stage 2 starts from.

    Progress is measured on a fixed probe batch of `evaluation.fidelity_samples` test images
    (default 64, at most the test split).
    """
    runtime = runtime or cpu_runtime()
    out_dir = _start(out_dir, runtime)
    strategy, spec = init_strategy(config, init), design_spec(config, design)
    data, teacher, arch, student, same_labels = _student(config, dataset, size, variant, seed, teacher_dir,
                                                         shards_dir, runtime)
    copied = copy_groups(student, teacher, strategy["copy"], copy_head=same_labels)
    phases = _phases(spec, _spec(config, "distill.train"), f"distill_designs.{design}")
    where = [f"distill_designs.{design}" + (f".phases[{i}]" if "phases" in spec else "") + ".losses"
             for i in range(len(phases))]
    terms = [parse_terms(phase["losses"], key) for (phase, _), key in zip(phases, where)]
    teacher, student = runtime.place(teacher), runtime.place(student)
    fingerprint = _fingerprint({**config, "init_strategy": strategy, "design": spec},
                               ["distill.train", "design", "init_strategy", "evaluation.fidelity_samples",
                                *_input_keys(dataset)], seed,
                               {"step": "distill", "dataset": dataset, "size": size, "variant": variant,
                                "init": init, "design": design},
                               {"data": data.dir / MANIFEST, "teacher_weights": Path(teacher_dir) / "model.safetensors"},
                               runtime)
    samples = config.get("evaluation", {}).get("fidelity_samples", 64)
    probe = runtime.batch(data.fixed_batch("test", min(samples, data.num_samples("test")))[0])[0]
    desc = f"distill {dataset}/{size}/{variant}/{init}/{design}"
    hparams = cell_hparams("distill", dataset=dataset, size=size, variant=variant, init=init, design=design, seed=seed)
    summaries = []
    for i, ((phase, train), phase_terms) in enumerate(zip(phases, terms)):
        freeze = phase.get("freeze", True)
        if freeze == "copied":  # what the strategy copied stays the teacher's; the rest trains
            freeze = [group for group, count in copied.items() if count]
        task = DistillTask(teacher, student, phase_terms, probe, freeze=freeze)
        # Teacher-forced terms call the student's attention modules one by one (compiled there).
        task.compiled_modules = lambda: [block.attn for block in student.blocks]
        if len(phases) == 1:
            summaries.append(fit(task, train, data, out_dir, seed=seed, desc=desc, fingerprint=fingerprint,
                                 runtime=runtime, hparams=hparams))
        else:  # each phase in a folder of its own; one curve in the distillation's events
            summaries.append(_fit_phase(task, train, data, out_dir / f"phase{i}", seed=seed,
                                        desc=f"{desc} phase {i + 1}/{len(phases)}",
                                        fingerprint={**fingerprint, "phase": i}, runtime=runtime,
                                        events_dir=run_events_dir(out_dir),
                                        events_offset=sum(s["steps"] for s in summaries), hparams=hparams))
    if len(phases) > 1:
        _join_phase_logs(out_dir, len(phases), runtime)
    summary = {**summaries[-1], "steps": sum(s["steps"] for s in summaries),
               "train_time_s": round(sum(s["train_time_s"] for s in summaries), 3),
               "images_seen": sum(s["images_seen"] for s in summaries)}
    losses = [dict(t.entry(), phase=i) for i, phase_terms in enumerate(terms) for t in phase_terms]
    metrics = {"dataset": dataset, "size": size, "variant": variant, "init": init, "design": design, "seed": seed,
               "loss": "+".join(dict.fromkeys(t["loss"] for t in losses)), "losses": losses,
               "phase_steps": [s["steps"] for s in summaries], "copied": copied,
               "head_copied": same_labels and "head" in strategy["copy"], "probe_samples": len(probe), **summary}
    metrics = _finish(out_dir, metrics, config, fingerprint, {"model.safetensors": student.state_dict()},
                      _arch(student, arch, size, variant, data, dataset), runtime)
    if len(phases) > 1 and runtime.world.main:  # like checkpoint/: internal once the step is complete
        for i in range(len(phases)):
            shutil.rmtree(out_dir / f"phase{i}", ignore_errors=True)
    return metrics


def _fit_phase(task, spec: TrainSpec, data, phase_dir: Path, *, seed: int, desc: str, fingerprint: dict,
               runtime: Runtime, events_dir: Path, events_offset: int, hparams: dict) -> dict:
    """One phase of a multi-phase design, in its own folder: a finished phase (its summary.json) is
    loaded rather than rerun, so a killed job resumes in the phase it was in."""
    done = phase_dir / "summary.json"
    if done.exists():
        summary = read_json(done, what="phase summary")
        task.model.load_state_dict(_load_tensors(phase_dir / "model.safetensors", "phase weights"))
        return summary
    summary = fit(task, spec, data, phase_dir, seed=seed, desc=desc, fingerprint=fingerprint, runtime=runtime,
                  events_dir=events_dir, events_offset=events_offset, hparams=hparams)
    if runtime.world.main:
        write_safetensors(phase_dir / "model.safetensors", {k: v.cpu() for k, v in task.model.state_dict().items()})
        publish_log(phase_dir)
        write_json(done, summary)
    return summary


def _join_phase_logs(out_dir: Path, phases: int, runtime: Runtime) -> None:
    """The phases' logs as the distillation's one log (each record tagged with its phase), where
    `_finish` publishes it from."""
    if not runtime.world.main:
        return
    lines = []
    for i in range(phases):
        for line in (out_dir / f"phase{i}" / "train.jsonl").read_text().splitlines():
            if line.strip():
                lines.append(json.dumps({**json.loads(line), "phase": i}))
    live = live_log_path(out_dir)
    live.parent.mkdir(parents=True, exist_ok=True)
    live.write_text("".join(line + "\n" for line in lines))


def run_student(config: dict, dataset: str, size: str, variant: str, init: str, seed: int, teacher_dir,
                shards_dir, out_dir, distilled_dir=None, runtime: Runtime | None = None, *,
                design: str = NO_DESIGN, budget: int | None = None, kd_dir=None) -> dict:
    """Stage 2: initialize a student from the teacher by strategy `init` (or start from its stage-1
    folder `distilled_dir`, written by `run_distill` with `design`), then train it on `dataset` for
    `budget` steps (default student.train.steps) with the task's cross-entropy (weight
    `task_weight`, default 1) plus the strategy's `train_losses` against the teacher; logit terms
    read `kd_dir`'s model when given (the softmax reference, for a target of other labels).

    Init 'reference' (variant 'softmax') is the softmax reference: the teacher trained on the target
    with the students' budget. Variant 'softmax' with an init strategy is a control student: a
    softmax ViT initialized (and distilled) like the linear students.
    """
    if init == REFERENCE_INIT and variant != SOFTMAX:
        raise ValueError(f"init {REFERENCE_INIT!r} is the softmax reference: its variant is {SOFTMAX!r}, "
                         f"not {variant!r}")
    runtime = runtime or cpu_runtime()
    out_dir = _start(out_dir, runtime)
    strategy = init_strategy(config, init)
    train = dict(get(config, "student.train"), **({"steps": int(budget)} if budget is not None else {}))
    spec = TrainSpec.from_dict(train, "student.train")
    mixup = _mixup(config, dataset, spec, "student.train", runtime)
    if design != NO_DESIGN and distilled_dir is None:
        raise ValueError(f"init strategy {init!r} with design {design!r} starts from a distillation: "
                         f"pass the distillation folder")
    distill = None
    if design != NO_DESIGN:  # stage 1's student, copies and all
        data, teacher, arch, same_labels = _teacher(config, dataset, size, teacher_dir, shards_dir, runtime)
        distilled_dir = Path(distilled_dir)
        info = read_json(distilled_dir / "metrics.json", what="distillation metrics")
        student, _ = load_model(distilled_dir, what="distilled student")
        copied = info["copied"]
        distill = {"design": design, "loss": info["loss"], "steps": info["steps"], "time_s": info["train_time_s"],
                   "final_loss": info["final_loss"]}
    else:
        data, teacher, arch, student, same_labels = _student(config, dataset, size, variant, seed, teacher_dir,
                                                             shards_dir, runtime)
        copied = copy_groups(student, teacher, strategy["copy"], copy_head=same_labels)
    inputs = {"data": data.dir / MANIFEST, "teacher_weights": Path(teacher_dir) / "model.safetensors"}
    if distill:
        inputs["distilled"] = distilled_dir / "model.safetensors"
    extra = strategy.get("train_losses")
    terms = parse_terms(extra, f"init_strategies.{init}.train_losses") if extra else []
    logit_teacher = None
    if kd_dir is not None:
        inputs["kd_teacher"] = Path(kd_dir) / "model.safetensors"
        logit_teacher, _ = load_model(kd_dir, what="logit teacher")
    fingerprint = _fingerprint({**config, "init_strategy": strategy, "student": {"train": train}},
                               ["student", "init_strategy", *_input_keys(dataset)], seed,
                               {"step": "student", "dataset": dataset, "size": size, "variant": variant,
                                "init": init, "design": design}, inputs, runtime)
    if runtime.world.main:
        print(f"student {dataset}/{size}/{variant}/{init}/{design}/steps{spec.steps}/seed{seed}: copied "
              + ", ".join(f"{g}={copied.get(g, 0)}" for g in GROUPS)
              + (f" + distilled ({design})" if distill else "")
              + (f" + training losses {', '.join(t.label for t in terms)}" if terms else ""), file=sys.stderr)
    student = runtime.place(student)
    objective = None
    if terms:
        objective = Objective(runtime.place(teacher), student, terms,
                              logit_teacher=None if logit_teacher is None else runtime.place(logit_teacher))
    task = ClassifyTask(student, data, spec, runtime, mixup, objective=objective,
                        task_weight=strategy.get("task_weight", 1.0))
    summary = fit(task, spec, data, out_dir, seed=seed,
                  desc=f"student {dataset}/{size}/{variant}/{init}/{design}/steps{spec.steps}",
                  fingerprint=fingerprint, runtime=runtime,
                  hparams=cell_hparams("reference" if init == REFERENCE_INIT else "student", dataset=dataset,
                                       size=size, variant=variant, init=init, design=design, budget=spec.steps,
                                       seed=seed))
    metrics = {"dataset": dataset, "size": size, "variant": variant, "init": init, "design": design,
               "budget": spec.steps, "seed": seed, "copied": copied,
               "head_copied": same_labels and "head" in strategy["copy"], "distill": distill,
               "train_losses": [t.entry() for t in terms], "task_weight": strategy.get("task_weight", 1.0),
               "kd_teacher": None if kd_dir is None else str(kd_dir),
               "test_samples": summary.pop("samples"), **summary}
    if runtime.world.main:  # before metrics.json, which marks the run complete
        write_predictions(out_dir / PREDICTIONS, task.final_predictions["pred"], task.final_predictions["label"],
                          split_digest(data.info))
        # The evaluation in the job that trained the model: no second process re-importing torch and
        # reloading the model, the teacher and the test split (a job costs its steps).
        _write_evaluation(out_dir, metrics, _evaluation(config, metrics, student, teacher, data, runtime),
                          out_dir / EVALUATION)
    return _finish(out_dir, metrics, config, fingerprint, {"model.safetensors": student.state_dict()},
                   _arch(student, arch, size, variant, data, dataset), runtime)


def run_evaluate(config: dict, run_dir, teacher_dir, shards_dir, out_path, runtime: Runtime | None = None) -> dict:
    """`linvit evaluate`: evaluate a trained run again, by hand (another `evaluation:` setting, another
    device). The workflow's training jobs write their eval.json themselves (run_student)."""
    runtime = runtime or cpu_runtime()
    run_dir = Path(run_dir)
    remove_stale_temps(Path(out_path).parent, Path(out_path).name)
    metrics = read_json(run_dir / "metrics.json", what="run metrics", keys=EVAL_NAMED + ("test_acc",))
    model, _ = load_model(run_dir)
    data, teacher, _, _ = _teacher(config, metrics["dataset"], metrics["size"], teacher_dir, shards_dir, runtime)
    result = _evaluation(config, metrics, model, teacher, data, runtime)
    _write_evaluation(run_dir, metrics, result, out_path)
    return result


EVALUATION = "eval.json"
EVAL_NAMED = ("dataset", "size", "variant", "init", "design", "budget", "seed")


def _evaluation(config: dict, metrics: dict, model, teacher, data: ShardSet, runtime: Runtime) -> dict:
    """Fidelity to the teacher's attention, parameter counts and throughput of a trained model, with the
    run's identity and test accuracy from `metrics` (eval.json's record).

    Fidelity is computed in fp32 (the KL of small probabilities); throughput under the runtime's
    precision on its device, and the record says both with the batch size; eval_time_s is its own cost.
    """
    start = time.perf_counter()
    model, teacher = runtime.place(model).eval(), runtime.place(teacher).eval()
    settings = config.get("evaluation", {})
    x, _ = data.fixed_batch("test", min(settings.get("fidelity_samples", 64), data.num_samples("test")))
    x = runtime.batch(x)[0]
    attention = attention_report(teacher, model, x)
    batch = settings.get("throughput_batch", 64)
    result = {k: metrics[k] for k in EVAL_NAMED}
    result.update(test_acc=metrics["test_acc"], **attention,
                  fidelity_samples=len(x), **parameter_counts(model),
                  throughput_img_s=throughput(model, x, batch_size=batch, runtime=runtime),
                  throughput_batch=batch, **runtime.describe(), threads=torch.get_num_threads())
    result["eval_time_s"] = round(time.perf_counter() - start, 3)
    return result


def _write_evaluation(run_dir: Path, metrics: dict, result: dict, out_path) -> None:
    """An evaluation into the run's TensorBoard events (at its last step: fidelity per block, throughput,
    parameters), then `out_path` (eval.json), the mark of a done evaluation."""
    fidelity = {f"{m}{part}": result[f"fidelity_{m}{part}"] for m in ("kl", "js", "corr") for part in ("", "_mean")}
    write_evaluation(run_dir, metrics.get("steps", metrics["budget"]),
                     {**scalars(fidelity, "fidelity"), **scalars({k: result[k] for k in ("throughput_img_s", "params")},
                                                                 "eval")})
    write_json(out_path, result)
