"""Statistics of the report: 95% Student-t intervals, paired (same-seed) differences, and the
learning-rate analyses of an LR sweep. Plain Python, no SciPy.

Every number of a results table is a mean over seeds with its 95% interval and n. A claim that
one scale beats another at a setting rests on the paired difference: the same seed gives both
runs the same data order and (scale aside) the same initialisation, so the per-seed differences
cancel what the seeds share. It is "resolved" only when that difference's interval excludes 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from scripts.report.runs import LR_KEY, Run, group_runs

LEVEL = 0.95
LOSSES = {  # --loss choice -> (summary field, what the tables call it)
    "full": ("final_val_loss_full", "whole-split final val loss"),
    "sampled": ("final_val_loss", "sampled final val loss"),
}


# ---------------------------------------------------------------------------------------------
# Student t
# ---------------------------------------------------------------------------------------------


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on t_cdf (monotone in t)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p={p} must lie strictly between 0 and 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------------------------------------
# Intervals and paired differences
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """Mean of n values with the half-width of its 95% t interval (None when n = 1)."""

    mean: float
    half: Optional[float]
    n: int

    @property
    def lo(self) -> float:
        return self.mean - (self.half or 0.0)

    @property
    def hi(self) -> float:
        return self.mean + (self.half or 0.0)

    def excludes_zero(self) -> bool:
        return self.half is not None and (self.lo > 0 or self.hi < 0)

    def text(self, digits: int = 4) -> str:
        if self.half is None:
            return f"{self.mean:.{digits}f} (n=1, no interval)"
        return f"{self.mean:.{digits}f} ± {self.half:.{digits}f} (n={self.n})"


def mean_interval(values: list[float]) -> Optional[Interval]:
    """Mean and 95% t interval of the finite values; None when there are none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    n = len(values)
    if n == 1:
        return Interval(values[0], None, 1)
    sem = statistics.stdev(values) / math.sqrt(n)
    return Interval(statistics.fmean(values), t_quantile(0.5 + LEVEL / 2, n - 1) * sem, n)


def paired_difference(a: dict, b: dict) -> Optional[Interval]:
    """Interval of a[seed] - b[seed] over the seeds both have with finite values."""
    seeds = [s for s in a if s in b and _finite(a[s]) and _finite(b[s])]
    return mean_interval([a[s] - b[s] for s in sorted(seeds, key=str)])


def verdict(diff: Optional[Interval], lower: str = "lower", higher: str = "higher") -> str:
    """What a paired difference supports: `lower`, `higher`, or not resolved (and why)."""
    if diff is None:
        return "not resolved (no pairs)"
    if diff.half is None:
        return "not resolved (n=1)"
    if not diff.excludes_zero():
        return "not resolved (interval contains 0)"
    return lower if diff.hi < 0 else higher


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


# ---------------------------------------------------------------------------------------------
# Per-run numbers
# ---------------------------------------------------------------------------------------------


def final_loss(run: Run, which: str) -> Optional[float]:
    """The run's final val loss of kind `which` (LOSSES); None when the run lacks the field,
    NaN when it diverged."""
    if run.diverged:
        return math.nan
    if which == "sampled":
        return run.final_val_loss_sampled
    return run.summary_value(LOSSES[which][0])


def by_seed(runs: list[Run], value: Callable[[Run], Optional[float]]) -> dict:
    """seed -> value over the runs that have one (the first run of a seed counts)."""
    out = {}
    for r in runs:
        v = value(r)
        if v is not None and r.seed not in out:
            out[r.seed] = v
    return out


# ---------------------------------------------------------------------------------------------
# Learning-rate sweeps
# ---------------------------------------------------------------------------------------------


def clipped_loss(run: Run, which: str) -> Optional[float]:
    """min(final loss, loss at init), a diverged run counting as its loss at init (Wortsman et
    al. 2023); None when the run lacks the loss or has no loss at init."""
    init = run.loss_at_init
    loss = final_loss(run, which)
    if init is None or loss is None:
        return None
    return init if not math.isfinite(loss) else min(loss, init)


def lr_table(runs: list[Run], which: str) -> dict[float, dict]:
    """lr -> {seed: clipped loss} for one variant at one setting, LRs in increasing order."""
    table: dict[float, dict] = {}
    for r in sorted(runs, key=lambda r: r.lr):
        table.setdefault(r.lr, {})
    for lr in table:
        table[lr] = by_seed([r for r in runs if r.lr == lr], lambda r: clipped_loss(r, which))
    return table


def best_lr(table: dict[float, dict]) -> Optional[dict]:
    """The LR of lowest mean clipped loss, its interval, and the LRs whose paired difference to
    it is not resolved (the best LR is known only up to those)."""
    means = {lr: mean_interval(list(s.values())) for lr, s in table.items()}
    means = {lr: m for lr, m in means.items() if m is not None}
    if not means:
        return None
    best = min(means, key=lambda lr: means[lr].mean)
    tied = [lr for lr in means if lr != best
            and (d := paired_difference(table[lr], table[best])) is not None
            and not d.excludes_zero()]
    return {"lr": best, "loss": means[best], "tied": tied, "means": means}


def complete_seeds(table: dict[float, dict]) -> list:
    """The seeds that have a loss at every LR of the grid."""
    if not table:
        return []
    return sorted(set.intersection(*(set(s) for s in table.values())), key=str)


def grid_mean_by_seed(table: dict[float, dict]) -> dict:
    """seed -> mean clipped loss over the LR grid, for the seeds complete over the grid."""
    return {seed: statistics.fmean(table[lr][seed] for lr in table)
            for seed in complete_seeds(table)}


def sensitivity_by_seed(table: dict[float, dict]) -> dict:
    """seed -> LR sensitivity (Wortsman et al. 2023): the mean over the LR grid of the clipped
    loss minus its minimum over the grid, for the seeds complete over the grid."""
    return {seed: grid_mean_by_seed(table)[seed] - min(table[lr][seed] for lr in table)
            for seed in complete_seeds(table)}


def loss_at_best_lr(table: dict[float, dict]) -> dict:
    """seed -> clipped loss at the LR of lowest mean loss ({} when there is none)."""
    best = best_lr(table)
    return dict(table[best["lr"]]) if best else {}


def at_best_lr(lr_runs, which: str) -> dict:
    """Group key without the LR -> the runs of that group at its own best LR."""
    out = {}
    for key, vruns in group_runs(lr_runs, drop=(LR_KEY,)).items():
        best = best_lr(lr_table(vruns, which))
        if best is not None:
            out[key] = [r for r in vruns if r.lr == best["lr"]]
    return out
