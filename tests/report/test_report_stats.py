"""scripts/report/stats.py against published t-table values and numbers worked by hand: t
intervals, paired t-tests, Holm's adjustment, failed runs and the held-out choice of an LR."""

import math
from pathlib import Path

import pytest

from scripts.report import stats as st
from scripts.report.runs import RunRecord

# Two-sided 95% (upper 0.975) and 99% (0.995) Student-t critical values, as printed in
# standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2), by degrees of freedom.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 30: 2.042,
         100: 1.984}
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 5: 4.032, 10: 3.169}


@pytest.mark.parametrize("df, t", T_975.items())
def test_t_quantile_975_matches_the_table(df, t):
    assert st.t_quantile(0.975, df) == pytest.approx(t, abs=6e-4)


@pytest.mark.parametrize("df, t", T_995.items())
def test_t_quantile_995_matches_the_table(df, t):
    assert st.t_quantile(0.995, df) == pytest.approx(t, abs=6e-4)


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.999])
def test_t_quantile_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(p):
    assert st.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert st.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)),
                                                rel=1e-9)


def test_t_quantile_is_symmetric_and_tends_to_the_normal():
    assert st.t_quantile(0.025, 7) == pytest.approx(-st.t_quantile(0.975, 7))
    assert st.t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)


def test_mean_interval_by_hand():
    # 1, 2, 3: mean 2, s = 1, half = t(0.975, 2) * 1 / sqrt(3) = 4.3026527 / 1.7320508
    iv = st.mean_interval([1.0, 2.0, 3.0])
    assert (iv.mean, iv.n) == (2.0, 3)
    assert iv.half == pytest.approx(2.4841377, abs=1e-6)
    assert iv.text() == "2.0000 ± 2.4841 (n=3)"
    one = st.mean_interval([1.5, math.nan, None])   # non-finite and missing values dropped
    assert (one.mean, one.half, one.n) == (1.5, None, 1)
    assert one.text() == "1.5000 (n=1, no interval)"
    assert st.mean_interval([]) is None


def test_paired_difference_resolved_and_not():
    base = {"1": 1.90, "2": 2.30, "3": 2.15}
    # differences 0.10, 0.12, 0.11: mean 0.11, s = 0.01, half = 4.3026527 * 0.01 / sqrt(3)
    diff = st.paired_difference({"1": 2.00, "2": 2.42, "3": 2.26, "4": 9.0}, base)
    assert diff.n == 3 and diff.mean == pytest.approx(0.11)
    assert diff.half == pytest.approx(0.0248414, abs=1e-6)
    assert st.verdict(one({"1": 2.00, "2": 2.42, "3": 2.26, "4": 9.0}, base)) == "higher"
    # differences 0.10, 0.20, 0.05: mean 0.11667, s = 0.076376, half = 0.18973: contains 0
    diff = st.paired_difference({"1": 2.00, "2": 2.50, "3": 2.20}, base)
    assert diff.half == pytest.approx(0.189731, abs=1e-5)
    assert st.verdict(one({"1": 2.00, "2": 2.50, "3": 2.20}, base)) == (
        "not resolved (Holm p >= 0.05)")
    # the unpaired seeds' spread would hide this; paired, -0.01 at every seed is resolved
    lower = {s: v - 0.01 + 1e-3 * i for i, (s, v) in enumerate(base.items())}
    assert st.verdict(one(lower, base), "lower than sqrt_dk") == "lower than sqrt_dk"
    assert st.verdict(one({"1": 1.0}, base)) == "not resolved (n=1)"
    assert st.verdict(one({"9": 1.0}, base)) == "not resolved (no pairs)"
    assert st.paired_difference({"1": math.nan, "2": 2.3}, base).n == 1


def one(a: dict, b: dict) -> st.Comparison:
    """A family of one comparison (Holm leaves its p as it is)."""
    return st.family([(a, b)])[0]


