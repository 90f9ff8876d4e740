"""The high-LR report (lr_stability.png of scripts/report/figures.py, and the LR tables'
pairing of a bound against the same scale without it): on conftest.stability_sweep, where
sqrt_dk fails at 1e-1, none at 1e-2 (seed 2) and 1e-1, and sqrt_dk with scaling.softcap=50
at no LR."""

import math

import pytest
from conftest import (
    report_in_process,
    stability_head_value,
    stability_sweep,
    table_row,
)

from scripts.report import stats as st
from scripts.report.figures import Frame, edge_runs, head_extreme, plot_lr, plot_stability
from scripts.report.runs import LR_KEY, group_runs, load_runs
from scripts.report.style import Arms


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return stability_sweep(tmp_path_factory.mktemp("stability"))


@pytest.fixture(scope="module")
def arms(sweep):
    runs, _ = load_runs([sweep])
    groups = group_runs(runs, drop=(LR_KEY,))
    return {Arms.of(groups).name(key): runs for key, runs in groups.items()}


def frame(runs) -> Frame:
    keys = group_runs(runs, drop=(LR_KEY,))
    return Frame(Arms.of(keys), Arms.of(keys).looks(keys))


def test_each_arm_is_named_by_its_scale_and_the_bound_it_adds(arms):
    assert set(arms) == {"sqrt_dk", "none", "sqrt_dk, softcap=50"}


def test_edge_runs_are_the_highest_stable_and_the_first_failing_lr(arms):
    picked = {name: [(lr, run.lr, run.seed, dashes) for lr, run, dashes
                     in edge_runs(runs, "full", None)] for name, runs in arms.items()}
    assert picked["sqrt_dk"] == [(1e-2, 1e-2, "1", "-"), (1e-1, 1e-1, "1", "--")]
    # none fails at 1e-2 on seed 2 only: that run, not seed 1's, which did not fail
    assert picked["none"] == [(1e-3, 1e-3, "1", "-"), (1e-2, 1e-2, "2", "--")]
    # no run of the soft-capped arm failed: the top of its grid, solid (its highest stable LR)
    assert picked["sqrt_dk, softcap=50"] == [(1e-1, 1e-1, "1", "-")]
    assert st.survives_up_to(arms["none"], "full", None) == 1e-3


def test_head_extremes_are_the_max_logit_and_the_least_entropy_over_layers_and_heads(arms):
    run = next(r for r in arms["sqrt_dk"] if r.lr == 1e-2 and r.seed == "1")
    steps, logits = head_extreme(run, "max_logit", max)
    assert steps == [0, 10, 20, 30]
    assert logits == [pytest.approx(stability_head_value("max_logit", 1e-2, 1, (i, 1, 1)))
                      for i in range(4)]
    _, entropy = head_extreme(run, "entropy_norm", min)
    assert entropy == [pytest.approx(stability_head_value("entropy_norm", 1e-2, 1, (i, 1, 1)))
                       for i in range(4)]
    failed = next(r for r in arms["sqrt_dk"] if r.lr == 1e-1 and r.seed == "1")
    assert head_extreme(failed, "max_logit", max)[0] == [0, 10, 20]   # the NaN eval left out


def test_the_figures_draw_each_arms_curve_and_its_edge_runs(sweep):
    runs, _ = load_runs([sweep])
    top = plot_lr(frame(runs), runs, "full", st.Plan()).axes[0]   # loss against LR
    crosses = [line for line in top.lines if line.get_marker() == "x"]
    assert [list(line.get_xdata()) for line in crosses] == [[1e-1], [], [1e-2, 1e-1]]
    fig = plot_stability(frame(runs), runs, "full")
    panels = {ax.get_title().split("\n")[0]: ax for ax in fig.axes if ax.get_title()}
    assert set(panels) == {"sqrt_dk", "sqrt_dk, softcap=50", "none"}
    assert panels["none"].get_title() == "none\nlr 0.001 / 0.01"   # stable / failing
    lines = panels["none"].lines
    assert [line.get_linestyle() for line in lines] == ["-", "--"]
    assert lines[1].get_ydata()[-1] == pytest.approx(
        stability_head_value("max_logit", 1e-2, 2, (2, 1, 1)))
    assert panels["none"].get_yscale() == "log"
    assert panels["sqrt_dk, softcap=50"].get_title() == "sqrt_dk, softcap=50\nlr 0.1"
    assert [t.get_text() for t in fig.legends[0].get_texts()][:3] == [
        "sqrt_dk", "sqrt_dk, softcap=50", "none"]
    without = [r for r in runs if r.lr >= 1e-2]
    for r in without:
        r.evals = [{k: v for k, v in e.items() if k != "attn_heads"} for e in r.evals]
    assert plot_stability(frame(without), without, "full") is None


