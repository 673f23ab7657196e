"""Model-scope losses (each docstring is its formula): the whole models' final features and logits,
each model on its own forward (never teacher-forced).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Views, _f, register_loss


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
