"""Teachers: any timm Vision Transformer, from timm's hub, a weights file, or trained here.

A model is described by a plain, JSON-serializable dict, the "arch" (saved as model.json beside
model.safetensors), from which `build_model` rebuilds it without its weights:

| key               | what                                                                         |
| timm_model        | a name `timm.create_model` knows ("deit_tiny_patch16_224", "linvit_micro_softmax") |
| model_args        | the other create_model keywords that shape it ({"depth": 2, "reg_tokens": 4})  |
| num_classes, img_size ([h, w]), in_chans | its geometry (never in model_args)                   |
| patch_size, num_prefix_tokens | read from the built model, for checks made without building it     |
| pretrained_cfg    | input_size, mean, std, interpolation, crop_pct: how its images are prepared    |
| variant           | "softmax" for a teacher, the linear operator for a student                     |
| source            | "hub", "file" (with file and sha256) or "trained"                              |

Callers add their own keys (dataset, classes, size); every function here keeps them. An arch written
by older runs has `size` instead of `timm_model` and means `linvit_<size>_softmax` with no model_args.
Loading leans on timm: its ViT checkpoint filter (foreign layouts, position embeddings of another
size), its hub and cache, its position-embedding resampling and its Hugging Face export layout.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
from pathlib import Path

import timm
import torch
from timm.models import clean_state_dict
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from timm.layers import resample_abs_pos_embed
from torch import nn

from .io import atomic_path, file_sha256, write_safetensors
from .models import model_name, model_variant, swap_attention
from .registry import SOFTMAX

__all__ = ["TeacherError", "describe", "build_model", "load_weights", "load_pretrained", "adapt",
           "check_fit", "check_built_from", "save_timm_checkpoint"]

# Keys of the arch that are the model's geometry, never create_model keywords in model_args.
_GEOMETRY = ("num_classes", "img_size", "in_chans")
_CFG_KEYS = ("input_size", "mean", "std", "interpolation", "crop_pct")
_HEADS = ("head", "head_dist")  # a distilled DeiT has two classifiers


class TeacherError(ValueError):
    """A teacher that cannot be used, said in one line naming the file, model or dataset."""


def _line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0].strip()


def _pair(size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(int(s) for s in size)


def describe(model: VisionTransformer, *, timm_model: str, model_args: dict | None = None,
             source: str = "trained", **extra) -> dict:
    """The arch of a built model: what `build_model` needs to rebuild it, plus the caller's keys."""
    h, w = _pair(model.patch_embed.img_size)
    in_chans = model.patch_embed.proj.in_channels
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    pretrained_cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items() if k in _CFG_KEYS}
    pretrained_cfg["input_size"] = [in_chans, h, w]
    return {
        "timm_model": timm_model,
        "model_args": {k: v for k, v in (model_args or {}).items() if k not in _GEOMETRY},
        "num_classes": model.num_classes, "img_size": [h, w], "in_chans": in_chans,
        "patch_size": int(model.patch_embed.patch_size[0]),
        "num_prefix_tokens": int(model.num_prefix_tokens),
        "pretrained_cfg": pretrained_cfg, "variant": model_variant(model), "source": source, **extra,
    }


def _timm_name(arch: dict) -> tuple[str, dict]:
    if "timm_model" in arch:
        return arch["timm_model"], dict(arch.get("model_args") or {})
    if "size" in arch:  # model.json of older runs: linvit's own sizes
        return model_name(arch["size"], SOFTMAX), {}
    raise TeacherError(f"model description has neither 'timm_model' nor 'size': {sorted(arch)}")


def build_model(arch: dict, *, variant: str | None = None, num_classes: int | None = None,
                img_size=None, in_chans: int | None = None) -> VisionTransformer:
    """A fresh, randomly initialized model of arch's architecture (weights are the caller's job);
    a variant other than softmax swaps every block's attention for that linear operator."""
    name, model_args = _timm_name(arch)
    img = img_size if img_size is not None else arch["img_size"]
    model = timm.create_model(
        name, pretrained=False, **model_args,
        num_classes=arch["num_classes"] if num_classes is None else num_classes,
        img_size=_pair(img), in_chans=arch["in_chans"] if in_chans is None else in_chans)
    variant = arch.get("variant", SOFTMAX) if variant is None else variant
    if variant != SOFTMAX:
        swap_attention(model, variant)
    return model