def test_paired_p_is_the_paired_t_test_by_hand():
    """Differences 0.10, 0.12, 0.11: t = 0.11 / (0.01 / sqrt 3) on 2 degrees of freedom, whose
    two-sided p has the closed form 1 - t / sqrt(2 + t^2)."""
    base = {"1": 1.90, "2": 2.30, "3": 2.15}
    t = 0.11 / (0.01 / math.sqrt(3))
    p = st.paired_p({"1": 2.00, "2": 2.42, "3": 2.26}, base)
    assert p == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-6)
    assert st.paired_p({"1": 2.0, "2": 2.1}, {"1": 2.0, "2": 2.1}) == 1.0   # all differences 0
    assert st.paired_p({"1": 2.0}, base) is None


def test_holm_by_hand():
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4). Sorted: 0.005 * 4 = 0.02, 0.01 * 3 = 0.03,
    0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> raised to the 0.06 before it (the step-down stops at
    the first p it cannot reject). In the given order: 0.03, 0.06, 0.06, 0.02."""
    assert st.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # a comparison without a test stays None and does not count in m
    assert st.holm([0.02, None, 0.04]) == [pytest.approx(0.04), None, pytest.approx(0.04)]
    assert st.holm([0.6, 0.7]) == [1.0, 1.0]   # capped at 1
    assert st.holm([]) == []


def test_family_resolves_only_below_the_holm_threshold():
    """Differences 0.10, 0.20, 0.14: mean 0.14667, s = 0.050332, t = 5.047 on 2 degrees of
    freedom, p = 1 - t / sqrt(2 + t^2) = 0.0371. Alone it is resolved; three such comparisons
    in one table are not (Holm multiplies the smallest p by 3)."""
    base = {"1": 0.0, "2": 0.0, "3": 0.0}
    group = {"1": 0.10, "2": 0.20, "3": 0.14}
    (c,) = st.family([(group, base)])
    m = 0.44 / 3
    t = m / (math.sqrt(((0.10 - m) ** 2 + (0.20 - m) ** 2 + (0.14 - m) ** 2) / 2) / math.sqrt(3))
    assert c.p == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-6)
    assert c.p == pytest.approx(0.0371, abs=1e-4) and c.resolved
    three = st.family([(group, base)] * 3)
    assert [x.p_holm for x in three] == pytest.approx([3 * c.p] * 3)
    assert not any(x.resolved for x in three)
    assert st.verdict(three[0]) == "not resolved (Holm p >= 0.05)"


def test_identical_runs_are_not_a_test_and_not_counted_in_the_family():
    """uniform attention never uses q and k, so its runs at two q/k initialisations are the
    same runs: their 'difference' is one observation read twice, not evidence of no effect."""
    same = {"1": 4.84, "2": 4.83, "3": 4.85}
    base = {"1": 0.0, "2": 0.0, "3": 0.0}
    group = {"1": 0.10, "2": 0.20, "3": 0.14}
    twin, real = st.family([(same, dict(same)), (group, base)])
    assert twin.identical and twin.p is None and twin.p_holm is None
    assert st.verdict(twin) == "identical runs (not a test)"
    (alone,) = st.family([(group, base)])
    assert real.p_holm == pytest.approx(alone.p)   # m = 1: the twin is not counted
    assert not st.identical({"1": 2.0}, {"1": 2.0})   # one pair: untested, not "identical"


def fake_run(lr, seed, loss, *, init=4.0, diverged=False, full=True):
    summary = {"final_val_loss": loss, "diverged": diverged}
    if full:
        summary["final_val_loss_full"] = loss
    return RunRecord(Path("."), {"optim.lr": str(lr), "trainer.seed": str(seed)}, "none", [],
               [{"kind": "eval", "step": 0, "val_loss": init},
                {"kind": "eval", "step": 5, "val_loss": loss}], summary, {})


def test_final_loss_is_none_when_the_whole_split_field_is_missing():
    assert st.final_loss(fake_run(1e-3, 1, 2.0), "full") == 2.0
    assert st.final_loss(fake_run(1e-3, 1, 2.0, full=False), "full") is None
    assert st.final_loss(fake_run(1e-3, 1, 2.0, full=False), "sampled") == 2.0
    assert math.isnan(st.final_loss(fake_run(1e-3, 1, 2.0, diverged=True), "full"))


def test_lr_table_best_lr_and_sensitivity_by_hand():
    """Seed 1: losses 2, 1, diverged (-> init 4) at three LRs; seed 2: 2.2, 1.1, 5 (-> 4).
    Sensitivity per seed: mean(1, 0, 3) = 4/3 and mean(1.1, 0, 2.9) = 4/3."""
    runs = [fake_run(1e-3, 1, 2.0), fake_run(1e-2, 1, 1.0), fake_run(1e-1, 1, 7.0, diverged=True),
            fake_run(1e-3, 2, 2.2), fake_run(1e-2, 2, 1.1), fake_run(1e-1, 2, 5.0)]
    table = st.lr_table(runs, "full")
    assert table == {1e-3: {"1": 2.0, "2": 2.2}, 1e-2: {"1": 1.0, "2": 1.1},
                     1e-1: {"1": 4.0, "2": 4.0}}
    best = st.best_lr(table)
    assert best["lr"] == 1e-2 and best["loss"].mean == pytest.approx(1.05)
    # against 1e-2: 1e-3 gives 1.0, 1.1 (t = 1.05 / 0.05 = 21 on 1 df, p = 1 - 2 atan(21) / pi
    # = 0.0303), 1e-1 gives 3.0, 2.9 (t = 59, p = 0.0108); Holm: 0.0216 and 0.0303 -> resolved
    assert best["tied"] == []
    sens = st.sensitivity_by_seed(table)
    assert sens == pytest.approx({"1": 4 / 3, "2": 4 / 3})
    assert st.grid_mean_by_seed(table) == pytest.approx({"1": 7 / 3, "2": 7.3 / 3})
    assert not best["edge"]
    table[1e-1].pop("2")   # seed 2 no longer covers the grid
    assert list(st.sensitivity_by_seed(table)) == ["1"]
    assert st.sensitivity_by_seed({1e-2: {"1": 1.0, "2": 1.1}}) == {}   # one LR: not defined


def test_best_lr_lists_the_lrs_it_is_not_resolved_from():
    runs = [fake_run(1e-3, 1, 2.0), fake_run(1e-3, 2, 1.9), fake_run(1e-2, 1, 1.95),
            fake_run(1e-2, 2, 2.05), fake_run(1e-1, 1, 3.0), fake_run(1e-1, 2, 2.95)]
    best = st.best_lr(st.lr_table(runs, "full"))
    assert best["lr"] == 1e-3 and best["tied"] == [1e-2]
    assert st.best_lr(st.lr_table([fake_run(1e-3, 1, 2.0, full=False)], "full")) is None


def test_failure_rules():
    levels = {"unigram": 3.0, "bigram": 2.5, "trigram": 2.0}
    assert st.failure(fake_run(1e-3, 1, 2.0), "full", levels) is None
    assert st.failure(fake_run(1e-3, 1, 2.0, diverged=True), "full", None).startswith("diverged")
    above_unigram = fake_run(1e-3, 1, 3.5)   # below its step-0 loss 4.0
    assert "unigram" in st.failure(above_unigram, "full", levels)
    assert st.failure(above_unigram, "full", None) is None   # no levels: rule not applied
    above_init = fake_run(1e-3, 1, 4.5)
    assert "step-0 loss 4.0000" in st.failure(above_init, "full", None)
    assert st.failure(fake_run(1e-3, 1, 4.0), "full", None) is None   # equal is not above
    # without the whole-split loss only the non-finite rule applies to the full loss
    assert st.failure(fake_run(1e-3, 1, 4.5, full=False), "full", None) is None
    assert st.failure(fake_run(1e-3, 1, 4.5, full=False), "sampled", None) is not None


def grid_runs(losses: dict) -> list:
    """losses: lr -> [loss of seed 1, 2, 3]."""
    return [fake_run(lr, seed, loss) for lr, row in losses.items()
            for seed, loss in enumerate(row, start=1)]


# seed 3 alone prefers 1e-2; seeds 1 and 2 prefer 1e-3 (means 1.3 vs 1.4 on those two)
GRID = {1e-4: [3.0, 3.0, 3.0], 1e-3: [1.0, 1.6, 2.0], 1e-2: [1.5, 1.3, 1.0],
        1e-1: [3.5, 3.5, 3.5]}


def test_held_out_leave_one_seed_out_by_hand():
    """Seed 1 left out: seeds 2, 3 mean 1.8 at 1e-3, 1.15 at 1e-2 -> 1e-2, loss 1.5.
    Seed 2 left out: seeds 1, 3: 1.5 vs 1.25 -> 1e-2, loss 1.3. Seed 3 left out: seeds 1, 2:
    1.3 vs 1.4 -> 1e-3, loss 2.0. The same-seed best (1e-2, mean 1.2667) reads lower."""
    (held,) = st.held_out(grid_runs(GRID), "full", st.Plan()).values()
    assert held["chosen"] == {"1": 1e-2, "2": 1e-2, "3": 1e-3}
    assert held["loss"] == {"1": 1.5, "2": 1.3, "3": 2.0}
    assert held["best"]["lr"] == 1e-2 and not held["best"]["edge"]
    assert {r.seed: r.lr for r in held["runs"]} == held["chosen"]


def test_held_out_split_and_earlier_stage():
    plan = st.Plan(select_seeds=frozenset({"1", "2"}))   # report: the other seed, 3
    (held,) = st.held_out(grid_runs(GRID), "full", plan).values()
    assert held["best"]["lr"] == 1e-3 and held["chosen"] == {"3": 1e-3}
    assert held["loss"] == {"3": 2.0}
    plan = st.Plan(report_seeds=frozenset({"1"}))        # chosen on seeds 2, 3: 1e-2
    (held,) = st.held_out(grid_runs(GRID), "full", plan).values()
    assert held["chosen"] == {"1": 1e-2} and held["loss"] == {"1": 1.5}
    stage1 = grid_runs({1e-3: [2.0, 2.0, 2.0], 1e-2: [1.0, 1.1, 0.9]})   # picks 1e-2 (edge)
    stage2 = [fake_run(lr, seed, 1.7 + seed / 10) for lr in (1e-3, 1e-2) for seed in (4, 5)]
    (held,) = st.held_out(stage2, "full", st.Plan(select_runs=stage1)).values()
    assert held["best"]["lr"] == 1e-2 and held["best"]["edge"]
    assert held["loss"] == pytest.approx({"4": 2.1, "5": 2.2})
    assert {r.lr for r in held["runs"]} == {1e-2}


class Counts:
    """A run's two summary counts of the whole-split evaluation, as RunRecord reads them."""

    def __init__(self, targets, split_targets):
        self.counts = {"full_eval_targets": targets, "full_eval_split_targets": split_targets}

    def summary_value(self, name, kind):
        return self.counts[name]


def test_the_figures_name_a_whole_split_loss_on_a_subset_for_what_it_is():
    subset = st.loss_name("full", [Counts(542416, 542416), Counts(131072, 542416)])
    assert subset == "final val loss on a fixed\nsubset of the val split (nats)"
    for runs in ([Counts(542416, 542416)], [Counts(None, None)]):
        assert st.loss_name("full", runs) == "whole-split final val loss (nats)"
    assert st.loss_name("sampled", [Counts(131072, 542416)]) == "sampled final val loss (nats)"
