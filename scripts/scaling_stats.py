"""Why attention divides by sqrt(d_k): the arithmetic of docs/scaling.md, reproduced.

    python scripts/scaling_stats.py [--out docs/figures] [--trials 20000] [--seed 0]

prints a Markdown report (every number docs/scaling.md quotes) and writes three figures to --out:

- ``variance_vs_dk.png``: measured Var(q.k) for random unit-variance q, k against d_k
  (log-log, with the line y = d_k), and the standard deviation before/after dividing by
  sqrt(d_k).
- ``worked_weights.png``: the softmax weights of the worked score rows, unscaled and scaled.
- ``gap_ratio_vs_width.png``: the weight ratio exp(gap) of a one-sigma score gap against head
  width, for a divisor sqrt(d_k) and for a fixed divisor 8.

The numbers come from small functions that the tests import and assert
(tests/test_scaling_stats.py). Softmax here is plain ``torch.softmax`` on a score row: this is the
textbook formula, not the attention module (tests/test_attention.py checks the module).
Runs in a few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from scripts.report.style import dodge  # noqa: E402

D_KS = tuple(2**i for i in range(2, 11))  # 4, 8, ..., 1024
N_TRIALS = 20_000
SEED = 0
HEAD_WIDTHS = (16, 64, 256)
FIXED_DIVISOR = 8.0  # sqrt(64): a "fixed divisor of 8" is right only at d_k = 64

# The worked rows of docs/scaling.md: (label, scores, divisor, divisor label).
WORKED_ROWS = (
    ("q.k for q=(1,1,1)", (3.0, 1.0, -1.0), 1.0, "1"),
    ("q.k for q=(1,1,1)", (3.0, 1.0, -1.0), math.sqrt(3.0), "sqrt(3)"),
    ("five scores", (12.0, 8.0, 4.0, 0.0, -4.0), 1.0, "1"),
    ("five scores", (12.0, 8.0, 4.0, 0.0, -4.0), 8.0, "8"),
    ("d_k=64 row", (8.0, 0.0, -8.0, 4.0), 1.0, "1"),
    ("d_k=64 row", (8.0, 0.0, -8.0, 4.0), 8.0, "sqrt(64)=8"),
    ("d_k=64 row", (8.0, 0.0, -8.0, 4.0), 64.0, "64 (d_k)"),
)


# ---------------------------------------------------------------------------------------------
# 1. The variance argument
# ---------------------------------------------------------------------------------------------


def example_scores() -> list[float]:
    """q = (1,1,1) against k1 = (1,1,1), k2 = (1,0,0), k3 = (-1,0,0): scores (3, 1, -1)."""
    q = torch.tensor([1.0, 1.0, 1.0])
    keys = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])  # (3, 3)
    return (keys @ q).tolist()  # (3,)


def dot_variance(d_k: int, n_trials: int = N_TRIALS, seed: int = SEED, sigma: float = 1.0) -> float:
    """Sample variance of q.k over n_trials pairs with i.i.d. N(0, sigma^2) components.

    Theory: Var(q.k) = d_k * sigma^4 (a sum of d_k independent products, each of variance
    sigma^4). The seed is offset by d_k so every size draws its own, reproducible, sample.
    """
    rng = np.random.default_rng(seed + d_k)
    q = rng.normal(0.0, sigma, size=(n_trials, d_k))  # (N, D)
    k = rng.normal(0.0, sigma, size=(n_trials, d_k))  # (N, D)
    dots = np.einsum("nd,nd->n", q, k)  # (N,)
    return float(dots.var(ddof=1))


def variance_table(d_ks=D_KS, n_trials: int = N_TRIALS, seed: int = SEED) -> list[dict]:
    """One row per d_k: measured variance, relative error against d_k, std before/after scaling."""
    rows = []
    for d_k in d_ks:
        var = dot_variance(d_k, n_trials, seed)
        rows.append(
            {
                "d_k": d_k,
                "var": var,
                "rel_err": abs(var - d_k) / d_k,
                "std": math.sqrt(var),
                "std_scaled": math.sqrt(var) / math.sqrt(d_k),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# 2. Softmax of the worked rows and its Jacobian
# ---------------------------------------------------------------------------------------------


def softmax_weights(scores, divisor: float = 1.0) -> list[float]:
    """softmax(scores / divisor), in float64 so the tiny weights (1e-7) keep their digits."""
    s = torch.tensor(scores, dtype=torch.float64) / divisor  # (T,)
    return torch.softmax(s, dim=-1).tolist()


def softmax_jacobian(scores, divisor: float = 1.0) -> torch.Tensor:
    """J = diag(p) - p p^T: dp_i / dz_j at the scaled scores z = scores / divisor.

    This is the derivative with respect to the *scaled* score; the derivative with respect to
    the raw q.k carries a further factor 1/divisor.
    """
    p = torch.tensor(softmax_weights(scores, divisor), dtype=torch.float64)  # (T,)
    return torch.diag(p) - torch.outer(p, p)  # (T, T)


def jacobian_max(scores, divisor: float = 1.0) -> float:
    """Largest |entry| of the softmax Jacobian: how much gradient can flow through the row."""
    return float(softmax_jacobian(scores, divisor).abs().max())


def jacobian_entry(scores, divisor: float, i: int, j: int) -> float:
    """dp_i / dz_j: the diagonal p_i (1 - p_i) when i == j, else -p_i p_j."""
    return float(softmax_jacobian(scores, divisor)[i, j])


# ---------------------------------------------------------------------------------------------
# 3. A fixed divisor against sqrt(d_k) across head widths
# ---------------------------------------------------------------------------------------------


def one_sigma_gap(d_k: int, divisor: float) -> float:
    """A one-sigma difference of raw scores is sqrt(d_k) (section 1); after the divisor:"""
    return math.sqrt(d_k) / divisor


def gap_weight_ratio(d_k: int, divisor: float) -> float:
    """Weight ratio of two keys one sigma apart: p_a / p_b = exp(z_a - z_b) = exp(gap)."""
    return math.exp(one_sigma_gap(d_k, divisor))


def gap_table(widths=HEAD_WIDTHS, fixed: float = FIXED_DIVISOR) -> list[dict]:
    """Per head width: the one-sigma gap and weight ratio under a fixed divisor and sqrt(d_k)."""
    return [
        {
            "d_k": d,
            "gap_fixed": one_sigma_gap(d, fixed),
            "ratio_fixed": gap_weight_ratio(d, fixed),
            "gap_sqrt": one_sigma_gap(d, math.sqrt(d)),
            "ratio_sqrt": gap_weight_ratio(d, math.sqrt(d)),
        }
        for d in widths
    ]


# ---------------------------------------------------------------------------------------------
# 4. What GPT-2's 0.02 initialisation makes of q.k at step 0
# ---------------------------------------------------------------------------------------------

INIT_STD = 0.02  # GPT-2's weight initialisation (Radford et al. 2019), used by model/gpt.py
# (d_model, d_head): the default model, the three head widths of the head-width experiment, and
# GPT-2 small
INIT_SHAPES = ((128, 32), (256, 16), (256, 64), (256, 256), (768, 64))


def init_component_variance(d_model: int, std: float = INIT_STD) -> float:
    """Variance of one q (or k) component at step 0: q_i = sum_j W_ij x_j over d_model inputs.

    x is LayerNormed (unit variance per component) and W_ij ~ N(0, std^2), so
    Var(q_i) = d_model * std^2: 128 * 0.02^2 = 0.0512, far below the 1 the sqrt(d_k) argument
    assumes.
    """
    return d_model * std**2


def init_score_std(d_model: int, d_head: int, factor: float, std: float = INIT_STD) -> float:
    """Predicted std of the logit factor * q.k at step 0: Var(q.k) = d_head var(q_i) var(k_i)."""
    return factor * math.sqrt(d_head) * init_component_variance(d_model, std)


def measured_init_score_std(d_model: int, d_head: int, n_pairs: int = 4096, n_draws: int = 8,
                            seed: int = SEED, std: float = INIT_STD) -> float:
    """Std of q.k between LayerNormed random tokens, with W_q, W_k drawn as GPT-2 draws them.

    Averaged over n_draws weight draws (the variance given one draw depends on that draw).
    """
    gen = torch.Generator().manual_seed(seed)
    variances = []
    for _ in range(n_draws):
        w_q = torch.randn(d_head, d_model, generator=gen, dtype=torch.float64) * std  # (D, C)
        w_k = torch.randn(d_head, d_model, generator=gen, dtype=torch.float64) * std  # (D, C)
        x = torch.randn(2, n_pairs, d_model, generator=gen, dtype=torch.float64)  # (2, N, C)
        x = torch.nn.functional.layer_norm(x, (d_model,))  # unit variance per token
        q, k = x[0] @ w_q.T, x[1] @ w_k.T  # (N, D) each: a query and a key from other tokens
        variances.append(float((q * k).sum(-1).var()))
    return math.sqrt(sum(variances) / n_draws)


def init_table(shapes=INIT_SHAPES) -> list[dict]:
    """Per (d_model, d_head): Var(q_i) and the predicted step-0 logit std under three scales."""
    return [
        {
            "d_model": c,
            "d_head": d,
            "var_q": init_component_variance(c),
            "std_none": init_score_std(c, d, 1.0),
            "std_sqrt_dk": init_score_std(c, d, 1 / math.sqrt(d)),
            "std_dk": init_score_std(c, d, 1 / d),
        }
        for c, d in shapes
    ]


# ---------------------------------------------------------------------------------------------
# 5. Softmax as a temperature, the sqrt(d_model) mistake, and the muP argument
# ---------------------------------------------------------------------------------------------


def weight_ratio(scores, c: float, i: int, j: int) -> float:
    """p_i / p_j of softmax(c * scores) = exp(c (s_i - s_j)) = (the ratio at c = 1) ** c."""
    p = softmax_weights(scores, 1.0 / c)
    return p[i] / p[j]


def entropy(weights) -> float:
    """Entropy of a weight row in nats: log(T) when flat, 0 when one weight is 1."""
    return -sum(w * math.log(w) for w in weights if w > 0)


def d_model_divisor_std(n_head: int) -> float:
    """Logit std when q.k (unit components, Var = d_head) is divided by sqrt(d_model) instead.

    sqrt(d_model) = sqrt(n_head) * sqrt(d_head), so the std is 1 / sqrt(n_head), not 1.
    """
    return 1.0 / math.sqrt(n_head)


def aligned_score_mean(d_k: int, rho: float, n_trials: int = N_TRIALS, seed: int = SEED) -> float:
    """Sample mean of q.k when each k_i has correlation rho with q_i (unit variances).

    Theory: rho * d_k. Once training aligns q with k, q.k grows like d_k (a sum of d_k terms of
    mean rho), not like sqrt(d_k): the reason muP divides by d_k (Yang et al. 2022).
    """
    rng = np.random.default_rng(seed + d_k)
    q = rng.normal(size=(n_trials, d_k))  # (N, D)
    k = rho * q + math.sqrt(1 - rho**2) * rng.normal(size=(n_trials, d_k))  # (N, D)
    return float(np.einsum("nd,nd->n", q, k).mean())


def mup_divisor(d_head: int, alpha: float = 8.0) -> float:
    """muP codes often write the scale as alpha / d_head; alpha = 8 equals 1/sqrt(64) at 64."""
    return d_head / alpha


# ---------------------------------------------------------------------------------------------
# 6. Fully masked rows, float16, qk-norm and soft-capping
# ---------------------------------------------------------------------------------------------


def fully_masked_row(fill: float, t: int = 4) -> list[float]:
    """softmax of a row whose every entry is the mask fill: NaN for -inf, 1/T for finfo.min."""
    return torch.softmax(torch.full((t,), fill), dim=-1).tolist()


def sdpa_fully_masked_row() -> list[float]:
    """Output of torch's F.scaled_dot_product_attention for a query whose keys are all masked."""
    gen = torch.Generator().manual_seed(SEED)
    q, k, v = torch.randn(3, 1, 1, 2, 4, generator=gen)  # (B, H, T, D) each, T = 2 queries
    allowed = torch.tensor([[True, True], [False, False]])  # (T, T): query 1 sees no key
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return out[0, 0, 1].tolist()  # (D,)


