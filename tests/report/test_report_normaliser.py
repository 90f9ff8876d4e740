"""Runs that vary scaling.normaliser (scripts/report/normaliser.py; style.Arms): the tables of
the registered questions against a hand computation (scipy's t and paired t-test, Holm by hand)
on committed fixtures of real shrunk runs, reported as configs/experiment/normaliser.yaml's
header says: 40-step runs (trainer.eval_every=10, trainer.eval_iters=2, optim.warmup_steps=5,
trainer.full_eval_tokens=4096, one thread) of experiment=normaliser_select on seed 101 at LRs
0.005, 0.01 and 0.04 (runs.csv only: lr_transfer.png reads no curves), and of
experiment=normaliser on seeds 1-3, each arm at the LR that stage chose (0.01 for sqrt_dk with
softmax1, 0.005 for the others), uniform attention included. The figure contract of
normaliser.png, lr_transfer.png and loss_vs_baseline.png on them: test_figure_contract.py."""

import csv
import math
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from conftest import report_in_process, table_row  # noqa: E402
from scipy import stats  # noqa: E402

from scripts.report import stats as st  # noqa: E402
from scripts.report.figures import Frame, plot_lr  # noqa: E402
from scripts.report.normaliser import normaliser_sections, plot_normaliser  # noqa: E402
from scripts.report.runs import LR_KEY, NORMALISER_KEY, group_runs  # noqa: E402
from scripts.report.runs_csv import read_runs_csv  # noqa: E402
from scripts.report.style import Arms  # noqa: E402
from scripts.report.tables import Reading  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
STAGE_2, STAGE_1 = FIXTURES / "normaliser" / "runs.csv", FIXTURES / "normaliser_select" / "runs.csv"
NORMALISERS = ("softmax", "softmax1", "sink", "sigmoid")
ARMS = {(scale, n): scale + ("" if n == "softmax" else f", {n}")
        for scale in ("sqrt_dk", "none") for n in NORMALISERS} | {("uniform", "softmax"): "uniform"}
CHOSEN = {arm: 0.01 if arm == ("sqrt_dk", "softmax1") else 0.005 for arm in ARMS}
SEEDS = ("1", "2", "3")
REPORT = ("--select-from", STAGE_1, "--against", "scaling=sqrt_dk,scaling.normaliser=softmax")


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def column(arm: tuple, name: str) -> np.ndarray:
    """A column of the stage-2 runs of an arm, seeds 1, 2, 3 in order."""
    found = {r["trainer.seed"]: float(r[name]) for r in rows(STAGE_2)
             if (r["scaling"], r[NORMALISER_KEY]) == arm}
    return np.array([found[s] for s in SEEDS])


def interval(values) -> str:
    """mean ± t(0.975, n - 1) s / sqrt(n), as the tables write it."""
    v = np.asarray(values, float)
    half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return f"{v.mean():.4f} ± {half:.4f}"


def holm(ps: list[float]) -> list[float]:
    """Holm 1979 by hand: the i-th smallest of m times m - i, running maximum, at most 1."""
    order, out, top = np.argsort(ps), [0.0] * len(ps), 0.0
    for i, j in enumerate(order):
        top = max(top, min(1.0, (len(ps) - i) * ps[j]))
        out[j] = top
    return out


def p_text(p: float) -> str:
    return f"{p:.3g}"


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    """results.md's "Normalisers" section of the preset's report command, by subsection."""
    out = tmp_path_factory.mktemp("normaliser")
    assert report_in_process("--from-csv", STAGE_2, "--out", out, "--figures",
                             "normaliser.png", *REPORT) == 0
    text = (out / "results.md").read_text()
    return text, dict(part.split("\n", 1) for part in text.split("## Normalisers")[1]
                      .split("\n### ")[1:])


def test_an_arm_is_its_scale_and_normaliser_softmax_the_default():
    runs, _ = read_runs_csv(STAGE_2)
    keys = list(group_runs(runs, drop=(LR_KEY,)))
    for arms in (Arms.of(keys), Arms.of(keys, {"scaling", NORMALISER_KEY})):
        names = {(dict(k)["scaling"], dict(k)[NORMALISER_KEY]): arms.name(k) for k in keys}
        assert names == ARMS
        assert {arms.setting(k) for k in keys} == {()}   # the normaliser is no panel
        assert len({look[0] for look in arms.looks(keys).values()}) == len(ARMS)
    # a run written before scaling.normaliser existed used softmax: its arm is the scale's own
    old = ((("scaling", "sqrt_dk"), (NORMALISER_KEY, None)), (("scaling", "none"),
                                                              (NORMALISER_KEY, "sink")))
    assert [Arms.of(old).name(k) for k in old] == ["sqrt_dk", "none, sink"]


