"""Diagnostics of attention (trainer.diagnostics): the weights and per-head statistics of one
forward by the explicit path, in float32 from detached tensors, and q/k gradient norms.
Dimension letters: B batch, T time, H heads, D head width (d_head)."""

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from model.attention import MultiHeadAttention, build_mask
from model.config import SATURATION_THRESHOLD
from model.gpt import GPT, eval_mode


class Explained(NamedTuple):
    """explain's answer: the output and what the explicit path saw on the way."""

    y: Tensor  # (B, T, C), as forward returns it
    weights: Tensor  # (B, H, T, T) softmax weights, before dropout
    stats: dict[str, Tensor]  # per-head statistics, each (H,) (attention_stats)


def explain(attn: MultiHeadAttention, x: Tensor, *, causal: bool = True,
            valid_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None) -> Explained:
    """attn's forward by the explicit path, with the weights and statistics."""
    q, k, v = attn.split_heads(x)  # (B, H, T, D) each
    mask = build_mask(x, causal, valid_mask, attn_mask)
    gq = q if attn.length is None else attn.length(q, mask, causal)  # q * g(n) per row
    y, weights, logits = attn.explicit(gq, k, v, mask)
    stats = attention_stats(q, k, logits, weights,
                            None if mask is None else (mask.allowed, mask.row_ok), valid_mask)
    return Explained(attn.merge_heads(y), weights, stats)


@torch.no_grad()
def layer_stats(model: GPT, idx: Tensor, valid_mask: Optional[Tensor] = None
                ) -> list[dict[str, Tensor]]:
    """Per layer, attention_stats on that layer's own input, in eval mode, so that dropout
    neither changes them nor draws random numbers: a pre-hook explains each attention call."""
    stats = []

    def hook(attn, args, kwargs):
        stats.append(explain(attn, *args, **kwargs).stats)

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True)
               for block in model.blocks]
    try:
        with eval_mode(model):
            model.trunk(idx, valid_mask)
    finally:
        for handle in handles:
            handle.remove()
    return stats


def attention_stats(q: Tensor, k: Tensor, logits: Tensor, weights: Tensor,
                    allowed: Optional[tuple[Tensor, Tensor]],
                    valid_mask: Optional[Tensor]) -> dict[str, Tensor]:
    """Per-head statistics, each (H,) float32, of q, k (B, H, T, D) after qk_norm and the
    explicit path's logits and weights (B, H, T, T). `allowed`: the mask's (allowed (B|1, H|1,
    T, T), row_ok (B|1, H|1, T, 1)), None without a mask. Real rows: real tokens with an allowed
    key; entries: their allowed keys. Raw scores q.k come before the scale and soft-cap, so scales
    compare: unit-variance q, k give Var(q.k) = d_head, raw_var 1 (docs/scaling.md).
        entropy        mean over real rows of -sum_j w_j log w_j (nats)
        entropy_norm   mean over real rows with at least 2 keys of the entropy / ln(their
                       number of allowed keys): 1 = uniform, 0 = one-hot (Wortsman et al. 2023)
        saturated      fraction of real rows whose largest weight exceeds SATURATION_THRESHOLD
        max_logit      max |logit| over entries (after the scale and soft-cap)
        raw_var        Var(q.k) / d_head over entries (divisor n)
        raw_max_logit  max |q.k| over entries
        q_norm, k_norm mean L2 norm of q (real rows) and k (real tokens) over D
    """
    B, H, T, D = q.shape
    rows = torch.ones(B, H, T, 1, dtype=torch.bool, device=q.device)  # (B, H, T, 1)
    if allowed is not None:
        rows = rows & allowed[1]
    if valid_mask is not None:
        rows = rows & valid_mask[:, None, :, None]
    entries = rows.expand(B, H, T, T) if allowed is None else rows & allowed[0]  # (B, H, T, T)
    n_rows = rows.sum(dim=(0, 2, 3)).clamp(min=1)  # (H,)
    n_entries = entries.sum(dim=(0, 2, 3)).clamp(min=1)  # (H,)
    w = weights.detach().float()
    row_entropy = torch.special.entr(w).sum(dim=-1, keepdim=True)  # (B, H, T, 1); entr(0) = 0
    row_saturated = w.amax(dim=-1, keepdim=True) > SATURATION_THRESHOLD  # (B, H, T, 1)
    keys = entries.sum(dim=-1, keepdim=True)  # (B, H, T, 1) allowed keys per row
    wide = rows & (keys >= 2)  # rows that could spread their weight: ln(keys) > 0
    row_norm_entropy = row_entropy / keys.clamp(min=2).log()  # (B, H, T, 1)
    tokens = rows if valid_mask is None else valid_mask[:, None, :, None].expand_as(rows)
    q_len, k_len = (t.detach().float().norm(dim=-1, keepdim=True) for t in (q, k))  # (B,H,T,1)
    with torch.autocast(q.device.type, enabled=False):  # float32 whatever the caller runs in
        raw = q.detach().float() @ k.detach().float().transpose(-2, -1)  # (B, H, T, T)
    raw = raw.masked_fill(~entries, 0.0)
    raw_mean = raw.sum(dim=(0, 2, 3)) / n_entries  # (H,)
    raw_dev = (raw - raw_mean[:, None, None]).masked_fill(~entries, 0.0)  # (B, H, T, T)
    return {
        "entropy": (row_entropy * rows).sum(dim=(0, 2, 3)) / n_rows,
        "entropy_norm": (row_norm_entropy * wide).sum(dim=(0, 2, 3))
        / wide.sum(dim=(0, 2, 3)).clamp(min=1),
        "q_norm": (q_len * rows).sum(dim=(0, 2, 3)) / n_rows,
        "k_norm": (k_len * tokens).sum(dim=(0, 2, 3)) / tokens.sum(dim=(0, 2, 3)).clamp(min=1),
        "max_logit": logits.detach().float().abs().masked_fill(~entries, 0.0).amax(dim=(0, 2, 3)),
        "saturated": (row_saturated & rows).sum(dim=(0, 2, 3)) / n_rows,
        "raw_var": raw_dev.square().sum(dim=(0, 2, 3)) / n_entries / D,
        "raw_max_logit": raw.abs().amax(dim=(0, 2, 3)),
    }


def qk_grad_norms(attn: MultiHeadAttention) -> tuple[float, float]:
    """L2 norms of W_q's and W_k's gradients (weight and bias together; one host sync), or
    (0.0, 0.0) before any backward pass."""
    grads = [[p.grad for p in proj.parameters()] for proj in (attn.q_proj, attn.k_proj)]
    if any(g is None for gs in grads for g in gs):
        return 0.0, 0.0
    sq = [sum(g.float().square().sum() for g in gs) for gs in grads]
    return tuple(torch.stack(sq).sqrt().tolist())
