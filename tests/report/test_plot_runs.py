"""scripts/plot_runs.py's main, in this process, on small fake sweeps made here: files exist,
table numbers match the inputs and the statistics of scripts/report/stats.py, only the folders
named are read. Its command line (exit codes, printed report): tests/e2e/test_report_cli.py.

The tests of the tables use `tables_only` (plot_runs draws no figure); those of which figures
are written, `unrendered_figures` (the figures are built, savefig writes a placeholder); the
one-seed LR sweep's report renders every step figure and an LR figure."""

import contextlib
import io
import itertools
import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    N_LAYER,
    T975,
    FakeRun,
    curve,
    interval,
    make_run,
    report_in_process,
    table_row,
    tables_of,
    unrendered_savefig,
    without_figures,
)
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from scipy.stats import ttest_rel

from scripts.report import figures, style
from scripts.report import stats as st
from scripts.report.runs import LR_KEY, group_runs, load_runs


def printed_report(*args, levels=None) -> str:
    """report_in_process, which must succeed; what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert report_in_process(*args, levels=levels) == 0
    return printed.getvalue()


@contextlib.contextmanager
def unrendered():
    """unrendered_figures for a module-scoped fixture."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", unrendered_savefig)
        yield


FULL = {("sqrt_dk", 1): 1.90, ("sqrt_dk", 2): 1.95, ("sqrt_dk", 3): 1.93,
        ("none", 1): 1.80, ("none", 2): 1.86, ("none", 3): 1.82,   # lower at every seed
        ("dk", 1): 1.91, ("dk", 2): 1.90, ("dk", 3): 1.98}          # mixed: not resolved


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    """scale x seed: a partial run, a diverged one, one without the whole-split loss, a run
    without metrics and one with an empty metrics file. Read only."""
    sweep = (tmp_path_factory.mktemp("ablation") / "multirun" / "scaling_ablation"
             / "2026-12-01_10-00-00")
    for (scaling, seed), full in FULL.items():
        make_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"],
                 curve(4.1701, full + 0.05, 4, seed), full=full,
                 fake=FakeRun(variant_scale={"none": 8.0, "dk": 0.125}.get(scaling, 1.0)))
    make_run(sweep, ["scaling=learned", "trainer.seed=1"], [4.17, 2.0, 1.9], full=1.9)
    make_run(sweep, ["scaling=learned", "trainer.seed=2"], [4.17, 2.0, 1.95])   # no full loss
    make_run(sweep, ["scaling=learned", "trainer.seed=3"], [4.17, 9.0, 12.0],
             fake=FakeRun(diverged=True))
    running = make_run(sweep, ["scaling=qk_norm", "trainer.seed=1"], [4.17, 2.2],
                       fake=FakeRun(finished=False))
    metrics = running / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"kind": "train", "st')   # caught mid-write
    make_run(sweep, ["scaling=constant", "trainer.seed=1"], [4.17, 2.0],
             fake=FakeRun(metrics="missing"))
    make_run(sweep, ["scaling=constant", "trainer.seed=2"], [4.17, 2.0],
             fake=FakeRun(metrics="empty"))
    return sweep


@pytest.fixture(scope="module")
def ablation_report(ablation, tmp_path_factory):
    """The report of the ablation sweep, figures unrendered: (out folder, results.md, what it
    printed)."""
    out = tmp_path_factory.mktemp("ablation_out")
    with unrendered():
        printed = printed_report(ablation, "--out", out)
    return out, (out / "results.md").read_text(), printed


def test_results_table_gives_intervals_n_and_says_when_the_whole_split_loss_is_missing(
        ablation_report):
    out, text, printed = ablation_report
    assert text in printed
    sq = table_row(text, "scaling=sqrt_dk")
    full = [FULL[("sqrt_dk", s)] for s in (1, 2, 3)]
    assert sq[1] == "3" and sq[2] == f"{interval(full)} (n=3)"
    assert sq[3] == f"{interval([f + 0.05 for f in full])} (n=3)"   # sampled, labelled so
    learned = table_row(text, "scaling=learned")
    assert learned[2] == "missing: 1 of 2 runs lack final_val_loss_full"
    assert learned[5] == "1"                                         # diverged
    qk = table_row(text, "scaling=qk_norm")
    assert qk[2] == "missing: 1 of 1 runs lack final_val_loss_full (1 still running)"
    assert qk[6] == "1" and qk[8] == "10"   # still running: at its last eval
    assert sq[8] == "30" and learned[8] == "20"   # the horizon: summary.json steps
    assert "whole-split final val loss" in text.splitlines()[6]
    skipped = text.split("## Skipped")[1]
    assert "scaling=constant,trainer.seed=1: no metrics.jsonl" in skipped
    assert "scaling=constant,trainer.seed=2: empty metrics.jsonl" in skipped
    assert "qk_norm" not in skipped   # its torn last line is dropped, the run is read
    for name in ("loss_curves.png", "diagnostics.png", "qk_grad_norms.png"):
        assert (out / name).stat().st_size > 0
    assert not (out / "lr_transfer.png").exists()   # no LR axis in this sweep


def test_paired_table_claims_an_order_only_when_the_holm_p_is_below_005(ablation_report):
    paired = ablation_report[1].split("## Paired differences")[1]
    paired = paired.split("## Attention")[0]
    none = table_row(paired, "all", "none")
    base = [FULL[("sqrt_dk", s)] for s in (1, 2, 3)]
    mine = [FULL[("none", s)] for s in (1, 2, 3)]
    p_none = ttest_rel(mine, base).pvalue
    assert none[2:4] == ["3", interval(np.subtract(mine, base))]
    dk = table_row(paired, "all", "dk")
    p_dk = ttest_rel([FULL[("dk", s)] for s in (1, 2, 3)], base).pvalue
    assert dk[3] == interval([FULL[("dk", s)] - FULL[("sqrt_dk", s)] for s in (1, 2, 3)])
    # family: none and dk tested (m = 2); learned (one pair) and qk_norm (none) untested
    assert (none[4], dk[4]) == (f"{p_none:.3g}", f"{p_dk:.3g}")
    assert p_none < p_dk and none[5] == f"{2 * p_none:.3g}"   # Holm: the smaller p times 2,
    assert dk[5] == f"{max(p_dk, 2 * p_none):.3g}"             # the larger times 1, kept monotone
    assert none[6] == "lower than sqrt_dk" and dk[6] == "not resolved (Holm p >= 0.05)"
    learned = table_row(paired, "all", "learned")   # seed 1 only has a whole-split loss
    assert learned[2] == "1" and learned[4:] == ["n/a", "n/a", "not resolved (n=1)"]
    qk = table_row(paired, "all", "qk_norm")   # still running: no whole-split loss
    assert qk[2] == "0" and qk[6] == "not resolved (no pairs)"
    assert "Family: 2 paired t-tests, Holm-adjusted together; 2 more without two pairs" in paired


