"""Attention fidelity per block (KL, JS, map correlation) and class-token rows, on real micro ViTs."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from linvit.attention import attention_maps
from linvit.evaluate import attention_fidelity, attention_report, class_token_rows
from linvit.models import build_vit, capture_attention

DEPTH, HEADS, GRID = 4, 4, (7, 7)  # micro: depth 4, 4 heads, 28 px / patch 4
LN2 = math.log(2)


def vit(variant: str = "softmax", seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_vit("micro", num_classes=4, img_size=28, in_chans=1, variant=variant, **kw)


@pytest.fixture(scope="module")
def x():
    return torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def teacher():
    return vit()


def check_lists(fid):
    assert set(fid) == {"kl", "js", "corr"}
    for values in fid.values():
        assert len(values) == DEPTH and all(isinstance(v, float) and math.isfinite(v) for v in values)


@pytest.mark.parametrize("variant", ["softmax", "elu", "focused"])
def test_identical_models_agree(variant, x):
    model = vit(variant)
    fid = attention_fidelity(model, copy.deepcopy(model), x)
    check_lists(fid)
    assert all(abs(v) < 1e-5 for v in fid["kl"])
    assert all(abs(v) < 1e-5 for v in fid["js"])
    assert all(abs(v - 1) < 1e-4 for v in fid["corr"])


@pytest.mark.parametrize("variant", ["elu", "focused", "relu"])
def test_a_different_student_differs_and_js_is_bounded(variant, teacher, x):
    fid = attention_fidelity(teacher, vit(variant, seed=3), x)
    check_lists(fid)
    assert all(v > 1e-4 for v in fid["kl"])
    assert all(0 < v <= LN2 + 1e-6 for v in fid["js"])
    assert all(-1 - 1e-5 <= v <= 1 + 1e-5 for v in fid["corr"])
    assert min(fid["corr"]) < 0.999


def test_js_stays_below_ln2_for_nearly_one_hot_maps(teacher, x):
    sharp = copy.deepcopy(teacher)
    with torch.no_grad():
        for block in sharp.blocks:
            block.attn.qkv.weight.mul_(40)  # q k^T grows 1600-fold: near one-hot softmax rows
    fid = attention_fidelity(sharp, vit("elu", seed=5), x)
    assert max(fid["js"]) <= LN2 + 1e-6
    assert max(fid["js"]) > 0.3  # far apart, near the bound
    assert max(fid["kl"]) > max(fid["js"])  # KL is unbounded


def test_fidelity_is_fp32_under_autocast_and_restores_training_mode(teacher, x):
    student, teacher = vit("elu", seed=2).train(), copy.deepcopy(teacher).eval()
    plain = attention_fidelity(teacher, student, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = attention_fidelity(teacher, student, x)
    for key in plain:
        assert under[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-7)
    assert student.training and not teacher.training  # each model's mode as it was


def test_block_count_mismatch_is_an_error(teacher, x):
    deeper = build_vit("mini", num_classes=4, img_size=28, in_chans=1)
    with pytest.raises(ValueError, match="blocks"):
        attention_fidelity(teacher, deeper, x)


@pytest.mark.parametrize("variant", ["softmax", "elu", "focused"])
def test_class_token_rows(variant, x):
    model = vit(variant, seed=4)
    out = class_token_rows(model, x[0])
    assert out["row"] == "class token" and out["block"] == DEPTH - 1
    assert out["prefix"] == 1 and out["grid"] == list(GRID) and out["tokens"] == 1 + 49
    heads = torch.tensor(out["heads"])
    assert heads.shape == (HEADS, 50) and (heads >= 0).all()
    assert torch.allclose(heads.sum(-1), torch.ones(HEADS), atol=1e-5)
    # The same row as the block's map computed directly.
    model.eval()
    inputs = capture_attention(model, x[:1])[1][0]
    expected = attention_maps(model.blocks[1].attn, inputs)[0, :, 0]
    assert torch.allclose(torch.tensor(class_token_rows(model, x[:1], block=1)["heads"]), expected, atol=1e-6)


def test_class_token_rows_without_a_class_token_averages_patch_rows(x):
    model = vit(class_token=False, global_pool="avg")
    out = class_token_rows(model, x[:1], block=0)
    assert out["row"] == "mean of rows" and out["prefix"] == 0 and out["block"] == 0
    heads = torch.tensor(out["heads"])
    assert heads.shape == (HEADS, 49)
    assert torch.allclose(heads.sum(-1), torch.ones(HEADS), atol=1e-5)


def test_class_token_rows_with_register_tokens(x):
    model = vit("elu", reg_tokens=2)
    out = class_token_rows(model, x[:1])
    assert out["prefix"] == 3 and out["tokens"] == 52 and len(out["heads"][0]) == 52


def test_class_token_rows_takes_one_image(teacher, x):
    with pytest.raises(ValueError, match="one image"):
        class_token_rows(teacher, x[:2])
    with pytest.raises(IndexError):
        class_token_rows(teacher, x[0], block=DEPTH)


def test_attention_report_keys(teacher, x):
    out = attention_report(teacher, vit("focused", seed=6), x)
    for k in ("kl", "js", "corr"):
        assert len(out[f"fidelity_{k}"]) == DEPTH
        assert out[f"fidelity_{k}_mean"] == pytest.approx(sum(out[f"fidelity_{k}"]) / DEPTH)
    assert set(out["cls_attention"]) == {"teacher", "student"}
    assert len(out["cls_attention"]["student"]["heads"]) == HEADS


def test_class_token_rows_draw_as_attention_maps(teacher, x, tmp_path):
    """What class_token_rows returns, plus the cell's names, is a record the report's figure draws."""
    from linvit.report.figures import attention_maps as draw

    cell = {"dataset": "dsA", "size": "micro", "variant": "elu", "init": "random", "design": "none",
            "budget": 100, "seed": 0}
    records = [{**cell, **class_token_rows(teacher, x[0]), "model": "teacher"},
               {**cell, **class_token_rows(vit("elu", seed=7), x[0]), "model": "student"}]
    png, svg = draw(records, tmp_path)
    assert png.stat().st_size > 0 and svg.stat().st_size > 0
