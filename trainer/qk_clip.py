"""QK-Clip (Kimi Team 2025, "Kimi K2", arXiv 2507.20534, sec. 2.1): optim.qk_clip sets its threshold
tau (K2 uses 100).

After each optimizer step, every head whose largest pre-softmax logit s q.k in that step's
forward exceeded tau has its query and key projection rows (weight and bias) multiplied by
sqrt(tau / max). q and k each shrink by that factor, so the head's logits on the same input
shrink by tau / max: its largest becomes tau. Heads under tau are untouched. Unlike a
soft-cap, which bounds the scores the softmax sees and leaves W_q and W_k free to keep growing,
the clip bounds the weights themselves (docs/scaling.md, "Bounding the scores").

The max comes from the step itself, with no change to the attention module: forward hooks on
each attention's W_q and W_k take q and k from their outputs and keep a running max per head of
s q.k over the allowed entries (the masks come from a pre-hook on the attention's call), in
`max_logit`, over the step's micro-batches, in training mode only (an evaluation's forward does
not count). The cost is one more q k^T product without gradient per layer. With
several processes the maxima are all-reduced (max) first, so every replica clips alike.
`qk_clip_count` (a buffer, so it is checkpointed and resumed) counts each head's clips.
"""

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor

from model.attention import MultiHeadAttention, build_mask
from model.errors import ConfigError

UNBOUNDED = ("qk_norm", "uniform")   # scales whose logits the clip cannot bound or has none


def setup(model: torch.nn.Module, tau: float) -> Callable[[], None]:
    """Arm every attention module of `model` (a GPT) for QK-Clip at threshold tau; the clip,
    for the step to call after AdamW."""
    scaling, norm = model.config.scaling.name, model.config.scaling.qk_norm
    if scaling in UNBOUNDED or norm != "none":
        raise ConfigError(
            f"optim.qk_clip={tau} cannot work with scaling={scaling}"
            + (f" scaling.qk_norm={norm}" if norm != "none" else "") + ": "
            + ("uniform attention has no logits to clip" if scaling == "uniform" else
               "a norm on q and k per head undoes any scaling of their projection rows, so the "
               "clip cannot change the logits")
            + "; drop optim.qk_clip (optim.qk_clip=null) or pick another scale (and "
            "scaling.qk_norm=none).")
    pos, length = model.config.pos, model.config.scaling.length
    if pos == "rope" or length != "fixed":
        raise ConfigError(
            f"optim.qk_clip={tau} cannot work with "
            + ("model.pos=rope" if pos == "rope" else f"scaling.length={length}")
            + ": the clip reads the logits from W_q's and W_k's outputs, before "
            + ("RoPE turns q and k" if pos == "rope" else "the length factor multiplies q")
            + ", so the largest logit it clips at is not the one softmax sees; drop "
            "optim.qk_clip (optim.qk_clip=null), or use model.pos=learned or nope with "
            "scaling.length=fixed.")
    for block in model.blocks:
        attn = block.attn
        device = attn.q_proj.weight.device
        attn.register_buffer("qk_clip_count", torch.zeros(attn.n_head, dtype=torch.long,
                                                          device=device))
        attn.max_logit = torch.full((attn.n_head,), -math.inf, device=device)
        attn.register_forward_pre_hook(remember_masks, with_kwargs=True)
        attn.q_proj.register_forward_hook(partial(remember_q, attn))
        attn.k_proj.register_forward_hook(partial(track_max, attn))
    return partial(clip, model, tau)


def remember_masks(attn: MultiHeadAttention, args: tuple, kwargs: dict) -> None:
    """Pre-hook of an attention call: its input and masks, which track_max needs."""
    attn.clip_call = (args[0], kwargs.get("causal", True), kwargs.get("valid_mask"),
                      kwargs.get("attn_mask"))


def remember_q(attn: MultiHeadAttention, q_proj, inputs, q: Tensor) -> None:
    """Hook on attn.q_proj (called before k_proj): its output q (B, T, HD), for track_max."""
    attn.clip_q = q.detach()


@torch.no_grad()
def track_max(attn: MultiHeadAttention, k_proj, inputs, k: Tensor) -> None:
    """Hook on attn.k_proj: fold this forward's per-head max of s q.k (allowed entries, before
    any soft-cap) into attn.max_logit. k (B, T, HD) is W_k's output, q W_q's (remember_q)."""
    if not attn.training:
        return
    x, causal, valid_mask, attn_mask = attn.clip_call
    B, T, _ = k.shape
    H, D = attn.n_head, attn.d_head
    q, k = (t.float().view(B, T, H, D).transpose(1, 2) for t in (attn.clip_q, k))
    raw = q @ k.transpose(-2, -1)  # (B, H, T, T): q.k, the scale applied to the max below
    mask = build_mask(x, causal, valid_mask, attn_mask)
    if mask is not None:
        raw = raw.masked_fill(~mask.allowed, -math.inf)
    s = attn.scale()  # > 0 (uniform's 0 is refused): max of s q.k = s max q.k, per head
    largest = raw.amax(dim=(0, 2, 3)) * (s.view(H) if isinstance(s, Tensor) else s)  # (H,)
    attn.max_logit = torch.maximum(attn.max_logit, largest)


@torch.no_grad()
def clip(model: torch.nn.Module, tau: float) -> None:
    """Scale W_q and W_k rows (and bias) of each head whose step max exceeded tau by
    sqrt(tau / max), count it, and reset the running max for the next step."""
    for block in model.blocks:
        attn = block.attn
        step_max = attn.max_logit  # (H,)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(step_max, op=dist.ReduceOp.MAX)
        over = step_max > tau  # (H,)
        factor = torch.where(over, (tau / step_max).sqrt(), torch.ones_like(step_max))  # (H,)
        H, D = attn.n_head, attn.d_head
        for p in [*attn.q_proj.parameters(), *attn.k_proj.parameters()]:  # (HD, C), bias (HD,)
            p.view(H, D, -1).mul_(factor.view(H, 1, 1).to(p.dtype))  # each head's rows
        attn.qk_clip_count += over.long()
        attn.max_logit = torch.full_like(step_max, -math.inf)