def test_diagnostics_tables_give_scaled_and_raw_statistics(ablation_report):
    text = ablation_report[1]
    last = text.split("### Last evaluation")[1]
    row = table_row(last, "scaling=none")
    finals = np.array([FULL[("none", s)] + 0.05 for s in (1, 2, 3)])
    top = 10 ** N_LAYER   # raw max |q.k| of the last layer, per unit of val loss

    def iv3(values, decimals):   # four significant digits of the mean
        v = np.asarray(values)
        half = T975[3] * v.std(ddof=1) / math.sqrt(3)
        return f"{v.mean():.{decimals}f} ± {half:.{decimals}f}"

    assert row[1:4] == ["3", "30", "1.050 ± 0.000"]
    assert row[4] == "0.005000 ± 0.000000"   # mean over layers of 0.00, 0.01
    assert row[5] == iv3(finals * top * 8.0, 0) and row[6] == iv3(finals * top, 1)
    assert row[7] == iv3(finals * np.mean(np.arange(1, N_LAYER + 1)), 3)
    first = table_row(text.split("### First evaluation")[1].split("###")[0], "scaling=dk")
    assert first[2] == "0" and first[5:7] == ["52.13 ± 0.00", "417.0 ± 0.0"]   # 4.17*100/8


def test_runs_without_raw_statistics_say_not_recorded(tmp_path, tables_only):
    sweep = tmp_path / "sweep"
    for seed in (1, 2):
        make_run(sweep, ["scaling=dk", f"trainer.seed={seed}"], [4.0, 2.0], full=2.0,
                 fake=FakeRun(raw=False))
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    row = table_row((out / "results.md").read_text().split("### Last")[1], "scaling=dk")
    assert row[6:8] == ["not recorded", "not recorded"]


def test_a_whole_split_loss_on_a_subset_says_so_from_folders_and_from_runs_csv(tmp_path,
                                                                              tables_only):
    """trainer.full_eval_tokens scores an even subset of the split: results.md says how much,
    also when rebuilt from runs.csv; a run that scored the whole split adds nothing."""
    sweep = tmp_path / "sweep"
    for seed in (1, 2):
        make_run(sweep, ["scaling=dk", f"trainer.seed={seed}"], [4.0, 2.0], full=2.0,
                 fake=FakeRun(targets=(131072, 542416)))
    out, again = tmp_path / "out", tmp_path / "again"
    assert report_in_process(sweep, "--out", out) == 0
    note = ("covers an even fixed subset of the validation split (trainer.full_eval_tokens):"
            " 131,072 of the split's 542,416 targets.")
    assert note in (out / "results.md").read_text()
    assert report_in_process("--from-csv", out / "runs.csv", "--out", again) == 0
    assert note in (again / "results.md").read_text()
    whole = tmp_path / "whole"
    make_run(whole, ["scaling=dk", "trainer.seed=1"], [4.0, 2.0], full=2.0,
             fake=FakeRun(targets=(542416, 542416)))
    assert report_in_process(whole, "--out", tmp_path / "w") == 0
    assert "subset" not in (tmp_path / "w" / "results.md").read_text()


def test_only_the_named_sweep_is_read(tmp_path, capsys, tables_only):
    preset = tmp_path / "multirun" / "head_width"
    for time, loss in (("2026-11-01_10-00-00", 3.0), ("2026-12-01_10-00-00", 2.0)):
        for seed in (1, 2):
            make_run(preset / time, ["scaling=dk", f"trainer.seed={seed}"], [4.0, loss],
                     full=loss + 0.01 * seed)
    out = tmp_path / "out"
    assert report_in_process(preset / "2026-12-01_10-00-00", "--out", out) == 0
    row = table_row((out / "results.md").read_text(), "scaling=dk")
    assert row[1] == "2" and row[2] == f"{interval([2.01, 2.02])} (n=2)"
    capsys.readouterr()
    assert report_in_process(*sorted(preset.iterdir()), "--out", out) == 0   # pooling, if asked
    assert table_row(capsys.readouterr().out, "scaling=dk")[1] == "4"


LRS = (1e-3, 1e-2, 1e-1)
LR_FULL = {  # (scaling, lr) -> whole-split loss of seeds 1, 2, 3 (None: diverged)
    ("sqrt_dk", 1e-3): [2.30, 2.32, 2.31], ("sqrt_dk", 1e-2): [2.00, 2.05, 2.01],
    ("sqrt_dk", 1e-1): [2.60, 2.50, 2.70],
    ("qk_norm", 1e-3): [2.40, 2.41, 2.45], ("qk_norm", 1e-2): [2.10, 2.02, 2.04],
    ("qk_norm", 1e-1): [2.05, 2.00, 2.06],   # best at 0.1, 0.01 not resolved from it
    ("none", 1e-3): [2.20, 2.21, 2.19], ("none", 1e-2): [2.10, 2.12, 2.08],
    ("none", 1e-1): [None, 5.0, 2.9],        # seed 1 diverged, seed 2 above the init loss
}
INIT = 4.0


@pytest.fixture(scope="module")
def lr_sweep(tmp_path_factory):
    """Read only."""
    sweep = tmp_path_factory.mktemp("lr_sweep") / "multirun" / "lr_transfer" / "t"
    for (scaling, lr), losses in LR_FULL.items():
        for seed, loss in enumerate(losses, start=1):
            ov = ["model.d_head=16", f"optim.lr={lr}", f"scaling={scaling}",
                  f"trainer.seed={seed}"]
            if loss is None:
                make_run(sweep, ov, [INIT, 30.0, math.inf], fake=FakeRun(diverged=True))
            else:
                make_run(sweep, ov, [INIT, 3.0, loss + 0.1], full=loss)
    for seed in (1, 2, 3):   # a second head width, one scale, so settings differ
        make_run(sweep, ["model.d_head=64", "optim.lr=0.01", "scaling=sqrt_dk",
                         f"trainer.seed={seed}"], [INIT, 3.0, 2.2], full=2.1 + 0.01 * seed)
    return sweep


@pytest.fixture(scope="module")
def lr_report(lr_sweep, tmp_path_factory):
    """The report of the LR sweep, figures unrendered: its out folder."""
    out = tmp_path_factory.mktemp("lr_out")
    with unrendered():
        printed_report(lr_sweep, "--out", out)
    return out


