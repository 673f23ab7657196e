"""The objective: sum_i weight_i * loss_i of a config's terms, computed from one teacher forward
(and one student forward when a term runs end to end) per batch through forward hooks; teacher-forced
terms run the student's attention (or block) on the teacher's recorded inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..attention import attention_maps
from .base import Views
from .terms import Term, parse_terms


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