# -- weights files ----------------------------------------------------------------------------

def _torch_load(path: Path):
    # As timm's loader: argparse.Namespace (the `args` of timm's training checkpoints) is allowed.
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception:
            unsafe = []
        if unsafe:
            raise TeacherError(
                f"weights file {path} holds pickled objects ({', '.join(unsafe[:3])}), and loading it "
                f"would run code: save model.state_dict() instead of the model") from None
        raise TeacherError(f"weights file {path} cannot be read (corrupt?): {_line(err)}") from None


def load_weights(path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors or torch checkpoint file, by timm's names.

    Unwrapped as timm's `load_state_dict` does (EMA weights first, then "state_dict", then "model")
    and cleaned of DDP/compile prefixes by timm's `clean_state_dict`. Only weights are read: a file
    that needs pickled code to load is refused, as is anything but a mapping of names to tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise TeacherError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        import safetensors.torch

        try:
            checkpoint = safetensors.torch.load_file(str(path), device="cpu")
        except Exception as err:  # safetensors raises its own error, or OSError, for a bad file
            raise TeacherError(f"weights file {path} cannot be read (corrupt?): {_line(err)}") from None
    else:
        try:
            checkpoint = _torch_load(path)
        except TeacherError:
            raise
        except Exception as err:  # RuntimeError (zip reader), EOFError, ... for a damaged file
            raise TeacherError(f"weights file {path} cannot be read (corrupt?): {_line(err)}") from None
    state = checkpoint
    if isinstance(checkpoint, dict):
        for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
            if checkpoint.get(key) is not None:
                state = checkpoint[key]
                break
    if not isinstance(state, dict) or not state:
        what = "no tensors" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise TeacherError(f"weights file {path} holds {what}, not a mapping of parameter names to tensors")
    bad = next((k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise TeacherError(f"weights file {path} is not a mapping of parameter names to tensors: "
                           f"{bad!r} is a {type(state[bad]).__name__}")
    return clean_state_dict(state)


# -- pretrained teachers ----------------------------------------------------------------------

def _check_vit(name: str, model_args: dict) -> nn.Module:
    """The model built on the meta device (no memory, no weights): is `name` a timm ViT at all?"""
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **model_args)
    except Exception as err:  # unknown name (RuntimeError), a bad keyword (TypeError), ...
        raise TeacherError(f"timm model {name!r} cannot be built: {_line(err)}") from None
    if not isinstance(model, VisionTransformer):
        raise TeacherError(f"timm model {name!r} is a {type(model).__name__}, not a timm VisionTransformer "
                           f"(timm.models.vision_transformer.VisionTransformer or a subclass such as DeiT's)")
    return model


def _first_mismatch(model: nn.Module, state: dict) -> str | None:
    own = model.state_dict()
    for key, value in own.items():
        if key not in state:
            return f"missing {key!r}"
        if state[key].shape != value.shape:
            return f"{key!r} is {tuple(state[key].shape)} in the file, {tuple(value.shape)} in the model"
    extra = next((k for k in state if k not in own), None)
    return f"unexpected {extra!r}" if extra is not None else None


def pretrained_architecture(timm_model: str, *, file=None, model_args: dict | None = None,
                            weights: bool = False) -> tuple[VisionTransformer, dict, dict, dict]:
    """What `load_pretrained` builds, on the meta device (no weights, no memory): the model, its
    options without geometry, the options it is built with (plus the native img_size), and the timm
    config.json beside `file` ({} for none).

    With `weights`, `file` is read (quietly), the model is built at the file's classes and channels
    (its head and patch embedding), exactly as `load_pretrained` builds it, and a file whose tensors do
    not fit it is refused as `load_pretrained` refuses it (so a caller can refuse it before writing
    anything); without, at the architecture's defaults (a one-channel file would look like a
    three-channel teacher)."""
    sidecar = timm_config(file) if file is not None else {}
    # The options the weights were made with: the config.json's (timm's hub layout), then the caller's.
    given = {**sidecar.get("model_args", {}), **(model_args or {})}
    model_args = {k: v for k, v in given.items() if k not in _GEOMETRY}
    # The resolution the weights were made at: the options', else the timm config.json beside the
    # file (timm's hub layout), else the architecture's default; so position embeddings load as they are.
    native = given.get("img_size") or (
        (sidecar.get("pretrained_cfg") or {}).get("input_size") or [None])[1:] or None
    build_args = {**model_args, **({"img_size": _pair(native)} if native else {})}
    meta = _check_vit(timm_model, build_args)
    if weights and file is not None:
        state, _ = _filtered(Path(file), timm_model, meta)
        with torch.device("meta"):
            meta = _build_for_file(timm_model, Path(file), {**build_args, **_file_geometry(state, meta)})
        _check_keys(meta, state, file, timm_model)
    return meta, model_args, build_args, sidecar


def _check_keys(model: nn.Module, state: dict, file, timm_model: str) -> None:
    problem = _first_mismatch(model, state)
    if problem:
        raise TeacherError(f"weights file {file} does not fit timm model {timm_model!r}: {problem}")


def _filtered(file: Path, timm_model: str, meta: VisionTransformer) -> tuple[dict, str | None]:
    """The tensors of weights file `file` through timm's ViT checkpoint filter into `meta`'s layout
    (foreign layouts, another patch or position-embedding size), and "AxB to CxD" when the filter
    resampled the file's position table to `meta`'s grid (else None)."""
    state = load_weights(file)
    table = state.get("pos_embed")
    before = _table_grid(meta, state, table)
    try:
        filtered = checkpoint_filter_fn(state, meta, adapt_layer_scale=True)
    except Exception as err:
        raise TeacherError(f"weights file {file} does not fit timm model {timm_model!r}: {_line(err)}") from None
    after = filtered.get("pos_embed")
    resampled = None
    if table is not None and after is not None and after is not table:  # the filter made a new table
        h, w = (int(s) for s in meta.patch_embed.grid_size)
        resampled = f"{before} to {h}x{w}"
    return filtered, resampled


def _table_grid(meta: VisionTransformer, state: dict, table) -> str:
    """The grid of a file's position table, as timm's filter reads it: from the patch kernel and the
    pretrained size when they account for every position, else square; "N positions" otherwise."""
    if table is None or table.ndim != 3:
        return "?"
    prefix = 0 if getattr(meta, "no_embed_class", False) else int(getattr(meta, "num_prefix_tokens", 1))
    n = int(table.shape[1]) - prefix
    grid = None
    try:
        from timm.models.vision_transformer import get_pretrained_grid_size

        grid = get_pretrained_grid_size(meta, state.get("patch_embed.proj.weight"), n)
    except ImportError:  # an older timm: it assumes a square grid
        pass
    if grid is None:
        side = math.isqrt(max(n, 0))
        grid = (side, side) if side * side == n else None
    return f"{grid[0]}x{grid[1]}" if grid else f"{n} positions"


def _file_geometry(state: dict, meta: VisionTransformer) -> dict:
    """The classes and channels of a (filtered) weights file: its head's rows, its patch kernel's inputs."""
    geometry = {}
    head = state.get("head.weight")
    geometry["num_classes"] = head.shape[0] if head is not None and head.ndim == 2 else (
        meta.num_classes if "head.bias" in state else 0)
    patch = state.get("patch_embed.proj.weight")
    if patch is not None and patch.ndim == 4:
        geometry["in_chans"] = patch.shape[1]
    return geometry


def _build_for_file(timm_model: str, file: Path, build_args: dict) -> VisionTransformer:
    try:
        return timm.create_model(timm_model, pretrained=False, **build_args)
    except Exception as err:
        raise TeacherError(f"timm model {timm_model!r} cannot be built for weights file {file}: {_line(err)}") from None


def load_pretrained(timm_model: str, *, file=None, model_args: dict | None = None) -> tuple[VisionTransformer, dict]:
    """A pretrained teacher and its arch: timm's published weights (hub or its local cache), or a file.

    A file is read by `load_weights` and passed through timm's ViT checkpoint filter (foreign
    layouts, another position-embedding size) into the architecture at its native image size; its
    classes and channels are those of the file's head and patch embedding.
    """
    meta, model_args, build_args, sidecar = pretrained_architecture(timm_model, file=file, model_args=model_args)
    if file is None:
        try:
            model = timm.create_model(timm_model, pretrained=True, **model_args)
        except Exception as err:  # offline and not cached, no published weights, a bad download
            from huggingface_hub import constants

            raise TeacherError(f"cannot load pretrained weights of timm model {timm_model!r} from the hub "
                               f"or its cache ({constants.HF_HUB_CACHE}): {type(err).__name__}: "
                               f"{_line(err)}") from None
        return model.eval(), describe(model, timm_model=timm_model, model_args=model_args, source="hub")

    file = Path(file)
    state, resampled = _filtered(file, timm_model, meta)
    model = _build_for_file(timm_model, file, {**build_args, **_file_geometry(state, meta)})
    _check_keys(model, state, file, timm_model)
    model.load_state_dict(state, strict=True)
    if resampled:  # said once, here, where the weights are loaded (not by the checks before it)
        print(f"teacher {file}: position table resampled from {resampled}", file=sys.stderr, flush=True)
    arch = describe(model, timm_model=timm_model, model_args=model_args, source="file",
                    file=str(file), sha256=file_sha256(file))
    # How the file's images were prepared (mean, std, crop...), when its config.json says.
    arch["pretrained_cfg"].update({k: v for k, v in (sidecar.get("pretrained_cfg") or {}).items()
                                   if k in _CFG_KEYS and k != "input_size"})
    return model.eval(), arch


def check_built_from(folder, arch: dict) -> None:
    """A loaded teacher's folder still stands for its weights file: the file its job recorded (config.json's
    `teacher_file`: resolved path, size, mtime; linvit.config.file_stamp) exists and, if its size or mtime
    moved, still has the sha256 of model.json. Snakemake reruns a teacher whose file changed, but plans
    no job for a file that is gone and then lets the students read the old folder. A folder made outside
    the workflow records no file and is not checked."""
    from .config import file_stamp

    folder = Path(folder)
    try:
        record = json.loads((folder / "config.json").read_text())["config"]["teacher_file"]
        path, built = Path(record["path"]), (record["size"], record["mtime_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if arch.get("source") != "file":
        return
    if not path.is_file():
        raise TeacherError(f"teacher folder {folder} was built from {path}, which no longer exists: restore it, "
                           f"or name the teacher's new file in the config (the workflow then rebuilds the folder)")
    now = file_stamp({"file": str(path)})
    if (now["size"], now["mtime_ns"]) != built and file_sha256(path) != arch.get("sha256"):
        raise TeacherError(f"teacher folder {folder} was built from another version of {path} (its sha256 is not "
                           f"model.json's): rerun that teacher (the workflow plans it)")


def timm_config(file) -> dict:
    """timm's config.json beside a weights file (what push_to_hf_hub and save_timm_checkpoint
    write), or {} when there is none; a config.json that does not parse is an error naming it."""
    path = Path(file).with_name("config.json")
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TeacherError(f"{path} (beside weights file {file}) is not a readable timm config: {_line(err)}") from None
    return data if isinstance(data, dict) else {}


# -- a teacher at a target's geometry -----------------------------------------------------------

@torch.no_grad()
def adapt(model: VisionTransformer, arch: dict, *, img_size=None,
          num_classes: int | None = None) -> tuple[VisionTransformer, dict]:
    """The teacher at a target's image size and label space, as timm adapts pretrained weights.

    A new image size resamples the position embeddings (timm's `resample_abs_pos_embed`, from the
    teacher's own grid); a new number of classes leaves the classifier(s) freshly initialized.
    Everything else is copied. Unchanged geometry returns the model itself.
    """
    old_img, new_img = _pair(model.patch_embed.img_size), _pair(img_size if img_size is not None
                                                                 else model.patch_embed.img_size)
    new_classes = model.num_classes if num_classes is None else num_classes
    if old_img == new_img and new_classes == model.num_classes:
        return model, arch
    target = build_model(arch, variant=model_variant(model), num_classes=new_classes, img_size=new_img,
                         in_chans=model.patch_embed.proj.in_channels)
    state = dict(model.state_dict())
    if state.get("pos_embed") is not None and tuple(model.patch_embed.grid_size) != tuple(target.patch_embed.grid_size):
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state["pos_embed"] = resample_abs_pos_embed(
            state["pos_embed"], new_size=list(target.patch_embed.grid_size),
            old_size=list(model.patch_embed.grid_size), num_prefix_tokens=prefix, verbose=False)
    fresh = set()
    if new_classes != model.num_classes:
        fresh = {k for k in target.state_dict() if k.split(".")[0] in _HEADS}
        state = {k: v for k, v in state.items() if k.split(".")[0] not in _HEADS}
    result = target.load_state_dict(state, strict=False)
    left = sorted(set(result.missing_keys) - fresh) + sorted(result.unexpected_keys)
    if left:
        raise TeacherError(f"teacher {arch.get('timm_model', arch.get('size'))!r} cannot be adapted to "
                           f"{list(new_img)} px, {new_classes} classes: {left[0]!r} does not carry over")
    target.train(model.training)
    cfg = dict(arch.get("pretrained_cfg") or {})
    cfg["input_size"] = [model.patch_embed.proj.in_channels, *new_img]
    return target, {**arch, "num_classes": new_classes, "img_size": list(new_img), "pretrained_cfg": cfg}


def check_fit(arch: dict, *, teacher: str, dataset: str, image_size, channels: int, num_classes: int,
              same_labels: bool) -> None:
    """What must hold before any training with this teacher on this dataset, said in one line.

    Another resolution is fine when the patch size divides it (adapt resamples), and another
    label space is fine unless the dataset is declared to share the teacher's (the head is replaced).
    """
    h, w = _pair(image_size)
    p = arch.get("patch_size")
    if p is None:  # an older model.json: the size's patch size
        from .sizes import size_spec
        p = size_spec(arch["size"])["patch_size"]
    if h % p or w % p:
        near = [max(p, p * round(s / p)) for s in (h, w)]
        raise TeacherError(
            f"dataset {dataset!r} gives {h}x{w} images, not a multiple of teacher {teacher}'s patch size {p}: "
            f"set datasets.{dataset}.transform.input_size to a multiple of {p} (e.g. {near})")
    if channels != arch["in_chans"]:
        raise TeacherError(f"dataset {dataset!r} has {channels} channel(s), teacher {teacher} takes "
                           f"{arch['in_chans']}")
    if same_labels and num_classes != arch["num_classes"]:
        raise TeacherError(f"dataset {dataset!r} is declared to share teacher {teacher}'s labels but has "
                           f"{num_classes} classes, the teacher {arch['num_classes']}")


# -- export -----------------------------------------------------------------------------------

def save_timm_checkpoint(model: VisionTransformer, arch: dict, folder) -> Path:
    """model.safetensors and config.json as timm's `push_to_hf_hub` lays them out (written by
    timm's own `save_config_for_hf`), so timm and `load_pretrained(file=...)` both load it.

    A student whose operators timm cannot rebuild (a linear variant of a foreign timm model) is
    refused: its config would name an architecture with softmax attention.
    """
    from timm.models._hub import save_config_for_hf

    folder = Path(folder)
    name, model_args = _timm_name(arch)
    variant = model_variant(model)
    if variant != SOFTMAX:
        size = arch.get("size") or (name[len("linvit_"):-len("_softmax")]
                                    if name.startswith("linvit_") and name.endswith("_softmax") else None)
        if size is None:
            raise TeacherError(f"timm model {name!r} with {variant!r} attention has no timm name: "
                               f"timm can only rebuild linvit_<size>_<variant> students")
        name = model_name(size, variant)
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in (arch.get("pretrained_cfg") or {}).items()}
    # timm's exporter starts from the model's pretrained_cfg (a model built outside timm's factory,
    # such as build_vit's, has none: the arch's stands in), under the name that rebuilds it.
    had = hasattr(model, "pretrained_cfg")
    saved = getattr(model, "pretrained_cfg", None)
    if saved:
        cfg = dict(saved, architecture=name)
    else:
        default = timm.models.get_pretrained_cfg(name)
        h, w = _pair(model.patch_embed.img_size)
        cfg = {**(default.to_dict() if default else {}), **data, "architecture": name,
               "input_size": (model.patch_embed.proj.in_channels, h, w), "num_classes": model.num_classes}
    weights = write_safetensors(folder / "model.safetensors", model.state_dict())
    with atomic_path(folder / "config.json") as tmp:
        model.pretrained_cfg = cfg
        try:
            save_config_for_hf(model, str(tmp), model_args=model_args, data_config=data)
        finally:
            if had:
                model.pretrained_cfg = saved
            else:
                del model.pretrained_cfg
    return weights