def clipped(scaling, lr):
    return [INIT if x is None else min(x, INIT) for x in LR_FULL[(scaling, lr)]]


def test_lr_section_best_lr_sensitivity_and_pairs(lr_report):
    out = lr_report
    assert (out / "lr_transfer.png").stat().st_size > 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    sens = {}
    for scaling in ("sqrt_dk", "qk_norm", "none"):
        per_seed = np.array([clipped(scaling, lr) for lr in LRS])   # (lr, seed)
        sens[scaling] = per_seed.mean(axis=0) - per_seed.min(axis=0)
    row = table_row(lr_part, "scaling=sqrt_dk, model.d_head=16")
    assert row[1:4] == ["3", "0.01", "none"]
    # 1e-2 is best on every pair of seeds, so each held-out seed is read there
    assert row[4:6] == [f"{interval(clipped('sqrt_dk', 1e-2))} (n=3)", "0.01"]
    grid_mean = np.array([clipped("sqrt_dk", lr) for lr in LRS]).mean(axis=0)
    assert row[6] == f"{interval(grid_mean)} (n=3)"
    assert row[7] == f"{interval(sens['sqrt_dk'])} (n=3)"
    row = table_row(lr_part, "scaling=qk_norm, model.d_head=16")
    assert row[2:4] == ["0.1 (grid edge)", "0.01"] and row[8] == "0"
    row = table_row(lr_part, "scaling=none, model.d_head=16")   # seed 1 diverged, seed 2
    assert row[2] == "0.01" and row[8] == "2"                   # ended above its init loss
    sens_pairs = lr_part.split("LR sensitivity, paired")[1].split("Mean clipped")[0]
    pair = table_row(sens_pairs, "model.d_head=16", "none")
    assert pair[3] == interval(sens["none"] - sens["sqrt_dk"])
    grid = lr_part.split("Mean clipped")[1]
    assert table_row(grid, "scaling=none, model.d_head=16")[3] == (
        f"{interval(clipped('none', 1e-1))} (2 failed)")
    # none fails at 0.1 (seeds 1 and 2): it survives up to 0.01; the others fail nowhere
    assert table_row(grid, "scaling=none, model.d_head=16")[4] == "0.01"
    assert table_row(grid, "scaling=sqrt_dk, model.d_head=16")[4] == "0.1 (all)"


def test_lr_curves_show_each_scale_at_its_chosen_lr_on_the_held_out_seeds(lr_sweep):
    """Seeds 1, 2 choose: qk_norm's means there are 2.06 at 1e-2 and 2.025 at 1e-1."""
    runs, _ = load_runs([lr_sweep])
    held = st.held_out(runs, "full", st.Plan(select_seeds=frozenset({"1", "2"})))
    qk = held[(("scaling", "qk_norm"), ("model.d_head", "16"))]
    assert [(r.seed, r.lr) for r in qk["runs"]] == [("3", 0.1)]
    assert all([r.seed for r in h["runs"]] == ["3"] for h in held.values())


def lr_figure(runs):
    """lr_transfer.png of the runs, drawn (not rendered) with the report's arms and looks."""
    keys = group_runs(runs, drop=(LR_KEY,))
    arms = style.Arms.of(keys)
    return figures.plot_lr(figures.Frame(arms, arms.looks(keys)), runs, "full")


def lr_points(ax) -> dict:
    """{arm: (LRs, means, [(bar's low end, high end) at each, if any])} of an LR panel."""
    found = {}
    for bars in ax.containers:
        segments = bars.lines[2][0].get_segments() if bars.lines[2] else []
        found[bars.get_label()] = (*bars.lines[0].get_data(),
                                   [(seg[0][1], seg[1][1]) for seg in segments])
    return found


def test_an_lr_point_is_the_mean_of_its_seeds_its_bar_cut_at_the_loss_at_init(lr_sweep):
    """sqrt_dk at 1e-2: the mean of 2.00, 2.05, 2.01 with its t interval; none at 1e-1: 4.0
    (diverged), 4.0 (5.0 clipped) and 2.9, whose interval (+-1.58) is cut at 4.0."""
    runs, _ = load_runs([lr_sweep])
    ax = next(ax for ax in lr_figure(runs).axes if ax.get_title() == "d_head=16")
    points = lr_points(ax)
    lrs, means, bars = points["sqrt_dk"]
    assert list(lrs) == list(LRS) and ax.get_yscale() == "linear"
    iv = st.mean_interval(clipped("sqrt_dk", 1e-2))
    assert means[1] == pytest.approx(2.02) and bars[1] == pytest.approx((iv.lo, iv.hi))
    iv = st.mean_interval(clipped("none", 1e-1))
    assert points["none"][1][2] == pytest.approx(iv.mean) and iv.hi > INIT
    assert points["none"][2][2] == pytest.approx((iv.lo, INIT))


def test_lr_points_on_a_log_axis_are_geometric_means_with_intervals_of_the_log_losses(tmp_path):
    """Losses 1e-3, 1e-2, 1e-1 at one LR beside 2.0-2.2 at another (a log axis): the point is
    their geometric mean 1e-2 (the arithmetic mean, 0.037, is not), its bar 1e-2 x exp(+-t s)
    with s the standard deviation of the log losses (ln 10); two seeds, a bar of length 0."""
    for lr, losses in ((1e-3, [1e-3, 1e-2, 1e-1]), (1e-2, [2.0, 2.1, 2.2]), (1e-1, [2.5, 2.6])):
        for seed, loss in enumerate(losses, start=1):
            make_run(tmp_path / "s", [f"optim.lr={lr}", "scaling=sqrt_dk",
                                      f"trainer.seed={seed}"], [INIT, 3.0, loss], full=loss)
    ax = lr_figure(load_runs([tmp_path / "s"])[0]).axes[0]
    (lrs, means, bars), = lr_points(ax).values()
    half = T975[3] * math.log(10) / math.sqrt(3)
    assert ax.get_yscale() == "log" and means[0] == pytest.approx(1e-2)
    assert bars[0] == pytest.approx((1e-2 * math.exp(-half), 1e-2 * math.exp(half)))
    assert means[2] == pytest.approx(math.sqrt(2.5 * 2.6)) and bars[2] == (means[2], means[2])


