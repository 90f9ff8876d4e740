"""Why attention divides by sqrt(d_k): the arithmetic of SCIENCE.md sections 1-2, reproduced.

    python scripts/scaling_stats.py [--out docs/figures] [--trials 20000] [--seed 0]

prints a Markdown report and writes three figures to --out:

- ``variance_vs_dk.png``: measured Var(q.k) for random unit-variance q, k against d_k
  (log-log, with the line y = d_k), and the standard deviation before/after dividing by
  sqrt(d_k).
- ``worked_weights.png``: the softmax weights of SCIENCE.md's worked rows, unscaled and scaled.
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

D_KS = tuple(2**i for i in range(2, 11))  # 4, 8, ..., 1024
N_TRIALS = 20_000
SEED = 0
HEAD_WIDTHS = (16, 64, 256)
FIXED_DIVISOR = 8.0  # the seed's "fixed divisor of 8": right only at d_k = 64

# The worked rows of SCIENCE.md section 2: (label, scores, divisor, divisor label).
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
# 1. The variance argument (SCIENCE.md section 1)
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
# 2. Softmax of the worked rows and its Jacobian (SCIENCE.md section 2)
# ---------------------------------------------------------------------------------------------


def softmax_weights(scores, divisor: float = 1.0) -> list[float]:
    """softmax(scores / divisor), in float64 so the tiny weights (1e-7) keep their digits."""
    s = torch.tensor(scores, dtype=torch.float64) / divisor  # (T,)
    return torch.softmax(s, dim=-1).tolist()


def softmax_jacobian(scores, divisor: float = 1.0) -> torch.Tensor:
    """J = diag(p) - p p^T: dp_i / dz_j at the scaled scores z = scores / divisor.

    This is the derivative with respect to the *scaled* score, as SCIENCE.md states it; the
    derivative with respect to the raw q.k carries a further factor 1/divisor.
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
# Report: Markdown tables and figures
# ---------------------------------------------------------------------------------------------


def _fmt_weights(ws) -> str:
    return "(" + ", ".join(f"{w:.3g}" if w < 1e-3 else f"{w:.3f}" for w in ws) + ")"


def markdown_report(var_rows: list[dict], n_trials: int, seed: int) -> str:
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
    lines += ["", f"Largest relative error: {100 * worst:.2f}% (the seed's claim: under 5%).", ""]
    lines += [
        f"Example scores q=(1,1,1) . k1, k2, k3 = {tuple(example_scores())}",
        "",
        "## Softmax weights of the worked rows",
        "",
        "| scores | divisor | weights | max abs Jacobian entry |",
        "|---|---|---|---:|",
    ]
    for _, scores, div, div_label in WORKED_ROWS:
        ws = softmax_weights(scores, div)
        scores_txt = "(" + ", ".join(f"{s:g}" for s in scores) + ")"
        lines.append(
            f"| {scores_txt} | {div_label} | {_fmt_weights(ws)} | {jacobian_max(scores, div):.4f} |"
        )
    row5 = (12.0, 8.0, 4.0, 0.0, -4.0)
    row4 = (8.0, 0.0, -8.0, 4.0)
    lines += [
        "",
        f"Row (8, 0, -8, 4): max |J| {jacobian_max(row4, 1):.4f} unscaled vs "
        f"{jacobian_max(row4, 8):.4f} divided by 8: "
        f"{jacobian_max(row4, 8) / jacobian_max(row4, 1):.1f}x larger.",
        f"Row (12, 8, 4, 0, -4): top diagonal p1(1-p1) {jacobian_entry(row5, 1, 0, 0):.4f} unscaled"
        f" vs {jacobian_entry(row5, 8, 0, 0):.4f} divided by 8; off-diagonal dp1/dz3 "
        f"{jacobian_entry(row5, 1, 0, 2):.2g} vs {jacobian_entry(row5, 8, 0, 2):.3f}.",
        "",
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
    ax.semilogy(widths, [gap_weight_ratio(d, FIXED_DIVISOR) for d in D_KS], "o-",
                label=f"fixed divisor {FIXED_DIVISOR:g}")
    ax.semilogy(widths, [gap_weight_ratio(d, math.sqrt(d)) for d in D_KS], "s-",
                label="divisor sqrt(d_k)")
    ax.set_xscale("log", base=2)
    for d in HEAD_WIDTHS:  # the widths SCIENCE.md works through
        ratio = gap_weight_ratio(d, FIXED_DIVISOR)
        ax.annotate(f"{ratio:.2f}", (d, ratio), textcoords="offset points", xytext=(-28, 6))
    ax.set(xlabel="head width d_k", ylabel="weight ratio exp(gap) of a one-sigma gap",
           title="fixed divisor 8: saturates wide heads, washes out narrow")
    ax.axvline(64, color="grey", ls=":", lw=1)
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures"),
                        help="folder for the PNG figures (created if missing)")
    parser.add_argument("--trials", type=int, default=N_TRIALS, help="random pairs per d_k")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    var_rows = variance_table(D_KS, args.trials, args.seed)
    print(markdown_report(var_rows, args.trials, args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_variance(var_rows, args.out / "variance_vs_dk.png")
    plot_worked_weights(args.out / "worked_weights.png")
    plot_gap_ratio(args.out / "gap_ratio_vs_width.png")
    print(f"Figures written to {args.out}/: variance_vs_dk.png, worked_weights.png, "
          "gap_ratio_vs_width.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
