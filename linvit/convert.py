"""`linvit convert`: one pretrained softmax timm ViT in, one linear-attention timm checkpoint out.

The pipeline's own steps (linvit.steps), run in order in subfolders of --out, each skipped when its
metrics.json exists (a rerun resumes; a killed training step resumes from its own checkpoint):

    teacher/    the teacher loaded from a timm name or a weights file (run_teacher's `teachers:` path);
                a harness teacher folder (with model.json) is used where it is
    reference/  only when the target's labels are not the teacher's: the softmax reference (the
                teacher trained on the target with the student's budget), what the student is compared with
    distill/    stage 1, when the init strategy distills: the student as the strategy initializes it,
                trained by the distillation design (run_distill)
    student/    stage 2: the student trained on the target for --steps (run_student)
    evaluate/   accuracy on the target's test split of the exported checkpoint (loaded back through
                timm) and of the teacher or reference; latency and peak memory of both

Then --out/model.safetensors and --out/config.json (linvit.teachers.save_timm_checkpoint), which
`timm.create_model("linvit_<size>_<variant>", pretrained=True, pretrained_cfg_overlay=...)` loads
after `import linvit.models`, and summary.json / summary.md saying what was copied, distilled and
measured, with the exact call. Everything that can be refused (a teacher that does not exist, does not
match the requested student, or cannot fit the dataset; unknown names) is refused in one line before
any training. See docs/convert.md.

Wiring into linvit.cli: `add_parser(subparsers)`; `main(argv)` runs it standalone and returns the
exit status. This module imports torch lazily (only when the command runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["add_parser", "main", "convert", "load_converted"]

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "workflow" / "config" / "default.yaml"
DEFAULT_INIT = "copy_mlp_distill"
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
SHAPE_KEYS = ("embed_dim", "depth", "num_heads", "patch_size")
REQUEST = "request.json"  # what --out was made with: a rerun with other settings is refused


class ConvertError(ValueError):
    """A conversion that cannot run, said in one line."""


# -- command line -----------------------------------------------------------------------------

def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--teacher", required=True,
                   help="a teacher folder written by `linvit teacher` (with model.json), a timm model name "
                        "(weights from timm's hub or its cache), or a weights file (.safetensors/.pth/.pt/.bin)")
    p.add_argument("--model", default=None,
                   help="the timm model name a weights file fits (default: the 'architecture' of the "
                        "timm config.json beside it)")
    p.add_argument("--model-args", default=None, type=json.loads,
                   help="JSON: timm.create_model options the teacher weights were made with (e.g. "
                        "'{\"reg_tokens\": 4}'), for a name or a file")
    p.add_argument("--variant", required=True, help="the linear attention operator (see `linvit variants`)")
    p.add_argument("--size", default=None,
                   help="the requested student's linvit size (micro, mini, deit_tiny, ...); checked against "
                        "the teacher's shape before anything runs (default: the size of the teacher's shape)")
    p.add_argument("--init", default=DEFAULT_INIT, help=f"init strategy of the config (default {DEFAULT_INIT})")
    p.add_argument("--design", default=None,
                   help="distillation design (default: the config's first of `distills`, i.e. the paper's recipe)")
    p.add_argument("--shards", required=True, help="the target's shards (`linvit shards`); its test split is evaluated")
    p.add_argument("--dataset", default=None,
                   help="the config's dataset entry for the shards (transform, labels); default: the "
                        "dataset name in the shards' manifest")
    p.add_argument("--distill-steps", type=int, default=None, help="stage 1 budget (default: distill.train.steps)")
    p.add_argument("--steps", type=int, default=None, help="stage 2 budget (default: student.train.steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default=None,
                   help=f"config file whose training settings to use (default: {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[2])})")
    p.add_argument("--device", default=None, help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--bench-batch", type=int, default=None,
                   help="the larger batch of the latency and memory figures (default: evaluation.throughput_batch)")
    p.add_argument("--bench-seconds", type=float, default=0.5,
                   help="least time each latency figure is measured for (default 0.5)")
    p.add_argument("--out", required=True, help="output folder")
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    """`linvit convert` in linvit.cli's subcommands; errors raise, for cli.main to print in one line."""
    p = subparsers.add_parser("convert", help="convert a pretrained softmax timm ViT into a linear-attention "
                                              "timm checkpoint (distill, train, evaluate, export)",
                              description=__doc__.split("\n\n")[0])
    _arguments(p)
    p.set_defaults(fn=_cli, config_json=None)
    return p


