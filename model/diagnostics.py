"""Diagnostics of attention (trainer.diagnostics): the weights and per-head statistics of one
forward by the explicit path, where the attention mass goes (the first token, the sink), the
size of the residual stream, in float32 from detached tensors, and q/k gradient norms.
Dimension letters: B batch, T time, C model width, H heads, D head width (d_head)."""

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from model.attention import MultiHeadAttention, build_mask
from model.config import SATURATION_THRESHOLD, SDPA_NORMALISERS
from model.gpt import GPT, eval_mode

# Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View" (ICLR
# 2025; sail-sg/Attention-Sink, eval_sink_open_source.py): a head is a sink head on a sequence
# when the first token's score over the sequence's first SINK_WINDOW tokens exceeds SINK_EPSILON
SINK_WINDOW = 64
SINK_EPSILON = 0.3
TOP_K = 3   # Sun et al. 2024, "Massive Activations in Large Language Models": top-1, 2, 3 |h|


class Explained(NamedTuple):
    """explain's answer: the output and what the explicit path saw on the way."""

    y: Tensor  # (B, T, C), as forward returns it
    weights: Tensor  # (B, H, T, T) weights over the real keys, before dropout
    stats: dict[str, Tensor]  # per-head statistics, each (H,) (attention_stats)
    rows: Tensor  # (B, H, T, 1) bool, the real rows: real tokens with an allowed key


def explain(attn: MultiHeadAttention, x: Tensor, *, causal: bool = True,
            valid_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None) -> Explained:
    """attn's forward by the explicit path, with the weights and statistics."""
    q, k, v = attn.split_heads(x)  # (B, H, T, D) each
    mask = build_mask(x, causal, valid_mask, attn_mask)
    gq = q if attn.length is None else attn.length(q, mask, causal)  # q * g(n) per row
    y, weights, logits = attn.explicit(gq, k, v, mask)
    stats = attention_stats(q, k, logits, read_weights(weights, attn.scaling.normaliser),
                            None if mask is None else (mask.allowed, mask.row_ok), valid_mask)
    rows = real_rows(q, None if mask is None else mask.row_ok, valid_mask)
    return Explained(attn.merge_heads(y, x), weights, stats, rows)


@torch.no_grad()
def layer_stats(model: GPT, idx: Tensor, valid_mask: Optional[Tensor] = None
                ) -> list[dict[str, Tensor]]:
    """Per layer, attention_stats and mass_stats on that layer's own input, in eval mode, so
    that dropout neither changes them nor draws random numbers: a pre-hook explains each
    attention call."""
    stats = []

    def hook(attn, args, kwargs):
        info = explain(attn, *args, **kwargs)
        cap = {} if attn.q_norm is None else {"logit_cap": logit_cap(attn)}
        stats.append(info.stats | mass_stats(info.weights, info.rows, attn.scaling.normaliser)
                     | cap)

    run_hooked(model, idx, valid_mask, [
        block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks])
    return stats


@torch.no_grad()
def residual_stats(model: GPT, idx: Tensor, valid_mask: Optional[Tensor] = None
                   ) -> list[dict[str, Tensor]]:
    """Per layer, activation_stats of the residual stream after the block (the hidden states
    Sun et al. 2024 measure: a decoder layer's output), in eval mode as layer_stats."""
    stats = []

    def hook(block, args, output):
        stats.append(activation_stats(output, valid_mask))

    run_hooked(model, idx, valid_mask, [b.register_forward_hook(hook) for b in model.blocks])
    return stats


def run_hooked(model: GPT, idx: Tensor, valid_mask: Optional[Tensor], handles: list) -> None:
    """model.trunk in eval mode with the hooks of `handles`, which are removed after, even on
    error."""
    try:
        with eval_mode(model):
            model.trunk(idx, valid_mask)
    finally:
        for handle in handles:
            handle.remove()


def real_rows(q: Tensor, row_ok: Optional[Tensor], valid_mask: Optional[Tensor]) -> Tensor:
    """(B, H, T, 1) bool of q (B, H, T, D): True where the query is a real token (valid_mask)
    with an allowed key (the mask's row_ok (B|1, H|1, T, 1))."""
    B, H, T, _ = q.shape
    rows = torch.ones(B, H, T, 1, dtype=torch.bool, device=q.device)  # (B, H, T, 1)
    if row_ok is not None:
        rows = rows & row_ok
    if valid_mask is not None:
        rows = rows & valid_mask[:, None, :, None]
    return rows


