"""Attention-map losses (block scope; each docstring is its formula) and the per-row functions
`kl_rows`, `js_rows` and `map_correlation`, shared with the evaluation.
"""

from __future__ import annotations

import torch

from .base import Views, _f, register_loss

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


# -- the losses (each docstring is its formula) ---------------------------------------------------


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
