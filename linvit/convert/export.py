"""The converted checkpoint in timm's layout: --out/model.safetensors and config.json written, loaded
back through timm and checked tensor by tensor, and the timm.create_model call that loads them."""

from __future__ import annotations

from pathlib import Path

from .request import ConvertError

# Keywords of the call that are not the model's own options (timm's exporter adds the geometry to model_args).
CALL_KEYS = ("pretrained", "pretrained_cfg_overlay", "num_classes", "img_size", "in_chans")


def timm_call(out: Path) -> dict:
    """The timm.create_model call that loads --out/model.safetensors: its name and keywords. The
    overlay carries the checkpoint's pretrained_cfg (classes, input size, mean, std, crop): with
    the architecture's default class count timm would drop the trained head."""
    from ..io import read_json

    config = read_json(out / "config.json", what="exported timm config")
    cfg = config["pretrained_cfg"]
    overlay = {"file": str(out / "model.safetensors")}
    overlay.update({k: cfg[k] for k in ("num_classes", "input_size", "mean", "std", "crop_pct", "interpolation")
                    if k in cfg})
    overlay["num_classes"] = config["num_classes"]
    c, h, w = cfg["input_size"]
    # timm's exporter adds the geometry to model_args: given once, below.
    options = {k: v for k, v in (config.get("model_args") or {}).items() if k not in CALL_KEYS}
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


def export(student_dir: Path, size: str, out: Path, *, fresh: bool) -> dict:
    """--out/model.safetensors and config.json (timm's layout), written when the student was trained
    in this run or they are missing; checked by loading them back through timm: every tensor equal
    to the trained student's."""
    import torch

    from ..steps import load_model
    from ..teachers import save_timm_checkpoint

    model, arch = load_model(student_dir, what="student")
    if fresh or not (out / "model.safetensors").exists() or not (out / "config.json").exists():
        save_timm_checkpoint(model, {**arch, "size": size}, out)
    call = timm_call(out)
    loaded = load_converted(call).state_dict()
    own = model.state_dict()
    bad = next((k for k in own if k not in loaded or not torch.equal(own[k], loaded[k])), None)
    if bad is not None or set(loaded) != set(own):
        raise ConvertError(f"{out / 'model.safetensors'} does not load back through timm as trained "
                           f"({bad or 'other tensors'}); remove it and rerun")
    return call