def uniform_causal_entropy(t: int = 64) -> float:
    """Mean entropy of flat causal rows over a block of t: row i has i keys, entropy log(i)."""
    return sum(math.log(i) for i in range(1, t + 1)) / t


def fp16_scores(value: float = 40.0, d_head: int = 64) -> tuple[float, float]:
    """q = k = value in every component, float16: ((q @ k^T) * s, (q * s) @ k^T), s = 1/sqrt(d)."""
    q = torch.full((1, d_head), value, dtype=torch.float16)  # (1, D)
    s = 1.0 / math.sqrt(d_head)
    return float((q @ q.T) * s), float((q * s) @ q.T)


def qk_norm_logit_bound(d_head: int, gain: float = 1.0) -> float:
    """Largest |q.k| / sqrt(d_head) once q and k are LayerNormed (no bias) with gain g.

    A LayerNormed vector has norm sqrt(d_head) * g, so by Cauchy-Schwarz
    |q.k| <= d_head * g^2 and the scaled logit is at most sqrt(d_head) * g^2.
    """
    return math.sqrt(d_head) * gain**2


def measured_qk_norm_max_logit(d_head: int, n_trials: int = 2000, seed: int = SEED) -> float:
    """Largest |LN(q).LN(k)| / sqrt(d_head) over random q, k, including k = q (the bound's case)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.layer_norm(torch.randn(n_trials, d_head, generator=gen), (d_head,))
    k = torch.nn.functional.layer_norm(torch.randn(n_trials, d_head, generator=gen), (d_head,))
    logits = torch.cat([(q * k).sum(-1), (q * q).sum(-1)]) / math.sqrt(d_head)  # (2N,)
    return float(logits.abs().max())


def softcap(logit: float, cap: float = 50.0) -> float:
    """Gemma 2's soft-cap: cap * tanh(logit / cap), near the identity for |logit| << cap."""
    return cap * math.tanh(logit / cap)


