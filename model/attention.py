"""Multi-head attention written from scratch, with the score scale as an experimental switch.

    Attention(Q, K, V) = softmax(Q K^T * s + M) V

`s` is the score scale (one value per variant below, always computed from the per-head width
d_head, never d_model) and `M` is the additive mask: 0 where a key may be attended, -inf where
it may not. The explicit path below computes this equation line by line and keeps the weights
for plotting and statistics; the SDPA path hands the same q, k, v, scale and mask to
`F.scaled_dot_product_attention` for speed (under CPU bf16 autocast a plain causal mask up to
T = 512 goes to three bf16 matmul calls instead, faster there than torch's CPU SDPA kernels).
tests/test_attention.py holds the paths equal.

Scale variants (ScalingConfig.name), see SCIENCE.md section 3:
    sqrt_dk   s = 1/sqrt(d_head)                       Vaswani et al. 2017, sec. 3.2.1
    none      s = 1                                    the ablation
    dk        s = 1/d_head                             muP, Yang et al. 2022
    constant  s = 1/divisor whatever d_head            the seed's "fixed divisor of 8"
    learned   s = exp(log_scale[h]) per head, initialised at 1/sqrt(d_head) (cf. Swin v2)
    qk_norm   LayerNorm/RMSNorm q and k per head, then s = 1/sqrt(d_head)   Dehghani et al. 2023
Optional soft-cap (Gemma 2): logits <- c * tanh(logits / c), after the scale, before the mask.

The scale multiplies q before the product: in float16, (q @ k^T) * s overflows 65504 where
(q * s) @ k^T does not (q = k = 40, d_head = 64: inf versus 12800).

Masks. This module's padding mask is `valid_mask` (B, T) bool, True = a real token that may be
attended: the polarity of SDPA's boolean attn_mask and of Hugging Face's attention_mask.
nn.MultiheadAttention's key_padding_mask is the opposite (True = ignore): pass ~key_padding_mask.
A query row in which every key is masked (for example a left-pad position under a causal mask)
has no valid softmax; here such rows output zeros and zero weights, with finite gradients, in
both paths and every dtype. We guarantee this ourselves instead of relying on a backend: such
rows are opened to every key (so softmax is defined everywhere) and then zeroed.

Dimension letters: B batch, T time, C model width (d_model), H heads, D head width (d_head).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.errors import ConfigError

SCALINGS = ("sqrt_dk", "none", "dk", "constant", "learned", "qk_norm")
QK_NORMS = ("layernorm", "rmsnorm")
ATTN_IMPLS = ("auto", "explicit", "sdpa")
SATURATION_THRESHOLD = 0.99  # a row is "saturated" when its largest weight exceeds this
# Under CPU bf16 autocast a plain causal SDPA call up to this length runs as bf16 matmuls
# (MultiHeadAttention._cpu_bf16_causal): 1.5-2x faster than torch's CPU SDPA kernels at T = 64-512
# on an AMX CPU, slower from T = 1024, where its T x T logits also cost memory (docs/benchmarks.md).
CPU_BF16_MATMUL_MAX_T = 512


@dataclass(frozen=True)
class ScalingConfig:
    """Which score scale `s` the attention uses (SCIENCE.md section 3)."""

    name: str = "sqrt_dk"
    divisor: float = 8.0  # `constant`: logits = q.k / divisor whatever d_head
    norm: str = "layernorm"  # `qk_norm`: "layernorm" | "rmsnorm"
    softcap: Optional[float] = None  # Gemma-2 soft-cap c*tanh(logits/c), after scale, before mask

    def __post_init__(self):
        if self.name not in SCALINGS:
            raise ConfigError(
                f"scaling.name={self.name!r} is not a known score scale; "
                f"choose one of {', '.join(SCALINGS)} (e.g. scaling=sqrt_dk on the command line)."
            )
        if not (isinstance(self.divisor, (int, float)) and math.isfinite(self.divisor)
                and self.divisor > 0):
            raise ConfigError(
                f"scaling.divisor={self.divisor!r} must be a positive finite number "
                "(the fixed divisor of the `constant` scale; the seed's value is 8.0)."
            )
        if self.norm not in QK_NORMS:
            raise ConfigError(
                f"scaling.norm={self.norm!r} is not a known qk normalisation; "
                f"set scaling.norm to one of {', '.join(QK_NORMS)}."
            )
        if self.softcap is not None and not (
            isinstance(self.softcap, (int, float)) and math.isfinite(self.softcap)
            and self.softcap > 0
        ):
            raise ConfigError(
                f"scaling.softcap={self.softcap!r} must be null (no soft-cap) or a positive "
                "finite number (Gemma 2 uses 50.0)."
            )


class AttentionInfo(NamedTuple):
    """What forward returns besides y when asked: weights (B, H, T, T) or None, and stats."""

    weights: Optional[Tensor]
    stats: Optional[dict[str, Tensor]]


def build_mask(T: int, device: torch.device, causal: bool, valid_mask: Optional[Tensor],
               attn_mask: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """Combine the masks into one boolean mask, True = query may attend key.

    Returns (allowed, row_ok): allowed (B|1, H|1, T, T) or None when nothing is masked, and
    row_ok (B|1, H|1, T, 1), True where a query row has at least one allowed key.
    """
    allowed = attn_mask
    if causal:
        tril = torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)
        allowed = tril if allowed is None else allowed & tril
    if valid_mask is not None:
        keys = valid_mask[:, None, None, :]  # (B, 1, 1, T): padded keys are never attended
        allowed = keys if allowed is None else allowed & keys
    if allowed is None:
        return None, None
    allowed = allowed.expand(*allowed.shape[:-2], T, T)  # (B|1, H|1, T, T)
    return allowed, allowed.any(dim=-1, keepdim=True)  # row_ok (B|1, H|1, T, 1)


def attention_weights(logits: Tensor, allowed: Optional[Tensor] = None,
                      row_ok: Optional[Tensor] = None) -> Tensor:
    """softmax(logits + M) over the last axis with the fully-masked-row policy.

    Rows with no allowed key are opened to every key before the softmax (so it is defined and
    its gradient finite) and zeroed after it.
    """
    if allowed is None:
        return logits.softmax(dim=-1)
    open_allowed = allowed | ~row_ok  # (B|1, H|1, T, T)
    weights = logits.masked_fill(~open_allowed, float("-inf")).softmax(dim=-1)
    return weights.masked_fill(~row_ok, 0.0)


def attention_stats(logits: Tensor, weights: Tensor, allowed: Optional[Tensor],
                    real_rows: Optional[Tensor]) -> dict[str, Tensor]:
    """Per-head statistics, each of shape (H,), computed in float32.

    entropy: mean over real query rows of -sum_j w_j log w_j (nats).
    max_logit: max |logit| (after scale and soft-cap) over allowed entries.
    saturated: fraction of real query rows whose largest weight exceeds 0.99.
    real_rows (B|1, H|1, T) bool marks the query rows that count (None: all).
    Diagnostics only: computed on detached tensors, so they keep no autograd graph.
    """
    B, H, T, _ = weights.shape
    w = weights.detach().float()
    row_entropy = torch.special.entr(w).sum(dim=-1)  # (B, H, T); entr(0) = 0
    row_saturated = (w.amax(dim=-1) > SATURATION_THRESHOLD).float()  # (B, H, T)
    if real_rows is None:
        rows = torch.ones(B, H, T, device=w.device)
    else:
        rows = real_rows.expand(B, H, T).float()  # (B, H, T)
    n_rows = rows.sum(dim=(0, 2)).clamp(min=1.0)  # (H,)
    abs_logits = logits.detach().float().abs()  # (B, H, T, T)
    if allowed is not None:
        abs_logits = abs_logits.masked_fill(~allowed, 0.0)
    return {
        "entropy": (row_entropy * rows).sum(dim=(0, 2)) / n_rows,
        "max_logit": abs_logits.amax(dim=(0, 2, 3)),
        "saturated": (row_saturated * rows).sum(dim=(0, 2)) / n_rows,
    }


def check_attn_impl(attn_impl: str, scaling: ScalingConfig) -> None:
    """ConfigError unless attn_impl is known and can apply the scaling (SDPA has no soft-cap)."""
    if attn_impl not in ATTN_IMPLS:
        raise ConfigError(
            f"model.attn_impl={attn_impl!r} is not known; choose one of "
            f"{', '.join(ATTN_IMPLS)}."
        )
    if attn_impl == "sdpa" and scaling.softcap is not None:
        raise ConfigError(
            f"model.attn_impl='sdpa' cannot apply scaling.softcap={scaling.softcap}: SDPA "
            "has no soft-cap; set model.attn_impl=explicit (or auto) or scaling.softcap=null."
        )


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T * s + M) V over n_head heads of width d_head, then an output projection.

    attn_impl: "explicit" materialises logits and weights (readable, can return them and
    statistics); "sdpa" calls F.scaled_dot_product_attention (fast); "auto" uses sdpa unless
    weights or statistics are requested or a soft-cap is set (SDPA has no soft-cap). Asking
    for weights or statistics always runs the explicit path, whatever attn_impl is.
    `dropout` is attention dropout, applied to the weights in both paths while training.
    """

    def __init__(self, d_model: int, n_head: int, d_head: int, scaling: ScalingConfig,
                 dropout: float = 0.0, bias: bool = True, attn_impl: str = "auto"):
        super().__init__()
        check_attn_impl(attn_impl, scaling)
        for name, value in (("d_model", d_model), ("n_head", n_head), ("d_head", d_head)):
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"model.{name}={value!r} must be a positive integer.")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.dropout={dropout!r} must be in [0, 1).")
        self.d_model, self.n_head, self.d_head = d_model, n_head, d_head
        self.scaling, self.dropout, self.attn_impl = scaling, dropout, attn_impl
        # one fused projection for q, k and v: rows [0, HD) are q, [HD, 2HD) k, [2HD, 3HD) v
        self.qkv = nn.Linear(d_model, 3 * n_head * d_head, bias=bias)
        self.proj = nn.Linear(n_head * d_head, d_model, bias=bias)
        if scaling.name == "learned":
            # per-head temperature in log space, so it stays positive; starts at 1/sqrt(d_head)
            self.log_scale = nn.Parameter(torch.full((n_head,), -0.5 * math.log(d_head)))
        if scaling.name == "qk_norm":
            # normalise each head's q and k over D with a learnable gain (ViT-22B)
            norm = nn.LayerNorm if scaling.norm == "layernorm" else nn.RMSNorm
            kwargs = {"bias": False} if scaling.norm == "layernorm" else {}
            self.q_norm = norm(d_head, eps=1e-5, **kwargs)
            self.k_norm = norm(d_head, eps=1e-5, **kwargs)

    def scale(self) -> float | Tensor:
        """The score scale s: a float, or for `learned` a (H, 1, 1) tensor (one per head)."""
        name, D = self.scaling.name, self.d_head
        if name in ("sqrt_dk", "qk_norm"):
            return 1.0 / math.sqrt(D)
        if name == "none":
            return 1.0
        if name == "dk":
            return 1.0 / D
        if name == "constant":
            return 1.0 / self.scaling.divisor
        return self.log_scale.exp().view(self.n_head, 1, 1)  # learned: (H, 1, 1)

    def forward(self, x: Tensor, *, causal: bool = True, valid_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, return_weights: bool = False,
                return_stats: bool = False):
        """x (B, T, C) -> y (B, T, C), or (y, AttentionInfo) if weights or stats are requested.

        valid_mask: (B, T) bool, True = real token that may be attended (SDPA / Hugging Face
            polarity; nn.MultiheadAttention's key_padding_mask is its negation).
        attn_mask: (B|1, 1|H, T, T) bool, True = query may attend key (e.g. document masking).
        """
        B, T, C = x.shape
        H, D = self.n_head, self.d_head
        _check_mask("valid_mask", valid_mask, (B, T))
        _check_mask("attn_mask", attn_mask, None)
        # 1. project and split heads: (B, T, 3HD) -> 3 x (B, T, H, D) -> 3 x (B, H, T, D)
        if self.scaling.name == "qk_norm":
            # the same product as row blocks of the fused weight, so that q and k come out
            # contiguous: LayerNorm copies a strided view of the fused output, forward and
            # backward, which made the layer 10-16% slower at T = 64-512 (docs/benchmarks.md)
            biases = (None,) * 3 if self.qkv.bias is None else self.qkv.bias.split(H * D)
            q, k, v = (F.linear(x, w, b).view(B, T, H, D)
                       for w, b in zip(self.qkv.weight.split(H * D), biases))
            q, k = self.q_norm(q), self.k_norm(k)  # (B, T, H, D), normalised over D
        else:  # views of one (B, T, 3HD) output
            q, k, v = (t.view(B, T, H, D) for t in self.qkv(x).split(H * D, dim=2))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        # 2. one boolean mask, True = may attend (SDPA alone needs none for a plain causal mask)
        explicit = (return_weights or return_stats or self.attn_impl == "explicit"
                    or self.scaling.softcap is not None)
        only_causal = causal and valid_mask is None and attn_mask is None
        allowed, row_ok = None, None
        if explicit or not only_causal:
            allowed, row_ok = build_mask(T, x.device, causal, valid_mask, attn_mask)
        # 3. attention
        if explicit:
            y, weights, logits = self._explicit(q, k, v, allowed, row_ok)
        else:
            y = self._sdpa(q, k, v, only_causal, allowed, row_ok)
        # 4. merge heads (the mirror of the split) and project: (B, H, T, D) -> (B, T, C)
        y = self.proj(y.transpose(1, 2).reshape(B, T, H * D))
        if not (return_weights or return_stats):
            return y
        stats = None
        if return_stats:
            real_rows = None if row_ok is None else row_ok[..., 0]  # (B|1, H|1, T)
            if valid_mask is not None:
                real_rows = real_rows & valid_mask[:, None, :]  # (B, H|1, T)
            stats = attention_stats(logits, weights, allowed, real_rows)
        return y, AttentionInfo(weights if return_weights else None, stats)

    def _explicit(self, q, k, v, allowed, row_ok):
        """The equation, line by line. Returns y (B, H, T, D), weights and logits (B, H, T, T)."""
        logits = (q * self.scale()) @ k.transpose(-2, -1)  # (B,H,T,D) @ (B,H,D,T) -> (B,H,T,T)
        if self.scaling.softcap is not None:
            c = self.scaling.softcap
            logits = c * torch.tanh(logits / c)  # Gemma 2: after the scale, before the mask
        weights = attention_weights(logits, allowed, row_ok)  # (B, H, T, T)
        dropped = F.dropout(weights, p=self.dropout, training=self.training)
        return dropped @ v, weights, logits  # (B,H,T,T) @ (B,H,T,D) -> (B,H,T,D)

    def _sdpa(self, q, k, v, only_causal, allowed, row_ok):
        """F.scaled_dot_product_attention with the variant's scale. Returns y (B, H, T, D)."""
        s = self.scale()
        if isinstance(s, Tensor):
            # `learned`: SDPA's scale= is one Python float per call; a per-head tensor cannot go
            # there, and turning the parameter into a float would cut its gradient and sync
            # the host. So q carries the per-head factor and SDPA multiplies by 1.
            q, s = q * s, 1.0  # (B, H, T, D) * (H, 1, 1)
        p = self.dropout if self.training else 0.0
        if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            T = q.shape[2]
            if (only_causal and T <= CPU_BF16_MATMUL_MAX_T
                    and torch.get_autocast_dtype("cpu") == torch.bfloat16):
                return self._cpu_bf16_causal(q, k, v, s, p)
            # CPU autocast runs SDPA in bf16, whose backward is ~5x slower than float32's on
            # CPU (scripts/bench.py): compute it in float32, return it in the autocast dtype.
            with torch.autocast("cpu", enabled=False):
                y = self._sdpa_call(q.float(), k.float(), v.float(), s, p, only_causal,
                                    allowed, row_ok)
            return y.to(torch.get_autocast_dtype("cpu"))
        return self._sdpa_call(q, k, v, s, p, only_causal, allowed, row_ok)

    @staticmethod
    def _cpu_bf16_causal(q, k, v, s, p):
        """Causal attention from three bf16 calls (baddbmm, softmax, bmm) for CPU bf16 autocast
        up to T = CPU_BF16_MATMUL_MAX_T, where this beats both of torch's CPU SDPA kernels.

        The mask is an additive -inf bias that baddbmm adds as it writes the logits, and s
        scales q (T x D) rather than the logits (T x T). As in the explicit path under autocast,
        the logits are rounded to bf16 (SDPA's kernels keep them in float32); the softmax
        computes in float32 and rounds its output. Returns y (B, H, T, D) in bf16.
        """
        B, H, T, D = q.shape
        bf16 = torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            q = (q * s).to(bf16).reshape(B * H, T, D)  # a copy: q is a strided view of qkv
            k = k.to(bf16).reshape(B * H, T, D)
            v = v.to(bf16).reshape(B * H, T, D)
            future = torch.full((T, T), float("-inf"), dtype=bf16, device=q.device).triu(1)
            logits = torch.baddbmm(future, q, k.transpose(1, 2))  # (BH, T, T), -inf above diag
            weights = F.dropout(logits.softmax(dim=-1), p=p, training=p > 0)
            return torch.bmm(weights, v).view(B, H, T, D)  # (BH, T, T) @ (BH, T, D)

    @staticmethod
    def _sdpa_call(q, k, v, s, p, only_causal, allowed, row_ok):
        """One SDPA call: is_causal for a plain causal mask, else one boolean attn_mask."""
        if only_causal or allowed is None:
            # never attn_mask together with is_causal=True (SCIENCE.md section 4)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=only_causal,
                                                  scale=s)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_ok, dropout_p=p,
                                           scale=s)  # (B, H, T, D)
        return y.masked_fill(~row_ok, 0.0)  # fully masked rows output zeros

    def qk_grad_norms(self) -> tuple[float, float]:
        """L2 norms of the gradients of the q and k projections (weight and bias together).

        Returns (0.0, 0.0) before any backward pass. One host sync for both numbers.
        """
        grads = [p.grad for p in self.qkv.parameters()]  # weight (3HD, C), bias (3HD,)
        if any(g is None for g in grads):
            return 0.0, 0.0
        HD = self.n_head * self.d_head
        q_sq = sum(g[:HD].float().square().sum() for g in grads)
        k_sq = sum(g[HD:2 * HD].float().square().sum() for g in grads)
        q_norm, k_norm = torch.stack([q_sq, k_sq]).sqrt().tolist()
        return q_norm, k_norm


def _check_mask(name: str, mask: Optional[Tensor], shape: Optional[tuple[int, int]]) -> None:
    """Masks must be boolean (a 0/1 integer mask is too easily given with the wrong polarity)."""
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(
            f"{name} must be a bool tensor with True = may attend, got dtype {mask.dtype}; "
            "for a Hugging Face attention_mask use mask.bool(), for nn.MultiheadAttention's "
            "key_padding_mask use ~mask."
        )
    if shape is not None and tuple(mask.shape) != shape:
        raise ValueError(f"{name} must have shape (B, T) = {shape}, got {tuple(mask.shape)}.")
    if shape is None and mask.dim() != 4:
        raise ValueError(f"{name} must have shape (B|1, 1|H, T, T), got {tuple(mask.shape)}.")