def test_each_arm_gets_its_own_lr_from_the_selection_stage():
    """The LR of lowest clipped whole-split loss on seed 101, arm by arm, by hand; the report
    reads each arm's stage-2 runs at it."""
    best = {}
    for r in rows(STAGE_1):
        loss = min(float(r["final_val_loss_full"]), float(r["init_val_loss"]))
        arm = (r["scaling"], r[NORMALISER_KEY])
        best[arm] = min(best.get(arm, (math.inf, 0.0)), (loss, float(r["optim.lr"])))
    assert {arm: lr for arm, (_, lr) in best.items()} == CHOSEN
    runs, select = read_runs_csv(STAGE_2)[0], read_runs_csv(STAGE_1)[0]
    held = st.held_out(runs, "full", st.Plan(select_runs=select))
    found = {(dict(k)["scaling"], dict(k)[NORMALISER_KEY]): h for k, h in held.items()}
    assert {arm: set(h["chosen"].values()) for arm, h in found.items()} == {
        arm: {lr} for arm, lr in CHOSEN.items()}
    assert all(sorted(r.seed for r in h["runs"]) == list(SEEDS) for h in found.values())


def test_lr_transfer_draws_each_arm_in_one_panel():
    runs, _ = read_runs_csv(STAGE_1)
    keys = group_runs(runs, drop=(LR_KEY,))
    arms = Arms.of(keys)
    fig = plot_lr(Frame(arms, arms.looks(keys)), runs, "full")
    (ax,) = fig.axes
    assert sorted(c.get_label() for c in ax.containers) == sorted(ARMS.values())
    for bars in ax.containers:   # each arm at its three LRs, the mean of its one seed
        arm = next(a for a, name in ARMS.items() if name == bars.get_label())
        xs, ys = bars.lines[0].get_data()
        by_lr = {float(r["optim.lr"]): min(float(r["final_val_loss_full"]),
                                           float(r["init_val_loss"]))
                 for r in rows(STAGE_1) if (r["scaling"], r[NORMALISER_KEY]) == arm}
        assert list(xs) == sorted(by_lr) and list(ys) == pytest.approx(
            [by_lr[x] for x in sorted(by_lr)], rel=1e-12)


def test_do_sinks_form_step_0_against_the_end_by_hand(section):
    _, parts = section
    registered, others = parts["Do sinks form?"].split("Every other arm")
    tests = {}
    for arm in ARMS:
        start, end = column(arm, "first_attn_first_mass"), column(arm, "attn_first_mass")
        same = np.array_equal(start, end)
        tests[arm] = (start, end, None if same else stats.ttest_rel(end, start).pvalue)
    others_p = [p for arm, (_, _, p) in tests.items() if arm != ("sqrt_dk", "softmax")
                and p is not None]
    adjusted = dict(zip([a for a, t in tests.items() if a != ("sqrt_dk", "softmax")
                         and t[2] is not None], holm(others_p)))
    adjusted[("sqrt_dk", "softmax")] = tests[("sqrt_dk", "softmax")][2]   # a family of 1
    for arm, (start, end, p) in tests.items():
        part = registered if arm == ("sqrt_dk", "softmax") else others
        group = f"scaling={arm[0]}, {arm[1]}"
        row = table_row(part, group)
        rates = [interval(column(arm, c)) for c in ("first_attn_sink_rate", "attn_sink_rate")]
        assert row[1:5] == ["3", interval(start), interval(end), interval(end - start)]
        assert row[7:9] == rates
        if p is None:   # uniform attention: the same weights at every step
            assert row[5:7] == ["n/a", "n/a"] and row[9] == "identical runs (not a test)"
            continue
        assert row[5:7] == [p_text(p), p_text(adjusted[arm])]
        d = end - start
        upper = d.mean() + stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
        assert row[9] == ("resolved above step 0" if adjusted[arm] < 0.05 and d.mean() > 0
                           else f"interval up to {upper:+.4f}; not resolved (Holm p >= 0.05)")
    assert "Family: 1 paired t-tests" in registered
    assert ("Family: 7 paired t-tests, Holm-adjusted together; 1 of identical runs" in others)
    # step 0 of softmax at sqrt_dk is near uniform weights over 64 keys, H_64 / 64
    assert "H_T / T = 0.0741" in registered


