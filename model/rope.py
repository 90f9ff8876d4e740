"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer), for `model.pos=rope`.

Each head's q and k (after the projections and any qk_norm) are cut into D/2 pairs (x_i,
x_{i+D/2}), the half-split layout of GPT-NeoX that litgpt and Hugging Face's Llama use, and
pair i at position t is turned by the angle t * theta_i, theta_i = rope_base^(-2i/D). A turn
keeps lengths, and a query turned by t_q meets a key turned by t_k as

    (R(t_q) q) . (R(t_k) k) = q . R(t_k - t_q) k,

so the scores carry the offset between query and key, never the absolute position. Meta's Llama
and torchtitan pair neighbouring components (x_{2i}, x_{2i+1}) as complex numbers instead: the
same turns with the components permuted. Position t is the index in the sequence; a left-padded
row shifts every position by one amount, which no offset sees.

Dimension letters: B batch, H heads, T time, D head width (d_head).
"""

import torch
import torch.nn as nn
from torch import Tensor


class Rotary(nn.Module):
    """q, k (B, H, T, D) -> the same, pair i at position t turned by t * base^(-2i/D)."""

    def __init__(self, d_head: int, base: float):
        super().__init__()
        self.d_head, self.base = d_head, base

    def angles(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos and sin of t * theta_i, each (T, D): the D/2 angles twice, one per half."""
        i2 = torch.arange(0, self.d_head, 2, device=device, dtype=torch.float32)  # (D/2,) 2i
        theta = self.base ** (-i2 / self.d_head)  # (D/2,)
        angle = torch.arange(T, device=device, dtype=torch.float32)[:, None] * theta  # (T, D/2)
        angle = torch.cat([angle, angle], dim=-1)  # (T, D)
        return angle.cos(), angle.sin()

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.angles(q.shape[-2], q.device)  # (T, D) each
        return rotate(q, cos, sin), rotate(k, cos, sin)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, D) with each pair (a, b) = (x_i, x_{i+D/2}) turned by its angle:
    (a cos - b sin, b cos + a sin), in x's dtype."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (B, H, T, D): (-b, a)
    return (x * cos + turned * sin).to(x.dtype)