def test_a_bound_is_paired_with_its_scale_without_it_in_the_lr_tables(sweep, tmp_path,
                                                                      tables_only):
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out, "--pair", "scaling.softcap=null") == 0
    text = (out / "results.md").read_text()
    against = text.split("paired by seed against `scaling.softcap=default` (the groups with"
                         " more than one LR)")
    assert len(against) == 2
    row = table_row(against[1], "scaling.softcap=50", "sqrt_dk")
    # per seed s, sensitivity = mean over the 3 LRs of the clipped loss - its minimum: sqrt_dk
    # (2.0, 1.5, 4.0 its loss at init) + 0.01 s -> 1 - s/300; soft-capped (2.0, 1.5, 1.6) +
    # 0.02 s -> 0.2; their difference -0.8 + s/300 over seeds 1 and 2
    diffs = [0.2 - (1 - s / 300) for s in (1, 2)]
    assert row[2] == "2"
    assert float(row[3].split(" ± ")[0].replace("−", "-")) == pytest.approx(
        sum(diffs) / 2, abs=5e-5)
    assert "Family: 1 paired t-tests" in against[1].split("\n\n")[2]
    # the baseline's tables are still there, and list no soft-capped row
    baseline = text.split("paired by seed against `sqrt_dk` (the groups with more than one LR)")
    assert len(baseline) == 2
    assert table_row(baseline[1], "scaling.softcap=default", "none")
    assert math.isfinite(float(table_row(baseline[1], "scaling.softcap=default", "none")[3]
                               .split(" ± ")[0].replace("−", "-")))


def test_one_control_puts_every_arm_against_the_scale_without_a_bound_in_one_family(
        sweep, tmp_path, tables_only):
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out, "--pair", "scaling.softcap=null",
                             "--one-control") == 0
    text = (out / "results.md").read_text()
    tables = text.split("LR sensitivity, paired by seed against `sqrt_dk, "
                        "scaling.softcap=default` (the groups with more than one LR)")
    assert len(tables) == 2 and "paired by seed against `scaling.softcap=default`" not in text
    table = tables[1].split("\n\n")[1]
    capped = table_row(table, "scaling.softcap=50", "sqrt_dk")
    unscaled = table_row(table, "scaling.softcap=default", "none")
    assert "Family: 2 paired t-tests" in tables[1].split("\n\n")[2]
    # the soft-capped arm as in the test above: differences -0.8 + s/300, t = 477 with one
    # degree of freedom, p = 1 - 2 atan(t) / pi; Holm over the two arms doubles the smaller p
    diffs = [0.2 - (1 - s / 300) for s in (1, 2)]
    t = abs(sum(diffs) / 2) / (abs(diffs[0] - diffs[1]) / math.sqrt(2) / math.sqrt(2))
    p = 1 - 2 * math.atan(t) / math.pi
    assert float(capped[4]) == pytest.approx(p, rel=5e-3)
    assert float(unscaled[4]) > p
    assert float(capped[5]) == pytest.approx(2 * p, rel=5e-3)
    assert capped[6] == "lower than control"


def test_no_figure_where_each_arm_ran_one_lr(sweep, tmp_path, unrendered_figures):
    """A reported stage (each scale at its chosen LR) has no grid to read stability on: its
    report draws no lr_stability.png, though its runs record per-head statistics."""
    runs, _ = load_runs([sweep])
    chosen = [r for r in runs if r.lr == 1e-2]
    assert plot_stability(frame(chosen), chosen, "full") is None
    two = chosen + [r for r in runs if r.variant == "none" and r.lr == 1e-3]
    assert plot_stability(frame(two), two, "full") is not None   # one arm with two LRs
    grid = tmp_path / "grid"
    assert report_in_process(sweep, "--out", grid) == 0
    assert (grid / "lr_stability.png").is_file()
    stage = tmp_path / "stage"   # the same runs read as a stage whose LRs were chosen on grid's
    assert report_in_process(sweep, "--out", stage, "--select-from", grid / "runs.csv") == 0
    assert not (stage / "lr_stability.png").exists()
