"""LR transfer across width (scripts/report/width.py): the optimum per width from a parabola
in log2 LR, its drift per doubling of width (one line through every seed's optima) with Holm
over the cells, wider against
narrower at each width's own best LR, on conftest.width_sweep, whose losses are parabolas in
log2 LR with known optima: under sp the optimum falls by 1.1, 0.9 and 1.0 (seeds 1-3) per
doubling, under mup it moves by 0.05, -0.05 and 0."""

import math

import pytest
from conftest import LOG2_LRS, SLOPES, WIDTHS, loss_at, optimum, table_row, width_sweep
from scipy import stats

from scripts.report import stats as st
from scripts.report.runs import load_runs
from scripts.report.tables import Reading, markdown_report
from scripts.report.width import (
    cell_optima,
    cells,
    drift,
    optimal_log2_lr,
    parabola_vertex,
    width_section,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_runs([width_sweep(tmp_path_factory.mktemp("width"))])[0]


def test_the_parabola_through_three_points_finds_its_vertex():
    assert parabola_vertex([0.0, 1.0, 2.0], [(x - 1.3) ** 2 for x in (0, 1, 2)]) == \
        pytest.approx(1.3)
    assert parabola_vertex([0.0, 1.0, 3.0], [4.0, 4.0, 4.0]) == 1.0   # flat: the middle point
    losses = {2.0 ** k: (k + 8.4) ** 2 for k in range(-10, -5)}
    assert optimal_log2_lr(losses) == pytest.approx(-8.4)
    assert optimal_log2_lr({2.0 ** k: -k for k in range(-10, -5)}) is None   # lowest at the edge


def test_each_seeds_optimum_and_its_drift_per_doubling(runs):
    by_cell = cells(runs)
    assert [dict(key)["param"] for key in by_cell] == ["mup", "sp"]
    for key, by_width in by_cell.items():
        param = dict(key)["param"]
        optima = cell_optima(by_width, "full")
        for width in WIDTHS:
            for seed in (1, 2, 3):
                # a parabola through three points of a parabola is exact
                assert optima[width][str(seed)] == pytest.approx(optimum(param, width, seed))
        # the seeds share the widths, so the line through all nine optima has the seeds'
        # mean slope
        fit = drift(optima)
        assert fit.diff.mean == pytest.approx(sum(SLOPES[param].values()) / 3)
        assert fit.diff.n == 9


def pooled_slope(seeds_slopes: dict) -> tuple[float, float, float]:
    """Slope, 95% half-width and p of the least-squares line through the optima
    -6 + slope_seed * log2(width / 64), computed from the textbook formulas."""
    xs = [math.log2(w / 64) for w in WIDTHS for _ in seeds_slopes]
    ys = [-6.0 + b * math.log2(w / 64) for w in WIDTHS for b in seeds_slopes.values()]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    se = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (n - 2) / sxx)
    return b, st.t_quantile(0.975, n - 2) * se, float(2 * stats.t.sf(abs(b / se), n - 2))


def test_a_drift_needs_three_optima_for_an_interval_and_two_widths_for_a_slope(tmp_path):
    assert drift({64: {"1": -6.0}, 128: {"1": -7.0}}).diff.half is None
    assert drift({64: {"1": -6.0}, 128: {"1": -7.0}}).diff.mean == pytest.approx(-1.0)
    assert drift({64: {"1": -6.0, "2": -6.5}, 128: {"1": None}}).diff is None
    runs = [r for r in load_runs([width_sweep(tmp_path)])[0]
            if r.setting("trainer.seed") == "1" and r.setting("model.d_model") != "256"]
    row = table_row("\n".join(width_section(runs, "full")), "scaling=sqrt_dk, param=sp")
    assert row[3:] == ["-1.100 (n=2, no interval)", "n/a", "n/a",
                       "not resolved (2 optima, no interval)"]


def test_the_width_tables_are_one_holm_family_each(runs):
    text = "\n".join(width_section(runs, "full"))
    sp = table_row(text, "scaling=sqrt_dk, param=sp")
    assert sp[1:4] == ["0.0156 (n=3)", "0.00781 (n=3)", "0.00391 (n=3)"]   # 2^-6, -7, -8
    b, half, p_sp = pooled_slope(SLOPES["sp"])
    assert sp[4] == f"{b:.3f} ± {half:.3f} (n=9)"
    assert float(sp[5]) == pytest.approx(p_sp, rel=1e-2)
    _, _, p_mup = pooled_slope(SLOPES["mup"])
    assert float(sp[6]) == pytest.approx(min(1, 2 * min(p_sp, p_mup)), rel=1e-2)   # Holm, 2 cells
    assert sp[7] == "falls with width"
    mup = table_row(text, "scaling=sqrt_dk, param=mup")
    assert mup[7] == "not resolved (Holm p >= 0.05)"
    assert "Family: 2 slope t-tests" in text
    wider = table_row(text, "scaling=sqrt_dk, param=sp", "64 -> 128")
    assert wider[2] == "3"
    best = {w: [min(loss_at("sp", w, s, k) for k in LOG2_LRS) for s in (1, 2, 3)]
            for w in (64, 128)}
    diff = sum(b - a for a, b in zip(best[64], best[128])) / 3
    assert float(wider[3].split(" ± ")[0]) == pytest.approx(diff, abs=5e-5)
    assert wider[6] == "wider better"
    assert len([line for line in text.splitlines() if " -> " in line]) == 4   # 2 cells x 2


def test_results_md_has_the_width_section_only_when_the_width_varies(runs):
    def report(rs):
        return markdown_report("read", rs, {}, rs, Reading("full", "sqrt_dk"))
    assert "## Width" in report(runs)
    assert "## Width" not in report([r for r in runs if r.setting("model.d_model") == "64"])