def test_arms_at_one_lr_and_loss_are_drawn_side_by_side(tmp_path):
    """Three scales with the same losses: their markers at one LR lie DODGE points apart."""
    for scaling, lr, seed in itertools.product(("sqrt_dk", "none", "dk"), (1e-3, 1e-2), (1, 2)):
        make_run(tmp_path / "s", [f"optim.lr={lr}", f"scaling={scaling}", f"trainer.seed={seed}"],
                 [INIT, 3.0, 2.0], full=2.0 + lr)
    fig = lr_figure(load_runs([tmp_path / "s"])[0])
    fig.canvas.draw()
    xs = sorted(bars.lines[0].get_transform().transform(np.column_stack(
        [np.asarray(v, float) for v in bars.lines[0].get_data()]))[0, 0]
        for bars in fig.axes[0].containers)
    assert np.diff(xs) == pytest.approx([style.DODGE * fig.dpi / 72] * 2)


def test_seeds_text_states_n_and_says_no_intervals_below_three():
    assert style.seeds_text([1]) == "n = 1 seed per line, no intervals"
    assert style.seeds_text([2, 2]) == "n = 2 seeds per line, no intervals"
    assert style.seeds_text([3]).startswith("mean of n = 3 seeds per line, 95% t interval")
    assert "n = 2-3" in style.seeds_text([2, 3]) and "(n = 2: no intervals)" in \
        style.seeds_text([2, 3])


def test_band_is_the_t_interval_of_three_seeds_and_absent_below():
    steps, mean, lo, hi = style.aggregate([([0, 10], [4.0, 2.0]), ([0, 10], [4.0, 2.2]),
                                           ([0, 10, 20], [4.0, 2.4, 1.0])])
    assert list(steps) == [0, 10, 20] and mean[1] == pytest.approx(2.2)
    half = T975[3] * 0.2 / math.sqrt(3)
    assert (lo[1], hi[1]) == pytest.approx((2.2 - half, 2.2 + half))
    assert lo[0] == hi[0] == 4.0 and math.isnan(lo[2])   # one seed at step 20: no band
    _, _, lo, hi = style.aggregate([([0], [1.0]), ([0], [2.0])])
    assert math.isnan(lo[0]) and math.isnan(hi[0])   # two seeds: no band


def test_log_band_is_geometric_and_stays_positive():
    """Gradient norms 1e-3, 1e-2 and 1e-1: the arithmetic band would reach below 0."""
    steps, mean, lo, hi = style.aggregate([([5], [1e-3]), ([5], [1e-2]), ([5], [1e-1])],
                                          log=True)
    half = T975[3] * math.log(10) / math.sqrt(3)   # s of ln values = ln 10
    assert mean[0] == pytest.approx(1e-2)
    assert (lo[0], hi[0]) == pytest.approx((1e-2 * math.exp(-half), 1e-2 * math.exp(half)))
    assert lo[0] > 0


def test_an_arm_is_a_scale_and_the_switches_it_turns_on():
    keys = [(("scaling", "sqrt_dk"), ("model.d_head", "16"), ("scaling.softcap", None)),
            (("scaling", "sqrt_dk"), ("model.d_head", "64"), ("scaling.softcap", None)),
            (("scaling", "none"), ("model.d_head", "16"), ("scaling.softcap", None)),
            (("scaling", "sqrt_dk"), ("model.d_head", "16"), ("scaling.softcap", "50"))]
    arms = style.Arms.of(keys)
    assert [arms.name(k) for k in keys] == ["sqrt_dk", "sqrt_dk", "none", "sqrt_dk, softcap=50"]
    assert arms.settings(keys) == [(("model.d_head", "16"),), (("model.d_head", "64"),)]
    looks = arms.looks(keys)
    assert looks["sqrt_dk"] == style.LOOKS["sqrt_dk"] and looks["none"] == style.LOOKS["none"]
    assert looks["sqrt_dk, softcap=50"] == style.palette(["sqrt_dk, softcap=50"])[
        "sqrt_dk, softcap=50"]   # a look of its own name, whatever else is drawn


def test_a_normaliser_is_a_switch_off_at_softmax_whatever_the_most_common():
    """Sink most common, softmax still the default; a run without the key used softmax."""
    keys = [(("scaling", "sqrt_dk"), ("scaling.normaliser", "sink")),
            (("scaling", "none"), ("scaling.normaliser", "sink")),
            (("scaling", "sqrt_dk"), ("scaling.normaliser", "softmax")),
            (("scaling", "none"), ("scaling.normaliser", None))]
    for arms in (style.Arms.of(keys), style.Arms.of(keys, {"scaling.normaliser"})):
        assert [arms.name(k) for k in keys] == ["sqrt_dk, sink", "none, sink", "sqrt_dk", "none"]
        assert arms.settings(keys) == [()]   # one panel
        assert len({look[0] for look in arms.looks(keys).values()}) == 4


def test_the_palette_gives_no_colour_twice():
    """Every fixed look and as many other arms (a scale with a switch) as the pool has
    colours: no colour twice."""
    names = [*style.LOOKS, *(f"sqrt_dk, softcap={c}" for c in range(len(style.POOL)))]
    colours = [to_hex(look[0]) for look in style.palette(names).values()]
    assert len(set(colours)) == len(names)


def test_an_arms_look_is_a_function_of_its_name_alone():
    """Adding an arm, or drawing fewer, changes no other arm's look; a collision in the pool is
    resolved by name order (the later name takes the next free slot)."""
    names = ["sqrt_dk, softcap=50", "none, qk_clip=50", "sqrt_dk, z_loss=0.0001", "dk"]
    alone = {name: style.palette([name])[name] for name in names}
    assert style.palette(names) == alone
    assert style.palette([*names, "a_new_scale", "sqrt_dk, a_new_normaliser"]).items() >= (
        alone.items())
    slot = zlib.crc32(b"sqrt_dk, softcap=50") % len(style.POOL)
    twin = next(f"arm {i}" for i in itertools.count()
                if zlib.crc32(f"arm {i}".encode()) % len(style.POOL) == slot)
    looks = style.palette(["sqrt_dk, softcap=50", twin])
    assert looks[twin] == alone["sqrt_dk, softcap=50"]   # "arm ..." sorts first: its slot
    assert looks["sqrt_dk, softcap=50"][0] == style.POOL[(slot + 1) % len(style.POOL)]


