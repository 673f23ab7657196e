"""ReLU linear attention (EfficientViT, Cai et al. 2023).

phi(x) = relu(x), applied per head; no extra parameters. A query whose features are all zero
gets a zero output (its normalizer is zero); the tiny eps keeps that finite, as in EfficientViT.
"""

import torch.nn.functional as F

from .base import LinearAttention, register_attention


@register_attention("relu")
class ReluAttention(LinearAttention):
    eps = 1e-15

    def features(self, q, k):
        return F.relu(q), F.relu(k)
