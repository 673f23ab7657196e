"""Agent attention (Han, Ye, Han, Xia, Pan, Wan, Song and Huang, ECCV 2024, "Agent Attention: On
the Integration of Softmax and Linear Attention").

Formula as implemented, per head (scale = head_dim^-0.5), following the official DeiT version
(LeapLabTHU/Agent-Attention, agent_transformer/models/agent_deit.py):

    A        = AdaptiveAvgPool_{7x7}(Q on the patch grid)               (n_a = 49 agent tokens)
    S_agent  = softmax_j(scale * A K^T + B1)                              (n_a x N, over all keys)
    S_query  = softmax_a(scale * Q A^T + B2)                              (N x n_a, over the agents)
    out      = S_query (S_agent V) + DWC_3x3(V)

with the agent biases of the official DeiT code: for patch key (r, c) and agent a,
B1[a, (r, c)] = bilinear(an_bias)[a, r, c] + ah_bias[a, r] + aw_bias[a, c], for a prefix key
B1[a, cls] = ac_bias[a]; symmetrically B2[(r, c), a] = bilinear(na_bias)[a, r, c] + ha_bias[r, a]
+ wa_bias[c, a] and B2[cls, a] = ca_bias[a] (an_bias/na_bias are 7x7 per agent and head,
bilinearly resized to the patch grid as in the official code). Everything is O(N n_a): no N x N
matrix is formed; the implicit matrix is S_query S_agent (rows sum to one) and the convolution is
written as `mix`/`bias`. DWC is a depthwise 3x3 convolution on V over the patch grid, one filter
per channel of C = H*D (groups = dim, as in the official code).

Class/prefix tokens, as in the official DeiT code: agents are pooled from the patch queries only;
prefix tokens are keys of the agent softmax (bias ac_bias) and queries of the query softmax (bias
ca_bias); they get no convolution term. With several prefix tokens (timm register/distillation
tokens) they share ac_bias/ca_bias (the official code has exactly one class token).

Extra parameters (attn_extra group) and their init:
  an_bias, na_bias (H, n_a, 7, 7), ah_bias (1, H, n_a, gh, 1), aw_bias (1, H, n_a, 1, gw),
  ha_bias (1, H, gh, 1, n_a), wa_bias (1, H, 1, gw, n_a), ac_bias (1, H, n_a, 1),
  ca_bias (1, H, 1, n_a): zeros (official: truncated normal, std 0.02)
  dwc (Conv2d C->C, 3x3, groups=C): zero weight and bias (official: PyTorch default init)
So the operator starts as pure agent attention (two plain softmaxes through the agents).
Copies from a softmax checkpoint: `qkv` and `proj`. Defaults: agent_num = 49, kernel_size = 3
(the official DeiT-T and DeiT-S settings, 49 agents in every block; the official DeiT-B uses
agent_num = 81, a 9x9 pool, still with 7x7 an_bias/na_bias).

Deliberate differences from the official code: the zero inits above (so a transferred softmax
checkpoint starts from the pure agent core; the official std-0.02 biases are close to zero anyway);
the position biases are sized by the patch grid (gh, gw) instead of a square `window` (the same
shapes when gh = gw = window, so official tensors load); softmax runs in fp32 with its maximum
subtracted (torch.softmax), so activations 100x their usual scale stay finite.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import ImplicitAttention, LinearAttention, register_attention

_BIAS_GRID = 7  # an_bias/na_bias are 7x7 per agent in the official code, resized to the grid


@register_attention("agent")
class AgentAttention(LinearAttention):
    positional = True

    def __init__(self, dim, num_heads=8, *, agent_num: int = 49, kernel_size: int = 3, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'agent' needs grid_size (patch rows, cols)")
        pool = math.isqrt(agent_num)
        if pool * pool != agent_num:
            raise ValueError(f"agent_num {agent_num} must be a square (agents are pooled to a square grid)")
        self.agent_num = agent_num
        self.pool_size = pool
        gh, gw = self.grid_size
        h, a = num_heads, agent_num
        self.an_bias = nn.Parameter(torch.zeros(h, a, _BIAS_GRID, _BIAS_GRID))
        self.na_bias = nn.Parameter(torch.zeros(h, a, _BIAS_GRID, _BIAS_GRID))
        self.ah_bias = nn.Parameter(torch.zeros(1, h, a, gh, 1))
        self.aw_bias = nn.Parameter(torch.zeros(1, h, a, 1, gw))
        self.ha_bias = nn.Parameter(torch.zeros(1, h, gh, 1, a))
        self.wa_bias = nn.Parameter(torch.zeros(1, h, 1, gw, a))
        self.ac_bias = nn.Parameter(torch.zeros(1, h, a, 1))
        self.ca_bias = nn.Parameter(torch.zeros(1, h, 1, a))
        self.dwc = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        nn.init.zeros_(self.dwc.weight)
        nn.init.zeros_(self.dwc.bias)

    # -- agents and biases -----------------------------------------------------------------------
    def _agents(self, q):
        """(B, H, n_a, D): the patch queries average-pooled to a pool x pool grid, per channel, as
        one product with the pooling's own weights (read off F.adaptive_avg_pool2d with one-hot
        images) on q's layout: the pooling needed the queries copied to a channel layout first."""
        patches = self.patch_slice(q.shape[-2])
        return self._pooling(q.dtype, q.device) @ q[:, :, patches]

    def _pooling(self, dtype, device):
        """(n_a, patches): adaptive average pooling of the patch grid to pool x pool, as a matrix.
        The pooling is separable: each axis's weights are read off F.adaptive_avg_pool2d itself
        (one-hot inputs), and their outer product is the 2-D pooling's."""
        gh, gw = self.grid_size
        axes = []
        for size in (gh, gw):
            eye = torch.eye(size, dtype=dtype, device=device).reshape(size, 1, size, 1)
            axes.append(F.adaptive_avg_pool2d(eye, (self.pool_size, 1)).reshape(size, self.pool_size).T)
        rows, cols = axes  # (pool, gh), (pool, gw)
        return (rows[:, None, :, None] * cols[None, :, None, :]).reshape(self.agent_num, gh * gw)

    def _resized(self, bias, dtype):
        """F.interpolate(bias, size=grid, mode="bilinear") for the (H, n_a, 7, 7) biases, as two
        small products R_h bias R_w^T: bilinear resizing is separable, and the per-axis weights are
        read off F.interpolate itself (one-hot inputs), so the numbers are its own. Products (and
        their backward) cost a fraction of the resize's own kernels on the CPU."""
        gh, gw = self.grid_size
        eye = torch.eye(_BIAS_GRID, dtype=dtype, device=bias.device).reshape(_BIAS_GRID, 1, _BIAS_GRID, 1)
        rh = F.interpolate(eye, size=(gh, 1), mode="bilinear").reshape(_BIAS_GRID, gh).T
        rw = F.interpolate(eye, size=(gw, 1), mode="bilinear").reshape(_BIAS_GRID, gw).T
        return rh @ bias.to(dtype) @ rw.T

    def _biases(self, n, dtype):
        """B1 (1, H, n_a, N) for the agent softmax and B2 (1, H, N, n_a) for the query softmax."""
        h, a, p = self.num_heads, self.agent_num, self.num_prefix_tokens
        gh, gw = self.grid_size
        an = self._resized(self.an_bias, dtype)
        b1 = an.reshape(1, h, a, gh * gw) + (self.ah_bias + self.aw_bias).to(dtype).reshape(1, h, a, gh * gw)
        if p:  # the class/register tokens' biases first (no copy of the rest without them)
            b1 = torch.cat([self.ac_bias.to(dtype).expand(1, h, a, p), b1], dim=-1)
        na = self._resized(self.na_bias, dtype)
        b2 = na.reshape(1, h, a, gh * gw).transpose(-2, -1)
        b2 = b2 + (self.ha_bias + self.wa_bias).to(dtype).reshape(1, h, gh * gw, a)
        if p:
            b2 = torch.cat([self.ca_bias.to(dtype).expand(1, h, p, a), b2], dim=-2)
        return b1, b2

    def _softmaxes(self, q, k):
        self.patch_slice(q.shape[-2])  # checks the token count against the grid
        scale = self.head_dim ** -0.5
        agents = self._agents(q)
        b1, b2 = self._biases(q.shape[-2], q.dtype)
        agents = agents * scale  # the scale on the n_a agents, not on the N queries and keys
        agent_attn = torch.softmax(agents @ k.transpose(-2, -1) + b1, dim=-1)  # (B,H,n_a,N)
        query_attn = torch.softmax(q @ agents.transpose(-2, -1) + b2, dim=-1)  # (B,H,N,n_a)
        return query_attn, agent_attn

    # -- the core --------------------------------------------------------------------------------
    def attend(self, q, k, v):
        query_attn, agent_attn = self._softmaxes(q, k)
        # the convolution term, zero-padded over the prefix tokens (they get none)
        return query_attn @ (agent_attn @ v) + self.mix(v)

    def implicit(self, q, k, v):
        query_attn, agent_attn = self._softmaxes(q, k)
        mix, bias = self.mix_matrices(q.shape[-2])
        return ImplicitAttention(attn=query_attn @ agent_attn, v=v, mix=mix.to(v.dtype),
                                 bias=bias.to(v.dtype))

    # -- depthwise convolution on V over the patch grid (one filter per channel of C) ------------
    def _grid(self, t):
        """Patch tokens of (B, H, N, D) as (B, C, gh, gw) in channels-last layout (c = h*D + d)."""
        b, h, n, d = t.shape
        gh, gw = self.grid_size
        return t[:, :, self.patch_slice(n)].transpose(1, 2).reshape(b, gh, gw, h * d).permute(0, 3, 1, 2)

    def _conv(self, v):
        """The convolution's output on the patch tokens, (B, H, gh*gw, D)."""
        b, h, n, d = v.shape
        conv = F.conv2d(self._grid(v), self.dwc.weight.to(v.dtype), self.dwc.bias.to(v.dtype),
                        padding=self.dwc.padding, groups=h * d)
        return conv.permute(0, 2, 3, 1).reshape(b, -1, h, d).transpose(1, 2)

    def mix(self, v):
        if not self.num_prefix_tokens:
            return self._conv(v)
        return F.pad(self._conv(v), (0, 0, self.num_prefix_tokens, 0))  # prefix tokens: no conv

    def mix_matrices(self, n):
        gh, gw = self.grid_size
        h, d, p = self.num_heads, self.head_dim, gh * gw
        start = self.patch_slice(n).start
        w = self.dwc.weight
        dtype = torch.promote_types(w.dtype, torch.float32)
        basis = torch.eye(p, device=w.device, dtype=dtype).reshape(p, 1, gh, gw).expand(p, h * d, gh, gw)
        cols = F.conv2d(basis, w.to(dtype), None, padding=self.dwc.padding, groups=h * d)
        mix = torch.zeros(h, d, n, n, device=w.device, dtype=dtype)
        mix[:, :, start:, start:] = cols.reshape(p, h, d, p).permute(1, 2, 3, 0)  # (H, D, out, in)
        bias = torch.zeros(h, d, n, device=w.device, dtype=dtype)
        bias[:, :, start:] = self.dwc.bias.to(dtype).reshape(h, d, 1)
        return mix, bias