def test_sampled_loss_on_request_and_bad_input(tmp_path, capsys, tables_only):
    run = make_run(tmp_path / "one", ["scaling=dk", "trainer.seed=1"], [4.17, 2.0, 1.5])
    shutil.rmtree(run / ".hydra")   # overrides then come from run.json
    out = tmp_path / "out"
    assert report_in_process(run, "--out", out, "--loss", "sampled") == 0
    row = table_row((out / "results.md").read_text(), "scaling=dk")
    assert row[1:4] == ["1", "1.5000 (n=1)", "1.5000 (n=1)"]
    assert report_in_process(tmp_path / "nope", "--out", out) == 2
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert report_in_process(tmp_path / "empty", "--out", out) == 2
    assert "no run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:   # argparse
        report_in_process(run, "--out", out, "--loss", "best")
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_run_with_a_bad_line_before_its_last_is_skipped_with_one_warning(
        tmp_path, capsys, tables_only):
    sweep = tmp_path / "sweep"
    make_run(sweep, ["scaling=dk", "trainer.seed=1"], [4.17, 2.0, 1.5], full=1.5)
    damaged = make_run(sweep, ["scaling=none", "trainer.seed=1"], [4.17, 2.0, 1.5], full=1.5)
    metrics = damaged / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join([lines[0], "not json\n", *lines[1:]]))
    out = tmp_path / "out"
    capsys.readouterr()
    assert report_in_process(sweep, "--out", out) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("skipped")]
    assert len(warnings) == 1 and str(damaged) in warnings[0] and "line 2" in warnings[0]
    text = (out / "results.md").read_text()
    assert table_row(text, "scaling=dk")[1] == "1"
    assert f"{damaged}: " in text.split("## Skipped")[1]


def test_lr_left_at_default_groups_with_the_same_lr_set_explicitly(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep, ["scaling=dk", "optim.lr=1e-2", "trainer.seed=1"], [4.0, 2.0], full=2.0)
    make_run(sweep, ["scaling=dk", "trainer.seed=2"], [4.0, 2.5], full=2.5,
             fake=FakeRun(config={"optim": {"lr": 0.01}}))
    make_run(sweep, ["scaling=dk", "optim.lr=0.1", "trainer.seed=1"], [4.0, 3.0], full=3.0)
    runs, _ = load_runs([sweep])
    table = st.lr_table(runs, "full")
    assert table == {0.01: {"1": 2.0, "2": 2.5}, 0.1: {"1": 3.0}}


def test_pair_against_a_setting_of_another_key(tmp_path, capsys, tables_only):
    """init_scale's question: each scale at unit-variance init minus the same scale and seed
    at the default init."""
    sweep = tmp_path / "sweep"
    loss = {("null", 1): 2.00, ("null", 2): 2.10, ("null", 3): 2.05,
            ("0.0884", 1): 2.60, ("0.0884", 2): 2.75, ("0.0884", 3): 2.62}
    for (init, seed), full in loss.items():
        make_run(sweep, [f"model.qk_init_std={init}", "scaling=none", f"trainer.seed={seed}"],
                 [4.0, 3.0, full], full=full)
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out, "--pair", "model.qk_init_std=null") == 0
    part = (out / "results.md").read_text().split("against `model.qk_init_std=default`")[1]
    row = table_row(part, "model.qk_init_std=0.0884", "none")
    diffs = [loss[("0.0884", s)] - loss[("null", s)] for s in (1, 2, 3)]
    p = ttest_rel([loss[("0.0884", s)] for s in (1, 2, 3)],
                  [loss[("null", s)] for s in (1, 2, 3)]).pvalue
    assert row[2:] == ["3", interval(diffs), f"{p:.3g}", f"{p:.3g}",   # a family of one
                       "higher than model.qk_init_std=default"]
    for bad, why in (("model.qk_init_std=0.5", "takes the values null, 0.0884"),
                     ("optim.lr=1e-3", "a KEY these runs vary (model.qk_init_std)"),
                     ("model.qk_init_std", "give KEY=VALUE")):
        capsys.readouterr()
        assert report_in_process(sweep, "--out", out, "--pair", bad) == 2
        err = capsys.readouterr().err
        assert why in err, err


# ---------------------------------------------------------------------------------------------
# Failed runs, runs.csv and --from-csv, the held-out choice of an LR
# ---------------------------------------------------------------------------------------------

LEVELS = {"unigram": 3.3, "bigram": 2.5, "trigram": 2.1}


@pytest.fixture
def failing(tmp_path):
    """sqrt_dk and none, seeds 1-3. none's seed 3 ends at 3.5: below its step-0 loss (4.0),
    above the unigram level (3.3). none's seed 2 ends at 4.2, above its step-0 loss."""
    sweep = tmp_path / "sweep"
    full = {("sqrt_dk", 1): 2.0, ("sqrt_dk", 2): 2.1, ("sqrt_dk", 3): 2.05,
            ("none", 1): 1.9, ("none", 2): 4.2, ("none", 3): 3.5}
    for (scaling, seed), loss in full.items():
        make_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"], [4.0, 3.0, loss],
                 full=loss)
    return sweep


def test_failed_runs_are_counted_and_left_out_of_means_and_pairs(failing, tmp_path, capsys,
                                                                   tables_only):
    out = tmp_path / "out"
    assert report_in_process(failing, "--out", out, levels=LEVELS) == 0
    text = (out / "results.md").read_text()
    row = table_row(text, "scaling=none")
    assert row[1:3] == ["3", "1.9000 (n=1)"] and row[5] == "2"   # row[5]: failed
    assert "above the unigram reference level (3.3000 nats/token)" in text
    failed = text.split("## Failed runs")[1].split("##")[0]
    assert "scaling=none,trainer.seed=2: final loss 4.2000 above the unigram level" in failed
    assert "scaling=none,trainer.seed=3: final loss 3.5000 above the unigram level" in failed
    pair = table_row(text.split("## Paired")[1], "all", "none")
    assert pair[2:4] == ["1", "-0.1000 (n=1)"]   # only seed 1: neither run failed
    # without reference levels only the step-0 rule catches seed 2; seed 3 counts
    capsys.readouterr()
    assert report_in_process(failing, "--out", out) == 0
    text = (out / "results.md").read_text()
    row = table_row(text, "scaling=none")
    assert row[2] == f"{interval([1.9, 3.5])} (n=2)" and row[5] == "1"
    assert "no reference levels were given, so the unigram rule is not applied" in text
    failed = text.split("## Failed runs")[1].split("##")[0]
    assert "seed=2: final loss 4.2000 above its step-0 loss 4.0000" in failed
    assert "seed=3" not in failed


