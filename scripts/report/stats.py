"""Statistics of the report: 95% Student-t intervals, paired (same-seed) tests as Holm
families (Holm 1979: a difference is resolved only where its adjusted p is below 0.05), which
runs failed, and the learning-rate analyses of an LR sweep (docs/report.md).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from scipy import stats

from scripts.report.runs import LR_KEY, RunRecord, group_runs

LEVEL = 0.95
ALPHA = 1 - LEVEL  # a Holm-adjusted p below this resolves a paired difference
LOSSES = {  # --loss choice -> (summary field, what the tables call it)
    "full": ("final_val_loss_full", "whole-split final val loss"),
    "sampled": ("final_val_loss", "sampled final val loss"),
}


def subset_counts(runs: list[RunRecord]) -> list[tuple[int, int]]:
    """(targets scored, targets in the split) of the runs whose whole-split loss covers a fixed
    subset of the split (trainer.full_eval_tokens), each pair once, sorted."""
    counts = {(r.summary_count("full_eval_targets"), r.summary_count("full_eval_split_targets"))
              for r in runs}
    return sorted(c for c in counts if None not in c and c[0] < c[1])


def loss_name(which: str, runs: list[RunRecord]) -> str:
    """What a figure calls the loss `which` of these runs (a subset of the split says so)."""
    if which == "full" and subset_counts(runs):
        return "final val loss on a fixed\nsubset of the val split"
    return LOSSES[which][1]


# Intervals, paired differences and their Holm family


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

    def text(self, digits: int = 4) -> str:
        if self.half is None:
            return f"{self.mean:.{digits}f} (n={self.n}, no interval)"
        return f"{self.mean:.{digits}f} ± {self.half:.{digits}f} (n={self.n})"


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with df degrees of freedom."""
    return float(stats.t.ppf(p, df))


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


def common_seeds(a: dict, b: dict) -> list:
    """The seeds with a finite value in both a and b, in a fixed order."""
    return sorted((s for s in a if s in b and _finite(a[s]) and _finite(b[s])), key=str)


def paired_difference(a: dict, b: dict) -> Optional[Interval]:
    """Interval of a[seed] - b[seed] over the seeds both have with finite values."""
    return mean_interval([a[s] - b[s] for s in common_seeds(a, b)])


def paired_p(a: dict, b: dict) -> Optional[float]:
    """Two-sided p of the paired t-test (scipy.stats.ttest_rel) of a against b over their
    common seeds; None below two pairs. Differences all exactly 0 (t = 0/0) give p = 1."""
    seeds = common_seeds(a, b)
    if len(seeds) < 2:
        return None
    with warnings.catch_warnings():   # differences all (nearly) equal: scipy warns, p stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue)
    return 1.0 if math.isnan(p) else p


def logs(values: dict) -> dict:
    """{seed: log value} of the positive values: a ratio of losses as a difference of logs."""
    return {s: math.log(v) for s, v in values.items() if _finite(v) and v > 0}


