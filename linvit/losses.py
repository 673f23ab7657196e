"""Distillation losses registered by name, the terms a config combines them in, and the objective.

Notation, block l, head h: A = softmax(q k^T / sqrt(d)) the teacher's map, Â the student's implicit
map (row-normalized), y the per-head attention output before the output projection (the input of
`attn.proj`), the attention output after `proj`, the block output, the logits; the student's
tensors wear a hat. A loss is one function of a `Views` (the tensors it reads, by name): a
block-scope loss computes block l's value and the objective averages it over the term's blocks; a
model-scope loss compares the whole models' features or logits.

A term is one config entry `{loss: NAME, weight: 1.0, blocks: all, tokens: all, forced: ..., tau: 1.0}`
(see `parse_terms`); the objective is sum_i weight_i * loss_i.

Teacher forcing (`forced: true`, the default of the attention losses): the student's attention of
block l runs on the teacher's attention input of block l (its norm1 output), so every block learns
independently of what the rest of the student does. End to end (`forced: false`): each model runs
its own forward on the images and the student's tensors come from the student's forward.

The per-row functions `kl_rows`, `js_rows` and `map_correlation` are shared with the evaluation.
Attention maps are computed in at least fp32 with autocast off (`attention_maps` does it for every
caller), so the N x N maps of teacher and student never run in the training autocast's bf16 or fp16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention_maps
from .registry import LOSS_ALIASES

# -- per-row functions (shared with the evaluation) ------------------------------------------------


def _logc(t: torch.Tensor, eps: float) -> torch.Tensor:
    return t.clamp_min(eps).log()


def kl_rows(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KL(p_i || q_i) = sum_j p_ij (log max(p_ij, eps) - log max(q_ij, eps)) of every row i.

    p, q: row-stochastic (..., N, N) (or any (..., N) rows); returns (..., N) (one value per row).
    """
    return (p * (_logc(p, eps) - _logc(q, eps))).sum(-1)


def js_rows(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Jensen-Shannon divergence of every row: 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2.

    p, q: row-stochastic (..., N, N); returns (..., N). Symmetric, between 0 and log 2.
    """
    m = (p + q) / 2
    return 0.5 * kl_rows(p, m, eps) + 0.5 * kl_rows(q, m, eps)


def map_correlation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of the flattened maps p, q (..., N, N): one value per leading index (...,).

    Computed in at least fp32; 0 where either map is constant (its variance is zero).
    """
    dtype = torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)
    a = p.to(dtype).flatten(-2)
    b = q.to(dtype).flatten(-2)
    a = a - a.mean(-1, keepdim=True)
    b = b - b.mean(-1, keepdim=True)
    cov = (a * b).sum(-1)
    norm = (a.square().sum(-1) * b.square().sum(-1)).sqrt()
    tiny = torch.finfo(dtype).tiny
    return torch.where(norm > tiny, cov / norm.clamp_min(tiny), torch.zeros_like(cov))


# -- the registry ----------------------------------------------------------------------------------

SCOPES = ("block", "model")
FORCING = ("optional", "always", "never")
# What a loss may read: (teacher_X, student_X) pairs of a Views.
BLOCK_TENSORS = ("maps", "pre", "out", "block")
MODEL_TENSORS = ("features", "logits")
TERM_OPTIONS = ("tau",)  # term keys passed to a loss that lists them in its `options`


@dataclass(frozen=True)
class Loss:
    """A registered loss: its function `(views, **options) -> scalar` and how a term may use it.

    scope:   "block" (one block's value; the objective averages over the term's blocks) or "model".
    forcing: "optional" (a term chooses, teacher-forced by default), "always" or "never".
    reads:   the tensors it reads (teacher_X and student_X of a Views for each X).
    tokens:  whether a term may restrict it to the patch tokens.
    options: term options passed to the function as keywords (logit_kd's tau).
    """

    name: str
    fn: Callable
    scope: str = "block"
    forcing: str = "optional"
    reads: tuple[str, ...] = BLOCK_TENSORS
    tokens: bool = True
    options: tuple[str, ...] = ()

    def __call__(self, views: "Views", **options) -> torch.Tensor:
        return self.fn(views, **options)

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or "").strip()


