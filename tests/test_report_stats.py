"""scripts/report/stats.py against published t-table values and numbers worked by hand."""

import math
from pathlib import Path

import pytest

from scripts.report import stats as st
from scripts.report.runs import Run

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


def test_t_cdf_is_symmetric_and_tends_to_the_normal():
    assert st.t_cdf(0.0, 3) == 0.5
    assert st.t_cdf(-1.3, 4) == pytest.approx(1 - st.t_cdf(1.3, 4), abs=1e-14)
    assert st.t_quantile(0.025, 7) == pytest.approx(-st.t_quantile(0.975, 7))
    assert st.t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError, match="strictly between"):
        st.t_quantile(1.0, 3)


def test_mean_interval_by_hand():
    # 1, 2, 3: mean 2, s = 1, half = t(0.975, 2) * 1 / sqrt(3) = 4.3026527 / 1.7320508
    iv = st.mean_interval([1.0, 2.0, 3.0])
    assert (iv.mean, iv.n) == (2.0, 3)
    assert iv.half == pytest.approx(2.4841377, abs=1e-6)
    assert iv.text() == "2.0000 ± 2.4841 (n=3)"
    one = st.mean_interval([1.5, math.nan, None])   # non-finite and missing values dropped
    assert (one.mean, one.half, one.n) == (1.5, None, 1)
    assert one.text() == "1.5000 (n=1, no interval)" and not one.excludes_zero()
    assert st.mean_interval([]) is None


def test_paired_difference_resolved_and_not():
    base = {"1": 1.90, "2": 2.30, "3": 2.15}
    # differences 0.10, 0.12, 0.11: mean 0.11, s = 0.01, half = 4.3026527 * 0.01 / sqrt(3)
    diff = st.paired_difference({"1": 2.00, "2": 2.42, "3": 2.26, "4": 9.0}, base)
    assert diff.n == 3 and diff.mean == pytest.approx(0.11)
    assert diff.half == pytest.approx(0.0248414, abs=1e-6)
    assert st.verdict(diff) == "higher"
    # differences 0.10, 0.20, 0.05: mean 0.11667, s = 0.076376, half = 0.18973: contains 0
    diff = st.paired_difference({"1": 2.00, "2": 2.50, "3": 2.20}, base)
    assert diff.half == pytest.approx(0.189731, abs=1e-5)
    assert st.verdict(diff) == "not resolved (interval contains 0)"
    # the unpaired seeds' spread would hide this; paired, -0.01 at every seed is resolved
    diff = st.paired_difference({s: v - 0.01 + 1e-3 * i for i, (s, v) in
                                 enumerate(base.items())}, base)
    assert st.verdict(diff, "lower than sqrt_dk") == "lower than sqrt_dk"
    assert st.verdict(st.paired_difference({"1": 1.0}, base)) == "not resolved (n=1)"
    assert st.verdict(st.paired_difference({"9": 1.0}, base)) == "not resolved (no pairs)"
    assert st.paired_difference({"1": math.nan, "2": 2.3}, base).n == 1


def fake_run(lr, seed, loss, *, init=4.0, diverged=False, full=True):
    summary = {"final_val_loss": loss, "diverged": diverged}
    if full:
        summary["final_val_loss_full"] = loss
    return Run(Path("."), {"optim.lr": str(lr), "trainer.seed": str(seed)}, "none", [],
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
    # 1e-3 minus 1e-2 is 1.0 and 1.1: mean 1.05, half 12.706 * 0.05 = 0.64 -> resolved
    assert best["tied"] == []
    sens = st.sensitivity_by_seed(table)
    assert sens == pytest.approx({"1": 4 / 3, "2": 4 / 3})
    assert st.grid_mean_by_seed(table) == pytest.approx({"1": 7 / 3, "2": 7.3 / 3})
    table[1e-1].pop("2")   # seed 2 no longer covers the grid
    assert list(st.sensitivity_by_seed(table)) == ["1"]
    assert st.loss_at_best_lr(table) == {"1": 1.0, "2": 1.1}


def test_best_lr_lists_the_lrs_it_is_not_resolved_from():
    runs = [fake_run(1e-3, 1, 2.0), fake_run(1e-3, 2, 1.9), fake_run(1e-2, 1, 1.95),
            fake_run(1e-2, 2, 2.05), fake_run(1e-1, 1, 3.0), fake_run(1e-1, 2, 2.95)]
    best = st.best_lr(st.lr_table(runs, "full"))
    assert best["lr"] == 1e-3 and best["tied"] == [1e-2]
    assert st.best_lr(st.lr_table([fake_run(1e-3, 1, 2.0, full=False)], "full")) is None