def _cli(args: argparse.Namespace) -> None:
    if args.threads < 0:
        raise ConvertError(f"--threads {args.threads}: give a positive number of threads (0: torch's choice)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    convert(args)


def main(argv=None) -> int:
    """Run `linvit convert` with `argv` (a list of arguments, or an argparse.Namespace); the exit
    status: 0, 1 with one line on stderr for a mistake or a diverged run, 130 when interrupted."""
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        args = _arguments(argparse.ArgumentParser(prog="linvit convert", description=__doc__.split("\n\n")[0])
                          ).parse_args(argv)
    from .train import TrainingDiverged

    try:
        _cli(args)
    except KeyboardInterrupt:
        print("linvit convert: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, TrainingDiverged) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"linvit convert: error: {msg}", file=sys.stderr)
        return 1
    return 0


# -- what to convert, checked before anything runs --------------------------------------------------

def _say(text: str) -> None:
    print(text, flush=True)


def _shape_of(model) -> dict:
    return {"embed_dim": int(model.embed_dim), "depth": len(model.blocks),
            "num_heads": int(model.blocks[0].attn.num_heads), "patch_size": int(model.patch_embed.patch_size[0])}


def _shape_text(shape: dict) -> str:
    return (f"embed dim {shape['embed_dim']}, depth {shape['depth']}, {shape['num_heads']} heads, "
            f"patch {shape['patch_size']}")


def _resolve_teacher(args) -> dict:
    """Where the teacher comes from, and its architecture built on the meta device (no weights, no
    compute): {kind, label, arch, meta, entry (the `teachers:` entry for a name/file), dir (a folder)}."""
    import torch

    from .io import read_json
    from .teachers import describe, pretrained_architecture, timm_config

    given = str(args.teacher)
    path = Path(given).expanduser()
    model_args = dict(args.model_args or {})
    if path.is_dir():
        arch = read_json(path / "model.json", what=f"teacher folder {path}: model description") \
            if (path / "model.json").is_file() else None
        if arch is None:
            raise ConvertError(f"teacher folder {path} has no model.json (give a folder written by `linvit teacher`, "
                               f"a weights file or a timm model name)")
        if arch.get("variant", "softmax") != "softmax":
            raise ConvertError(f"teacher folder {path} holds a {arch['variant']!r} student, not a softmax teacher")
        from .teachers import build_model

        with torch.device("meta"):
            meta = build_model(arch)
        return {"kind": "folder", "label": f"{path} ({arch.get('timm_model', arch.get('size'))})", "arch": arch,
                "meta": meta, "entry": None, "dir": path.resolve()}
    if path.is_file():
        if path.suffix not in WEIGHT_SUFFIXES:
            raise ConvertError(f"teacher {path} is a file but not a weights file ({', '.join(WEIGHT_SUFFIXES)})")
        name = args.model or timm_config(path).get("architecture")
        if not name:
            raise ConvertError(f"teacher weights file {path}: give --model TIMM_NAME (its architecture); there is "
                               f"no timm config.json beside it naming one")
        entry = {"model": name, "file": str(path.resolve()), **({"model_args": model_args} if model_args else {})}
        kind, label, file = "file", f"{name} (file {path})", path
    else:
        looks_like_path = os.sep in given or given.startswith((".", "~")) or given.endswith(WEIGHT_SUFFIXES)
        import timm

        if looks_like_path or not timm.is_model(given):
            raise ConvertError(f"teacher {given!r} does not exist: it is neither a folder, a weights file nor a "
                               f"timm model name")
        name, file = given, None
        entry = {"model": name, **({"model_args": model_args} if model_args else {})}
        kind, label = "hub", name
    # The architecture the steps will load it into (linvit.teachers), on the meta device; a file's
    # classes and channels are read from its head and patch embedding, as the loader reads them.
    meta, options, _, _ = pretrained_architecture(name, file=file, model_args=model_args, weights=True)
    arch = describe(meta, timm_model=name, model_args=options, source=kind)
    return {"kind": kind, "label": label, "arch": arch, "meta": meta, "entry": entry, "dir": None}


def _student_size(teacher: dict, requested: str | None, variant: str) -> str:
    """The linvit size of the student: --size, checked against the teacher's shape, else the size
    whose shape the teacher has. timm rebuilds a converted student only as linvit_<size>_<variant>."""
    from .models import model_name
    from .sizes import SIZES

    shape = _shape_of(teacher["meta"])
    if requested is not None:
        if requested not in SIZES:
            raise ConvertError(f"--size {requested!r} is not a linvit size; known sizes: {', '.join(SIZES)}")
        wanted = {k: SIZES[requested][k] for k in SHAPE_KEYS}
        if wanted != shape:
            raise ConvertError(f"teacher {teacher['label']} has {_shape_text(shape)}; the requested student "
                               f"{model_name(requested, variant)} (--size {requested}) has {_shape_text(wanted)}")
        return requested
    own = teacher["arch"].get("size")
    candidates = ([own] if own in SIZES else []) + list(SIZES)
    for name in candidates:
        if {k: SIZES[name][k] for k in SHAPE_KEYS} == shape:
            return name
    known = "; ".join(f"{n}: {_shape_text(s)}" for n, s in SIZES.items())
    raise ConvertError(f"teacher {teacher['label']} has {_shape_text(shape)}, the shape of no linvit size "
                       f"({known}): a converted student is a linvit_<size>_<variant> timm model")


def _first_difference(a: dict, b: dict) -> str | None:
    for key, value in a.items():
        if key not in b:
            return f"{key!r} is only in the first"
        if tuple(b[key].shape) != tuple(value.shape):
            return f"{key!r} is {tuple(value.shape)} against {tuple(b[key].shape)}"
    extra = next((k for k in b if k not in a), None)
    return None if extra is None else f"{extra!r} is only in the second"


def _check_student(teacher: dict, size: str, variant: str) -> None:
    """The student the steps train (the teacher's architecture with `variant` attention) must be the
    one timm builds as linvit_<size>_<variant> with the teacher's options: compared on the meta device."""
    import timm
    import torch

    from .models import model_name
    from .teachers import build_model

    arch, name = teacher["arch"], model_name(size, variant)
    geometry = {"num_classes": arch["num_classes"], "img_size": tuple(arch["img_size"]), "in_chans": arch["in_chans"]}
    with torch.device("meta"):
        try:
            trained = build_model(arch, variant=variant)
        except ValueError as err:
            raise ConvertError(f"teacher {teacher['label']} cannot take {variant!r} attention: "
                               f"{str(err).splitlines()[0]}") from None
        exported = timm.create_model(name, pretrained=False, **arch.get("model_args", {}), **geometry)
    problem = _first_difference(trained.state_dict(), exported.state_dict())
    if problem:
        raise ConvertError(f"teacher {teacher['label']} with {variant!r} attention is not the timm model {name} "
                           f"with its options ({problem}): timm could not load the converted checkpoint")


def _design(config: dict, init: str, given: str | None) -> str:
    """The distillation design: 'none' for a strategy that does not distill, the design a strategy
    names, else --design, else the config's first design (the paper's recipe in default.yaml)."""
    from .config import NO_DESIGN, design_names, design_specs, init_strategy

    distill = init_strategy(config, init).get("distill", False)
    if not distill:
        if given not in (None, NO_DESIGN):
            raise ConvertError(f"init strategy {init!r} does not distill: --design {given} does not apply")
        return NO_DESIGN
    if isinstance(distill, str):
        if given not in (None, distill):
            raise ConvertError(f"init strategy {init!r} distills with design {distill!r} only, not {given!r}")
        return distill
    known = design_specs(config)
    if given is None:
        names = design_names(config)
        if not names:
            raise ConvertError(f"init strategy {init!r} distills, but the config names no distillation design "
                               f"(distills, distill_designs or distill.loss)")
        return names[0]
    if given not in known:
        raise ConvertError(f"unknown distillation design {given!r}; known: {', '.join(sorted(known)) or 'none'}")
    return given


def _config(args) -> dict:
    """The training settings: --config's, else default.yaml's; the budgets from --distill-steps and
    --steps (they are the config keys the steps read, so they are in each step's fingerprint)."""
    import copy

    from .config import get, load_config, validate_schema

    path = args.config or DEFAULT_CONFIG
    config = copy.deepcopy(load_config(path))
    try:
        validate_schema(config, partial=True)  # types and ranges, before any step
    except ValueError as err:
        raise ConvertError(f"{path}: {err}") from None
    for key in ("student.train", "distill.train", "init_strategies"):
        get(config, key)  # a config without training settings is one line naming the key
    if args.bench_batch is not None and args.bench_batch < 1:
        raise ConvertError(f"--bench-batch {args.bench_batch}: give a batch of 1 or more")
    if not args.bench_seconds > 0:
        raise ConvertError(f"--bench-seconds {args.bench_seconds}: give a time above 0")
    for flag, key, value in (("--distill-steps", "distill", args.distill_steps), ("--steps", "student", args.steps)):
        if value is not None:
            if not 1 <= value <= 10**8:
                raise ConvertError(f"{flag} {value}: give a number of steps from 1 to 10^8")
            config[key]["train"]["steps"] = int(value)
    return config


def _check_request(out: Path, request: dict) -> None:
    """--out holds one conversion: a rerun with other settings would skip steps made under them."""
    from .io import read_json, write_json

    path = out / REQUEST
    if path.exists():
        old = read_json(path, what="conversion request")
        changed = [k for k in [*request, *(k for k in old if k not in request)] if old.get(k) != request.get(k)]
        if changed:
            k = changed[0]
            raise ConvertError(f"{out} holds a conversion made with other settings ({k}: {old.get(k)!r}, now "
                               f"{request.get(k)!r}): use another --out, or remove it")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, request)


# -- the conversion ---------------------------------------------------------------------------------

class _Stages:
    """The numbered stage lines; `run` skips a step whose metrics.json exists, unless a step before it
    ran in this invocation (then what it would skip was made from older inputs)."""

    def __init__(self, names: list[str]):
        self.names, self.ran = names, False

    def start(self, name: str, text: str) -> None:
        _say(f"[{self.names.index(name) + 1}/{len(self.names)}] {name}: {text}")

    def run(self, name: str, folder: Path, text: str, fn, settings: dict | None = None) -> dict:
        """`settings`: what the step's metrics record of how it ran; a step done under others runs again."""
        done = None if self.ran else _done(folder)
        changed = [k for k, v in (settings or {}).items() if done is not None and done.get(k) != v]
        if changed:
            done = None
            text += f" (again: {changed[0]} changed)"
        self.start(name, text + (f" (done: {folder / 'metrics.json'} exists, skipped)" if done else ""))
        if done is not None:
            return done
        self.ran = True
        return fn()


def _done(folder: Path) -> dict | None:
    from .io import read_json

    metrics = folder / "metrics.json"
    return read_json(metrics, what=f"{folder.name} metrics") if metrics.exists() else None


def convert(args) -> dict:
    """Run the conversion `args` (the command's arguments) describes; returns the summary."""
    from . import inputs
    from .config import LOGIT_LOSSES, NO_DESIGN, REFERENCE_INIT, init_strategy
    from .data.loader import read_manifest
    from .data.shards import MANIFEST
    from .device import runtime as make_runtime
    from .io import file_sha256, read_json
    from .models import model_name
    from .registry import SOFTMAX, names
    from .teachers import check_fit

    config = _config(args)
    shards = Path(args.shards).expanduser().resolve()
    info = read_manifest(shards / MANIFEST)
    dataset = args.dataset or info.get("dataset") or shards.name
    spec = config.setdefault("datasets", {}).setdefault(dataset, {})
    variants = [v for v in names("variant") if v != SOFTMAX]
    if args.variant not in variants:
        raise ConvertError(f"--variant {args.variant!r} is not a linear attention operator; known: {', '.join(variants)}")
    strategy = init_strategy(config, args.init)
    design = _design(config, args.init, args.design)
    teacher = _resolve_teacher(args)
    size = _student_size(teacher, args.size, args.variant)
    _check_student(teacher, size, args.variant)
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
    # Everything that can be refused has been: from here on, the steps run.
    out = Path(args.out).expanduser().resolve()
    request = {"teacher": str(teacher["dir"] or (teacher["entry"].get("file") or teacher["entry"]["model"])),
               "model": arch["timm_model"], "model_args": arch.get("model_args", {}), "size": size,
               "variant": args.variant, "init": args.init, "design": design, "dataset": dataset,
               "shards_manifest_sha256": file_sha256(shards / MANIFEST), "seed": args.seed,
               "distill_steps": config["distill"]["train"]["steps"], "steps": config["student"]["train"]["steps"],
               "config_sha256": _sha(config)}
    weights = teacher["dir"] / "model.safetensors" if teacher["dir"] else teacher["entry"].get("file")
    if weights is not None and Path(weights).is_file():
        request["teacher_sha256"] = file_sha256(weights)
    _check_request(out, request)
    kd = any((t if isinstance(t, str) else t["loss"]) in LOGIT_LOSSES for t in strategy.get("train_losses") or [])
    plan = ["teacher"] + ([] if same_labels else ["reference"]) \
        + ([] if design == NO_DESIGN else ["distill"]) + ["student", "evaluate"]
    stages = _Stages(plan)
    budget = config["student"]["train"]["steps"]
    from . import steps

    # teacher
    if teacher["kind"] != "folder":
        teacher_dir = out / "teacher"
        where = teacher["entry"].get("file") or "timm's hub or its cache"
        stages.run("teacher", teacher_dir, f"loading {arch['timm_model']} from {where}",
                   lambda: steps.run_teacher(config, size, None, None, teacher_dir, runtime=rt))
    else:
        teacher_dir = teacher["dir"]
        stages.start("teacher", f"the folder {teacher_dir} ({arch['timm_model']}"
                     + (f", trained on {arch['dataset']!r}" if arch.get("dataset") else "") + ")")
    teacher_arch = read_json(teacher_dir / "model.json", what="teacher description")
    step_size = teacher_arch.get("size") or size  # the name the steps know the teacher by

    # reference: the teacher trained on the target's labels with the student's budget
    reference_dir = out / "reference"
    if "reference" in plan:
        stages.run("reference", reference_dir,
                   f"dataset {dataset!r} has its own labels, so the teacher's head does not apply to it: the "
                   f"softmax reference (the teacher trained on it, {budget} steps) is what the student is compared with",
                   lambda: steps.run_student(config, dataset, step_size, SOFTMAX, REFERENCE_INIT, args.seed,
                                             teacher_dir, shards, reference_dir, runtime=rt, design=NO_DESIGN,
                                             budget=budget))

    # stage 1
    distill_dir = out / "distill"
    if "distill" in plan:
        stages.run("distill", distill_dir,
                   f"design {design!r}, {config['distill']['train']['steps']} steps, from the student as init "
                   f"strategy {args.init!r} makes it",
                   lambda: steps.run_distill(config, dataset, step_size, args.variant, args.init, design, args.seed,
                                             teacher_dir, shards, distill_dir, runtime=rt))

    # stage 2
    student_dir = out / "student"
    stages.run("student", student_dir, f"{model_name(size, args.variant)} on {dataset!r}, {budget} steps",
               lambda: steps.run_student(config, dataset, step_size, args.variant, args.init, args.seed,
                                         teacher_dir, shards, student_dir,
                                         distilled_dir=distill_dir if design != NO_DESIGN else None, runtime=rt,
                                         design=design, budget=budget,
                                         kd_dir=reference_dir if kd and not same_labels else None))
    call = _export(student_dir, size, out, fresh=stages.ran)

    # evaluation
    eval_dir = out / "evaluate"
    batch = args.bench_batch if args.bench_batch is not None else config.get("evaluation", {}).get("throughput_batch", 64)
    evaluation = stages.run("evaluate", eval_dir, f"accuracy on the test split of {dataset!r}, latency and peak "
                                                  f"memory on {_device_name(rt)}",
                            lambda: _evaluate(spec, info, shards, teacher_dir, teacher_arch, same_labels,
                                              reference_dir, call, rt, eval_dir, batch=batch,
                                              seconds=args.bench_seconds),
                            settings={"bench_batch": int(batch), "bench_seconds": float(args.bench_seconds)})
    summary = _summary(out, teacher, teacher_dir, request, strategy, same_labels, call, evaluation)
    for line in _closing_lines(summary):
        _say(line)
    return summary


def _sha(data) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


# -- export -------------------------------------------------------------------------------------

def _timm_call(out: Path) -> dict:
    """The timm.create_model call that loads --out/model.safetensors: its name and keywords. The
    overlay carries the checkpoint's pretrained_cfg (classes, input size, mean, std, crop): with
    the architecture's default class count timm would drop the trained head."""
    from .io import read_json

    config = read_json(out / "config.json", what="exported timm config")
    cfg = config["pretrained_cfg"]
    overlay = {"file": str(out / "model.safetensors")}
    overlay.update({k: cfg[k] for k in ("num_classes", "input_size", "mean", "std", "crop_pct", "interpolation")
                    if k in cfg})
    overlay["num_classes"] = config["num_classes"]
    c, h, w = cfg["input_size"]
    # timm's exporter adds the geometry to model_args: given once, below.
    options = {k: v for k, v in (config.get("model_args") or {}).items() if k not in _CALL_KEYS}
    kwargs = {"pretrained": True, "pretrained_cfg_overlay": overlay, **options,
              "num_classes": config["num_classes"], "img_size": [h, w], "in_chans": c}
    text = "import timm, linvit.models\nmodel = timm.create_model(" + ", ".join(
        [repr(config["architecture"])] + [f"{k}={_py(v)}" for k, v in kwargs.items()]) + ")"
    return {"model_name": config["architecture"], "kwargs": kwargs, "code": text}


def _py(value) -> str:
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={_py(v)}" for k, v in value.items()) + ")"
    if isinstance(value, list):
        return "(" + ", ".join(_py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def load_converted(call: dict):
    """The converted model as timm builds it from the summary's call (`import linvit.models` first)."""
    import timm

    import linvit.models  # noqa: F401  registers linvit_<size>_<variant>

    return timm.create_model(call["model_name"], **call["kwargs"]).eval()


def _export(student_dir: Path, size: str, out: Path, *, fresh: bool) -> dict:
    """--out/model.safetensors and config.json (timm's layout), written when the student was trained
    in this run or they are missing; checked by loading them back through timm: every tensor equal
    to the trained student's."""
    import torch

    from .steps import load_model
    from .teachers import save_timm_checkpoint

    model, arch = load_model(student_dir, what="student")
    if fresh or not (out / "model.safetensors").exists() or not (out / "config.json").exists():
        save_timm_checkpoint(model, {**arch, "size": size}, out)
    call = _timm_call(out)
    loaded = load_converted(call).state_dict()
    own = model.state_dict()
    bad = next((k for k in own if k not in loaded or not torch.equal(own[k], loaded[k])), None)
    if bad is not None or set(loaded) != set(own):
        raise ConvertError(f"{out / 'model.safetensors'} does not load back through timm as trained "
                           f"({bad or 'other tensors'}); remove it and rerun")
    return call


# -- evaluation -------------------------------------------------------------------------------------

def _device_name(rt) -> str:
    import platform

    import torch

    from .io import cpu_info

    if rt.cuda:
        return f"{rt.device} ({torch.cuda.get_device_name(rt.device)})"
    cpu = cpu_info("model name") or platform.processor() or platform.machine()
    return f"cpu ({cpu}, {torch.get_num_threads()} torch threads)"


def _evaluate(spec, info, shards: Path, teacher_dir: Path, teacher_arch: dict, same_labels: bool,
              reference_dir: Path, call: dict, rt, eval_dir: Path, *, batch: int, seconds: float) -> dict:
    """Accuracy (fp32, on the runtime's device) of the exported checkpoint loaded through timm and of
    the teacher (adapted to the dataset's geometry) or the softmax reference, on the test split read
    exactly as the steps read it; then latency and peak memory of both."""
    from . import inputs
    from .data.loader import ShardSet
    from .evaluate import accuracy, parameter_counts
    from .io import write_json
    from .steps import load_model
    from .teachers import adapt, describe

    data = ShardSet(shards, pipeline=inputs.pipeline(spec, teacher_arch, info))
    converted = load_converted(call).to(rt.device)
    fp32 = _fp32(rt)
    result = {"converted": {**accuracy(converted, data, runtime=fp32), **parameter_counts(converted)}}
    if same_labels:
        base, base_arch = load_model(teacher_dir, what="teacher")
        base, base_arch = adapt(base, base_arch, img_size=tuple(data.input_size), num_classes=data.num_classes)
        role = "teacher"
        note = "the teacher itself (the dataset shares its labels)"
    else:
        base, base_arch = load_model(reference_dir, what="softmax reference")
        role = "reference"
        note = ("the softmax reference: the teacher trained on the target with the student's budget (the "
                "dataset has its own labels, so the teacher's head does not apply to it)")
    base = base.eval().to(rt.device)
    result["baseline"] = {"role": role, "note": note, **accuracy(base, data, runtime=fp32),
                          **parameter_counts(base)}
    size = tuple(data.input_size)
    example = {"channels": data.channels, "size": list(size)}
    converted_arch = describe(converted, timm_model=call["model_name"], model_args={
        k: v for k, v in call["kwargs"].items() if k not in _CALL_KEYS})
    bench = _benchmark({"baseline": (base, base_arch), "converted": (converted, converted_arch)}, example, rt,
                       batch=batch, seconds=seconds)
    metrics = {"test_samples": data.num_samples("test"), "accuracy_precision": "fp32", "bench_seconds": float(seconds),
               "pipeline": "the whole image, normalized by the shards' statistics" if data.pipeline is None
               else "timm's evaluation transform (resize, center crop, normalize)",
               **result, **bench}
    write_json(eval_dir / "metrics.json", metrics)
    return metrics


_CALL_KEYS = ("pretrained", "pretrained_cfg_overlay", "num_classes", "img_size", "in_chans")


def _fp32(rt):
    from dataclasses import replace

    return replace(rt, precision="fp32")


def _larger(model, arch: dict, side: tuple[int, int]):
    """(the model at twice the side, a note): position embeddings resampled by timm's
    resample_abs_pos_embed (linvit.teachers.adapt). An operator whose own parameters are shaped by
    the patch grid is rebuilt at the new grid with fresh weights (timing and memory do not depend on
    the values), and the note says so; (None, why) when it cannot be built at all."""
    from .models import model_variant
    from .teachers import adapt, build_model

    try:
        bigger, _ = adapt(model.cpu(), arch, img_size=side)
        return bigger.eval(), "position embeddings resampled"
    except (ValueError, RuntimeError) as err:
        import re

        found = re.search(r"size mismatch for ([\w.]+)", str(err))
        detail = (f"{found.group(1)} is shaped by the patch grid" if found
                  else (str(err).strip().splitlines() or [type(err).__name__])[0][:120])
    try:
        fresh = build_model(arch, variant=model_variant(model), num_classes=model.num_classes, img_size=side,
                            in_chans=model.patch_embed.proj.in_channels)
    except (ValueError, RuntimeError) as err:
        return None, f"cannot be built at {side[0]}x{side[1]}: {str(err).strip().splitlines()[0]}"
    return fresh.eval(), f"weights do not carry over ({detail}): timed with fresh weights"


def _benchmark(models: dict, example: dict, rt, *, batch: int, seconds: float) -> dict:
    """Latency (ms per image at batch 1 and `batch`) and peak forward memory of each model
    ({name: (model, arch)}) at its resolution and at twice the side (4x the patch tokens), under the
    runtime's precision on its device."""
    h, w = example["size"]
    c = example["channels"]
    sides = {"native": (h, w), "4x_tokens": (2 * h, 2 * w)}
    batches = sorted({1, int(batch)})
    rows, probes = [], []
    for name, (model, arch) in models.items():
        for res, side in sides.items():
            m, why = (model, None) if res == "native" else _larger(model, arch, side)
            if m is not None:
                m = m.to(rt.device).eval()
                probes.append({"arch": arch, "img_size": list(side), "shapes": [[b, c, *side] for b in batches],
                               "rows": list(range(len(rows), len(rows) + len(batches)))})
            for b in batches:
                p = _patch(model)
                row = {"model": name, "resolution": res, "image_size": list(side),
                       "tokens": (side[0] // p) * (side[1] // p), "batch": b}
                if m is None:
                    row["skipped"] = why
                else:
                    if why:
                        row["note"] = why
                    row["ms_per_image"] = _latency(m, (b, c, *side), rt, seconds)
                    if rt.cuda:
                        row["peak_mib"] = _cuda_peak(m, (b, c, *side), rt)
                rows.append(row)
            if m is not None and m is not model:
                del m
    if rt.cuda:
        method = ("torch.cuda.max_memory_allocated during one forward (after reset_peak_memory_stats), minus the "
                  "memory allocated before it (the weights and the input batch): the forward's own peak")
    else:
        method, peaks = _cpu_peaks(probes, rt)
        for probe, values in zip(probes, peaks):
            for i, value in zip(probe["rows"], values):
                rows[i]["peak_mib"] = value
    return {"device": _device_name(rt), "precision": rt.precision, "bench_batch": int(batch),
            "memory_method": method, "speed": rows}


def _patch(model) -> int:
    return int(model.patch_embed.patch_size[0])


def _latency(model, shape, rt, seconds: float) -> float:
    """Milliseconds per image of a forward at `shape` (batch first), from the harness's own
    throughput measurement (linvit.evaluate.throughput: warm-up, then at least `seconds` of runs)."""
    import torch

    from .evaluate import throughput

    example = torch.randn(1, *shape[1:])
    return round(1e3 / throughput(model, example, batch_size=shape[0], seconds=seconds, runtime=rt), 4)


def _cuda_peak(model, shape, rt) -> float:
    import torch

    x = torch.randn(*shape, device=rt.device)
    torch.cuda.synchronize(rt.device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(rt.device)
    before = torch.cuda.memory_allocated(rt.device)
    with torch.no_grad(), rt.autocast():
        model(x)
    torch.cuda.synchronize(rt.device)
    return round((torch.cuda.max_memory_allocated(rt.device) - before) / 2**20, 3)


_CPU_METHOD = ("measured in a separate process: each model rebuilt there at the resolution (same architecture, "
               "random weights: activations do not depend on their values) and run once as a warm-up; then "
               "for each batch the input built, freed heap returned to the OS (glibc malloc_trim), the peak "
               "resident size reset (/proc/self/clear_refs), one forward, and VmHWM after it minus VmRSS "
               "before it: the forward's own peak, weights and input excluded")


def _cpu_peaks(probes: list, rt) -> tuple[str, list]:
    """Peak forward memory on the CPU of each probe ({arch, img_size, shapes}), in MiB, measured in
    a child process (see _CPU_METHOD)."""
    import subprocess

    import torch

    if not probes:
        return _CPU_METHOD, []
    jobs = [{k: p[k] for k in ("arch", "img_size", "shapes")} for p in probes]
    proc = subprocess.run([sys.executable, "-c", "from linvit.convert import _memory_child; _memory_child()"],
                          input=json.dumps({"threads": torch.get_num_threads(), "precision": rt.precision,
                                            "jobs": jobs}),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"not measured: the measuring process failed ({last})", [[None] * len(p["shapes"]) for p in probes]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["method"], result["peaks"]


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")


def _memory_child() -> None:
    """The child of _cpu_peaks: reads the jobs as JSON on stdin, prints the peaks as JSON."""
    import ctypes
    import gc

    request = json.loads(sys.stdin.read())
    import torch

    import linvit.models  # noqa: F401
    from linvit.device import cpu_runtime
    from linvit.teachers import build_model

    torch.set_num_threads(request["threads"])
    autocast = cpu_runtime().autocast if request.get("precision", "fp32") == "fp32" else \
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        trim = None
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _status_kib("VmHWM")
    except OSError as err:
        print(json.dumps({"method": f"not measured: the peak resident size cannot be reset here ({err})",
                          "peaks": [[None] * len(j["shapes"]) for j in request["jobs"]]}))
        return
    method = _CPU_METHOD + ("" if trim else " (malloc_trim unavailable: freed heap may be reused, "
                                            "an underestimate)")
    peaks = []
    for job in request["jobs"]:
        model = build_model(job["arch"], img_size=job["img_size"]).eval()
        values = []
        with torch.no_grad(), autocast():
            model(torch.randn(1, *job["shapes"][0][1:]))
            for shape in job["shapes"]:
                x = torch.randn(*shape)
                gc.collect()
                if trim:
                    trim(0)
                before = _status_kib("VmRSS")
                Path("/proc/self/clear_refs").write_text("5")
                model(x)
                values.append(round((_status_kib("VmHWM") - before) / 1024, 3))
                del x
        peaks.append(values)
        del model
    print(json.dumps({"method": method, "peaks": peaks}))


# -- summary ----------------------------------------------------------------------------------------

def _summary(out: Path, teacher: dict, teacher_dir: Path, request: dict, strategy: dict, same_labels: bool,
             call: dict, evaluation: dict) -> dict:
    from .io import read_json, write_json, write_text

    student = read_json(out / "student" / "metrics.json", what="student metrics")
    distill = _done(out / "distill") if request["design"] != "none" else None
    copied = {g: int(n) for g, n in (student.get("copied") or {}).items()}
    conv, base = evaluation["converted"], evaluation["baseline"]
    summary = {
        "out": str(out),
        "timm": {**call, "local_dir": f"timm.create_model('local-dir:{out}', pretrained=True)  "
                                      f"# after import linvit.models"},
        "teacher": {"source": teacher["kind"], "model": teacher["arch"]["timm_model"],
                    "model_args": teacher["arch"].get("model_args", {}), "given": str(request["teacher"]),
                    "folder": str(teacher_dir), "shape": _shape_of(teacher["meta"])},
        "student": {"model": call["model_name"], "size": request["size"], "variant": request["variant"],
                    "init": request["init"], "design": request["design"], "seed": request["seed"],
                    "params": conv["params"], "params_by_group": conv["params_by_group"]},
        "copied": {"strategy_groups": list(strategy.get("copy", [])), "groups": copied,
                   "params": sum(copied.values()), "of_params": conv["params"],
                   "head_copied": bool(student.get("head_copied"))},
        "distilled": None if distill is None else {
            "design": request["design"], "loss": distill.get("loss"), "losses": distill.get("losses"),
            "steps": distill.get("steps"), "phase_steps": distill.get("phase_steps"),
            "final_loss": distill.get("final_loss"), "probe_loss": distill.get("distill_loss"),
            "probe_loss_per_term": distill.get("distill_terms"),
            "probe_samples": distill.get("probe_samples"), "train_time_s": distill.get("train_time_s")},
        "trained": {"dataset": request["dataset"], "steps": student.get("steps"),
                    "train_time_s": student.get("train_time_s"), "final_loss": student.get("final_loss"),
                    "test_acc_at_end_of_training": student.get("test_acc"),
                    "train_losses": student.get("train_losses") or [], "task_weight": student.get("task_weight", 1.0),
                    "logit_teacher": "reference" if student.get("kd_teacher") else (
                        "teacher" if student.get("train_losses") else None)},
        "accuracy": {"dataset": request["dataset"], "split": "test", "samples": evaluation["test_samples"],
                     "precision": evaluation["accuracy_precision"], "images": evaluation["pipeline"],
                     "converted": conv["test_acc"], "baseline": base["role"], "baseline_acc": base["test_acc"],
                     "baseline_note": base["note"], "teacher": base["test_acc"] if base["role"] == "teacher" else None,
                     "same_labels": same_labels},
        "device": evaluation["device"], "precision": evaluation["precision"],
        "memory_method": evaluation["memory_method"], "speed": evaluation["speed"],
    }
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", _markdown(summary))
    return summary


def _fmt(value, digits=4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _terms_text(terms: list | None) -> str:
    """A design's loss terms in words: 'proj_mse' or, with several phases, 'phase 1: ...; phase 2: ...'."""
    if not terms:
        return ""
    phases: dict[int, list[str]] = {}
    for t in terms:
        options = ", ".join(f"{k} {v}" for k, v in t.items() if k not in ("loss", "weight", "phase"))
        text = t["loss"] + ("" if t.get("weight", 1) == 1 else f" x {t['weight']}") + (f" ({options})" if options else "")
        phases.setdefault(int(t.get("phase", 0)), []).append(text)
    if len(phases) == 1:
        return " + ".join(next(iter(phases.values())))
    return "; ".join(f"phase {p + 1}: {' + '.join(ts)}" for p, ts in sorted(phases.items()))


def _markdown(s: dict) -> str:
    t, st, c, d, a = s["teacher"], s["student"], s["copied"], s["distilled"], s["accuracy"]
    lines = [f"# Conversion: {t['model']} -> {st['model']}", "",
             f"Teacher: {t['model']} ({t['source']}: {t['given']}), {_shape_text(t['shape'])}.",
             f"Student: {st['model']} ({st['params']:,} parameters), init `{st['init']}`, "
             f"design `{st['design']}`, seed {st['seed']}.", "", "## Load it", "", "```python", s["timm"]["code"],
             "```", "", f"or `{s['timm']['local_dir']}`.", "", "## Copied from the teacher", "",
             "| group | parameters copied | student parameters |", "| --- | ---: | ---: |"]
    for g, n in st["params_by_group"].items():
        lines.append(f"| {g} | {c['groups'].get(g, 0):,} | {n:,} |")
    lines += [f"| **all** | **{c['params']:,}** | **{c['of_params']:,}** |", "",
              f"Strategy groups: {', '.join(c['strategy_groups']) or 'none'}; the head "
              f"{'was copied' if c['head_copied'] else 'was not copied (a new head for the target, or not in the strategy)'}.",
              "", "## Distilled", ""]
    if d is None:
        lines.append("Nothing: the init strategy does not distill.")
    else:
        losses = _terms_text(d.get("losses")) or d.get("loss")
        lines.append(f"Design `{d['design']}` (losses: {losses}), {d['steps']} steps"
                     + (f" in phases {d['phase_steps']}" if d.get("phase_steps") and len(d["phase_steps"]) > 1 else "")
                     + f", {_fmt(d['train_time_s'], 1)} s; last training loss {_fmt(d['final_loss'], 5)}, loss on "
                       f"{d['probe_samples']} probe test images {_fmt(d['probe_loss'], 5)}.")
    tr = s["trained"]
    extra = ""
    if tr["train_losses"]:
        extra = (f" Loss: {tr['task_weight']:g} x cross-entropy + {_terms_text(tr['train_losses'])}"
                 + (" (logits from the softmax reference)" if tr["logit_teacher"] == "reference" else "") + ".")
    lines += ["", "## Trained", "", f"{tr['steps']} steps on `{tr['dataset']}` in {_fmt(tr['train_time_s'], 1)} s "
              f"(last loss {_fmt(tr['final_loss'])}).{extra}", "",
              f"## Accuracy on `{a['dataset']}`'s test split ({a['samples']} images, {a['precision']})", "",
              "| model | top-1 |", "| --- | ---: |",
              f"| converted ({st['model']}, loaded through timm as above) | {_fmt(a['converted'])} |",
              f"| {a['baseline']} | {_fmt(a['baseline_acc'])} |", "",
              f"The {a['baseline']} is {a['baseline_note']}. Images: {a['images']}.", "",
              f"## Latency and peak memory on {s['device']} ({s['precision']})", "",
              "| model | resolution | tokens | batch | ms / image | peak forward MiB | note |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in s["speed"]:
        size = "x".join(map(str, r["image_size"]))
        if "skipped" in r:
            lines.append(f"| {r['model']} | {size} | {r['tokens']} | {r['batch']} | - | - | skipped: {r['skipped']} |")
        else:
            lines.append(f"| {r['model']} | {size} | {r['tokens']} | {r['batch']} | {_fmt(r['ms_per_image'], 3)} "
                         f"| {_fmt(r.get('peak_mib'), 2)} | {r.get('note', '')} |")
    lines += ["", f"Peak memory: {s['memory_method']}.", "",
              "At twice the side (4x the patch tokens) the position embeddings are resampled with timm's "
              "resample_abs_pos_embed (linvit.teachers.adapt).", ""]
    return "\n".join(lines)


def _closing_lines(s: dict) -> list[str]:
    a = s["accuracy"]
    lines = [f"converted {s['teacher']['model']} -> {s['student']['model']}: test accuracy {a['converted']:.4f} "
             f"on {a['dataset']!r}, {a['baseline']} {a['baseline_acc']:.4f}"
             + ("" if a["baseline"] == "teacher" else " (the teacher's head does not apply to these labels)")]
    native = {(r["model"], r["batch"]): r for r in s["speed"] if r["resolution"] == "native" and "ms_per_image" in r}
    big = max((b for _, b in native), default=None)
    if big is not None and ("converted", big) in native and ("baseline", big) in native:
        lines.append(f"latency at batch {big} on {s['device']}: {native[('converted', big)]['ms_per_image']:.3f} "
                     f"ms/image, {a['baseline']} {native[('baseline', big)]['ms_per_image']:.3f}")
    lines += ["load it with:", *("    " + x for x in s["timm"]["code"].splitlines()),
              f"wrote {s['out']}/model.safetensors, config.json, summary.json, summary.md"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
