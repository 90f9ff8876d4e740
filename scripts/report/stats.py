"""Statistics of the report (docs/report.md): 95% Student-t intervals, paired (same-seed)
t-tests as Holm families, which runs failed, and the learning-rate analyses of an LR sweep."""

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
    """The distinct (targets scored, in the split) of a whole-split loss on a subset."""
    counts = {tuple(r.summary_value(f"full_eval_{n}targets", int) for n in ("", "split_"))
              for r in runs}
    return sorted(c for c in counts if None not in c and c[0] < c[1])


def loss_name(which: str, runs: list[RunRecord]) -> str:
    """What a figure calls the loss `which` of these runs (a subset of the split says so)."""
    if which == "full" and subset_counts(runs):
        return "final val loss on a fixed\nsubset of the val split (nats)"
    return f"{LOSSES[which][1]} (nats)"


@dataclass(frozen=True)
class Interval:
    """Mean of n values with the half-width of its 95% t interval (None when n = 1)."""

    mean: float
    half: Optional[float]
    n: int
    lo = property(lambda self: self.mean - (self.half or 0.0))
    hi = property(lambda self: self.mean + (self.half or 0.0))

    def text(self, digits: int = 4) -> str:
        half = f" ± {self.half:.{digits}f}" if self.half is not None else ""
        return f"{self.mean:.{digits}f}{half} (n={self.n}{', no interval' if not half else ''})"


def t_quantile(p: float, df: float) -> float:
    return float(stats.t.ppf(p, df))


def mean_interval(values: list[float]) -> Optional[Interval]:
    """Mean and 95% t interval of the finite values; None when there are none."""
    values = [v for v in values if _finite(v)]
    n = len(values)
    if n < 2:
        return Interval(values[0], None, 1) if values else None
    sem = statistics.stdev(values) / math.sqrt(n)
    return Interval(statistics.fmean(values), t_quantile(0.5 + LEVEL / 2, n - 1) * sem, n)


def simultaneous(iv: Interval, m: int) -> Interval:
    """The interval widened to hold for all m of a family at once (Bonferroni: each at level
    1 - ALPHA / m), the bound a family-wise "not resolved" gives."""
    if iv.half is None or m <= 1:
        return iv
    df = iv.n - 1
    return Interval(iv.mean, iv.half * t_quantile(1 - ALPHA / (2 * m), df)
                    / t_quantile(0.5 + LEVEL / 2, df), iv.n)


def common_seeds(a: dict, b: dict) -> list:
    return sorted((s for s in a if s in b and _finite(a[s]) and _finite(b[s])), key=str)


def paired_difference(a: dict, b: dict) -> Optional[Interval]:
    return mean_interval([a[s] - b[s] for s in common_seeds(a, b)])


def paired_p(a: dict, b: dict) -> Optional[float]:
    """Two-sided p of the paired t-test (None below two pairs, 1 if all equal)."""
    if len(seeds := common_seeds(a, b)) < 2:
        return None
    with warnings.catch_warnings():   # differences all (nearly) equal: scipy warns, p stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue)
    return 1.0 if math.isnan(p) else p