def test_each_normaliser_minus_softmax_at_the_same_scale_a_family_of_6(section):
    part = section[1]["Do softmax1, sink and sigmoid lower it?"]
    arms = [(s, n) for s in ("sqrt_dk", "none") for n in NORMALISERS[1:]]
    ps = [stats.ttest_rel(column(a, "attn_first_mass"),
                          column((a[0], "softmax"), "attn_first_mass")).pvalue for a in arms]
    for arm, p, p_holm in zip(arms, ps, holm(ps)):
        mine, theirs = (column(a, "attn_first_mass") for a in (arm, (arm[0], "softmax")))
        rate = [column(a, "attn_sink_rate") for a in (arm, (arm[0], "softmax"))]
        row = table_row(part, f"scaling={arm[0]}, {arm[1]}")
        assert row[1:7] == ["3", interval(mine), interval(theirs), interval(mine - theirs),
                            p_text(p), p_text(p_holm)]
        assert row[7] == ("not resolved (Holm p >= 0.05)" if p_holm >= 0.05 else
                          "lower than softmax" if (mine - theirs).mean() < 0
                          else "higher than softmax")
        # the gap less the gap at step 0, where softmax1's and sink's extra slot already
        # takes weight from every key
        start = [column(a, "first_attn_first_mass") for a in (arm, (arm[0], "softmax"))]
        assert row[8] == interval((mine - start[0]) - (theirs - start[1]))
        assert row[9] == interval(rate[0] - rate[1])
    assert "Family: 6 paired t-tests, Holm-adjusted together." in part
    assert len([line for line in part.splitlines() if line.startswith("| scaling=")]) == 6


def test_the_scale_effect_per_normaliser_and_its_interaction_a_family_of_3(section):
    part = section[1]["Does the scale's effect change with the normaliser?"]
    loss = "final_val_loss_full"
    effect = {n: column(("none", n), loss) - column(("sqrt_dk", n), loss) for n in NORMALISERS}
    ratio = {n: np.log(column(("none", n), loss) / column(("sqrt_dk", n), loss))
             for n in NORMALISERS}
    row = table_row(part, "softmax")
    assert row[1:5] == ["3", interval(effect["softmax"]),
                        f"{math.exp(ratio['softmax'].mean()):.4g}", "reference"]
    # the family-wise interval: each of the 3 at level 1 - 0.05 / 3 (Bonferroni)
    t3 = stats.t.ppf(1 - 0.05 / 6, 2)
    ps = [stats.ttest_rel(effect[n], effect["softmax"]).pvalue for n in NORMALISERS[1:]]
    logs = [stats.ttest_rel(ratio[n], ratio["softmax"]).pvalue for n in NORMALISERS[1:]]
    for n, p, p_holm, lp, lp_holm in zip(NORMALISERS[1:], ps, holm(ps), logs, holm(logs)):
        row = table_row(part, n)
        d = effect[n] - effect["softmax"]
        assert row[1:5] == ["3", interval(effect[n]), f"{math.exp(ratio[n].mean()):.4g}",
                            interval(d)]
        wide = t3 * d.std(ddof=1) / math.sqrt(3)
        assert row[5] == f"{d.mean() - wide:+.4f} to {d.mean() + wide:+.4f}"
        r = ratio[n] - ratio["softmax"]
        h = stats.t.ppf(0.975, 2) * r.std(ddof=1) / math.sqrt(3)
        assert row[6:11] == [p_text(p), p_text(p_holm), "{:.4g} ({:.4g} to {:.4g})".format(
            *np.exp([r.mean(), r.mean() - h, r.mean() + h])), p_text(lp), p_text(lp_holm)]
        assert row[11] == "not resolved (Holm p >= 0.05)"   # ratios within 2x: the difference
        assert p_holm >= 0.05
    assert "Family: 3 paired t-tests, Holm-adjusted together." in part
    assert "Family: 3 paired t-tests of log loss, Holm-adjusted together." in part


