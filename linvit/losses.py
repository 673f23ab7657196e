"""Distillation losses registered by name, and the objective that combines them.

Per-row tensor functions (`kl_rows`, `js_rows`, `map_correlation`) are shared with the evaluation.
"""

from __future__ import annotations

import torch


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