LOSSES: dict[str, Loss] = {}


def register_loss(name: str, *, scope: str = "block", forced: str = "optional",
                  reads: tuple[str, ...] | None = None, tokens: bool = True, options: tuple[str, ...] = ()):
    """Function decorator: make a distillation loss `(Views, **options) -> scalar` selectable by name.

    `scope`, `forced` ("optional", "always", "never"), `reads`, `tokens` and `options` as in `Loss`;
    `reads` defaults to every tensor of the scope.
    """
    if scope not in SCOPES:
        raise ValueError(f"loss {name!r}: scope {scope!r} is not one of {', '.join(SCOPES)}")
    if forced not in FORCING:
        raise ValueError(f"loss {name!r}: forced {forced!r} is not one of {', '.join(FORCING)}")
    if scope == "model" and forced != "never":
        raise ValueError(f"loss {name!r}: a model-scope loss is never teacher-forced (forced='never')")
    allowed = BLOCK_TENSORS if scope == "block" else MODEL_TENSORS
    reads = tuple(reads) if reads is not None else allowed
    if not reads or set(reads) - set(allowed):
        raise ValueError(f"loss {name!r}: a {scope}-scope loss reads some of {', '.join(allowed)}, not {reads}")
    unknown = set(options) - set(TERM_OPTIONS)
    if unknown:
        raise ValueError(f"loss {name!r}: unknown term option(s) {sorted(unknown)}; known: {', '.join(TERM_OPTIONS)}")

    if name in LOSS_ALIASES:
        raise ValueError(f"distillation loss {name!r}: an old name of {LOSS_ALIASES[name]!r} "
                         f"(registry.LOSS_ALIASES); choose another")

    def wrap(fn):
        if name in LOSSES:
            raise ValueError(f"distillation loss {name!r} is registered twice")
        LOSSES[name] = Loss(name, fn, scope, forced, reads, tokens, tuple(options))
        return fn

    return wrap


def loss_name(name: str) -> str:
    """The registered name `name` means: itself, or what an old alias (registry.LOSS_ALIASES) stands for."""
    return LOSS_ALIASES.get(name, name)


def distill_loss(name: str) -> Loss:
    try:
        return LOSSES[loss_name(name)]
    except (KeyError, TypeError):
        raise ValueError(f"unknown distillation loss {name!r}; known losses: {', '.join(sorted(LOSSES))}") from None


class Views:
    """The tensors a loss reads, by name: each a tensor, or a function of no arguments computing it
    on first use (so the objective computes only what a loss reads). Tests build one by hand.

    Block scope (one block): teacher_maps, student_maps (B, H, N, N) row-stochastic A and Â;
    teacher_pre, student_pre (B, N, C) y and ŷ, the input of attn.proj; teacher_out, student_out
    (B, N, C) the attention outputs after proj; teacher_block, student_block (B, N, C) the block
    outputs. Model scope: teacher_features, student_features (B, N, C) `forward_features`;
    teacher_logits, student_logits (B, K).
    """

    def __init__(self, **tensors):
        self._tensors = tensors

    def __getattr__(self, name: str):
        tensors = self.__dict__.get("_tensors", {})
        if name.startswith("_") or name not in tensors:
            raise AttributeError(f"the loss reads {name!r}, which these views do not hold "
                                 f"(they hold: {', '.join(sorted(tensors)) or 'nothing'})")
        value = tensors[name]
        if callable(value) and not isinstance(value, torch.Tensor):
            value = tensors[name] = value()
        return value


