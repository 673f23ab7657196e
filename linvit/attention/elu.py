"""elu+1 linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

phi(x) = elu(x) + 1, applied per head; no extra parameters.
"""

import torch.nn.functional as F

from .base import LinearAttention, register_attention


@register_attention("elu")
class EluAttention(LinearAttention):
    eps = 1e-6

    def features(self, q, k):
        return F.elu(q) + 1.0, F.elu(k) + 1.0