def read_csv(path: Path) -> list[dict]:
    import csv
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_runs_csv_has_one_row_per_run_with_swept_keys_and_final_numbers(failing, tmp_path,
                                                                         tables_only):
    recall = make_run(failing, ["scaling=sqrt_dk", "trainer.seed=4"], [4.0, 3.0, 2.5],
                      full=2.123456789012345)
    summary = json.loads((recall / "summary.json").read_text())
    (recall / "summary.json").write_text(json.dumps({**summary, "final_val_accuracy": 0.875}))
    out = tmp_path / "out"
    assert report_in_process(failing, "--out", out, levels=LEVELS) == 0
    rows = read_csv(out / "runs.csv")
    assert len(rows) == 7
    columns = list(rows[0])
    assert columns[:3] == ["run", "scaling", "trainer.seed"]
    assert columns[3] == "final_val_loss_full" and columns[-3:] == [
        "ref_unigram", "ref_bigram", "ref_trigram"]
    by = {(r["scaling"], r["trainer.seed"]): r for r in rows}
    r = by[("none", "3")]
    assert r["run"] == str(failing / "scaling=none,trainer.seed=3")
    assert (float(r["final_val_loss_full"]), float(r["final_val_loss"])) == (3.5, 3.5)
    assert float(r["init_val_loss"]) == 4.0 and r["failed"] == "true"
    assert r["final_val_accuracy"] == "" and by[("sqrt_dk", "4")]["final_val_accuracy"] == "0.875"
    assert by[("sqrt_dk", "1")]["failed"] == "false" and r["finished"] == "true"
    # the last eval's attention means, combined over layers as the tables combine them
    assert (r["last_eval_step"], r["first_eval_step"]) == ("20", "0")
    assert float(r["attn_entropy"]) == pytest.approx(1.05)
    assert float(r["attn_raw_max_logit"]) == pytest.approx(3.5 * 10 ** N_LAYER)
    assert float(r["first_attn_raw_var"]) == pytest.approx(4.0 * 1.5)
    assert float(r["ref_unigram"]) == 3.3
    # every digit: the CSV reads back to the same float
    assert float(by[("sqrt_dk", "4")]["final_val_loss_full"]) == 2.123456789012345


def test_from_csv_rebuilds_the_same_tables(ablation, ablation_report, lr_sweep, tmp_path,
                                           capsys, unrendered_figures):
    """A sweep with running, diverged, failed and incomplete runs, and an LR sweep: the tables
    made from runs.csv alone equal the sweep's, digit for digit."""
    with pytest.MonkeyPatch.context() as mp:
        without_figures(mp)
        printed_report(lr_sweep, "--out", tmp_path / "lr_out", levels=LEVELS)
    for sweep, out in ((ablation, ablation_report[0]), (lr_sweep, tmp_path / "lr_out")):
        again = tmp_path / f"{sweep.name}_again"
        assert report_in_process("--from-csv", out / "runs.csv", "--out", again) == 0
        first, second = ((d / "results.md").read_text() for d in (out, again))
        assert tables_of(first) == tables_of(second)
        assert "## Learning rate" in first or sweep is ablation
        assert not (again / "runs.csv").exists()   # read alone, it is not written again
    assert (again / "lr_transfer.png").stat().st_size > 0
    assert "above the unigram reference level (3.3000" in second   # levels read from the CSV
    with pytest.raises(SystemExit):   # argparse: --from-csv still needs --out
        report_in_process("--from-csv", out / "runs.csv")
    assert report_in_process(lr_sweep, "--from-csv", out / "runs.csv", "--out", again) == 2
    assert "is read twice" in capsys.readouterr().err   # the CSV's runs are lr_sweep's
    (tmp_path / "bad.csv").write_text("run,scaling\nx,none\n")
    assert report_in_process("--from-csv", tmp_path / "bad.csv", "--out", again) == 2
    assert "lacks the column(s) final_val_loss_full" in capsys.readouterr().err


def test_lr_chosen_on_some_seeds_and_reported_on_others(lr_sweep, tmp_path, capsys,
                                                         tables_only):
    out = tmp_path / "out"
    assert report_in_process(lr_sweep, "--out", out, "--select-seeds", "1,2") == 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    assert "Best LR: chosen on seeds 1, 2; loss at it: seeds 3." in lr_part
    row = table_row(lr_part, "scaling=qk_norm, model.d_head=16")   # 2.06 vs 2.025 on 1, 2
    assert row[2] == "0.1 (grid edge)" and row[4:6] == ["2.0600 (n=1)", "0.1 (grid edge)"]
    row = table_row(lr_part, "scaling=none, model.d_head=16")   # seeds 1, 2: 2.11 at 1e-2
    assert row[2] == "0.01" and row[4] == "2.0800 (n=1)"
    # seed 3 alone prefers 1e-2 for qk_norm (2.04 vs 2.06), all seeds together 1e-1
    assert report_in_process(lr_sweep, "--out", out, "--report-seeds", "1,2") == 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    assert "Best LR: chosen on seeds 3; loss at it: seeds 1, 2." in lr_part
    row = table_row(lr_part, "scaling=qk_norm, model.d_head=16")
    assert row[2] == "0.01" and row[4] == f"{interval([2.10, 2.02])} (n=2)"
    capsys.readouterr()
    for bad, why in ((["--select-seeds", "1,2", "--report-seeds", "2,3"], "must not share"),
                     (["--select-seeds", "1,9"], "seed(s) 9 that no run has"),
                     (["--select-seeds", "1,2,3"], "non-empty")):
        assert report_in_process(lr_sweep, "--out", out, *bad) == 2
        assert why in capsys.readouterr().err


def test_lr_chosen_on_an_earlier_stage(lr_report, tmp_path, capsys, tables_only):
    """Stage 1 (lr_sweep, seeds 1-3) picks qk_norm 0.1, sqrt_dk and none 0.01 at d_head 16;
    stage 2 runs seeds 4, 5 at 0.01 and 0.1 and is read at stage 1's choice."""
    stage1 = lr_report
    stage2 = tmp_path / "stage2"
    for scaling in ("sqrt_dk", "none", "qk_norm"):
        for lr, base in ((0.01, 2.0), (0.1, 2.3)):
            for seed in (4, 5):
                make_run(stage2, ["model.d_head=16", f"optim.lr={lr}", f"scaling={scaling}",
                                  f"trainer.seed={seed}"], [INIT, 3.0, 2.5],
                         full=base + 0.01 * seed)
    out = tmp_path / "out"
    assert report_in_process(stage2, "--out", out, "--select-from", stage1 / "runs.csv") == 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    assert (f"chosen on the runs of `{stage1 / 'runs.csv'}` (seeds 1, 2, 3); loss at it: this"
            " sweep's seeds 4, 5.") in lr_part
    assert table_row(lr_part, "scaling=qk_norm")[4] == f"{interval([2.34, 2.35])} (n=2)"
    assert table_row(lr_part, "scaling=none")[4] == f"{interval([2.04, 2.05])} (n=2)"
    capsys.readouterr()
    flat = tmp_path / "flat"   # no LR axis and no --select-from: the options do not apply
    make_run(flat, ["scaling=dk", "trainer.seed=1"], [4.0, 2.0], full=2.0)
    assert report_in_process(flat, "--out", out, "--select-seeds", "1") == 2
    assert "do not vary optim.lr" in capsys.readouterr().err


