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

The package, by kind (a new loss is one `@register_loss` function in the module of its kind):
  base.py       the registry: `Loss`, `LOSSES`, `register_loss`, `distill_loss`, `Views`
  maps.py       attention-map losses (map_ce, map_rkl, map_js, map_fro) and the per-row functions
  hidden.py     hidden-state losses of a block (out_mse, proj_mse, block_l2, hidden_mse)
  model.py      model-scope losses: final features and logits (feat_cos, logit_kd, logit_kd_hard)
  terms.py      a config's terms: `Term`, `parse_terms`
  objective.py  the `Objective`: the recording hooks, one teacher (and student) forward per batch
"""

from . import hidden, maps, model  # noqa: F401  (importing a kind's module registers its losses)
from .base import (BLOCK_TENSORS, FORCING, LOSSES, MODEL_TENSORS, SCOPES, TERM_OPTIONS, Loss, Views,
                   distill_loss, loss_name, register_loss)
from .maps import js_rows, kl_rows, map_correlation
from .objective import Objective, Result, remove_recording, student_recording
from .terms import BLOCK_SELECTIONS, TERM_KEYS, TOKENS, Term, TermError, parse_terms

__all__ = ["BLOCK_SELECTIONS", "BLOCK_TENSORS", "FORCING", "LOSSES", "MODEL_TENSORS", "SCOPES", "TERM_KEYS",
           "TERM_OPTIONS", "TOKENS", "Loss", "Objective", "Result", "Term", "TermError", "Views", "distill_loss",
           "js_rows", "kl_rows", "loss_name", "map_correlation", "parse_terms", "register_loss",
           "remove_recording", "student_recording"]
