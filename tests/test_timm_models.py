"""linvit_<size>_<variant> are first-class timm models: the checks of timm's tests/test_models.py.

Over every micro and mini model (every operator, softmax included) and three deit_tiny ones:
forward, backward, the default config, reset_classifier, features_only, forward_intermediates,
and torch.fx forward and backward (traced as timm's tests trace, with torchvision's
create_feature_extractor). Then what the timm entry points add: pretrained weights from a file,
option routing, and the model listing. TorchScript is out of scope (deprecated in this torch).
"""

import copy
import math
import re

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models import get_notrace_functions, get_notrace_modules
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torchvision.models.feature_extraction import (NodePathTracer, create_feature_extractor,
                                                   get_graph_node_names)

import linvit.models
from linvit.attention import available_variants
from linvit.models import build_vit, model_name, model_variant, swap_attention
from linvit.sizes import INPUTS, SIZES

VARIANTS = available_variants()  # every registered operator, softmax included
SMALL = [model_name(size, v) for size in ("micro", "mini") for v in VARIANTS]
# deit_tiny: softmax, a plain kernel, and a grid operator. Built for 64x64 images (a 4x4 patch grid,
# 17 tokens instead of 197) except in test_forward, to keep the file fast on two cores.
DEIT = [model_name("deit_tiny", v) for v in ("softmax", "elu", "agent")]
MODELS = SMALL + DEIT
# torch.fx traces every block in Python; mini is micro deeper and wider, so fx runs on micro and deit.
FX_MODELS = [model_name("micro", v) for v in VARIANTS] + DEIT
SMALLER = {name: dict(img_size=64) for name in DEIT}

_built: dict = {}


def create(name: str, own_size: bool = False, **kwargs) -> nn.Module:
    """timm.create_model, each configuration built once (deit_tiny's init is slow) and copied."""
    kwargs = {**({} if own_size else SMALLER.get(name, {})), **kwargs}
    key = (name, tuple(sorted(kwargs.items())))
    if key not in _built:
        _built[key] = timm.create_model(name, **kwargs)
    return copy.deepcopy(_built[key])


def size_of(name: str) -> str:
    return next(s for s in sorted(SIZES, key=len, reverse=True) if name.startswith(f"linvit_{s}_"))


def inputs(name: str, batch: int, own_size: bool = False) -> torch.Tensor:
    spec = INPUTS[size_of(name)]
    side = spec["img_size"] if own_size else SMALLER.get(name, spec).get("img_size")
    return torch.randn(batch, spec["in_chans"], side, side)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_every_operator_has_a_model_of_every_size_listed_under_linvit():
    expected = {model_name(s, v) for s in SIZES for v in VARIANTS}
    assert len(VARIANTS) == 12 and set(timm.list_models("linvit_*")) == expected
    assert set(timm.list_models(module="linvit")) == expected
    for name in expected:
        fn = timm.models.model_entrypoint(name)
        assert fn.__name__ == name and fn.__module__ == "linvit.models" and getattr(linvit.models, name) is fn
        assert timm.models.get_pretrained_cfg(name).architecture == name
        assert not timm.models.is_model_pretrained(name)  # no published weights


@pytest.mark.parametrize("name", MODELS)
def test_forward(name):
    model = create(name, own_size=True).eval()  # at the input size of its default config
    x = inputs(name, 2, own_size=True)
    assert tuple(x.shape[1:]) == model.pretrained_cfg["input_size"]
    with torch.no_grad():
        out = model(x)
        assert out.shape == (2, INPUTS[size_of(name)]["num_classes"]) and out.isfinite().all()
        model.set_grad_checkpointing()  # recomputation changes nothing
        assert torch.allclose(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_backward_reaches_every_parameter(name):
    model = create(name, num_classes=42).train()
    out = model(inputs(name, 2))
    assert out.shape == (2, 42)
    out.mean().backward()
    # As timm's test: every parameter has a gradient. Some are exactly zero at initialization
    # (zero-initialized convs and gates of some operators feed nothing yet), so finite, not nonzero;
    # qkv shows the gradient does flow through every operator.
    for n, p in model.named_parameters():
        assert p.grad is not None, f"no gradient for {n}"
        assert p.grad.isfinite().all(), f"non-finite gradient for {n}"
    assert sum(p.grad.numel() for p in model.parameters()) == sum(p.numel() for p in model.parameters())
    assert all(b.attn.qkv.weight.grad.abs().sum() > 0 for b in model.blocks)


@pytest.mark.parametrize("name", MODELS)
def test_default_config(name):
    size, spec = size_of(name), INPUTS[size_of(name)]
    model = create(name).eval()
    cfg = model.pretrained_cfg  # the size's own input even where the model is built smaller
    img = spec["img_size"]
    assert cfg["architecture"] == name and cfg["fixed_input_size"]
    assert cfg["input_size"] == (spec["in_chans"], img, img) and cfg["num_classes"] == spec["num_classes"]
    assert cfg["mean"] == tuple(spec["mean"]) and cfg["std"] == tuple(spec["std"])
    data = timm.data.resolve_data_config({}, model=model)
    assert data["input_size"] == cfg["input_size"] and (data["mean"], data["std"]) == (cfg["mean"], cfg["std"])
    # first_conv and classifier name the real modules (what loading adapts for in_chans/classes).
    modules = dict(model.named_modules())
    conv, head = modules[cfg["first_conv"]], modules[cfg["classifier"]]
    assert isinstance(conv, nn.Conv2d) and conv.in_channels == spec["in_chans"]
    assert isinstance(head, nn.Linear) and head.out_features == model.num_classes == spec["num_classes"]
    assert model.num_features == model.head_hidden_size == SIZES[size]["embed_dim"]
    # forward_features is unpooled (B, prefix + patches, C); forward_head(pre_logits) pools it.
    x = inputs(name, 1)
    with torch.no_grad():
        feats = model.forward_features(x)
        tokens = model.num_prefix_tokens + math.prod(model.patch_embed.grid_size)
        assert feats.shape == (1, tokens, model.num_features)
        assert model.forward_head(feats, pre_logits=True).shape == (1, model.head_hidden_size)
        headless = create(name, num_classes=0, global_pool="").eval()
        assert headless(x).shape == (1, tokens, model.num_features)


@pytest.mark.parametrize("name", MODELS)
def test_reset_classifier(name):
    model = create(name).eval()
    x = inputs(name, 2)
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)
        assert model.num_classes == 0 and torch.allclose(model(x), pre)
        model.reset_classifier(7)
        assert model.num_classes == 7 and model(x).shape == (2, 7)


