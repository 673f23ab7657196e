"""`convert`: every check first (nothing is written until all have passed), then request.json, then
the stages in order in subfolders of --out, each a step of linvit.steps, then the export, the
measurements and the summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .export import export
from .measure import device_name, evaluate
from .request import check_request, check_variant, design, done, make_request, say, training_config
from .summary import closing_lines, write_summary
from .teacher import check_student, resolve_teacher, student_size


def convert(args) -> dict:
    """Run the conversion `args` (the command's arguments) describes; returns the summary."""
    job = _prepare(args)
    check_request(job.out, job.request)
    stages = _Stages(job.plan)
    teacher_arch = _teacher(job, stages)
    step_size = teacher_arch.get("size") or job.size  # the name the steps know the teacher by
    _reference(job, stages, step_size)
    _distill(job, stages, step_size)
    _student(job, stages, step_size)
    call = export(job.folder("student"), job.size, job.out, fresh=stages.ran)
    evaluation = _evaluate(job, stages, teacher_arch, call)
    summary = write_summary(job, call, evaluation)
    for line in closing_lines(summary):
        say(line)
    return summary


@dataclass
class _Conversion:
    """Everything decided about a conversion before anything is written."""

    args: object
    config: dict  # the training settings, with the budgets and the teacher as the steps know it
    shards: Path
    info: dict  # the shards' manifest
    dataset: str
    spec: dict  # the config's entry for the dataset
    strategy: dict  # the init strategy
    design: str
    teacher: dict  # see teacher.resolve_teacher
    size: str
    same_labels: bool  # the target has the teacher's labels: the teacher is the baseline, else the reference
    rt: object  # the runtime (linvit.device)
    out: Path
    request: dict
    plan: list  # the stages' names, in order

    @property
    def teacher_dir(self) -> Path:
        return self.teacher["dir"] if self.teacher["kind"] == "folder" else self.out / "teacher"

    @property
    def budget(self) -> int:
        return self.config["student"]["train"]["steps"]

    def folder(self, stage: str) -> Path:
        return self.out / stage


def _prepare(args) -> _Conversion:
    """Everything that can be refused, refused in one line before anything is written or trained."""
    from .. import inputs
    from ..config import NO_DESIGN, init_strategy
    from ..data.loader import read_manifest
    from ..data.shards import MANIFEST
    from ..device import runtime as make_runtime
    from ..teachers import check_fit

    config = training_config(args)
    shards = Path(args.shards).expanduser().resolve()
    info = read_manifest(shards / MANIFEST)
    dataset = args.dataset or info.get("dataset") or shards.name
    spec = config.setdefault("datasets", {}).setdefault(dataset, {})
    check_variant(args.variant)
    strategy = init_strategy(config, args.init)
    chosen = design(config, args.init, args.design)
    teacher = resolve_teacher(args)
    size = student_size(teacher, args.size, args.variant)
    check_student(teacher, size, args.variant)
    arch = teacher["arch"]
    same_labels = spec.get("labels") == "teacher" or (arch.get("dataset") is not None and arch.get("dataset") == dataset)
    image_size, channels = inputs.geometry(spec, arch, info)
    check_fit(arch, teacher=teacher["label"], dataset=dataset, image_size=image_size, channels=channels,
              num_classes=int(info["num_classes"]), same_labels=same_labels)
    rt = make_runtime(config, args.device)
    # The teacher as the steps know it: which dataset's labels it has (none for a loaded one), and
    # where a loaded one comes from.
    config["teacher"] = {"dataset": arch["dataset"]} if arch.get("dataset") else {}
    config["teachers"] = {size: teacher["entry"]} if teacher["entry"] else {}
    request = make_request(args, teacher, size, chosen, dataset, shards, config)
    plan = ["teacher"] + ([] if same_labels else ["reference"]) \
        + ([] if chosen == NO_DESIGN else ["distill"]) + ["student", "evaluate"]
    return _Conversion(args=args, config=config, shards=shards, info=info, dataset=dataset, spec=spec,
                       strategy=strategy, design=chosen, teacher=teacher, size=size, same_labels=same_labels, rt=rt,
                       out=Path(args.out).expanduser().resolve(), request=request, plan=plan)


class _Stages:
    """The numbered stage lines; `run` skips a step whose metrics.json exists, unless a step before it
    ran in this invocation (then what it would skip was made from older inputs)."""

    def __init__(self, names: list[str]):
        self.names, self.ran = names, False

    def start(self, name: str, text: str) -> None:
        say(f"[{self.names.index(name) + 1}/{len(self.names)}] {name}: {text}")

    def run(self, name: str, folder: Path, text: str, fn, settings: dict | None = None) -> dict:
        """`settings`: what the step's metrics record of how it ran; a step done under others runs again."""
        finished = None if self.ran else done(folder)
        changed = [k for k, v in (settings or {}).items() if finished is not None and finished.get(k) != v]
        if changed:
            finished = None
            text += f" (again: {changed[0]} changed)"
        self.start(name, text + (f" (done: {folder / 'metrics.json'} exists, skipped)" if finished else ""))
        if finished is not None:
            return finished
        self.ran = True
        return fn()


# -- the stages, in the order `convert` runs them ----------------------------------------------------

def _teacher(job: _Conversion, stages: _Stages) -> dict:
    """teacher/: a timm name or weights file loaded through run_teacher's `teachers:` path; a teacher
    folder is used where it is. Returns the teacher's model.json."""
    from .. import steps
    from ..io import read_json

    arch, teacher_dir = job.teacher["arch"], job.teacher_dir
    if job.teacher["kind"] != "folder":
        where = job.teacher["entry"].get("file") or "timm's hub or its cache"
        stages.run("teacher", teacher_dir, f"loading {arch['timm_model']} from {where}",
                   lambda: steps.run_teacher(job.config, job.size, None, None, teacher_dir, runtime=job.rt))
    else:
        stages.start("teacher", f"the folder {teacher_dir} ({arch['timm_model']}"
                     + (f", trained on {arch['dataset']!r}" if arch.get("dataset") else "") + ")")
    return read_json(teacher_dir / "model.json", what="teacher description")


def _reference(job: _Conversion, stages: _Stages, step_size: str) -> None:
    """reference/: the teacher trained on the target's labels with the student's budget."""
    from .. import steps
    from ..config import NO_DESIGN, REFERENCE_INIT
    from ..registry import SOFTMAX

    if "reference" not in job.plan:
        return
    folder = job.folder("reference")
    stages.run("reference", folder,
               f"dataset {job.dataset!r} has its own labels, so the teacher's head does not apply to it: the "
               f"softmax reference (the teacher trained on it, {job.budget} steps) is what the student is compared with",
               lambda: steps.run_student(job.config, job.dataset, step_size, SOFTMAX, REFERENCE_INIT, job.args.seed,
                                         job.teacher_dir, job.shards, folder, runtime=job.rt, design=NO_DESIGN,
                                         budget=job.budget))


def _distill(job: _Conversion, stages: _Stages, step_size: str) -> None:
    """distill/ (stage 1): the student as the init strategy makes it, trained by the design."""
    from .. import steps

    if "distill" not in job.plan:
        return
    args, folder = job.args, job.folder("distill")
    stages.run("distill", folder,
               f"design {job.design!r}, {job.config['distill']['train']['steps']} steps, from the student as init "
               f"strategy {args.init!r} makes it",
               lambda: steps.run_distill(job.config, job.dataset, step_size, args.variant, args.init, job.design,
                                         args.seed, job.teacher_dir, job.shards, folder, runtime=job.rt))


def _student(job: _Conversion, stages: _Stages, step_size: str) -> None:
    """student/ (stage 2): the student trained on the target; logits from the reference where the
    strategy's training losses distill logits and the target has its own labels."""
    from .. import steps
    from ..config import LOGIT_LOSSES, NO_DESIGN
    from ..models import model_name

    args, folder = job.args, job.folder("student")
    kd = any((t if isinstance(t, str) else t["loss"]) in LOGIT_LOSSES for t in job.strategy.get("train_losses") or [])
    stages.run("student", folder, f"{model_name(job.size, args.variant)} on {job.dataset!r}, {job.budget} steps",
               lambda: steps.run_student(job.config, job.dataset, step_size, args.variant, args.init, args.seed,
                                         job.teacher_dir, job.shards, folder,
                                         distilled_dir=job.folder("distill") if job.design != NO_DESIGN else None,
                                         runtime=job.rt, design=job.design, budget=job.budget,
                                         kd_dir=job.folder("reference") if kd and not job.same_labels else None))


def _evaluate(job: _Conversion, stages: _Stages, teacher_arch: dict, call: dict) -> dict:
    """evaluate/: accuracy, latency and peak memory of the exported checkpoint and its baseline; run
    again when the benchmark settings changed."""
    args, folder = job.args, job.folder("evaluate")
    batch = args.bench_batch if args.bench_batch is not None else \
        job.config.get("evaluation", {}).get("throughput_batch", 64)
    return stages.run("evaluate", folder, f"accuracy on the test split of {job.dataset!r}, latency and peak "
                                          f"memory on {device_name(job.rt)}",
                      lambda: evaluate(job.spec, job.info, job.shards, job.teacher_dir, teacher_arch, job.same_labels,
                                       job.folder("reference"), call, job.rt, folder, batch=batch,
                                       seconds=args.bench_seconds),
                      settings={"bench_batch": int(batch), "bench_seconds": float(args.bench_seconds)})