def read_weights(weights: Tensor, normaliser: str) -> Tensor:
    """The weights (B, H, T, T) that the statistics of where a row's weight goes read, float32
    and detached: as given under a softmax with or without an extra logit (SDPA_NORMALISERS),
    whose row sums to 1 with the extra logit's share; each weight's share of its row's total
    under any other normaliser (sigmoid), whose row sums to anything in (0, n). So a sigmoid
    row that gives each of its keys 0.5 reads as uniform, as softmax's 1/n does, not as n
    halves. A row whose weights are all 0 (no key) stays 0."""
    w = weights.detach().float()
    if normaliser in SDPA_NORMALISERS:
        return w
    total = w.sum(dim=-1, keepdim=True)  # (B, H, T, 1)
    return w / total.masked_fill(total == 0, 1.0)


def attention_stats(q: Tensor, k: Tensor, logits: Tensor, weights: Tensor,
                    allowed: Optional[tuple[Tensor, Tensor]],
                    valid_mask: Optional[Tensor]) -> dict[str, Tensor]:
    """Per-head statistics, each (H,) float32, of q, k (B, H, T, D) after qk_norm and the
    explicit path's logits and weights w (B, H, T, T) as read_weights reads them (under sigmoid
    each row's shares of its total). `allowed`: the mask's (allowed (B|1, H|1, T, T), row_ok
    (B|1, H|1, T, 1)), None without a mask. Real rows: real tokens with an allowed key; entries:
    their allowed keys. Raw scores q.k come before the scale and soft-cap, so scales compare:
    unit-variance q, k give Var(q.k) = d_head, raw_var 1 (docs/scaling.md).
        entropy        mean over real rows of -sum_j w_j log w_j (nats); a row's entropy under
                       softmax and sigmoid; under softmax1 and sink the keys' terms only, the
                       extra logit's left out
        entropy_norm   mean over real rows with at least 2 keys of the entropy / ln(their
                       number of allowed keys): 1 = uniform, 0 = one-hot (Wortsman et al. 2023)
        saturated      fraction of real rows whose largest w exceeds SATURATION_THRESHOLD
        max_logit      max |logit| over entries (after the scale and soft-cap)
        raw_var        Var(q.k) / d_head over entries (divisor n)
        raw_max_logit  max |q.k| over entries
        q_norm, k_norm mean L2 norm of q (real rows) and k (real tokens) over D
    """
    B, H, T, D = q.shape
    rows = real_rows(q, None if allowed is None else allowed[1], valid_mask)  # (B, H, T, 1)
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


def logit_cap(attn: MultiHeadAttention) -> Tensor:
    """Each head's cap on |s q.k| where q and k are normalised (scaling.qk_norm, or the qk_norm
    scale), (H,) float32, to read beside its max_logit: how close a head sits to its ceiling.
    A norm over D leaves q and k of length at most sqrt(D) (exactly, up to eps, for RMSNorm), so
    |q.k| <= D; gains g_q, g_k (shared by the heads) weigh coordinate i by g_q,i g_k,i, so
    |q.k| <= D max_i |g_q,i g_k,i|, reached by RMSNorm with q and k along that coordinate. The
    cap is s D max_i |g_q,i g_k,i| (s per head under `learned`), before scaling.length's factor
    g(n) and the soft-cap (docs/scaling.md, section 8)."""
    s, device = attn.scale(), attn.q_proj.weight.device
    s = s.detach().flatten() if isinstance(s, Tensor) else torch.full((attn.n_head,), s,
                                                                        device=device)
    g_q, g_k = attn.q_norm.weight, attn.k_norm.weight   # (D,) each, or None without a gain
    gain = 1.0 if g_q is None else (g_q * g_k).detach().abs().amax()
    return (s * attn.d_head * gain).float()