def test_sink_weight_and_residual_stream_by_hand(section):
    sink, residual = (section[1][k] for k in ("The sink's own weight", "The residual stream"))
    groups = [line.split("|")[1].strip() for line in sink.splitlines()
              if line.startswith("| scaling=")]
    assert groups == [f"scaling={s}, {n}" for s in ("sqrt_dk", "none")
                      for n in ("sink", "softmax1")]
    for arm in [(s, n) for s in ("sqrt_dk", "none") for n in ("softmax1", "sink")]:
        assert table_row(sink, f"scaling={arm[0]}, {arm[1]}")[1:] == [
            "3", interval(column(arm, "first_attn_sink_weight")),
            interval(column(arm, "attn_sink_weight"))]
    row = table_row(residual, "scaling=sqrt_dk, softmax")
    top = column(("sqrt_dk", "softmax"), "hidden_top1")
    half = stats.t.ppf(0.975, 2) * top.std(ddof=1) / math.sqrt(3)
    digits = max(0, 3 - math.floor(math.log10(abs(top.mean()))))   # 4 significant digits
    assert row[1:3] == ["3", f"{top.mean():.{digits}f} ± {half:.{digits}f}"]
    assert len([line for line in residual.splitlines() if line.startswith("| scaling=")]) == 9


def test_the_loss_table_of_each_arm_against_softmax_at_sqrt_dk_is_a_family_of_8(section):
    """The registered loss table: the LR section's own-LR pairs against --against's reference,
    seven arms and uniform attention, beside the reference levels."""
    text, _ = section
    part = text.split("against `sqrt_dk, softmax` at the same setting")[1].split("The same")[0]
    assert "Family: 8 paired t-tests, Holm-adjusted together." in part
    loss = "final_val_loss_full"
    ps = {arm: stats.ttest_rel(column(arm, loss), column(("sqrt_dk", "softmax"), loss)).pvalue
          for arm in ARMS if arm != ("sqrt_dk", "softmax")}
    for (arm, p), p_holm in zip(ps.items(), holm(list(ps.values()))):
        row = table_row(part, arm[1], arm[0])
        diff = column(arm, loss) - column(("sqrt_dk", "softmax"), loss)
        assert row[2:6] == ["3", interval(diff), p_text(p), p_text(p_holm)]
    assert "unigram 3.3234, bigram 2.5083, trigram 2.0542" in part


def test_no_section_without_normaliser_runs():
    runs, _ = read_runs_csv(FIXTURES / "length_text" / "runs.csv")
    assert normaliser_sections(runs, [], Reading("full", "sqrt_dk")) == ""
    runs, _ = read_runs_csv(STAGE_2)   # one normaliser only: nothing varies
    softmax = [r for r in runs if r.setting(NORMALISER_KEY) == "softmax"]
    assert normaliser_sections(softmax, [], Reading("full", "sqrt_dk")) == ""
    assert normaliser_sections(runs, [], Reading("full", "sqrt_dk")).startswith(
        "\n## Normalisers")


def test_the_figure_draws_each_arm_with_its_interval_cut_to_0_1():
    runs, levels = read_runs_csv(STAGE_2)
    keys = group_runs(runs, drop=(LR_KEY,))
    arms = Arms.of(keys)
    fig = plot_normaliser(Frame(arms, arms.looks(keys), "", levels), keys, "full")
    mass, loss = fig.axes
    for ax, name in ((mass, "attn_first_mass"), (loss, "final_val_loss_full")):
        drawn = {c.get_label().split(", lr ")[0]: c for c in ax.containers}
        assert sorted(drawn) == sorted(ARMS.values())
        for arm, text in ARMS.items():
            bars, values = drawn[text], column(arm, name)
            assert bars.lines[0].get_ydata()[0] == pytest.approx(values.mean(), rel=1e-12)
            half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
            if half == 0:   # uniform attention's weights: no bar
                assert not bars.lines[2]
                continue
            lo, hi = bars.lines[2][0].get_segments()[0][:, 1]
            assert (lo, hi) == pytest.approx((max(values.mean() - half, 0.0),
                                              values.mean() + half), rel=1e-9, abs=1e-12)
    # none with sigmoid spreads below 0 at n = 3: its bar stops at 0
    assert min(s[0][1] for c in mass.containers for bars in c.lines[2]
               for s in bars.get_segments()) == 0.0
    step0 = [line for line in mass.lines if line.get_label().startswith("sqrt_dk's mean")]
    assert step0[0].get_ydata()[0] == pytest.approx(
        column(("sqrt_dk", "softmax"), "first_attn_first_mass").mean())
    assert [t.get_text() for t in mass.get_xticklabels()] == [   # sigmoid's weight: no share
        n if n != "sigmoid" else "sigmoid\n(absolute weight)" for n in NORMALISERS]
