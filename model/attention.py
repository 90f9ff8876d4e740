"""Multi-head attention written from scratch, with the score scale as an experimental switch.

    Attention(Q, K, V) = softmax(Q K^T * s + M) V

`s` is the score scale (MultiHeadAttention.scale), a function of the per-head width d_head, not
d_model (`sqrt_dmodel` is that bug): SCALES[scaling.name](d_head, scaling, d_model) (model/config.py
holds every formula, docs/scaling.md explains them); `learned` learns one per head. `M` is the
additive mask: 0 where a key may be attended, -inf where not (build_mask). `explicit` computes
the equation line by line and keeps the weights; `sdpa` hands the same q, k, v, s and M to
F.scaled_dot_product_attention; forward picks one with a single `if`, and tests hold the two
equal. Optional soft-cap (Gemma 2): logits <- c * tanh(logits / c), after the scale.
scaling.qk_norm normalises each head's q and k before any scale (and before RoPE); model.attn_gate
multiplies each head's output by sigmoid(x W_g) before the output projection (Qiu et al. 2025).
scaling.normaliser swaps softmax for NORMALISERS[name] (model/config.py; docs/scaling.md, section
12): softmax1 and sink add a logit b per head (0; learned) to the denominator, never scaled (SDPA
gets it as a zero key whose mask column is b); sigmoid weighs each key alone (explicit only).
s multiplies q before the product: in float16 (q @ k^T) * s overflows 65504 where (q * s) @ k^T
does not (q = k = 40, d_head = 64: inf versus 12800).

Masks are bool, True = may attend (SDPA's polarity; nn.MultiheadAttention's key_padding_mask is
the negation).

Dimension letters: B batch, T time, C model width (d_model), H heads, D head width (d_head).
"""

import math
from functools import partial
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.config import NORMALISERS, SCALES, SDPA_NORMALISERS, GPTConfig


class Mask(NamedTuple):
    """M as booleans, with the fully-masked-row policy: a query row with no allowed key has no
    valid softmax (0/0), so `attend` opens it to every key (softmax and gradient stay finite)
    and zero_empty_rows then zeroes its weights and output; no backend decides this for us."""

    allowed: Tensor  # (B|1, H|1, T, T) True = query may attend key
    attend: Tensor  # (B|1, H|1, T, T) allowed, with rows that allow nothing opened to every key
    row_ok: Tensor  # (B|1, H|1, T, 1) True = the query row has at least one allowed key

    def zero_empty_rows(self, t: Tensor) -> Tensor:
        return t.masked_fill(~self.row_ok, 0.0)


def build_mask(x: Tensor, causal: bool, valid_mask: Optional[Tensor],
               attn_mask: Optional[Tensor]) -> Optional[Mask]:
    """The causal, padding and custom masks of x (B, T, C) as one Mask; None if none is set."""
    T = x.shape[1]
    _check_masks(x, valid_mask, attn_mask)
    allowed = attn_mask  # (B|1, 1|H, T, T) or None
    if causal:
        tril = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T): key <= query
        allowed = tril if allowed is None else allowed & tril
    if valid_mask is not None:
        keys = valid_mask[:, None, None, :]  # (B, 1, 1, T): padded keys are never attended
        allowed = keys if allowed is None else allowed & keys
    if allowed is None:
        return None
    allowed = allowed.expand(*allowed.shape[:-2], T, T)  # (B|1, H|1, T, T)
    row_ok = allowed.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    return Mask(allowed, allowed | ~row_ok, row_ok)


def _check_masks(x: Tensor, valid_mask: Optional[Tensor], attn_mask: Optional[Tensor]) -> None:
    """Bool masks (0/1 integers are too easily given with the wrong polarity) of their shapes."""
    for name, mask, shape in (("valid_mask", valid_mask, "(B, T)"),
                              ("attn_mask", attn_mask, "(B|1, 1|H, T, T)")):
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"{name} must be a bool tensor with True = may attend, got dtype "
                             f"{mask.dtype}; for a Hugging Face attention_mask use mask.bool(), "
                             "for nn.MultiheadAttention's key_padding_mask use ~mask.")
        if mask is not None and not (mask.dim() == 4 if name == "attn_mask"
                                     else mask.shape == x.shape[:2]):
            raise ValueError(f"{name} must have shape {shape}, got {tuple(mask.shape)}.")


def attention_weights(logits: Tensor, mask: Optional[Mask] = None, normaliser: str = "softmax",
                      b: Optional[Tensor] = None) -> Tensor:
    """NORMALISERS[normaliser](logits + M, b) over the last axis (softmax by default; b (H, 1, 1)
    the extra logit of softmax1 and sink), with Mask's policy for rows that allow nothing."""
    weigh = NORMALISERS[normaliser]
    if mask is None:
        return weigh(logits, b)
    weights = weigh(logits.masked_fill(~mask.attend, float("-inf")), b)  # (B, H, T, T)
    return mask.zero_empty_rows(weights)


