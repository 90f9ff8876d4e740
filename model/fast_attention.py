"""The SDPA path of MultiHeadAttention, with its hardware-specific speed routes.

model/attention.py is the file to read for the mathematics: this one computes the same
softmax(Q K^T * s + M) V by F.scaled_dot_product_attention (MultiHeadAttention.sdpa), choosing
per call the fastest of a few equivalent routes. MultiHeadAttention.forward reaches it through
one call, fast_attention.forward. Each route gives the numbers of the explicit path to the
precision of its dtype; tests/test_attention.py holds every route to that.

    split_heads     qk_norm: q, k, v as three products with row blocks of the fused weight,
                    so q and k come out contiguous; LayerNorm on the strided views of one
                    fused output copies them in forward and backward, which is slower.
    cpu_autocast    under CPU autocast, torch's CPU SDPA kernels are slow in bf16 (the backward
                    most of all): a plain causal mask up to CPU_BF16_MATMUL_MAX_T runs as three
                    bf16 calls (bf16_causal), everything else as SDPA in float32.

Measurements behind each route: docs/benchmarks.md (`python scripts/bench.py`).

Dimension letters: B batch, T time, C model width (d_model), H heads, D head width (d_head).
"""

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from model import attention

if TYPE_CHECKING:
    from model.attention import Mask, MultiHeadAttention

# The longest T for bf16_causal: beyond it, its (T, T) logits cost more time and memory than
# float32 SDPA (docs/benchmarks.md).
CPU_BF16_MATMUL_MAX_T = 512


def forward(mha: "MultiHeadAttention", x: Tensor, causal: bool, valid_mask: Optional[Tensor],
            attn_mask: Optional[Tensor]) -> Tensor:
    """MultiHeadAttention.forward through SDPA: x (B, T, C) -> y (B, T, C)."""
    T = x.shape[1]
    q, k, v = split_heads(mha, x)  # (B, H, T, D) each
    plain_causal = causal and valid_mask is None and attn_mask is None
    # SDPA needs no mask tensor for a plain causal mask (is_causal)
    mask = None if plain_causal else attention.build_mask(T, x.device, causal, valid_mask,
                                                          attn_mask)
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        y = cpu_autocast(mha, q, k, v, causal, mask)
    else:
        y = mha.sdpa(q, k, v, causal, mask)
    return mha.merge_heads(y)  # (B, H, T, D) -> (B, T, C)


def split_heads(mha: "MultiHeadAttention", x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """MultiHeadAttention.split_heads, with contiguous q and k for qk_norm's norms."""
    if mha.scaling.name != "qk_norm":
        return mha.split_heads(x)
    B, T, _ = x.shape
    H, D = mha.n_head, mha.d_head
    weights = mha.qkv.weight.split(H * D)  # 3 x (HD, C): the q, k and v rows of the fused weight
    biases = (None,) * 3 if mha.qkv.bias is None else mha.qkv.bias.split(H * D)
    q, k, v = (F.linear(x, w, b).view(B, T, H, D) for w, b in zip(weights, biases))
    q, k = mha.q_norm(q), mha.k_norm(k)  # (B, T, H, D), normalised over D
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)


def cpu_autocast(mha: "MultiHeadAttention", q: Tensor, k: Tensor, v: Tensor, causal: bool,
                 mask: Optional["Mask"]) -> Tensor:
    """SDPA under CPU autocast: y (B, H, T, D) in the autocast dtype."""
    dtype = torch.get_autocast_dtype("cpu")
    if (mask is None and causal and q.shape[2] <= CPU_BF16_MATMUL_MAX_T
            and dtype == torch.bfloat16):
        return bf16_causal(mha, q, k, v)
    with torch.autocast("cpu", enabled=False):
        y = mha.sdpa(q.float(), k.float(), v.float(), causal, mask)
    return y.to(dtype)


def bf16_causal(mha: "MultiHeadAttention", q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention from three bf16 calls (baddbmm, softmax, bmm): y (B, H, T, D) in bf16.

    The causal mask is the additive form of M, a -inf bias above the diagonal that baddbmm adds
    as it writes the logits, and s scales q (T x D) rather than the logits (T x T). As in the
    explicit path under autocast, the logits are rounded to bf16 (SDPA's kernels keep them in
    float32); the softmax computes in float32 and rounds its output.
    """
    B, H, T, D = q.shape
    bf16 = torch.bfloat16
    p = mha.dropout if mha.training else 0.0
    with torch.autocast("cpu", enabled=False):
        q = (q * mha.scale()).to(bf16).reshape(B * H, T, D)  # (B, H, T, D) -> (BH, T, D)
        k = k.to(bf16).reshape(B * H, T, D)
        v = v.to(bf16).reshape(B * H, T, D)
        future = torch.full((T, T), float("-inf"), dtype=bf16, device=q.device).triu(1)
        logits = torch.baddbmm(future, q, k.transpose(1, 2))  # (BH, T, T), -inf above diag
        weights = F.dropout(logits.softmax(dim=-1), p=p, training=p > 0)
        return torch.bmm(weights, v).view(B, H, T, D)  # (BH, T, T) @ (BH, T, D)