def _f(t: torch.Tensor) -> torch.Tensor:
    """t in at least fp32 (a loss sums over many entries; float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


# -- the losses (each docstring is its formula) ---------------------------------------------------


@register_loss("out_mse", reads=("pre",))
def out_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(ŷ_l, y_l): y = the per-head attention output before the output
    projection (the input of attn.proj), mean over images, tokens and channels (LoLCATs' attention
    transfer)."""
    return F.mse_loss(_f(v.student_pre), _f(v.teacher_pre))


@register_loss("proj_mse", reads=("out",))
def proj_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(attn_s(u_l), attn_t(u_l)): the attention module outputs (after
    proj), mean over images, tokens and channels."""
    return F.mse_loss(_f(v.student_out), _f(v.teacher_out))


@register_loss("map_ce", reads=("maps",))
def map_ce(v: Views, eps: float = 1e-8) -> torch.Tensor:
    """mean over blocks, images, heads and query rows i of -sum_j A_ij log max(Â_ij, eps),
    eps = 1e-8 (Hedgehog)."""
    return -(_f(v.teacher_maps) * _logc(_f(v.student_maps), eps)).sum(-1).mean()


@register_loss("map_rkl", reads=("maps",))
def map_rkl(v: Views, eps: float = 1e-8) -> torch.Tensor:
    """mean over blocks, images, heads and query rows i of KL(Â_i || A_i) =
    sum_j Â_ij (log max(Â_ij, eps) - log max(A_ij, eps)), eps = 1e-8 (reverse KL)."""
    return kl_rows(_f(v.student_maps), _f(v.teacher_maps), eps).mean()


@register_loss("map_js", reads=("maps",))
def map_js(v: Views, eps: float = 1e-8) -> torch.Tensor:
    """mean over blocks, images, heads and query rows i of 1/2 KL(A_i || M_i) + 1/2 KL(Â_i || M_i),
    M = (A + Â) / 2, logs of max(., eps), eps = 1e-8 (Jensen-Shannon)."""
    return js_rows(_f(v.teacher_maps), _f(v.student_maps), eps).mean()


@register_loss("map_fro", reads=("maps",))
def map_fro(v: Views) -> torch.Tensor:
    """mean over blocks, images and heads of ||Â - A||_F = sqrt(sum_ij (Â_ij - A_ij)^2)
    (MOHAWK stage 1)."""
    return torch.linalg.vector_norm(_f(v.student_maps) - _f(v.teacher_maps), dim=(-2, -1)).mean()


@register_loss("block_l2", forced="always", reads=("block",))
def block_l2(v: Views) -> torch.Tensor:
    """mean over blocks l, images and tokens of ||block_s(u_l) - block_t(u_l)||_2, the Euclidean norm
    over channels, u_l = the teacher's input to block l (always teacher-forced; MOHAWK stage 2)."""
    return torch.linalg.vector_norm(_f(v.student_block) - _f(v.teacher_block), dim=-1).mean()


