"""The teacher of a conversion: where it comes from (a harness folder, a weights file, a timm name),
its architecture built on the meta device (no weights, no compute), the linvit size its shape is, and
the check that the student the steps train is the one timm builds as linvit_<size>_<variant>."""

from __future__ import annotations

import os
from pathlib import Path

from .request import ConvertError

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
SHAPE_KEYS = ("embed_dim", "depth", "num_heads", "patch_size")


def shape_of(model) -> dict:
    return {"embed_dim": int(model.embed_dim), "depth": len(model.blocks),
            "num_heads": int(model.blocks[0].attn.num_heads), "patch_size": int(model.patch_embed.patch_size[0])}


def shape_text(shape: dict) -> str:
    return (f"embed dim {shape['embed_dim']}, depth {shape['depth']}, {shape['num_heads']} heads, "
            f"patch {shape['patch_size']}")


def resolve_teacher(args) -> dict:
    """Where the teacher comes from, and its architecture built on the meta device (no weights, no
    compute): {kind, label, arch, meta, entry (the `teachers:` entry for a name/file), dir (a folder)}."""
    import torch

    from ..io import read_json
    from ..teachers import describe, pretrained_architecture, timm_config

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
        from ..teachers import build_model

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


def student_size(teacher: dict, requested: str | None, variant: str) -> str:
    """The linvit size of the student: --size, checked against the teacher's shape, else the size
    whose shape the teacher has. timm rebuilds a converted student only as linvit_<size>_<variant>."""
    from ..models import model_name
    from ..sizes import SIZES

    shape = shape_of(teacher["meta"])
    if requested is not None:
        if requested not in SIZES:
            raise ConvertError(f"--size {requested!r} is not a linvit size; known sizes: {', '.join(SIZES)}")
        wanted = {k: SIZES[requested][k] for k in SHAPE_KEYS}
        if wanted != shape:
            raise ConvertError(f"teacher {teacher['label']} has {shape_text(shape)}; the requested student "
                               f"{model_name(requested, variant)} (--size {requested}) has {shape_text(wanted)}")
        return requested
    own = teacher["arch"].get("size")
    candidates = ([own] if own in SIZES else []) + list(SIZES)
    for name in candidates:
        if {k: SIZES[name][k] for k in SHAPE_KEYS} == shape:
            return name
    known = "; ".join(f"{n}: {shape_text(s)}" for n, s in SIZES.items())
    raise ConvertError(f"teacher {teacher['label']} has {shape_text(shape)}, the shape of no linvit size "
                       f"({known}): a converted student is a linvit_<size>_<variant> timm model")


def _first_difference(a: dict, b: dict) -> str | None:
    for key, value in a.items():
        if key not in b:
            return f"{key!r} is only in the first"
        if tuple(b[key].shape) != tuple(value.shape):
            return f"{key!r} is {tuple(value.shape)} against {tuple(b[key].shape)}"
    extra = next((k for k in b if k not in a), None)
    return None if extra is None else f"{extra!r} is only in the second"


def check_student(teacher: dict, size: str, variant: str) -> None:
    """The student the steps train (the teacher's architecture with `variant` attention) must be the
    one timm builds as linvit_<size>_<variant> with the teacher's options: compared on the meta device."""
    import timm
    import torch

    from ..models import model_name
    from ..teachers import build_model

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