def test_one_lr_groups_get_no_lr_sensitivity(lr_report, tmp_path, tables_only):
    """A stage 2 that runs each scale at its one chosen LR: the sensitivity (mean over the grid
    minus its minimum) is 0 by construction there, so it is neither reported nor compared."""
    stage2 = tmp_path / "stage2"
    for scaling, lr in (("sqrt_dk", 0.01), ("none", 0.01), ("qk_norm", 0.1)):
        for seed in (4, 5, 6):
            make_run(stage2, ["model.d_head=16", f"optim.lr={lr}", f"scaling={scaling}",
                              f"trainer.seed={seed}"], [INIT, 3.0, 2.5], full=2.0 + 0.01 * seed)
    out = tmp_path / "out"
    assert report_in_process(stage2, "--out", out, "--select-from", lr_report / "runs.csv") == 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    assert table_row(lr_part, "scaling=none")[7] == "one LR: not defined"
    assert "LR sensitivity, paired" not in lr_part
    assert "LR sensitivity: not compared. Every group ran one LR" in lr_part
    # `none` at two LRs, its own and sqrt_dk's (scaling_ablation's stage 2): still nothing to
    # compare with, since the baseline's sensitivity is 0 by construction
    for seed in (4, 5, 6):
        make_run(stage2, ["model.d_head=16", "optim.lr=0.1", "scaling=none",
                          f"trainer.seed={seed}"], [INIT, 3.0, 2.5], full=2.2 + 0.01 * seed)
    assert report_in_process(stage2, "--out", out, "--select-from", lr_report / "runs.csv") == 0
    lr_part = (out / "results.md").read_text().split("## Learning rate")[1]
    assert table_row(lr_part, "scaling=none")[7] != "one LR: not defined"
    assert "LR sensitivity: not compared. `sqrt_dk` ran one LR" in lr_part
    assert "LR sensitivity, paired" not in lr_part


def test_a_one_seed_lr_sweep_is_a_selection_stage_with_curves_at_its_best_lr(tmp_path,
                                                                             monkeypatch):
    """One seed leaves nothing to hold out: the report still names each variant's best LR and
    draws its curves there, saying that the LR was chosen on the runs drawn."""
    titles = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, fname, **kw: titles.update(
        {Path(fname).name: " ".join(fig._suptitle.get_text().split())}))
    sweep = tmp_path / "multirun" / "select" / "t"
    for scaling, losses in (("sqrt_dk", (2.0, 1.8)), ("none", (1.7, 1.9))):
        for lr, loss in zip((1e-3, 2e-3), losses):
            make_run(sweep, [f"optim.lr={lr}", f"scaling={scaling}", "trainer.seed=101"],
                     [INIT, 3.0, loss + 0.1], full=loss)
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    text = (out / "results.md").read_text()
    lr_part = text.split("## Learning rate")[1]
    assert table_row(lr_part, "scaling=sqrt_dk")[2] == "0.002 (grid edge)"
    assert table_row(lr_part, "scaling=none")[2] == "0.001 (grid edge)"
    assert "each arm at its best LR on seed 101, the seeds that chose it (not held out)" in \
        titles["loss_curves.png"]
    assert "lr_transfer.png" in titles


def test_how_a_run_was_executed_is_not_a_setting(tmp_path, tables_only):
    """A sweep finished on one thread, resumed, or read at more lengths after training holds
    the same runs: trainer.threads, trainer.resume and trainer.eval_lengths in some runs'
    overrides neither split a group nor become a runs.csv column."""
    sweep = tmp_path / "sweep"
    for seed, extra in ((1, []), (2, ["trainer.threads=1"]), (3, ["trainer.resume=auto"]),
                        (4, ["trainer.eval_lengths=[64]"])):
        for scaling, full in (("sqrt_dk", 1.9), ("none", 1.8)):
            make_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}", *extra],
                     [INIT, 2.5, full + 0.1], full=full + 0.01 * seed)
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    text = (out / "results.md").read_text()
    assert table_row(text, "scaling=none")[1] == "4"   # one group of four runs per scale
    assert not any(key in text for key in ("threads", "resume", "eval_lengths"))
    header = (out / "runs.csv").read_text().splitlines()[0].split(",")
    assert not {"trainer.threads", "trainer.resume", "trainer.eval_lengths"} & set(header)


# Five arms that differ in several keys at once: sqrt_dk and none at their defaults, and three
# that fold sqrt_dk's scale into W_q and W_k's init and LR, each at two gradient clips.
AGAINST_ARMS = {("sqrt_dk", "null", "1.0"): 2.00, ("none", "null", "1.0"): 2.30,
                ("none", "0.05", "0.5"): 2.02, ("none", "0.05", "1.0"): 2.10,
                ("none", "0.01", "0.5"): 2.20}


@pytest.fixture(scope="module")
def against_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("against")
    for (scaling, std, mult), loss in AGAINST_ARMS.items():
        for clip in ("1.0", "0.5"):
            for seed in (1, 2, 3):
                final = loss + 0.01 * seed + (0.05 if clip == "0.5" else 0.0)
                overrides = [f"scaling={scaling}", f"model.qk_init_std={std}",
                             f"optim.qk_lr_mult={mult}", f"optim.grad_clip={clip}",
                             f"trainer.seed={seed}"]
                make_run(sweep, overrides, [INIT, 3.0, final + 0.1], full=final)
    return sweep