def holm(pvalues: list[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (Holm 1979). With the m p-values sorted,
    p_(1) <= ... <= p_(m), the i-th becomes max over j <= i of min(1, (m - j + 1) p_(j)); a
    None (no test: fewer than two pairs) stays None and is not counted in m."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[Optional[float]] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """One paired difference of a family: its interval, its paired t-test p and its p
    adjusted by Holm over the family (None where there are fewer than two pairs)."""

    diff: Optional[Interval]
    p: Optional[float]
    p_holm: Optional[float]
    identical: bool = False   # every pair equal: the same runs twice, not a test

    @property
    def resolved(self) -> bool:
        return self.p_holm is not None and self.p_holm < ALPHA


def identical(a: dict, b: dict) -> bool:
    """Whether a and b are equal at each of at least two common seeds: the same runs read twice
    (uniform attention at two q/k initialisations, which it never uses)."""
    seeds = common_seeds(a, b)
    return len(seeds) >= 2 and all(a[s] == b[s] for s in seeds)   # one pair is untested anyway


def family(pairs: list[tuple[dict, dict]], log: bool = False) -> list[Comparison]:
    """The comparisons a - b ({seed: value} each) of one table, Holm-adjusted together; log:
    of log a - log b, the paired test of the ratio a / b. A pair of identical runs is not
    tested and not counted in the family's size."""
    pairs = [(logs(a), logs(b)) for a, b in pairs] if log else pairs
    same = [identical(a, b) for a, b in pairs]
    ps = [None if s else paired_p(a, b) for (a, b), s in zip(pairs, same)]
    return [Comparison(paired_difference(a, b), p, adjusted, s)
            for (a, b), p, adjusted, s in zip(pairs, ps, holm(ps), same)]


def verdict(c: Comparison, lower: str = "lower", higher: str = "higher") -> str:
    """What a paired comparison supports: `lower`, `higher`, or not resolved (and why)."""
    if c.diff is None:
        return "not resolved (no pairs)"
    if c.identical:
        return "identical runs (not a test)"
    if c.diff.half is None:
        return "not resolved (n=1)"
    if not c.resolved:
        return f"not resolved (Holm p >= {ALPHA:g})"
    return lower if c.diff.mean < 0 else higher


def p_text(p: Optional[float]) -> str:
    """A p-value as the tables print it; n/a where there was no test."""
    return "n/a" if p is None else f"{p:.3g}"


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


# Per-run numbers


def final_loss(run: RunRecord, which: str) -> Optional[float]:
    """The run's final val loss of kind `which` (LOSSES); None when the run lacks the field,
    NaN when it diverged."""
    if run.diverged:
        return math.nan
    if which == "sampled":
        return run.final_val_loss_sampled
    return run.summary_value(LOSSES[which][0])


def failure(run: RunRecord, which: str, levels: Optional[dict]) -> Optional[str]:
    """Why the run failed, or None (docs/report.md, "Failed runs"): a non-finite loss, or a
    final loss above the unigram level (when levels are given) or above its step-0 loss."""
    if run.diverged:
        return "diverged (non-finite loss)"
    loss = final_loss(run, which)
    if run.partial or loss is None:
        return None
    if levels and loss > levels["unigram"]:
        return f"final loss {loss:.4f} above the unigram level {levels['unigram']:.4f}"
    init = run.loss_at_init
    if init is not None and loss > init:
        return f"final loss {loss:.4f} above its step-0 loss {init:.4f}"
    return None


def by_seed(runs: list[RunRecord], value: Callable[[RunRecord], Optional[float]]) -> dict:
    """seed -> value over the runs that have one (the first run of a seed counts)."""
    out = {}
    for r in runs:
        v = value(r)
        if v is not None and r.seed not in out:
            out[r.seed] = v
    return out


# Learning-rate sweeps


def clipped_loss(run: RunRecord, which: str) -> Optional[float]:
    """min(final loss, loss at init), a diverged run counting as its loss at init (Wortsman et
    al. 2023); None when the run lacks the loss or has no loss at init."""
    init = run.loss_at_init
    loss = final_loss(run, which)
    if init is None or loss is None:
        return None
    return init if not math.isfinite(loss) else min(loss, init)


def lr_table(runs: list[RunRecord], which: str) -> dict[float, dict]:
    """lr -> {seed: clipped loss} for one variant at one setting, LRs in increasing order."""
    table: dict[float, dict] = {}
    for r in sorted(runs, key=lambda r: r.lr):
        table.setdefault(r.lr, {})
    for lr in table:
        table[lr] = by_seed([r for r in runs if r.lr == lr], lambda r: clipped_loss(r, which))
    return table


def best_lr(table: dict[float, dict]) -> Optional[dict]:
    """The LR of lowest mean clipped loss, its interval, the LRs whose paired difference to it
    is not resolved (Holm over the comparisons with it), and whether it is at the grid's edge."""
    means = {lr: mean_interval(list(s.values())) for lr, s in table.items()}
    means = {lr: m for lr, m in means.items() if m is not None}
    if not means:
        return None
    best = min(means, key=lambda lr: means[lr].mean)
    others = [lr for lr in means if lr != best]
    tests = family([(table[lr], table[best]) for lr in others])
    return {"lr": best, "loss": means[best], "means": means,
            "tied": [lr for lr, c in zip(others, tests) if not c.resolved],
            "edge": best in (min(table), max(table))}


def survives_up_to(runs: list[RunRecord], which: str, levels: Optional[dict]) -> Optional[float]:
    """The largest LR at and below which no run of the group failed; None if none."""
    failed = [r.lr for r in runs if failure(r, which, levels) is not None]
    safe = [r.lr for r in runs if not failed or r.lr < min(failed)]
    return max(safe) if safe else None


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
    loss minus its minimum over the grid, for the seeds complete over the grid; none for a
    group of one LR, where it is 0 by construction and so not defined."""
    if len(table) <= 1:
        return {}
    return {seed: grid_mean_by_seed(table)[seed] - min(table[lr][seed] for lr in table)
            for seed in complete_seeds(table)}




# A scale at its own best LR, without the winner's curse
# The loss at the LR that minimised the mean loss over some seeds is biased low on those same
# seeds (their noise helped pick it). So the LR is chosen on one set of seeds and its loss is
# read on others: a split of the sweep's seeds, the runs of an earlier stage, or by default
# each seed at the LR that is best on the other seeds (leave one seed out).


@dataclass(frozen=True)
class Plan:
    """Where the LR is chosen and where its loss is read. select_runs: the runs of an earlier
    stage (--select-from), None for the sweep's own; select_seeds / report_seeds: the seeds
    of each side (None: every seed of select_runs / of the sweep). With neither seed set nor
    select_runs, each seed is reported at the LR chosen on the other seeds."""

    select_seeds: Optional[frozenset] = None
    report_seeds: Optional[frozenset] = None
    select_runs: Optional[list] = None
    select_name: str = ""

    @property
    def leave_one_out(self) -> bool:
        return self.select_runs is None and self.select_seeds is None \
            and self.report_seeds is None

    def reports(self, seed) -> bool:
        """Whether the loss at the chosen LR is read on this seed of the sweep."""
        if self.report_seeds is not None:
            return seed in self.report_seeds
        own = self.select_runs is None and self.select_seeds is not None
        return not (own and seed in self.select_seeds)  # a split: the seeds not selecting

    def selects(self, seed) -> bool:
        """Whether this seed's runs (of select_runs, else of the sweep) choose the LR."""
        if self.select_seeds is not None:
            return seed in self.select_seeds
        own = self.select_runs is None and self.report_seeds is not None
        return not (own and seed in self.report_seeds)  # a split: the seeds not reported


def only_seeds(table: dict[float, dict], keep) -> dict[float, dict]:
    """The LR table restricted to the seeds in keep (a set, or a predicate on the seed)."""
    test = keep if callable(keep) else keep.__contains__
    return {lr: {s: v for s, v in seeds.items() if test(s)} for lr, seeds in table.items()}


def matching_runs(groups: dict[tuple, list[RunRecord]], run: RunRecord) -> list[RunRecord]:
    """The runs of the group (of another set of runs) whose variant and settings are run's:
    every (key, value) of that group's key is the run's setting of that key."""
    for key, runs in groups.items():
        if key[0][1] == run.variant and all(run.setting(k) == v for k, v in key[1:]):
            return runs
    return []


def held_out(lr_runs: list[RunRecord], which: str, plan: Plan) -> dict[tuple, dict]:
    """Group key without the LR -> {"best": best_lr of the selection (None if it has no loss),
    "chosen": {seed: LR its loss is read at}, "runs": the runs read, "loss": {seed: clipped
    loss at the chosen LR}}. Every reported seed's LR was chosen without that seed's runs."""
    groups = group_runs(lr_runs, drop=(LR_KEY,))
    earlier = group_runs(plan.select_runs, drop=(LR_KEY,)) if plan.select_runs else {}
    out = {}
    for key, runs in groups.items():
        report = [r for r in runs if plan.reports(r.seed)]
        source = matching_runs(earlier, runs[0]) if plan.select_runs is not None else runs
        table = only_seeds(lr_table(source, which), plan.selects)
        best = best_lr(table)
        chosen = {}
        for seed in sorted({r.seed for r in report}, key=str):
            pick = best_lr(only_seeds(table, lambda s, held=seed: s != held)) \
                if plan.leave_one_out else best
            if pick is not None:
                chosen[seed] = pick["lr"]
        read = list(by_seed([r for r in report if chosen.get(r.seed) == r.lr],
                            lambda r: r).values())
        out[key] = {"best": best, "chosen": chosen, "runs": read, "grid": sorted(table),
                    "loss": by_seed(read, lambda r: clipped_loss(r, which))}
    return out