def mass_stats(weights: Tensor, rows: Tensor, normaliser: str) -> dict[str, Tensor]:
    """Where each head's attention mass goes, per head, each (H,) float32, from the weights
    (B, H, T, T) over the real keys and the real rows (B, H, T, 1) (real tokens with an allowed
    key; a row with none has zero weights by policy and counts nowhere). Key 0 is the first
    token: the first of the window (data.packing=concat) or of the document piece (pad, whose
    padding is on the right); this model has no BOS token. first_mass, sink_score and
    sink_rate read the weights as read_weights does: under sigmoid each row's shares of its
    total, so a head that gives every key the same weight is no sink head, whatever that weight.
        first_mass   mean over real rows of the weight on key 0; uniform attention over T
                     causal rows gives (1 + 1/2 + ... + 1/T) / T
        sink_score   Gu et al.'s score of key 0, averaged over sequences (below)
        sink_rate    the share of sequences in which the head is a sink head (below); the
                     mean over heads and layers is Gu et al.'s sink rate
        sink_weight  mean over real rows of the weight the normaliser puts outside the real
                     keys, 1 - sum_j w_j of the weights as given: the +1 of softmax1, the
                     learned logit of sink; 0 for softmax; absent outside SDPA_NORMALISERS
                     (sigmoid), whose rows need not sum to 1
    Gu et al. 2024 (sail-sg/Attention-Sink, eval_sink_open_source.py, compute_attention_sink):
    on sequences cut to their first 64 tokens, key k's score in a layer and head is the mean
    attention it receives from the queries that can see it, sum_i A[i, k] / (64 - k); a head
    is a sink head on a sequence when the score of key 0 exceeds epsilon = 0.3; the sink rate
    is the share of (sequence, layer, head) triples that are, and their headline is key 0's.
    Here: the first SINK_WINDOW rows of the full-length forward, which under a causal mask are
    the weights of the 64-token forward (fewer rows when T < 64); the mean over the real rows
    among them (all of them without padding, as in their code); a sequence with no real row
    there counts in neither share nor denominator."""
    w = weights.detach().float()
    H = w.shape[1]
    n_rows = rows.sum(dim=(0, 2, 3)).clamp(min=1)  # (H,)
    first = read_weights(w, normaliser)[..., :1]  # (B, H, T, 1) the weight on key 0
    early = rows[:, :, :SINK_WINDOW]  # (B, H, W, 1) the real rows among the first W
    n_early = early.sum(dim=(2, 3))  # (B, H)
    score = (first[:, :, :SINK_WINDOW] * early).sum(dim=(2, 3)) / n_early.clamp(min=1)  # (B, H)
    counted = n_early > 0  # (B, H)
    n_counted = counted.sum(dim=0).clamp(min=1)  # (H,)
    stats = {"first_mass": (first * rows).sum(dim=(0, 2, 3)) / n_rows,
             "sink_score": (score * counted).sum(dim=0) / n_counted,
             "sink_rate": ((score > SINK_EPSILON) & counted).sum(dim=0) / n_counted}
    if normaliser == "softmax":   # no weight outside the keys
        stats["sink_weight"] = torch.zeros(H, device=w.device)
    elif normaliser in SDPA_NORMALISERS:   # the share of the extra logit b
        outside = 1.0 - w.sum(dim=-1, keepdim=True)  # (B, H, T, 1)
        stats["sink_weight"] = (outside * rows).sum(dim=(0, 2, 3)) / n_rows
    return stats


def activation_stats(h: Tensor, valid_mask: Optional[Tensor]) -> dict[str, Tensor]:
    """The size of hidden states h (B, T, C) over the real tokens (valid_mask (B, T)), each a
    float32 scalar. Sun et al. 2024 (locuslab/massive-activations, main_llm.py, exp2): per
    sequence, the TOP_K largest |h| and the median |h| over all its entries (torch.median: the
    lower middle value of an even count), averaged over sequences:
        top1, top2, top3   the largest, second and third largest |h|
        median             the median |h|
        kurtosis           excess kurtosis of the signed entries of every real token pooled,
                           m4 / m2^2 - 3 with central moments of divisor n (scipy.stats.kurtosis's
                           default, fisher=True, bias=True): 0 for a Gaussian, large when a few
                           entries are massive; NaN when all entries are equal
    A sequence with no real token counts in neither."""
    x = h.detach().float()
    real = (torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if valid_mask is None
            else valid_mask)  # (B, T)
    seqs, pad = real.any(dim=1), ~real[real.any(dim=1), :, None]  # (B,), (b, T, 1)
    size = x[seqs].abs()  # (b, T, C) the sequences with a real token
    top = size.masked_fill(pad, -1.0).flatten(1).topk(TOP_K, dim=1).values  # (b, TOP_K)
    median = size.masked_fill(pad, float("nan")).flatten(1).nanmedian(dim=1).values  # (b,)
    centred = x[real].flatten() - x[real].mean()  # (n,) every real entry
    z = centred / centred.square().mean().sqrt()
    stats = {f"top{i + 1}": top[:, i].mean() for i in range(TOP_K)}
    return stats | {"median": median.mean(), "kurtosis": z.pow(4).mean() - 3.0}


def qk_grad_norms(attn: MultiHeadAttention) -> tuple[float, float]:
    """L2 norms of W_q's and W_k's gradients (weight and bias together; one host sync), or
    (0.0, 0.0) before any backward pass."""
    grads = [[p.grad for p in proj.parameters()] for proj in (attn.q_proj, attn.k_proj)]
    if any(g is None for gs in grads for g in gs):
        return 0.0, 0.0
    sq = [sum(g.float().square().sum() for g in gs) for gs in grads]
    return tuple(torch.stack(sq).sqrt().tolist())