# ---------------------------------------------------------------------------------------------
# Report: Markdown tables and figures
# ---------------------------------------------------------------------------------------------


def _fmt_weights(ws) -> str:
    return "(" + ", ".join(f"{w:.3g}" if w < 1e-3 else f"{w:.3f}" for w in ws) + ")"


def _fmt_row(xs) -> str:
    return "(" + ", ".join(f"{x:g}" for x in xs) + ")"


def _variance_section(var_rows: list[dict], n_trials: int, seed: int) -> list[str]:
    lines = [
        f"## Var(q.k) for unit-variance q, k ({n_trials} trials per size, seed {seed})",
        "",
        "| d_k | Var(q.k) | rel. error vs d_k | std(q.k) | std(q.k / sqrt(d_k)) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in var_rows:
        lines.append(
            f"| {r['d_k']} | {r['var']:.2f} | {100 * r['rel_err']:.2f}% "
            f"| {r['std']:.3f} | {r['std_scaled']:.4f} |"
        )
    worst = max(r["rel_err"] for r in var_rows)
    sigma2 = dot_variance(64, n_trials, seed, sigma=2.0)
    return lines + [
        "",
        f"Largest relative error: {100 * worst:.2f}% (the tests require under 5%).",
        f"Components of variance 4 (sigma = 2), d_k = 64: Var(q.k) = {sigma2:.0f} "
        f"(theory 64 x 2^4 = 1024).",
        "",
        f"Example scores q=(1,1,1) . k1, k2, k3 = {tuple(example_scores())}",
        "",
    ]


def _worked_section() -> list[str]:
    lines = [
        "## Softmax weights of the worked rows",
        "",
        "| scores | divisor | weights | entropy (nats) | max abs Jacobian entry |",
        "|---|---|---|---:|---:|",
    ]
    for _, scores, div, div_label in WORKED_ROWS:
        ws = softmax_weights(scores, div)
        lines.append(f"| {_fmt_row(scores)} | {div_label} | {_fmt_weights(ws)} "
                     f"| {entropy(ws):.3f} | {jacobian_max(scores, div):.4f} |")
    row3, row5, row4 = WORKED_ROWS[0][1], WORKED_ROWS[2][1], WORKED_ROWS[4][1]
    lines += ["", "Jacobian diag(p) - p p^T of the row (3, 1, -1):", ""]
    for div, label in ((1.0, "unscaled"), (math.sqrt(3.0), "divided by sqrt(3)")):
        rows = softmax_jacobian(row3, div).tolist()
        lines.append(f"- {label}: " + "; ".join(_fmt_row(round(x, 4) for x in r) for r in rows))
    return lines + [
        "",
        f"Row (8, 0, -8, 4): max |J| {jacobian_max(row4, 1):.4f} unscaled vs "
        f"{jacobian_max(row4, 8):.4f} divided by 8: "
        f"{jacobian_max(row4, 8) / jacobian_max(row4, 1):.1f}x larger with respect to the scaled "
        f"score; with respect to the raw q.k, {jacobian_max(row4, 8) / 8:.3f} vs "
        f"{jacobian_max(row4, 1):.3f}: {jacobian_max(row4, 8) / 8 / jacobian_max(row4, 1):.2f}x.",
        f"Row (12, 8, 4, 0, -4): top diagonal p1(1-p1) {jacobian_entry(row5, 1, 0, 0):.4f} unscaled"
        f" vs {jacobian_entry(row5, 8, 0, 0):.4f} divided by 8; off-diagonal dp1/dz3 "
        f"{jacobian_entry(row5, 1, 0, 2):.2g} vs {jacobian_entry(row5, 8, 0, 2):.3f}.",
        "",
        "Softmax as a temperature, row (3, 1, -1): p1/p2 = "
        f"{weight_ratio(row3, 1.0, 0, 1):.3f} (e^2) at c = 1, "
        f"{weight_ratio(row3, 2.0, 0, 1):.2f} (e^4) at c = 2, "
        f"{weight_ratio(row3, 1 / math.sqrt(3.0), 0, 1):.3f} (e^(2/sqrt(3))) at c = 1/sqrt(3).",
        "",
    ]


def _gap_section() -> list[str]:
    lines = [
        f"## A one-sigma score gap: fixed divisor {FIXED_DIVISOR:g} vs sqrt(d_k)",
        "",
        "| d_k | gap (fixed 8) | ratio exp(gap) | gap (sqrt(d_k)) | ratio exp(gap) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for g in gap_table():
        lines.append(
            f"| {g['d_k']} | {g['gap_fixed']:.2f} | {g['ratio_fixed']:.2f} "
            f"| {g['gap_sqrt']:.2f} | {g['ratio_sqrt']:.2f} |"
        )
    lines.append("")
    for n_head in (4, 12):
        std = d_model_divisor_std(n_head)
        lines.append(f"Dividing by sqrt(d_model) with {n_head} heads: logit std {std:.3f}, "
                     f"one-sigma ratio {math.exp(std):.2f} (instead of 1 and 2.72).")
    return lines + [""]


def _init_section() -> list[str]:
    lines = [
        f"## Step 0 under GPT-2's initialisation (weights N(0, {INIT_STD}^2), LayerNormed input)",
        "",
        "| d_model | d_head | Var(q_i) | std of q.k (`none`) | measured | "
        "std of q.k / sqrt(d_head) (`sqrt_dk`) | std of q.k / d_head (`dk`) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in init_table():
        measured = measured_init_score_std(r["d_model"], r["d_head"])
        lines.append(f"| {r['d_model']} | {r['d_head']} | {r['var_q']:.4f} | {r['std_none']:.3f} "
                     f"| {measured:.3f} | {r['std_sqrt_dk']:.4f} | {r['std_dk']:.4f} |")
    return lines + [""]


def _extras_section() -> list[str]:
    lines = ["## Aligned q and k (correlation 0.5 per component): mean q.k", "",
             "| d_k | mean q.k | / sqrt(d_k) | / d_k |", "|---:|---:|---:|---:|"]
    for d_k in (16, 64, 256, 1024):
        m = aligned_score_mean(d_k, 0.5)
        lines.append(f"| {d_k} | {m:.1f} | {m / math.sqrt(d_k):.2f} | {m / d_k:.3f} |")
    unscaled, prescaled = fp16_scores()
    return lines + [
        "",
        f"muP's alpha / d_head with alpha = 8 at d_head = 64: divisor {mup_divisor(64):g} "
        f"(= sqrt(64)); at d_head = 256: {mup_divisor(256):g} (sqrt: 16).",
        f"Fully masked row: softmax of -inf fill {_fmt_row(fully_masked_row(float('-inf')))}, "
        f"of finfo.min fill {_fmt_row(fully_masked_row(torch.finfo(torch.float32).min))}, "
        f"SDPA output {_fmt_row(sdpa_fully_masked_row())} (torch {torch.__version__}).",
        f"Flat attention over the causal rows of a 64-token block: entropy "
        f"{uniform_causal_entropy(64):.3f} nats.",
        f"float16, q = k = 40, d_head = 64: (q @ k^T) / 8 = {unscaled:g}, "
        f"(q / 8) @ k^T = {prescaled:g} (float16 max 65504).",
        f"qk-norm bound at d_head = 32, unit gain: {qk_norm_logit_bound(32):.3f}; largest of "
        f"random normalised pairs: {measured_qk_norm_max_logit(32):.3f}.",
        f"Soft-cap 50: 10 -> {softcap(10):.2f}, 100 -> {softcap(100):.2f}, "
        f"1000 -> {softcap(1000):.2f}.",
    ]


def markdown_report(var_rows: list[dict], n_trials: int, seed: int) -> str:
    lines = (_variance_section(var_rows, n_trials, seed) + _worked_section() + _gap_section()
             + _init_section() + _extras_section())
    return "\n".join(lines) + "\n"


def plot_variance(var_rows: list[dict], path: Path) -> None:
    d = np.array([r["d_k"] for r in var_rows], dtype=float)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.loglog(d, d, "k--", label="y = d_k (theory)")
    ax1.loglog(d, [r["var"] for r in var_rows], "o", label="measured Var(q.k)")
    ax1.set(xlabel="d_k", ylabel="Var(q.k)", title="Var(q.k) grows like d_k")
    ax1.set_xscale("log", base=2)
    ax2.semilogx(d, [r["std"] for r in var_rows], "o-", label="std(q.k)")
    ax2.semilogx(d, [r["std_scaled"] for r in var_rows], "s-", label="std(q.k / sqrt(d_k))")
    ax2.set_xscale("log", base=2)
    ax2.set(xlabel="d_k", ylabel="standard deviation", title="Dividing by sqrt(d_k) restores 1")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_worked_weights(path: Path) -> None:
    by_row: dict[tuple, list] = {}
    for _, scores, div, div_label in WORKED_ROWS:
        by_row.setdefault(scores, []).append((div, div_label))
    fig, axes = plt.subplots(1, len(by_row), figsize=(4 * len(by_row), 3.6))
    for ax, (scores, divs) in zip(axes, by_row.items()):
        x = np.arange(len(scores))
        width = 0.8 / len(divs)
        for i, (div, label) in enumerate(divs):
            ax.bar(x + i * width, softmax_weights(scores, div), width, label=f"/ {label}")
        ax.set_xticks(x + 0.4 - width / 2, [f"{s:g}" for s in scores])
        ax.set(xlabel="raw score", ylabel="softmax weight", ylim=(0, 1))
        ax.set_title("scores (" + ", ".join(f"{s:g}" for s in scores) + ")")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_gap_ratio(path: Path) -> None:
    widths = np.array(D_KS, dtype=float)
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = [ax.semilogy(widths, [gap_weight_ratio(d, FIXED_DIVISOR) for d in D_KS], "o-",
                         label=f"fixed divisor {FIXED_DIVISOR:g}"),
             ax.semilogy(widths, [gap_weight_ratio(d, math.sqrt(d)) for d in D_KS], "s-",
                         label="divisor sqrt(d_k)")]
    for i, line in enumerate(lines):   # equal at d_k = 64: the two markers side by side
        dodge(ax, (i, len(lines)), line)
    ax.set_xscale("log", base=2)
    for d in HEAD_WIDTHS:  # the widths docs/scaling.md works through
        ratio = gap_weight_ratio(d, FIXED_DIVISOR)
        ax.annotate(f"{ratio:.2f}", (d, ratio), textcoords="offset points", xytext=(-28, 6))
    ax.set(xlabel="head width d_k", ylabel="weight ratio exp(gap) of a one-sigma gap",
           title="fixed divisor 8: sharper at wide heads, washed out at narrow")
    ax.axvline(64, color="grey", ls=":", lw=1, label="d_k = 64 = 8²: the two divisors agree")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_figures(var_rows: list[dict], out: Path) -> list[str]:
    """The three figures of the module docstring, into `out`; their file names."""
    out.mkdir(parents=True, exist_ok=True)
    plot_variance(var_rows, out / "variance_vs_dk.png")
    plot_worked_weights(out / "worked_weights.png")
    plot_gap_ratio(out / "gap_ratio_vs_width.png")
    return ["variance_vs_dk.png", "worked_weights.png", "gap_ratio_vs_width.png"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures"),
                        help="folder for the PNG figures (created if missing)")
    parser.add_argument("--trials", type=int, default=N_TRIALS, help="random pairs per d_k")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    var_rows = variance_table(D_KS, args.trials, args.seed)
    print(markdown_report(var_rows, args.trials, args.seed))
    print(f"Figures written to {args.out}/: {', '.join(draw_figures(var_rows, args.out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
