"""linvit.teachers: any timm ViT as a teacher, from a file, timm's hub cache, or an export (no network)."""

from __future__ import annotations

import json

import huggingface_hub.constants as hf_constants
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models.deit import VisionTransformerDistilled

from linvit import teachers
from linvit.attention import LinearAttention
from linvit.groups import parameter_group
from linvit.teachers import TeacherError

DEIT = "deit_tiny_patch16_224"
SMALL = {"depth": 2}  # deit_tiny's width and heads, two blocks: fast
# A ViT with register tokens, layer scale and position embeddings for the patches only.
REG = "vit_base_patch16_224"
REG_ARGS = {"embed_dim": 64, "depth": 2, "num_heads": 2, "reg_tokens": 4, "init_values": 1e-5,
            "no_embed_class": True}


def _vit(name=DEIT, seed=0, **args):
    torch.manual_seed(seed)
    model = timm.create_model(name, **args).eval()
    with torch.no_grad():  # layer scale starts at 1e-5: make every parameter matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def _x(size=224, n=2, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def deit():
    return _vit(**SMALL)


# -- files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pth", "safetensors", "nested"])
def test_file_round_trip(deit, tmp_path, kind):
    state = deit.state_dict()
    if kind == "safetensors":
        path = tmp_path / "w.safetensors"
        save_file(state, str(path))
    else:
        path = tmp_path / "w.pth"
        # nested: a training checkpoint under "model" with DDP's "module." prefix, as timm unwraps
        torch.save(state if kind == "pth" else
                   {"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    model, arch = teachers.load_pretrained(DEIT, file=path, model_args=SMALL)
    x = _x()
    with torch.no_grad():
        assert torch.equal(model(x), deit(x))
    assert not model.training
    assert arch["source"] == "file" and arch["file"] == str(path) and len(arch["sha256"]) == 64
    assert arch["timm_model"] == DEIT and arch["model_args"] == SMALL
    assert (arch["num_classes"], arch["img_size"], arch["in_chans"], arch["patch_size"],
            arch["num_prefix_tokens"], arch["variant"]) == (1000, [224, 224], 3, 16, 1, "softmax")
    assert arch["pretrained_cfg"]["input_size"] == [3, 224, 224]
    assert json.loads(json.dumps(arch)) == arch


def test_file_round_trip_full_deit_tiny(tmp_path):
    teacher = _vit()
    path = tmp_path / "deit_tiny.safetensors"
    save_file(teacher.state_dict(), str(path))
    model, arch = teachers.load_pretrained(DEIT, file=path)
    with torch.no_grad():
        assert torch.equal(model(_x(n=1)), teacher(_x(n=1)))
    assert arch["model_args"] == {} and len(model.blocks) == 12


def test_file_round_trip_registers_layer_scale(tmp_path):
    teacher = _vit(REG, **REG_ARGS)
    assert teacher.num_prefix_tokens == 5 and teacher.no_embed_class
    torch.save(teacher.state_dict(), tmp_path / "reg.pth")
    model, arch = teachers.load_pretrained(REG, file=tmp_path / "reg.pth", model_args=REG_ARGS)
    with torch.no_grad():
        assert torch.equal(model(_x()), teacher(_x()))
    assert arch["num_prefix_tokens"] == 5 and arch["model_args"] == REG_ARGS


def test_file_with_other_classes_and_a_different_pos_embed_size(tmp_path):
    """A fine-tuned file: its head sets the classes; a position embedding for another grid is
    resampled by timm's checkpoint filter to the architecture's native size."""
    teacher = _vit(num_classes=10, img_size=112, **SMALL)
    torch.save(teacher.state_dict(), tmp_path / "ft.pth")
    model, arch = teachers.load_pretrained(DEIT, file=tmp_path / "ft.pth", model_args=SMALL)
    assert arch["num_classes"] == 10 and arch["img_size"] == [224, 224]
    assert model.pos_embed.shape == (1, 197, 192)


def test_a_resampled_position_table_is_said_in_one_line(tmp_path, capsys):
    """A file whose position embeddings are for another grid loads resampled, and says so once;
    a file at the architecture's own grid says nothing."""
    teacher = _vit(img_size=112, **SMALL)
    torch.save(teacher.state_dict(), tmp_path / "at112.pth")
    capsys.readouterr()
    teachers.load_pretrained(DEIT, file=tmp_path / "at112.pth", model_args=SMALL)
    out, err = capsys.readouterr()
    lines = (out + err).splitlines()
    assert lines == [f"teacher {tmp_path / 'at112.pth'}: position table resampled from 7x7 to 14x14"], lines
    torch.save(_vit(**SMALL).state_dict(), tmp_path / "at224.pth")
    teachers.load_pretrained(DEIT, file=tmp_path / "at224.pth", model_args=SMALL)
    assert capsys.readouterr() == ("", "")


def test_refused_files_name_the_file(deit, tmp_path):
    cases = {}
    cases["pickled module"] = tmp_path / "module.pth"
    torch.save(deit, cases["pickled module"])
    cases["list"] = tmp_path / "list.pth"
    torch.save([deit.pos_embed.detach()], cases["list"])
    cases["not tensors"] = tmp_path / "floats.pth"
    torch.save({"pos_embed": 1.0}, cases["not tensors"])
    cases["missing"] = tmp_path / "absent.pth"
    good = tmp_path / "good.pth"
    torch.save(deit.state_dict(), good)
    cases["truncated"] = tmp_path / "truncated.pth"
    cases["truncated"].write_bytes(good.read_bytes()[:5000])
    cases["truncated safetensors"] = tmp_path / "truncated.safetensors"
    save_file(deit.state_dict(), str(tmp_path / "good.safetensors"))
    cases["truncated safetensors"].write_bytes((tmp_path / "good.safetensors").read_bytes()[:5000])
    words = {"pickled module": "run code", "list": "list", "not tensors": "'pos_embed'",
             "missing": "does not exist", "truncated": "corrupt", "truncated safetensors": "corrupt"}
    for case, path in cases.items():
        with pytest.raises(TeacherError) as err:
            teachers.load_pretrained(DEIT, file=path, model_args=SMALL)
        text = _one_line(err)
        assert str(path) in text and words[case] in text, (case, text)


def test_state_dict_of_another_architecture_names_file_and_key(tmp_path):
    other = timm.create_model("deit_small_patch16_224", depth=1)
    torch.save(other.state_dict(), tmp_path / "small.pth")
    with pytest.raises(TeacherError) as err:
        teachers.load_pretrained(DEIT, file=tmp_path / "small.pth", model_args={"depth": 1})
    text = _one_line(err)
    assert str(tmp_path / "small.pth") in text and DEIT in text and "'cls_token'" in text
    # fewer blocks in the file than in the model: the first missing key
    with pytest.raises(TeacherError) as err:
        teachers.load_pretrained("deit_small_patch16_224", file=tmp_path / "small.pth", model_args=SMALL)
    assert "missing 'blocks.1." in _one_line(err)


def test_not_a_vit_or_unknown_model_is_refused():
    for name, words in (("resnet18", "not a timm VisionTransformer"), ("no_such_model_x", "cannot be built")):
        with pytest.raises(TeacherError) as err:
            teachers.load_pretrained(name)
        text = _one_line(err)
        assert repr(name) in text and words in text


# -- timm's hub, through its own API, from a local cache ---------------------------------------

@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the environment once, at import
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_weights_from_the_local_cache(hub_cache):
    # timm resolves deit_tiny_patch16_224 to its default tag's hub id, timm/deit_tiny_patch16_224.fb_in1k,
    # and reads model.safetensors there before pytorch_model.bin.
    cfg = timm.models.get_pretrained_cfg(DEIT)
    assert cfg.hf_hub_id == "timm/deit_tiny_patch16_224.fb_in1k"
    teacher = _vit(seed=3)
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = hub_cache / "models--timm--deit_tiny_patch16_224.fb_in1k"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    save_file(teacher.state_dict(), str(repo / "snapshots" / revision / "model.safetensors"))
    model, arch = teachers.load_pretrained(DEIT)
    with torch.no_grad():
        assert torch.equal(model(_x(n=1)), teacher(_x(n=1)))
    assert arch["source"] == "hub" and "file" not in arch and not model.training
    assert arch["pretrained_cfg"]["crop_pct"] == 0.9


def test_hub_weights_not_cached_offline_is_one_line(hub_cache):
    with pytest.raises(TeacherError) as err:
        teachers.load_pretrained(DEIT)
    text = _one_line(err)
    assert repr(DEIT) in text and str(hub_cache) in text
    assert err.value.__cause__ is None and err.value.__suppress_context__


# -- a teacher at a target's geometry -----------------------------------------------------------

def _arch(model, name=DEIT, args=SMALL):
    return teachers.describe(model, timm_model=name, model_args=args, dataset="imagenet", classes=["a"])


def test_adapt_resamples_position_embeddings(deit):
    arch = _arch(deit)
    small, small_arch = teachers.adapt(deit, arch, img_size=64)
    assert small is not deit and small.pos_embed.shape == (1, 1 + 16, 192)
    assert deit.pos_embed.shape == (1, 197, 192)  # the teacher is untouched
    assert small(_x(64)).shape == (2, 1000)
    assert small_arch["img_size"] == [64, 64] and small_arch["pretrained_cfg"]["input_size"] == [3, 64, 64]
    assert small_arch["dataset"] == "imagenet" and small_arch["classes"] == ["a"]
    own = dict(deit.named_parameters())
    for name, p in small.named_parameters():
        if name != "pos_embed":
            assert torch.equal(p, own[name]), name
    # the class token's position embedding is kept, the patch grid's is resampled
    assert torch.equal(small.pos_embed[:, :1], deit.pos_embed[:, :1])


def test_adapt_unchanged_geometry_is_the_model(deit):
    arch = _arch(deit)
    same, same_arch = teachers.adapt(deit, arch, img_size=[224, 224], num_classes=1000)
    assert same is deit and same_arch == arch
    with torch.no_grad():
        assert torch.equal(same(_x()), deit(_x()))


def test_adapt_replaces_the_head(deit):
    arch = _arch(deit)
    model, new_arch = teachers.adapt(deit, arch, num_classes=7)
    assert model.head.weight.shape == (7, 192) and new_arch["num_classes"] == 7
    assert new_arch["img_size"] == [224, 224]
    with torch.no_grad():  # everything but the head carries over
        assert torch.equal(model.forward_features(_x()), deit.forward_features(_x()))


def test_adapt_distilled_deit_and_registers():
    distilled = _vit("deit_tiny_distilled_patch16_224", depth=1)
    assert isinstance(distilled, VisionTransformerDistilled)
    arch = _arch(distilled, "deit_tiny_distilled_patch16_224", {"depth": 1})
    assert arch["num_prefix_tokens"] == 2
    model, _ = teachers.adapt(distilled, arch, img_size=32, num_classes=3)
    assert model.head.weight.shape == model.head_dist.weight.shape == (3, 192)
    assert model.pos_embed.shape == (1, 2 + 4, 192) and model(_x(32)).shape == (2, 3)

    reg = _vit(REG, **REG_ARGS)
    model, _ = teachers.adapt(reg, _arch(reg, REG, REG_ARGS), img_size=48)
    assert model.pos_embed.shape == (1, 9, 64)  # no_embed_class: patches only
    assert torch.equal(model.reg_token, reg.reg_token) and model(_x(48)).shape == (2, 1000)


# -- checks before training ----------------------------------------------------------------------

def test_check_fit(deit):
    arch = _arch(deit)
    ok = dict(teacher="deit_tiny", dataset="cifar10", image_size=(32, 32), channels=3, num_classes=10)
    teachers.check_fit(arch, **ok, same_labels=False)  # another size and label space: adapted
    teachers.check_fit(arch, **{**ok, "num_classes": 1000}, same_labels=True)
    bad = [({"image_size": (28, 28)}, ["28x28", "patch size 16", "datasets.cifar10.transform.input_size"]),
           ({"channels": 1}, ["1 channel", "3"]),
           ({}, ["10 classes", "1000"])]
    for change, words in bad:
        with pytest.raises(TeacherError) as err:
            teachers.check_fit(arch, **{**ok, **change}, same_labels=not change)
        text = _one_line(err)
        assert "'cifar10'" in text and "deit_tiny" in text
        assert all(w in text for w in words), text


# -- export in timm's layout --------------------------------------------------------------------

def test_save_timm_checkpoint_loads_in_timm_and_here(deit, tmp_path):
    arch = _arch(deit)
    weights = teachers.save_timm_checkpoint(deit, arch, tmp_path / "export")
    assert weights == tmp_path / "export" / "model.safetensors"
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architecture"] == DEIT and config["num_classes"] == 1000
    assert config["num_features"] == 192 and config["model_args"]["depth"] == 2
    assert config["pretrained_cfg"]["input_size"] == [3, 224, 224]
    again = timm.create_model(config["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(weights)), **config["model_args"]).eval()
    ours, _ = teachers.load_pretrained(DEIT, file=weights, model_args=SMALL)
    with torch.no_grad():
        expected = deit(_x())
        assert torch.equal(again(_x()), expected) and torch.equal(ours(_x()), expected)


def test_save_timm_checkpoint_of_an_adapted_teacher(deit, tmp_path):
    small, arch = teachers.adapt(deit, _arch(deit), img_size=64, num_classes=5)
    weights = teachers.save_timm_checkpoint(small, arch, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["pretrained_cfg"]["input_size"] == [3, 64, 64] and config["num_classes"] == 5
    # Another label space than the architecture's default: timm keeps the head only when the
    # pretrained_cfg says the weights have 5 classes, as config.json does (timm's own local-dir: and
    # hf-hub: loaders read it from there).
    overlay = dict(config["pretrained_cfg"], file=str(weights))
    again = timm.create_model(DEIT, pretrained=True, pretrained_cfg_overlay=overlay, **config["model_args"])
    local = timm.create_model(f"local-dir:{tmp_path}", pretrained=True)
    with torch.no_grad():
        expected = small.eval()(_x(64))
        assert torch.equal(again.eval()(_x(64)), expected) and torch.equal(local.eval()(_x(64)), expected)


def test_a_file_with_timm_config_beside_it_loads_at_its_resolution_and_statistics(deit, tmp_path):
    """A checkpoint saved with timm's config.json (the hub layout) is read at the resolution it was
    made at, with the mean, std and crop it was trained with, without repeating them in the options."""
    small, arch = teachers.adapt(deit, _arch(deit), img_size=64, num_classes=5)
    arch["pretrained_cfg"].update(mean=[0.2, 0.3, 0.4], std=[0.5, 0.6, 0.7], crop_pct=1.0)
    weights = teachers.save_timm_checkpoint(small, arch, tmp_path)
    model, loaded = teachers.load_pretrained(DEIT, file=weights)
    assert loaded["img_size"] == [64, 64] and model.pos_embed.shape == small.pos_embed.shape
    assert loaded["pretrained_cfg"]["mean"] == [0.2, 0.3, 0.4] and loaded["pretrained_cfg"]["crop_pct"] == 1.0
    with torch.no_grad():
        assert torch.equal(model(_x(64)), small.eval()(_x(64)))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TeacherError, match="config.json"):
        teachers.load_pretrained(DEIT, file=weights)


# -- students of a teacher's architecture ---------------------------------------------------------

def test_build_model_linear_variant_matches_teacher_layout(deit):
    arch = _arch(deit)
    student = teachers.build_model(arch, variant="elu")
    assert all(isinstance(b.attn, LinearAttention) and b.attn.variant == "elu" for b in student.blocks)
    shared = lambda m: {k: v.shape for k, v in m.state_dict().items()  # noqa: E731
                        if k in dict(m.named_parameters()) and parameter_group(k) in ("embed", "mlp", "norm", "head")}
    assert shared(student) == shared(deit)
    teacher_again = teachers.build_model(arch)
    assert type(teacher_again.blocks[0].attn) is type(deit.blocks[0].attn)
    assert teacher_again.state_dict().keys() == deit.state_dict().keys()
    at32 = teachers.build_model(arch, variant="elu", img_size=32, num_classes=10)
    assert at32(_x(32)).shape == (2, 10)


def test_build_model_legacy_arch():
    legacy = {"size": "micro", "variant": "softmax", "num_classes": 10, "img_size": [28, 28], "in_chans": 1,
              "dataset": "fashion_mnist", "classes": list("0123456789")}
    teacher = teachers.build_model(legacy)
    assert teacher.embed_dim == 64 and len(teacher.blocks) == 4 and teacher.patch_embed.patch_size == (4, 4)
    student = teachers.build_model({**legacy, "variant": "elu"})
    assert isinstance(student.blocks[0].attn, LinearAttention)
    assert student(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    teachers.check_fit(legacy, teacher="t", dataset="d", image_size=28, channels=1, num_classes=10,
                       same_labels=True)
    arch = teachers.describe(teacher, timm_model="linvit_micro_softmax", size="micro")
    assert arch["patch_size"] == 4 and arch["size"] == "micro" and arch["pretrained_cfg"]["crop_pct"] == 1.0


def test_build_model_student_keeps_qk_norm():
    args = {"embed_dim": 64, "depth": 1, "num_heads": 2, "qk_norm": True}
    teacher = _vit("vit_small_patch16_224", **args)
    student = teachers.build_model(_arch(teacher, "vit_small_patch16_224", args), variant="elu", img_size=32)
    norms = lambda m: {k: v.shape for k, v in m.state_dict().items() if "_norm." in k}  # noqa: E731
    assert norms(student) == norms(teacher) and len(norms(student)) == 4
    assert isinstance(student.blocks[0].attn, LinearAttention)


def test_save_timm_checkpoint_of_linvit_models(tmp_path):
    """A legacy linvit model (built by build_vit, outside timm's factory) and its linear student
    export under the timm names that rebuild them; a linear student of a foreign model cannot."""
    from linvit.models import build_vit

    legacy = {"size": "micro", "variant": "softmax", "num_classes": 10, "img_size": [28, 28], "in_chans": 1}
    x = torch.randn(2, 1, 28, 28)
    for variant in ("softmax", "elu"):
        torch.manual_seed(0)
        model = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant=variant).eval()
        assert not hasattr(model, "pretrained_cfg")
        weights = teachers.save_timm_checkpoint(model, {**legacy, "variant": variant}, tmp_path / variant)
        assert not hasattr(model, "pretrained_cfg")
        config = json.loads((tmp_path / variant / "config.json").read_text())
        assert config["architecture"] == f"linvit_micro_{variant}"
        again = timm.create_model(config["architecture"], pretrained=True,
                                  pretrained_cfg_overlay=dict(file=str(weights)), **config["model_args"])
        with torch.no_grad():
            assert torch.equal(again.eval()(x), model(x))
    deit = _vit(depth=1)
    arch = _arch(deit, args={"depth": 1})
    with pytest.raises(TeacherError) as err:
        teachers.save_timm_checkpoint(teachers.build_model(arch, variant="elu"), arch, tmp_path / "no")
    assert repr(DEIT) in _one_line(err) and "'elu'" in str(err.value)
    assert not (tmp_path / "no").exists()
