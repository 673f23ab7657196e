"""Distillation losses: each registered loss against a value computed by hand, terms, the objective."""

import math

import pytest
import torch

from linvit.losses import js_rows, kl_rows, map_correlation

P = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
Q = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)


def test_kl_rows_by_hand():
    expected = [0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75),
                1.0 * math.log(1.0 / 0.5)]  # 0 log 0 = 0
    assert kl_rows(P, Q).tolist() == pytest.approx(expected)


def test_js_rows_by_hand():
    # row 0: m = (0.375, 0.625); row 1: m = (0.75, 0.25)
    row0 = 0.5 * (0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625)) \
        + 0.5 * (0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625))
    row1 = 0.5 * (1.0 * math.log(1.0 / 0.75)) + 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert js_rows(P, Q).tolist() == pytest.approx([row0, row1])
    assert js_rows(Q, P).tolist() == pytest.approx([row0, row1])  # symmetric


def test_map_correlation_by_hand():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    q = torch.tensor([[0.2, 0.8], [0.9, 0.1]])
    a = [0.5, 0.5, 1.0, 0.0]
    b = [0.2, 0.8, 0.9, 0.1]
    ma, mb = sum(a) / 4, sum(b) / 4
    cov = sum((u - ma) * (v - mb) for u, v in zip(a, b))
    expected = cov / math.sqrt(sum((u - ma) ** 2 for u in a) * sum((v - mb) ** 2 for v in b))
    assert map_correlation(p, q).item() == pytest.approx(expected, rel=1e-6)
    batch = torch.stack([torch.stack([p, q]), torch.stack([q, p])])  # (2 images, 2 heads, 2, 2)
    r = map_correlation(batch, batch.flip(1))
    assert r.shape == (2, 2) and r[0, 0].item() == pytest.approx(expected, rel=1e-6)
    assert map_correlation(p, p).item() == pytest.approx(1.0)
    assert map_correlation(p, torch.full((2, 2), 0.5)).item() == 0.0  # a constant map: 0, not nan