@pytest.mark.parametrize("name", MODELS)
def test_features_only(name):
    model = create(name, features_only=True).eval()
    shape = SIZES[size_of(name)]
    assert model.pretrained_cfg["architecture"] == name
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) == 3  # timm's ViT default: the last three blocks
    x = inputs(name, 2)
    grid = x.shape[-1] // shape["patch_size"]
    with torch.no_grad():
        outs = model(x)
    assert len(outs) == len(channels)
    for c, r, o in zip(channels, reductions, outs):
        assert c == shape["embed_dim"] and r == shape["patch_size"]
        assert o.shape == (2, c, grid, grid) and o.isfinite().all()


@pytest.mark.parametrize("name", MODELS)
def test_forward_intermediates(name):
    model = create(name).eval()
    shape = SIZES[size_of(name)]
    x = inputs(name, 1)
    grid = x.shape[-1] // shape["patch_size"]
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        assert len(inter) == shape["depth"]
        assert all(t.shape == (1, shape["embed_dim"], grid, grid) and t.isfinite().all() for t in inter)
        assert torch.allclose(final, model.forward_features(x))
        last_two = model.forward_intermediates(x, indices=2, intermediates_only=True)
        assert len(last_two) == 2 and torch.allclose(last_two[-1], inter[-1])


