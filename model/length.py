"""The logits' factor g(n) for a row that may attend n keys (`scaling.length`; docs/scaling.md,
"Length: positions and scales that grow with the number of keys").

With a margin D between the right key and n - 1 others, softmax gives the right key
e^D / (e^D + n - 1), about 1/n: attention thins out as the keys grow. A factor growing like
ln n lets the margin grow with them. Per query row n counts the keys the row may attend under
all its masks (causal, padding, documents: i + 1 for query i under the causal mask alone), and
q is multiplied by g(n) as it is by the width scale s, so the explicit and SDPA paths and the
attention statistics all see the factored logits g(n) * s * q.k:

    fixed       g = 1 (this module is not built)
    log_n       g = ln n / ln T0: 1 at the training length    Su's entropy-invariant scaling;
                                                             Chiang & Cholak 2022 up to a constant
    log_n_eval  g = max(1, ln n / ln T0) in eval mode only,   Qwen-7B's logn attention
                1 in training
    ssmax       g = s_h ln n, s_h learned per head,           Scalable-Softmax (Nakanishi 2025)
                starting at 1 / ln T0 (so g(T0) = 1)

T0 = scaling.length_base (model.block_size unless set). A row with no allowed key counts
n = 1, so g stays finite; the mask's policy zeroes its output as before.
Dimension letters: B batch, H heads, T time, D head width (d_head).
"""

import math
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor


class LengthFactor(nn.Module):
    """q (B, H, T, D) -> q * g(n), n per row from the mask (module docstring)."""

    def __init__(self, length: str, base: int, n_head: int):
        super().__init__()
        self.length, self.base = length, base
        if length == "ssmax":  # one s_h per head, s_h ln(T0) = 1 at the start
            self.ssmax_scale = nn.Parameter(torch.full((n_head,), 1.0 / math.log(base)))

    def forward(self, q: Tensor, mask: Optional[tuple], causal: bool) -> Tensor:
        """`mask`: model.attention's Mask (its `allowed` counts the keys), or None."""
        if self.length == "log_n_eval" and self.training:
            return q
        allowed = None if mask is None else mask.allowed  # (B|1, H|1, T, T)
        return (q * self.factor(keys_per_row(q, allowed, causal))).to(q.dtype)

    def factor(self, n: Tensor) -> Tensor:
        """g(n) for n (..., T, 1) keys: log_n and log_n_eval are exactly 1 at n = T0."""
        if self.length == "ssmax":
            return self.ssmax_scale.view(-1, 1, 1) * n.log()  # (H, 1, 1) * (.., T, 1)
        g = 1 + (n / self.base).log() / math.log(self.base)  # ln n / ln T0, 1 + 0 at n = T0
        return g.clamp(min=1.0) if self.length == "log_n_eval" else g


def keys_per_row(q: Tensor, allowed: Optional[Tensor], causal: bool) -> Tensor:
    """n, the keys each query row may attend, at least 1, float32: (B|1, H|1, T, 1) from the
    mask's `allowed` (B|1, H|1, T, T), or (T, 1) without one (i + 1 if causal, else T)."""
    T = q.shape[-2]
    if allowed is not None:
        n = allowed.sum(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    elif causal:
        n = torch.arange(1, T + 1, device=q.device)[:, None]  # (T, 1)
    else:
        n = torch.full((T, 1), T, device=q.device)  # (T, 1)
    return n.clamp(min=1).float()
