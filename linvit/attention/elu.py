"""elu+1 linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

phi(x) = elu(x) + 1, applied per head (`base.elu_plus_one`); no extra parameters.
"""

from .base import LinearAttention, elu_plus_one, register_attention


@register_attention("elu")
class EluAttention(LinearAttention):
    eps = 1e-6

    def features(self, q, k):
        return elu_plus_one(q), elu_plus_one(k)