def _create_fx_model(model: nn.Module, train: bool = False) -> nn.Module:
    """timm's tests/test_models.py `_create_fx_model`: trace with timm's leaf modules and functions
    and return the graph module that computes the model's output (all outputs in train mode)."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    eval_return_nodes, train_return_nodes = [eval_nodes[-1]], [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**tracer_kwargs).trace(model)
        graph_nodes = list(reversed(graph.nodes))
        output_node_names = [n.name for n in graph_nodes[0]._input_nodes.keys()]
        graph_node_names = [n.name for n in graph_nodes]
        train_return_nodes = [train_nodes[-graph_node_names.index(n)] for n in output_node_names]
    return create_feature_extractor(model, train_return_nodes=train_return_nodes,
                                    eval_return_nodes=eval_return_nodes, tracer_kwargs=tracer_kwargs)


@pytest.mark.parametrize("name", FX_MODELS)
def test_fx_forward(name):
    model = create(name).eval()
    x = inputs(name, 1)
    with torch.inference_mode():
        out = model(x)
        fx_out = torch.cat(tuple(_create_fx_model(model)(x).values()))
    assert torch.equal(fx_out, out) and out.isfinite().all()


@pytest.mark.parametrize("name", FX_MODELS)
def test_fx_backward(name):
    model = create(name, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx_model = _create_fx_model(model, train=True)
    out = torch.cat(tuple(fx_model(inputs(name, 2)).values()))
    out.mean().backward()
    for n, p in fx_model.named_parameters():
        assert p.grad is not None, f"no gradient for {n}"
    assert out.shape[-1] == 42 and out.isfinite().all()
    assert sum(p.grad.numel() for p in fx_model.parameters()) == num_params


# -- pretrained weights from a file ----------------------------------------------------------------

@pytest.mark.parametrize("name,options", [("linvit_micro_agent", dict(agent_num=16)),
                                          ("linvit_mini_rala", dict(rope=True)),
                                          ("linvit_micro_softmax", {})])
def test_pretrained_weights_load_from_a_file(name, options, tmp_path):
    trained = timm.create_model(name, **options).eval()
    with torch.no_grad():  # weights that differ from any fresh initialization
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(path))
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                               **options).eval()
    assert loaded.pretrained_cfg["file"] == str(path)
    for (k, a), b in zip(trained.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    x = inputs(name, 2)
    with torch.no_grad():
        assert torch.equal(loaded(x), trained(x))
    # timm's usual adaptation: a new class count keeps everything but the head.
    relabeled = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                                  num_classes=3, **options)
    assert relabeled.head.out_features == 3
    assert torch.equal(relabeled.patch_embed.proj.weight, trained.patch_embed.proj.weight)


@pytest.mark.parametrize("name", ["linvit_micro_elu", "linvit_mini_agent", "linvit_mini_softmax"])
def test_pretrained_without_weights_names_the_model_asked_for(name):
    # The old entry points closed over the loop variable: all named the last size's (deit_base).
    with pytest.raises(RuntimeError) as err:
        timm.create_model(name, pretrained=True)
    assert re.findall(r"linvit_\w+", str(err.value)) == [name]


# -- options ---------------------------------------------------------------------------------------

def test_timm_options_reach_the_vision_transformer_and_operators_keep_up():
    model = timm.create_model("linvit_micro_polarity", drop_path_rate=0.1, class_token=False, reg_tokens=2,
                              global_pool="avg", img_size=32, in_chans=3, num_classes=5, qkv_bias=False,
                              proj_drop_rate=0.2, no_embed_class=True)
    attn = model.blocks[0].attn
    assert model.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1) and model.global_pool == "avg"
    assert model.num_prefix_tokens == attn.num_prefix_tokens == 2 and model.cls_token is None
    assert attn.grid_size == (8, 8) and attn.qkv.bias is None and attn.proj_drop.p == pytest.approx(0.2)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_operator_options_go_to_every_operator():
    agent = timm.create_model("linvit_micro_agent", agent_num=16)
    hedgehog = timm.create_model("linvit_micro_hedgehog", activation="softmax")
    rala = timm.create_model("linvit_micro_rala", rope=True)
    assert {b.attn.agent_num for b in agent.blocks} == {16}
    assert {b.attn.activation for b in hedgehog.blocks} == {"softmax"}
    assert {b.attn.rope for b in rala.blocks} == {True}
    assert agent(torch.randn(1, 1, 28, 28)).isfinite().all()


@pytest.mark.parametrize("name,option", [("linvit_micro_softmax", "agent_num"), ("linvit_micro_elu", "rope"),
                                         ("linvit_micro_agent", "nonsense")])
def test_an_unknown_option_is_an_error_naming_it_and_the_model(name, option):
    with pytest.raises(ValueError, match=rf"^{name}: unknown option\(s\) '{option}'"):
        timm.create_model(name, **{option: 1})


def test_attention_dropout_is_refused_by_linear_operators_only():
    with pytest.raises(ValueError, match=r"linvit_micro_elu: .*attn_drop_rate=0.1.*no attention matrix"):
        timm.create_model("linvit_micro_elu", attn_drop_rate=0.1)
    assert timm.create_model("linvit_micro_softmax", attn_drop_rate=0.1).blocks[0].attn.attn_drop.p == 0.1


@pytest.mark.parametrize("variant", ["focused", "polarity", "agent", "cosformer", "rala", "mila"])
def test_grid_operators_refuse_dynamic_img_size(variant):
    with pytest.raises(ValueError, match=rf"'{variant}' works on a fixed patch grid.*dynamic_img_size"):
        timm.create_model(model_name("micro", variant), dynamic_img_size=True)


@pytest.mark.parametrize("variant", ["softmax", "elu", "relu", "performer", "hydra", "hedgehog"])
def test_gridless_operators_run_dynamic_img_size_at_any_size(variant):
    model = timm.create_model(model_name("micro", variant), dynamic_img_size=True).eval()
    with torch.no_grad():
        for side in (28, 36):
            assert model(torch.randn(1, 1, side, side)).shape == (1, 10)


def test_build_vit_and_timm_build_the_same_model():
    torch.manual_seed(3)
    a = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="agent", agent_num=16)
    torch.manual_seed(3)
    b = timm.create_model("linvit_micro_agent", agent_num=16)
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    with pytest.raises(ValueError, match=r"linvit_micro_softmax: unknown option\(s\) 'agent_num'"):
        build_vit("micro", num_classes=10, img_size=28, in_chans=1, agent_num=16)


def test_swap_attention_refuses_what_it_would_drop_and_swaps_operators_again():
    vit = VisionTransformer(img_size=28, in_chans=1, num_classes=10, scale_attn_norm=True, **SIZES["micro"])
    with pytest.raises(ValueError, match=r"'elu' cannot take scale_attn_norm=True"):
        swap_attention(vit, "elu")
    assert model_variant(vit) == "softmax"  # refused before any block changed
    model = swap_attention(build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="elu"), "agent")
    assert model_variant(model) == "agent" and model(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_operators_follow_the_dtype_the_model_is_built_in():
    model = timm.create_model("linvit_micro_focused", dtype=torch.float64).eval()
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    with torch.no_grad():
        assert model(torch.randn(1, 1, 28, 28, dtype=torch.float64)).dtype == torch.float64