def holm(pvalues: list[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (Holm 1979): the i-th smallest of m becomes max over
    j <= i of min(1, (m - j + 1) p_(j)). A None (no test) stays None, not counted in m."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted, running = [None] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """One paired difference of a family: its interval, p and Holm-adjusted p."""

    diff: Optional[Interval]
    p: Optional[float]
    p_holm: Optional[float]
    identical: bool = False   # every pair equal: the same runs twice, not a test
    resolved = property(lambda self: self.p_holm is not None and self.p_holm < ALPHA)


def identical(a: dict, b: dict) -> bool:
    """Whether a and b are equal at two or more common seeds: the same runs twice."""
    seeds = common_seeds(a, b)
    return len(seeds) >= 2 and all(a[s] == b[s] for s in seeds)


def family(pairs: list[tuple[dict, dict]], log: bool = False) -> list[Comparison]:
    """The comparisons a - b of one table, Holm-adjusted together; log: of logs."""
    if log:   # a ratio as a difference of logs
        pairs = [tuple({s: math.log(v) for s, v in d.items() if _finite(v) and v > 0}
                       for d in pair) for pair in pairs]
    same = [identical(a, b) for a, b in pairs]
    ps = [None if s else paired_p(a, b) for (a, b), s in zip(pairs, same)]
    return [Comparison(paired_difference(a, b), p, adjusted, s)
            for (a, b), p, adjusted, s in zip(pairs, ps, holm(ps), same)]


def verdict(c: Comparison, lower: str = "lower", higher: str = "higher", tie: str = "") -> str:
    """What a comparison supports: lower, higher, or not resolved (`tie` first)."""
    if c.diff is None:
        return "not resolved (no pairs)"
    if c.identical:
        return "identical runs (not a test)"
    if c.diff.half is None:
        return "not resolved (n=1)"
    if not c.resolved:
        return f"{tie}not resolved (Holm p >= {ALPHA:g})"
    return lower if c.diff.mean < 0 else higher


def p_text(p: Optional[float]) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def final_loss(run: RunRecord, which: str) -> Optional[float]:
    """The final val loss `which` (LOSSES); None if the run lacks it, NaN if it diverged."""
    if run.diverged or which == "sampled":
        return math.nan if run.diverged else run.final_val_loss_sampled
    return run.summary_value(LOSSES[which][0])


def failure(run: RunRecord, which: str, levels: Optional[dict]) -> Optional[str]:
    """Why the run failed (docs/report.md, "Failed runs"), or None."""
    if run.diverged:
        return "diverged (non-finite loss)"
    loss = final_loss(run, which)
    if run.partial or loss is None:
        return None
    if levels and loss > levels["unigram"]:
        return f"final loss {loss:.4f} above the unigram level {levels['unigram']:.4f}"
    if (init := run.loss_at_init) is not None and loss > init:
        return f"final loss {loss:.4f} above its step-0 loss {init:.4f}"
    return None


def by_seed(runs: list[RunRecord], value: Callable[[RunRecord], Optional[float]]) -> dict:
    """seed -> value over the runs that have one (the first run of a seed counts)."""
    out = {}
    for r in runs:
        if r.seed not in out and (v := value(r)) is not None:
            out[r.seed] = v
    return out


def clipped_loss(run: RunRecord, which: str) -> Optional[float]:
    """min(final loss, loss at init), a diverged run at its loss at init."""
    init, loss = run.loss_at_init, final_loss(run, which)
    if init is None or loss is None:
        return None
    return init if not math.isfinite(loss) else min(loss, init)


def lr_table(runs: list[RunRecord], which: str) -> dict[float, dict]:
    """lr -> {seed: clipped loss} for one variant at one setting, LRs in increasing order."""
    return {lr: by_seed([r for r in runs if r.lr == lr], lambda r: clipped_loss(r, which))
            for lr in sorted({r.lr for r in runs})}


def best_lr(table: dict[float, dict]) -> Optional[dict]:
    """The LR of lowest mean clipped loss, and the LRs not resolved from it (Holm)."""
    means = {lr: m for lr, s in table.items() if (m := mean_interval(list(s.values())))}
    if not means:
        return None
    best = min(means, key=lambda lr: means[lr].mean)
    others = [lr for lr in means if lr != best]
    tests = family([(table[lr], table[best]) for lr in others])
    return {"lr": best, "loss": means[best], "edge": best in (min(table), max(table)),
            "tied": [lr for lr, c in zip(others, tests) if not c.resolved]}


def survives_up_to(runs: list[RunRecord], which: str, levels: Optional[dict]) -> Optional[float]:
    """The largest LR at and below which no run of the group failed; None if none."""
    failed = [r.lr for r in runs if failure(r, which, levels) is not None]
    safe = [r.lr for r in runs if not failed or r.lr < min(failed)]
    return max(safe) if safe else None


def complete_seeds(table: dict[float, dict]) -> list:
    return sorted(set.intersection(*map(set, table.values())), key=str) if table else []


def grid_mean_by_seed(table: dict[float, dict]) -> dict:
    """seed -> mean clipped loss over the LR grid, for the seeds complete over the grid."""
    return {seed: statistics.fmean(table[lr][seed] for lr in table)
            for seed in complete_seeds(table)}


def sensitivity_by_seed(table: dict[float, dict]) -> dict:
    """seed -> the grid's mean clipped loss less its minimum (Wortsman et al. 2023)."""
    return {seed: grid_mean_by_seed(table)[seed] - min(table[lr][seed] for lr in table)
            for seed in complete_seeds(table)} if len(table) > 1 else {}


# A scale at its own best LR, without the winner's curse (docs/report.md): chosen on some
# seeds, read on others.


@dataclass(frozen=True)
class Plan:
    """Where the LR is chosen and read: select_runs (--select-from, None: the sweep's),
    select_seeds / report_seeds (None: all); none of them: leave one seed out."""

    select_seeds: Optional[frozenset] = None
    report_seeds: Optional[frozenset] = None
    select_runs: Optional[list] = None
    select_name: str = ""

    leave_one_out = property(lambda self: self.select_runs is None and self.select_seeds is None
                             and self.report_seeds is None)

    def reports(self, seed) -> bool:
        """Whether the chosen LR's loss is read on this seed (a split: the non-selecting)."""
        if self.report_seeds is not None:
            return seed in self.report_seeds
        return self.select_runs is not None or seed not in (self.select_seeds or ())

    def selects(self, seed) -> bool:
        """Whether this seed's runs (of select_runs, else of the sweep) choose the LR."""
        if self.select_seeds is not None:
            return seed in self.select_seeds
        return self.select_runs is not None or seed not in (self.report_seeds or ())


def only_seeds(table: dict[float, dict], keep) -> dict[float, dict]:
    return {lr: {s: v for s, v in seeds.items() if keep(s)} for lr, seeds in table.items()}


def matching_runs(groups: dict[tuple, list[RunRecord]], run: RunRecord) -> list[RunRecord]:
    """The runs of the group (of another set of runs) whose variant and settings are run's."""
    return next((runs for key, runs in groups.items() if key[0][1] == run.variant
                 and all(run.setting(k) == v for k, v in key[1:])), [])


def held_out(lr_runs: list[RunRecord], which: str, plan: Plan) -> dict[tuple, dict]:
    """Group key without LR -> {"best", "chosen" {seed: LR}, "runs" read, "loss" {seed:
    clipped loss}, "grid"}; no seed's LR is chosen on its own runs."""
    groups = group_runs(lr_runs, drop=(LR_KEY,))
    earlier = group_runs(plan.select_runs, drop=(LR_KEY,)) if plan.select_runs else {}
    out = {}
    for key, runs in groups.items():
        report = [r for r in runs if plan.reports(r.seed)]
        source = matching_runs(earlier, runs[0]) if plan.select_runs is not None else runs
        table = only_seeds(lr_table(source, which), plan.selects)
        best = best_lr(table)
        picks = {seed: best_lr(only_seeds(table, lambda s, held=seed: s != held))
                 if plan.leave_one_out else best for seed in sorted({r.seed for r in report},
                                                                    key=str)}
        chosen = {seed: pick["lr"] for seed, pick in picks.items() if pick is not None}
        read = list(by_seed([r for r in report if chosen.get(r.seed) == r.lr],
                            lambda r: r).values())
        out[key] = {"best": best, "chosen": chosen, "runs": read, "grid": sorted(table),
                    "loss": by_seed(read, lambda r: clipped_loss(r, which))}
    return out
