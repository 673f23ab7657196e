"""The request and its checks: the command's own settings (the config and its budgets, the variant,
the distillation design), checked before anything runs; request.json, what --out was made with (a
rerun with other settings is refused); and the steps' metrics.json already in --out."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "workflow" / "config" / "default.yaml"
DEFAULT_INIT = "copy_mlp_distill"
REQUEST = "request.json"  # what --out was made with: a rerun with other settings is refused


class ConvertError(ValueError):
    """A conversion that cannot run, said in one line."""


def say(text: str) -> None:
    print(text, flush=True)


def training_config(args) -> dict:
    """The training settings: --config's, else default.yaml's; the budgets from --distill-steps and
    --steps (they are the config keys the steps read, so they are in each step's fingerprint)."""
    import copy

    from ..config import get, load_config, validate_schema

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


def check_variant(variant: str) -> None:
    from ..registry import SOFTMAX, names

    variants = [v for v in names("variant") if v != SOFTMAX]
    if variant not in variants:
        raise ConvertError(f"--variant {variant!r} is not a linear attention operator; known: {', '.join(variants)}")


def design(config: dict, init: str, given: str | None) -> str:
    """The distillation design: 'none' for a strategy that does not distill, the design a strategy
    names, else --design, else the config's first design (the paper's recipe in default.yaml)."""
    from ..config import NO_DESIGN, design_names, design_specs, init_strategy

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


def make_request(args, teacher: dict, size: str, design: str, dataset: str, shards: Path, config: dict) -> dict:
    """What --out is made with: the teacher (and its weights' hash), the student, the data, the budgets
    and the whole config's hash."""
    from ..data.shards import MANIFEST
    from ..io import file_sha256

    arch = teacher["arch"]
    request = {"teacher": str(teacher["dir"] or (teacher["entry"].get("file") or teacher["entry"]["model"])),
               "model": arch["timm_model"], "model_args": arch.get("model_args", {}), "size": size,
               "variant": args.variant, "init": args.init, "design": design, "dataset": dataset,
               "shards_manifest_sha256": file_sha256(shards / MANIFEST), "seed": args.seed,
               "distill_steps": config["distill"]["train"]["steps"], "steps": config["student"]["train"]["steps"],
               "config_sha256": _sha(config)}
    weights = teacher["dir"] / "model.safetensors" if teacher["dir"] else teacher["entry"].get("file")
    if weights is not None and Path(weights).is_file():
        request["teacher_sha256"] = file_sha256(weights)
    return request


def _sha(data) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def check_request(out: Path, request: dict) -> None:
    """--out holds one conversion: a rerun with other settings would skip steps made under them."""
    from ..io import read_json, write_json

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


def done(folder: Path) -> dict | None:
    """A step's metrics.json in `folder`, or None where the step has not finished."""
    from ..io import read_json

    metrics = folder / "metrics.json"
    return read_json(metrics, what=f"{folder.name} metrics") if metrics.exists() else None