def with_sink_key(k: Tensor, v: Tensor, allowed: Optional[Tensor], causal: bool,
                  b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """SDPA's k, v (B, H, 1 + T, D) and float mask (B|1, H, T, 1 + T) for one more logit b (H, 1,
    1) in the denominator: a zero key and value first, of logit q.0 * s + b = b (SDPA adds the
    mask after its scale), then M as 0 where a key may be attended, -inf where not."""
    B, H, T, D = k.shape
    if allowed is None:  # every key, or key <= query
        allowed = torch.ones(1, 1, T, T, dtype=torch.bool, device=k.device)
        allowed = allowed.tril() if causal else allowed
    keys = torch.zeros_like(allowed, dtype=k.dtype).masked_fill(~allowed, float("-inf"))
    keys = keys.expand(-1, H, T, T)  # (B|1, H, T, T)
    mask = torch.cat([b.to(k.dtype).expand(keys.shape[0], H, T, 1), keys], dim=-1)  # b, then M
    zero = k.new_zeros(B, H, 1, D)
    return torch.cat([zero, k], dim=-2), torch.cat([zero, v], dim=-2), mask


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T * s + M) V over config.n_head heads of width config.d_head, then an output
    projection back to config.d_model. config.attn_impl: "explicit" (readable), "sdpa" (fast),
    "auto" = sdpa unless a soft-cap or sigmoid is set (SDPA has neither). config.dropout drops
    attention weights in every path while training; config.scaling: s and the normaliser."""

    def __init__(self, config: GPTConfig):
        super().__init__()   # config validated itself when built (model/config.py)
        d_model, n_head, d_head = config.d_model, config.n_head, config.d_head
        scaling, bias = config.scaling, config.bias
        self.n_head, self.d_head, self.d_model, self.scaling = n_head, d_head, d_model, scaling
        self.dropout, self.attn_impl = config.dropout, config.attn_impl
        # W_q, W_k, W_v: separate matrices, so an optimizer group can hold W_q and W_k apart
        # (optim.qk_lr_mult; under Adam a constant s is their init and LR: docs/scaling.md)
        self.q_proj = nn.Linear(d_model, n_head * d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_head * d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_head * d_head, bias=bias)
        self.proj = nn.Linear(n_head * d_head, d_model, bias=bias)
        if scaling.name == "learned":  # per-head, in log space to stay positive
            start = math.log(SCALES["learned"](d_head, scaling))
            self.log_scale = nn.Parameter(torch.full((n_head,), start))
        self.q_norm = self.k_norm = self.gate = self.rope = self.length = None  # built if named
        norm = scaling.norm if scaling.name == "qk_norm" else scaling.qk_norm  # qk_norm: sqrt_dk
        if norm != "none":  # each head's q and k over D with a gain (qk_norm_gain), before RoPE
            norm = partial(nn.LayerNorm, bias=False) if norm == "layernorm" else nn.RMSNorm
            norm = partial(norm, d_head, eps=1e-5, elementwise_affine=scaling.qk_norm_gain)
            self.q_norm, self.k_norm = norm(), norm()
        if config.attn_gate != "none":  # W_g: a logit per head, or per head and coordinate
            width = n_head * (d_head if config.attn_gate == "elementwise" else 1)
            self.gate = nn.Linear(d_model, width, bias=bias)
        if scaling.normaliser == "sink":  # b, one logit per head: 0 at the start (softmax1)
            self.sink = nn.Parameter(torch.zeros(n_head))
        if config.pos == "rope":
            from model.rope import Rotary
            self.rope = Rotary(d_head, config.rope_base)
        if scaling.length != "fixed":
            from model.length import LengthFactor
            self.length = LengthFactor(scaling.length, scaling.length_base, n_head)

    def scale(self) -> float | Tensor:
        """The score scale s: a float, or for `learned` a (H, 1, 1) tensor (one per head)."""
        if self.scaling.name == "learned":
            return self.log_scale.exp().view(self.n_head, 1, 1)  # (H, 1, 1)
        # uniform: every logit is 0, so softmax over the allowed keys is 1/(number allowed): the
        # masks and the fully-masked-row policy apply unchanged, and q, k get zero gradient
        return SCALES[self.scaling.name](self.d_head, self.scaling, self.d_model)

    def sink_logit(self, like: Tensor) -> Tensor:
        """b (H, 1, 1), the extra logit of softmax1 (0) and sink (learned); never scaled."""
        b = self.sink if self.scaling.normaliser == "sink" else like.new_zeros(self.n_head)
        return b.view(self.n_head, 1, 1)  # (H, 1, 1)

    def forward(self, x: Tensor, *, causal: bool = True, valid_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None) -> Tensor:
        """x (B, T, C) -> y (B, T, C). valid_mask (B, T): True = real token; attn_mask
        (B|1, 1|H, T, T): True = query may attend key (e.g. document masking)."""
        q, k, v = self.split_heads(x)  # 1. (B, H, T, D) each
        fused = (self.attn_impl != "explicit" and self.scaling.softcap is None
                 and self.scaling.normaliser in SDPA_NORMALISERS)
        # 2. M; SDPA needs no tensor for a plain causal mask (its is_causal)
        plain_causal = fused and causal and valid_mask is None and attn_mask is None
        mask = None if plain_causal else build_mask(x, causal, valid_mask, attn_mask)
        q = q if self.length is None else self.length(q, mask, causal)  # q * g(n) per row
        if fused:
            y = self.sdpa(q, k, v, causal, mask)  # 3. by one fused kernel
        else:
            y = self.explicit(q, k, v, mask)[0]  # 3. softmax(Q K^T * s + M) V, step by step
        return self.merge_heads(y, x)  # 4. (B, H, T, D) -> (B, T, C)

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, C) -> q, k, v, each (B, H, T, D): Q = x W_q, K = x W_k, V = x W_v, split
        into heads, then (scaling.qk_norm) the norms, then (model.pos=rope) q and k turned."""
        B, T, _ = x.shape
        H, D = self.n_head, self.d_head
        q, k, v = (proj(x).view(B, T, H, D)  # (B, T, C) @ (C, HD) -> (B, T, H, D)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # normalised over D
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        return (q, k, v) if self.rope is None else (*self.rope(q, k), v)  # RoPE turns q and k

    def merge_heads(self, y: Tensor, x: Tensor) -> Tensor:
        """y (B, H, T, D) -> (B, T, C): (model.attn_gate) each head's output times sigmoid(x W_g)
        of the layer's input x (Qiu et al. 2025), the mirror of split_heads, the projection."""
        B, H, T, D = y.shape
        if self.gate is not None:  # (B, T, C) @ (C, H|HD) -> (B, H, T, 1|D)
            y = y * self.gate(x).view(B, T, H, -1).transpose(1, 2).sigmoid()
        return self.proj(y.transpose(1, 2).reshape(B, T, H * D))  # (B, T, HD) -> (B, T, C)

    def explicit(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Mask]):
        """The equation line by line: y (B, H, T, D), weights (before dropout) and logits."""
        logits = (q * self.scale()) @ k.transpose(-2, -1)  # (B,H,T,D) @ (B,H,D,T) -> (B,H,T,T)
        if self.scaling.softcap is not None:
            c = self.scaling.softcap
            logits = c * torch.tanh(logits / c)  # after the scale, before the mask
        weights = attention_weights(logits, mask, self.scaling.normaliser,
                                    self.sink_logit(logits))  # (B, H, T, T), over the T keys
        dropped = F.dropout(weights, p=self.dropout, training=self.training)
        return dropped @ v, weights, logits  # (B,H,T,T) @ (B,H,T,D) -> (B,H,T,D)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, mask: Optional[Mask]) -> Tensor:
        """The same equation by F.scaled_dot_product_attention: y (B, H, T, D). mask=None with
        causal=True is SDPA's own causal mask (is_causal); SDPA refuses is_causal together with
        attn_mask, so a Mask always carries the causal part itself. softmax1 and sink: a zero key
        with logit b first (with_sink_key)."""
        s = self.scale()
        if isinstance(s, Tensor) or s == 0.0:
            # `learned`: SDPA's scale= is one Python float; a per-head tensor cannot go there,
            # and turning it into a float would cut its gradient. `uniform`: PyTorch's CPU
            # kernel applies scale=0 to its causal -inf too (0 * -inf = nan). So q carries it.
            q, s = q * s, 1.0  # (B, H, T, D) * (H, 1, 1) or * 0
        attn_mask = None if mask is None else mask.attend  # (B|1, H|1, T, T) or None
        if self.scaling.normaliser != "softmax":  # (B, H, 1 + T, D) and (B|1, H, T, 1 + T)
            k, v, attn_mask = with_sink_key(k, v, attn_mask, causal, self.sink_logit(q))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal and attn_mask is None, scale=s)  # (B, H, T, D)
        return y if mask is None else mask.zero_empty_rows(y)