@register_loss("hidden_mse", forced="never", reads=("block",))
def hidden_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(ĥ_l, h_l): h_l = block l's output hidden states while each model runs
    its own forward on the images (never teacher-forced), mean over images, tokens and channels."""
    return F.mse_loss(_f(v.student_block), _f(v.teacher_block))


@register_loss("feat_cos", scope="model", forced="never", reads=("features",))
def feat_cos(v: Views) -> torch.Tensor:
    """mean over images and tokens of 1 - cos(f̂, f): f = the final features (`forward_features`:
    class and patch tokens after the final norm), each model on its own forward."""
    return (1 - F.cosine_similarity(_f(v.student_features), _f(v.teacher_features), dim=-1)).mean()


@register_loss("logit_kd", scope="model", forced="never", reads=("logits",), tokens=False, options=("tau",))
def logit_kd(v: Views, tau: float = 1.0) -> torch.Tensor:
    """tau^2 * KL(softmax(z_t / tau) || softmax(z_s / tau)), summed over classes, mean over images
    (DeiT's soft distillation); z_t the logit teacher's logits, z_s the student's, tau = 1 by default."""
    log_t = F.log_softmax(_f(v.teacher_logits) / tau, dim=-1)
    log_s = F.log_softmax(_f(v.student_logits) / tau, dim=-1)
    return tau ** 2 * F.kl_div(log_s, log_t, reduction="batchmean", log_target=True)


@register_loss("logit_kd_hard", scope="model", forced="never", reads=("logits",), tokens=False)
def logit_kd_hard(v: Views) -> torch.Tensor:
    """mean over images of -log softmax(z_s)_c, c = argmax z_t: cross-entropy of the student's logits
    against the logit teacher's top class (DeiT's hard distillation)."""
    return F.cross_entropy(_f(v.student_logits), v.teacher_logits.argmax(-1))


# -- terms ------------------------------------------------------------------------------------------

TERM_KEYS = ("loss", "weight", "blocks", "tokens", "forced", "tau")
BLOCK_SELECTIONS = ("first", "last", "skip_last")
TOKENS = ("all", "patch")


class TermError(ValueError):
    """A term's value is wrong: `key` the term key at fault, `message` why."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Term:
    """One loss of an objective: loss (a registered name or an alias), weight >= 0, blocks ("all" or
    (first|last|skip_last, k)), tokens ("all" or "patch"), forced (teacher-forced or end to end;
    None: the loss's default) and tau (logit_kd's temperature). Validated and normalized on
    construction: `loss` is the registered name, `forced` a bool."""

    loss: str
    weight: float = 1.0
    blocks: str | tuple[str, int] = "all"
    tokens: str = "all"
    forced: bool | None = None
    tau: float = 1.0

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        try:
            spec = distill_loss(self.loss)
        except ValueError as err:
            raise TermError("loss", str(err)) from None
        set_("loss", spec.name)
        if not _number(self.weight) or self.weight < 0:
            raise TermError("weight", f"{self.weight!r} is not a finite number >= 0")
        set_("weight", float(self.weight))
        set_("blocks", _blocks(self.blocks))
        if spec.scope == "model" and self.blocks != "all":
            raise TermError("blocks", f"{spec.name} compares whole models; it takes no blocks")
        if self.tokens not in TOKENS:
            raise TermError("tokens", f"{self.tokens!r} is not one of {', '.join(TOKENS)}")
        if self.tokens != "all" and not spec.tokens:
            raise TermError("tokens", f"{spec.name} has no tokens to select")
        if self.forced is not None and not isinstance(self.forced, bool):
            raise TermError("forced", f"{self.forced!r} is not true or false")
        fixed = {"always": True, "never": False}.get(spec.forcing)
        if fixed is not None and self.forced not in (None, fixed):
            raise TermError("forced", f"{spec.name} is {'always' if fixed else 'never'} teacher-forced")
        set_("forced", fixed if fixed is not None else (True if self.forced is None else self.forced))
        if not _number(self.tau) or self.tau <= 0:
            raise TermError("tau", f"{self.tau!r} is not a finite number > 0")
        if self.tau != 1.0 and "tau" not in spec.options:
            raise TermError("tau", f"{spec.name} takes no temperature")
        set_("tau", float(self.tau))

    @property
    def spec(self) -> Loss:
        return distill_loss(self.loss)

    @property
    def options(self) -> dict:
        """The keywords the loss function takes from this term."""
        return {k: getattr(self, k) for k in self.spec.options}

    @property
    def label(self) -> str:
        """The loss name plus what differs from its defaults: 'map_ce[last 2, patch, end to end]'."""
        spec, parts = self.spec, []
        if self.blocks != "all":
            parts.append(f"{self.blocks[0]} {self.blocks[1]}")
        if self.tokens != "all":
            parts.append(self.tokens)
        if spec.forcing == "optional" and not self.forced:
            parts.append("end to end")
        if "tau" in spec.options and self.tau != 1.0:
            parts.append(f"tau={self.tau:g}")
        return f"{self.loss}[{', '.join(parts)}]" if parts else self.loss

    def entry(self) -> dict:
        """The config entry this term reads back from (defaults left out)."""
        spec, out = self.spec, {"loss": self.loss}
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.blocks != "all":
            out["blocks"] = {self.blocks[0]: self.blocks[1]}
        if self.tokens != "all":
            out["tokens"] = self.tokens
        if spec.forcing == "optional" and not self.forced:
            out["forced"] = False
        if "tau" in spec.options and self.tau != 1.0:
            out["tau"] = self.tau
        return out

    def block_indices(self, depth: int) -> list[int]:
        """The blocks this term reads in a model of `depth` blocks."""
        if self.blocks == "all":
            return list(range(depth))
        kind, k = self.blocks
        if k > depth or (kind == "skip_last" and k == depth):
            raise ValueError(f"distillation term {self.label}: blocks {{{kind}: {k}}} leaves no blocks "
                             f"or needs more than the model's {depth}")
        return {"first": list(range(k)), "last": list(range(depth - k, depth)),
                "skip_last": list(range(depth - k))}[kind]


def _blocks(value):
    if value == "all":
        return "all"
    if isinstance(value, dict):
        if len(value) != 1:
            raise TermError("blocks", f"{value!r}: give one of {', '.join(BLOCK_SELECTIONS)} (or all)")
        (kind, k), = value.items()
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        kind, k = value
    else:
        raise TermError("blocks", f"{value!r} is not all or {{first|last|skip_last: k}}")
    if kind not in BLOCK_SELECTIONS:
        raise TermError("blocks", f"unknown selection {kind!r}; known: all, {', '.join(BLOCK_SELECTIONS)}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise TermError("blocks", f"{kind}: {k!r} is not a whole number >= 1")
    return (kind, k)


def parse_terms(entries, key: str) -> list[Term]:
    """The terms of config key `key`: a list of entries, each a loss name or a mapping
    {loss, weight, blocks, tokens, forced, tau}; a single name or Term stands for a list of one.

    Errors are one line naming the key: "config key <key>[i].blocks: ...".
    """
    if isinstance(entries, (str, Term, dict)):
        entries = [entries]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"config key {key}: a non-empty list of distillation terms, not {entries!r}")
    terms = []
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, Term):
            terms.append(entry)
            continue
        if isinstance(entry, str):
            entry = {"loss": entry}
        if not isinstance(entry, dict):
            raise ValueError(f"config key {where}: a term is a loss name or a mapping with 'loss', not {entry!r}")
        unknown = [k for k in entry if k not in TERM_KEYS]
        if unknown:
            raise ValueError(f"config key {where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                             f"a term takes: {', '.join(TERM_KEYS)}")
        if "loss" not in entry:
            raise ValueError(f"config key {where}: a term needs 'loss' (one of: {', '.join(sorted(LOSSES))})")
        try:
            spec = distill_loss(entry["loss"])
        except ValueError as err:
            raise ValueError(f"config key {where}.loss: {err}") from None
        given = [k for k in ("blocks", "tokens", "forced", "tau") if k in entry]
        for k in given:
            why = {"blocks": f"{spec.name} compares whole models; it takes no blocks"
                   if spec.scope == "model" else None,
                   "tokens": None if spec.tokens else f"{spec.name} has no tokens to select",
                   "forced": None if spec.forcing == "optional" else
                   f"{spec.name} is {'always' if spec.forcing == 'always' else 'never'} teacher-forced; "
                   f"leave forced out",
                   "tau": None if "tau" in spec.options else f"{spec.name} takes no temperature"}[k]
            if why:
                raise ValueError(f"config key {where}.{k}: {why}")
        try:
            terms.append(Term(**entry))
        except TermError as err:
            raise ValueError(f"config key {where}.{err.key}: {err.message}") from None
    return terms


# -- the objective ------------------------------------------------------------------------------------


@dataclass
class Result:
    """One batch's objective: total = sum_i weight_i * terms[label_i]; per_block[label] maps each block
    a block-scope term reads to its value there (terms[label] is their mean); student_logits when the
    student ran its own forward with its head (an end-to-end logit term, or asked for)."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor]
    per_block: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    student_logits: torch.Tensor | None = None


class _Hook:
    """A forward (pre-)hook appending its module's input (args[0]) or output to `values` while its
    recording is on. A plain object, not a closure, so a model carrying it still deep-copies and
    pickles; and nothing of it names its block, so torch.compile traces one graph for every block's
    attention (a per-block constant in a hook is a per-block recompilation)."""

    def __init__(self, recording: "_Recording", what: str):
        self.recording, self.what, self.values = recording, what, []

    def __call__(self, module, args, output=None):
        if self.recording.on:
            self.values.append(output if self.what == "output" else args[0])


# kind -> (the module it is read at: a block's submodule, or the model's for "features"; its input
# (a forward pre-hook) or its output (a forward hook))
_CAPTURE = {"in": ("", "input"), "attn_in": ("attn", "input"), "pre": ("attn.proj", "input"),
            "out": ("attn", "output"), "block": ("", "output"), "features": ("norm", "output")}
# What a student records: its attention's input, y, output and its blocks' outputs, and its final
# features (the final norm's output: forward_features' result).
_STUDENT_KINDS = ("attn_in", "pre", "out", "block")


class _Recording:
    """Hooks recording `wanted` (kind, block) tensors of a ViT while `on` (block None: features)."""

    def __init__(self, model: nn.Module, wanted):
        self.on, self.hooks, self.handles = False, {}, []
        for kind, l in sorted(wanted, key=lambda w: (w[0], -1 if w[1] is None else w[1])):
            path, what = _CAPTURE[kind]
            module = model.get_submodule(path) if l is None else model.blocks[l].get_submodule(path)
            self.hooks[(kind, l)] = hook = _Hook(self, what)
            self.handles.append(module.register_forward_pre_hook(hook) if what == "input" else
                                module.register_forward_hook(hook))

    def collect(self) -> dict:
        """What each hook recorded last, by (kind, block); the hooks emptied."""
        out = {key: h.values[-1] for key, h in self.hooks.items() if h.values}
        for h in self.hooks.values():
            h.values.clear()
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.hooks = [], {}


_RECORDING = "_linvit_recording"  # the attribute of a student holding its recording hooks


def student_recording(model: nn.Module) -> _Recording:
    """The student's recording hooks: every block's attention input, y, attention output and output,
    and the final features; registered once per model and shared by every objective on it, so that a
    second objective (a design's next phase) needs no hooks a compiled model would ignore."""
    rec = model.__dict__.get(_RECORDING)
    if rec is None:
        wanted = {(kind, l) for kind in _STUDENT_KINDS for l in range(len(model.blocks))}
        if isinstance(getattr(model, "norm", None), nn.Module):
            wanted.add(("features", None))
        rec = _Recording(model, wanted)
        model.__dict__[_RECORDING] = rec
    return rec


def remove_recording(model: nn.Module) -> None:
    """Take the recording hooks objectives put on `model` off it (they cost nothing while off)."""
    rec = model.__dict__.pop(_RECORDING, None)
    if rec is not None:
        rec.remove()


def _select_tokens(t: torch.Tensor, maps: bool, prefix: int) -> torch.Tensor:
    """The patch tokens of t: maps keep patch rows and columns, rows renormalized."""
    if not maps:
        return t[:, prefix:]
    t = t[..., prefix:, prefix:]
    return t / t.sum(-1, keepdim=True).clamp_min(torch.finfo(t.dtype).tiny)


class Objective:
    """sum_i weight_i * loss_i of `terms` (Terms, config entries or loss names) for the student.

    Per batch: one teacher forward (no gradients) with hooks on what the terms read; one student
    forward (`student(x)`, so a compiled student runs compiled) with hooks only when a term runs end
    to end or the student's logits are asked for; teacher-forced terms run the student's
    `block.attn` (block_l2: the whole block) module by module on the teacher's captured inputs,
    for their blocks only. `logit_teacher` (default: the teacher) gives the logits of the logit
    losses: a model with the student's label space. The teachers never receive gradients.

    The student's hooks are registered once per student, by the first objective on it (they record
    only while an objective runs; see `student_recording`), so build the first objective before
    compiling the student (torch.compile ignores hooks added later).
    """

    def __init__(self, teacher: nn.Module, student: nn.Module, terms, logit_teacher: nn.Module | None = None,
                 key: str = "distill.losses"):
        self.terms = parse_terms(terms, key)
        self.teacher, self.student = teacher.eval(), student
        self.logit_teacher = logit_teacher if logit_teacher is not None else teacher
        for model in {id(m): m for m in (self.teacher, self.logit_teacher)}.values():
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
        self.labels = _unique([t.label for t in self.terms])
        depth = len(student.blocks)
        if any(t.spec.scope == "block" for t in self.terms) and len(teacher.blocks) != depth:
            raise ValueError(f"the teacher has {len(teacher.blocks)} blocks and the student {depth}: "
                             f"block terms compare them block by block")
        self.blocks = [t.block_indices(depth) if t.spec.scope == "block" else [] for t in self.terms]
        self.prefix = getattr(teacher, "num_prefix_tokens", 0)
        if any(t.tokens == "patch" for t in self.terms) and getattr(student, "num_prefix_tokens", 0) != self.prefix:
            raise ValueError(f"the teacher has {self.prefix} prefix tokens and the student "
                             f"{getattr(student, 'num_prefix_tokens', 0)}: tokens 'patch' needs them equal")
        # What the teacher's forward records, and what the student's own forward must have recorded.
        self._teacher_kinds, self._student_kinds = set(), set()
        for term, blocks in zip(self.terms, self.blocks):
            for l in blocks:
                for r in term.spec.reads:
                    self._teacher_kinds.add(("attn_in" if r == "maps" else r, l))
                    if term.forced:
                        self._teacher_kinds.add(("in" if r == "block" else "attn_in", l))
                    else:
                        self._student_kinds.add(("attn_in" if r == "maps" else r, l))
        model_reads = {r for t in self.terms if t.spec.scope == "model" for r in t.spec.reads}
        if "features" in model_reads:
            for name, model in (("teacher", teacher), ("student", student)):
                if not isinstance(getattr(model, "norm", None), nn.Module):
                    raise ValueError(f"the {name} has no final norm module `norm` to read its features at")
            self._teacher_kinds.add(("features", None))
            self._student_kinds.add(("features", None))
        self._teacher_logits = "logits" in model_reads
        self._end_to_end = bool(self._student_kinds or model_reads)
        self._recording = student_recording(student)

    @property
    def end_to_end(self) -> bool:
        """Whether the student runs its own forward on every batch (an end-to-end term)."""
        return self._end_to_end

    def __call__(self, x: torch.Tensor, student_logits: bool = False) -> Result:
        """The objective on images x; `student_logits=True` also returns the student's logits (from the
        end-to-end forward when there is one, else from a forward run for them)."""
        batch = _Batch(self, x, student_logits)
        values, per_block = {}, {}
        total = None
        for term, label, blocks in zip(self.terms, self.labels, self.blocks):
            loss = term.spec
            if loss.scope == "block":
                per_block[label] = {l: loss(batch.views(term, l), **term.options) for l in blocks}
                value = torch.stack(list(per_block[label].values())).mean()
            else:
                value = loss(batch.views(term, None), **term.options)
            values[label] = value
            total = term.weight * value if total is None else total + term.weight * value
        return Result(total, values, per_block, batch.student_logits)


def _unique(labels: list[str]) -> list[str]:
    out, count = [], {}
    for label in labels:
        count[label] = count.get(label, 0) + 1
        out.append(label if count[label] == 1 else f"{label}#{count[label]}")
    return out


def _forward(model: nn.Module, x: torch.Tensor, recording: _Recording, logits: bool):
    """Run model on x while `recording` records; its logits (model(x)) or None (forward_features)."""
    recording.collect()
    recording.on = True
    try:
        if logits:
            return model(x)
        model.forward_features(x)
        return None
    finally:
        recording.on = False


class _Batch:
    """One batch's recorded tensors, and the student tensors computed from them on first use."""

    def __init__(self, objective: Objective, x: torch.Tensor, want_logits: bool):
        self.o, self.cache = objective, {}
        teacher, student = objective.teacher, objective.student
        # The teacher: one forward, no gradients, hooks on what the terms read.
        same = objective.logit_teacher is teacher
        self.teacher_logits = None
        recording = _Recording(teacher, objective._teacher_kinds)
        try:
            with torch.no_grad():
                if objective._teacher_kinds or (objective._teacher_logits and same):
                    self.teacher_logits = _forward(teacher, x, recording, objective._teacher_logits and same)
                if objective._teacher_logits and not same:
                    self.teacher_logits = objective.logit_teacher(x)
            self.teacher = recording.collect()
        finally:
            recording.remove()
        # The student: its own forward, only when a term runs end to end or its logits are asked for.
        self.student, self.student_logits = {}, None
        if objective._end_to_end or want_logits:
            self.student_logits = _forward(student, x, objective._recording, True)
            self.student = objective._recording.collect()
            missing = objective._student_kinds - set(self.student)
            if missing:
                raise RuntimeError(f"the student's forward hooks did not record {sorted(missing)}: build the "
                                   f"first objective before compiling the student (torch.compile ignores hooks "
                                   f"added later)")

    # -- the student's teacher-forced tensors, each computed once per batch
    def _forced_attention(self, l: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        key = ("forced_attn", l)
        if key not in self.cache:
            rec = self.o._recording
            rec.collect()
            rec.on = True
            try:
                out = self.o.student.blocks[l].attn(self.teacher[("attn_in", l)])
            finally:
                rec.on = False
            self.cache[key] = (rec.collect().get(("pre", l)), out)
        return self.cache[key]

    def _raw(self, side: str, read: str, l: int | None, forced: bool) -> torch.Tensor:
        o = self.o
        if l is None:  # model scope
            if read == "logits":
                return self.teacher_logits if side == "teacher" else self.student_logits
            return (self.teacher if side == "teacher" else self.student)[("features", None)]
        if side == "teacher":
            if read == "maps":
                return self._cached(("t_maps", l), lambda: attention_maps(
                    o.teacher.blocks[l].attn, self.teacher[("attn_in", l)]).detach())
            return self.teacher[(read, l)]
        if not forced:
            if read == "maps":
                return self._cached(("s_maps_e2e", l), lambda: attention_maps(
                    o.student.blocks[l].attn, self.student[("attn_in", l)], grad=True))
            return self.student[(read, l)]
        if read == "maps":
            return self._cached(("s_maps", l), lambda: attention_maps(
                o.student.blocks[l].attn, self.teacher[("attn_in", l)], grad=True))
        if read == "block":
            return self._cached(("s_block", l), lambda: o.student.blocks[l](self.teacher[("in", l)]))
        pre, out = self._forced_attention(l)
        if read == "pre":
            if pre is None:
                raise RuntimeError(f"the student's attention of block {l} ran without its proj hook: build "
                                   f"the first objective before compiling the student")
            return pre
        return out

    def _cached(self, key, compute):
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def _get(self, side: str, read: str, l: int | None, term: Term) -> torch.Tensor:
        t = self._raw(side, read, l, term.forced)
        if term.tokens == "patch":
            key = ("patch", side, read, l, term.forced)
            return self._cached(key, lambda: _select_tokens(t, read == "maps", self.o.prefix))
        return t

    def views(self, term: Term, l: int | None) -> Views:
        return Views(**{f"{side}_{read}": (lambda side=side, read=read: self._get(side, read, l, term))
                        for read in term.spec.reads for side in ("teacher", "student")})