def test_against_pairs_every_arm_with_a_reference_setting_at_the_same_other_keys(
        against_sweep, tmp_path, tables_only):
    out = tmp_path / "out"
    reference = "scaling=sqrt_dk,model.qk_init_std=null,optim.qk_lr_mult=1.0"
    assert report_in_process(against_sweep, "--out", out, "--against", reference,
                             "--against", reference.replace("sqrt_dk", "none")) == 0
    text = (out / "results.md").read_text()
    part = text.split("## Paired differences against `sqrt_dk, model.qk_init_std=default,"
                      " optim.qk_lr_mult=1`")[1].split("## ")[0]
    table = part.split("The same pairs on log loss")[0]
    rows = [line for line in table.splitlines() if line.startswith("| model.qk_init_std=")]
    assert len(rows) == 4 * 2   # the four other arms, at each grad clip
    row = table_row(part, "model.qk_init_std=0.05, optim.grad_clip=0.5, optim.qk_lr_mult=0.5")
    # the arm and sqrt_dk at clip 0.5, seed by seed: 2.02 + 0.05 - (2.00 + 0.05) = 0.02 each
    assert row[1:3] == ["none", "3"] and row[3].startswith("0.0200 ± 0.0000")
    assert "Family: 8 paired t-tests" in part
    second = text.split("## Paired differences against `none, model")[1].split("## ")[0]
    assert len(table_row(second, "model.qk_init_std=0.05, optim.grad_clip=1,"
                                 " optim.qk_lr_mult=0.5", "none")) == 7
    assert table_row(second, "model.qk_init_std=default, optim.grad_clip=1,"
                             " optim.qk_lr_mult=1", "sqrt_dk")[3].startswith("-0.3000")
    assert "| model.qk_init_std=default, optim.grad_clip=1, optim.qk_lr_mult=1 | none |" \
        not in second   # the reference itself has no row


def test_against_names_its_keys_in_each_arm_and_every_arm_is_drawn_against_the_baseline(
        against_sweep, tmp_path, monkeypatch):
    """The keys --against compares are the arms' (not panels'): loss_vs_baseline.png draws all
    four arms besides sqrt_dk in each grad-clip panel, each named by the keys it moved."""
    shown = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, fname, **kw: shown.update(
        {Path(fname).name: fig}))
    assert report_in_process(against_sweep, "--out", tmp_path, "--figures", "loss_vs_baseline.png",
                             "--against", "scaling=sqrt_dk,model.qk_init_std=null,"
                             "optim.qk_lr_mult=1.0") == 0
    assert list(shown) == ["loss_vs_baseline.png"]
    panels = {ax.get_title(): sorted(line.get_label() for line in ax.lines
                                     if not style.reference(line, ax))
              for ax in shown["loss_vs_baseline.png"].axes}
    arms = ["none", "none, qk_init_std=0.01, qk_lr_mult=0.5", "none, qk_init_std=0.05",
            "none, qk_init_std=0.05, qk_lr_mult=0.5"]
    assert panels == {"grad_clip=0.5": arms, "grad_clip=1": arms}


def test_figures_draws_only_the_figures_named_and_refuses_another_name(against_sweep, tmp_path,
                                                                       capsys,
                                                                       unrendered_figures):
    out = tmp_path / "out"
    assert report_in_process(against_sweep, "--out", out, "--figures",
                             "loss_curves.png,lr_transfer.png") == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["loss_curves.png"]
    assert "--figures lr_transfer.png: not drawn" in (out / "results.md").read_text()
    with pytest.raises(SystemExit) as exit_:
        report_in_process(against_sweep, "--out", tmp_path / "new", "--figures", "loss.png")
    assert exit_.value.code == 2 and not (tmp_path / "new").exists()
    assert "loss.png is not a figure the report draws" in capsys.readouterr().err


def test_against_refuses_a_value_no_run_has(against_sweep, tmp_path, capsys, tables_only):
    assert report_in_process(against_sweep, "--out", tmp_path / "o", "--against",
                             "scaling=sqrt_dk,optim.qk_lr_mult=3") == 2
    assert "optim.qk_lr_mult takes the values 0.5, 1 in these runs" in capsys.readouterr().err


def test_losses_many_times_apart_read_the_paired_test_of_log_loss(tmp_path, tables_only):
    """none's losses 300 to 3000 times sqrt_dk's: the difference test is not resolved
    (p 0.27), the log test is (p 0.014), and the table says which verdict it reads."""
    sweep = tmp_path / "far"
    for seed, (base, other) in enumerate(((1e-4, 0.3), (2e-4, 0.06), (1e-4, 0.03)), start=1):
        for scaling, final in (("sqrt_dk", base), ("none", other)):
            make_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"],
                     [INIT, 3.0, final + 0.1], full=final)
    assert report_in_process(sweep, "--out", tmp_path / "out") == 0
    text = (tmp_path / "out" / "results.md").read_text()
    differences = [0.3 - 1e-4, 0.06 - 2e-4, 0.03 - 1e-4]
    logs = [math.log(0.3 / 1e-4), math.log(0.06 / 2e-4), math.log(0.03 / 1e-4)]
    row = table_row(text, "all", "none")
    assert float(row[4]) == pytest.approx(ttest_rel(differences, [0, 0, 0]).pvalue, rel=1e-3)
    assert float(row[4]) > 0.05
    assert row[6] == "higher than sqrt_dk (log loss test: more than 2x apart)"
    log_part = text.split("The same pairs on log loss")[1]
    ratio = table_row(log_part, "all", "none")
    half = T975[3] * np.std(logs, ddof=1) / math.sqrt(3)
    mean = np.mean(logs)
    assert ratio[3] == (f"{math.exp(mean):.4g} ({math.exp(mean - half):.4g} to"
                        f" {math.exp(mean + half):.4g})")
    assert float(ratio[4]) == pytest.approx(ttest_rel(logs, [0, 0, 0]).pvalue, rel=5e-3)
    assert ratio[6] == "higher than sqrt_dk"


def test_label_names_an_arm_by_words_at_each_of_its_values(capsys):
    """--label KEY=VALUE:WORDS: an arm's value in words, the value read as runs.csv writes it
    (10 significant digits), so one arm's values at two widths may share its name and look; a
    label without its words is refused with the form it wants (exit 2)."""
    from scripts.plot_runs import label_text
    keys = [(("scaling", "none"), ("model.qk_init_std", v), ("model.n_head", n))
            for v, n in ((None, "4"), ("0.008408964153", "4"), (None, "1"),
                         ("0.005946035575", "1"))]
    labels = dict(label_text(t).split(":", 1) for t in (
        "model.qk_init_std=0.008408964152537146:W_q, W_k init x d_head^-1/4",
        "model.qk_init_std=0.005946035575013605:W_q, W_k init x d_head^-1/4"))
    arms = style.Arms.of(keys, {"model.qk_init_std"}, labels)
    assert [arms.name(k) for k in keys] == ["none", "none, W_q, W_k init x d_head^-1/4"] * 2
    assert len({arms.looks(keys)[arms.name(k)] for k in keys}) == 2
    with pytest.raises(SystemExit) as stop:
        report_in_process("--out", "x", "--label", "model.qk_init_std=0.01")
    assert stop.value.code == 2 and "KEY=VALUE:WORDS" in capsys.readouterr().err
