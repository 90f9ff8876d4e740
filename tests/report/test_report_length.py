"""Runs evaluated past their training length (scripts/report/length.py, runs.csv's len* columns):
the registered prediction of the fixed factor against a hand computation, its paired test and
the accuracy family against scipy on the committed lookup fixture (20-step runs), the sliding
window verdicts on made-up text runs, runs.csv's columns written and read back, and the lookup
figure's band clipped to [0, 1]. The fixtures' diagnostics.png keeps the figure contract
(test_figure_contract.py)."""

import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from conftest import table_row  # noqa: E402
from scipy.stats import ttest_rel  # noqa: E402

from scripts.report import length, style  # noqa: E402
from scripts.report import stats as st  # noqa: E402
from scripts.report.figures import Frame  # noqa: E402
from scripts.report.runs import RunRecord, group_runs  # noqa: E402
from scripts.report.runs_csv import read_runs_csv, write_runs_csv  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
LOOKUP = {"config": {"data": {"task": "kv", "seq_len": 65, "num_values": 8}}}   # 64 pairs
TEXT = {"config": {"model": {"block_size": 64}}}


def lookup_run(seed: int, factor: str, weights: dict, accuracy: float = 0.5) -> RunRecord:
    """A finished lookup run with these weights on the right key ({n: p})."""
    record = {str(n): {"accuracy": accuracy, "loss": 1.0, "right_key_weight": p,
                       "right_key_weight_heads": [[p]], "sequences": 1000}
              for n, p in weights.items()}
    return RunRecord(Path(f"{factor}_{seed}"), {"scaling.length": factor,
                                                "trainer.seed": str(seed)}, "sqrt_dk", [],
                     [{"step": 0, "val_loss": 2.0}], {"length_eval": record}, LOOKUP)


def text_run(seed: int, factor: str, past: float) -> RunRecord:
    """A finished text run at lengths 64 and 128; its loss at positions 65-128 is its
    sliding-window loss (2.0) plus `past`."""
    buckets = {"1-64": {"loss": 2.5, "sliding_loss": 2.5, "targets": 10},
               "65-128": {"loss": 2.0 + past, "sliding_loss": 2.0, "targets": 10}}
    record = {"64": {"loss": 2.5, "sliding_loss": 2.5, "targets": 10,
                     "buckets": {"1-64": buckets["1-64"]}},
              "128": {"loss": 2.2 + past, "sliding_loss": 2.2, "targets": 20,
                      "buckets": buckets}}
    return RunRecord(Path(f"{factor}_{seed}"), {"scaling.length": factor,
                                                "trainer.seed": str(seed)}, "sqrt_dk", [],
                     [{"step": 0, "val_loss": 3.0}], {"length_eval": record}, TEXT)


def test_the_registered_prediction_by_hand():
    """D = mean over n = 16, 32, 64 of ln((n - 1) p / (1 - p)); p(n) = e^D / (e^D + n - 1)."""
    run = lookup_run(1, "fixed", {16: 0.2, 32: 0.1, 64: 0.05, 256: 0.01})
    d = (math.log(15 * 0.2 / 0.8) + math.log(31 * 0.1 / 0.9) + math.log(63 * 0.05 / 0.95)) / 3
    assert run.trained_length == 64
    assert length.predicted(run, 256) == pytest.approx(math.exp(d) / (math.exp(d) + 255),
                                                       rel=1e-12)
    # the prediction reproduces the weights it was fitted on when they follow it exactly
    exact = {n: math.exp(1.5) / (math.exp(1.5) + n - 1) for n in (16, 32, 64, 1024)}
    assert length.predicted(lookup_run(1, "fixed", exact), 1024) == pytest.approx(exact[1024])


def test_prediction_and_accuracy_tables_on_the_lookup_fixture():
    runs, _ = read_runs_csv(FIXTURES / "length_lookup" / "runs.csv")
    text = length.length_sections(runs, "sqrt_dk")
    by = {(r.setting("scaling.length"), r.seed): r for r in runs}
    seeds = ("1", "2", "3")
    logs, ps = {}, {}
    for n in (256, 1024, 2048):   # log measured - log predicted, D fitted by hand
        pred = []
        for s in seeds:
            w = {m: by["fixed", s].lengths[f"len{m}_right_key_weight"] for m in (16, 32, 64)}
            d = np.mean([math.log((m - 1) * p / (1 - p)) for m, p in w.items()])
            pred.append(math.exp(d) / (math.exp(d) + n - 1))
        measured = [by["fixed", s].lengths[f"len{n}_right_key_weight"] for s in seeds]
        logs[n] = np.log(measured) - np.log(pred)
        ps[n] = ttest_rel(np.log(measured), np.log(pred)).pvalue
    part = text.split("The registered prediction")[1].split("Accuracy past")[0]
    holm = st.holm(list(ps.values()))
    for (n, diff), p, p_holm in zip(logs.items(), ps.values(), holm):
        row = table_row(part, "scaling=sqrt_dk, scaling.length=fixed", str(n))
        assert row[2] == "3" and row[5].startswith(f"{math.exp(diff.mean()):.4g} (")
        assert row[6:8] == [f"{p:.3g}", f"{p_holm:.3g}"]
        assert row[8].startswith("not resolved from the prediction" if p_holm >= 0.05 else "")
    # accuracy past 64 of log_n against fixed, one family with ssmax's
    part = text.split("Accuracy past")[1]
    diff = [by["log_n", s].lengths["len1024_accuracy"] - by["fixed", s].lengths[
        "len1024_accuracy"] for s in seeds]
    row = table_row(part, "scaling.length=log_n, n=1024")
    assert row[1:4] == ["sqrt_dk", "3", st.mean_interval(diff).text().split(" (n")[0]]
    assert "Family: 2 paired t-tests" in part   # the identical pairs are not tests


def test_text_verdicts_against_the_sliding_window_and_the_fixed_factor():
    """Past 64: `uses` is 0.1 below its sliding window at every seed, `blows` 0.1 above it,
    `fixed` within noise of it; within 64 every group has the same loss."""
    noise = (0.01, -0.02, 0.015)
    runs = [text_run(s, factor, past + e) for factor, past in (("fixed", 0.0), ("uses", -0.1),
                                                             ("blows", 0.1))
            for s, e in zip((1, 2, 3), noise if factor == "fixed" else (0.001, 0.002, 0.0))]
    text = length.length_sections(runs, "sqrt_dk")
    sliding = text.split("Past the training length, each group's loss")[1]
    verdicts = {factor: table_row(sliding, f"scaling=sqrt_dk, scaling.length={factor}",
                                  "128")[-1] for factor in ("fixed", "uses", "blows")}
    assert verdicts["uses"] == "uses the extra context"
    assert verdicts["blows"] == "blow-up"
    assert re.fullmatch(r"interval up to \+0\.\d{4}; not resolved \(Holm p >= 0.05\)",
                        verdicts["fixed"])
    within, past = text.split("Family:")[:2]
    row = table_row(past, "scaling.length=uses, length=128, positions=65-128")
    expected = [-0.1 + u - f for u, f in zip((0.001, 0.002, 0.0), noise)]
    assert row[3] == st.mean_interval(expected).text().split(" (n")[0]
    assert table_row(within, "scaling.length=uses, length=64, positions=1-64")[-1] == (
        "identical runs (not a test)")


def test_runs_csv_writes_and_reads_the_length_columns(tmp_path):
    runs = [text_run(1, "fixed", 0.0), lookup_run(2, "fixed", {16: 0.2, 256: 0.01})]
    write_runs_csv(runs, tmp_path / "runs.csv", "full", None)
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert header[header.index("trained_length"):] == [
        "trained_length", "len64_loss", "len64_sliding_loss", "len64_b1_64_loss",
        "len64_b1_64_sliding_loss", "len128_loss", "len128_sliding_loss", "len128_b1_64_loss",
        "len128_b1_64_sliding_loss", "len128_b65_128_loss", "len128_b65_128_sliding_loss",
        "len16_loss", "len16_accuracy", "len16_right_key_weight", "len256_loss",
        "len256_accuracy", "len256_right_key_weight"]
    back, _ = read_runs_csv(tmp_path / "runs.csv")
    assert [r.lengths for r in back] == [r.lengths for r in runs]
    assert [r.trained_length for r in back] == [64, 64]


def test_the_lookup_band_is_clipped_to_0_1():
    """Weights near 1 spread over three seeds: the geometric mean's upper band passes 1."""
    runs = [lookup_run(s, "fixed", {16: p, 256: p}, accuracy=a)
            for s, p, a in ((1, 0.99, 1.0), (2, 0.4, 0.1), (3, 0.95, 0.95))]
    keys = group_runs(runs)
    arms = style.Arms.of(keys)
    frame = Frame(arms, style.palette([length.length_arms(arms).name(k) for k in keys]))
    fig = length.plot_lookup(frame, runs)
    weight, accuracy = fig.axes
    for ax in (weight, accuracy):
        top = max(p.vertices[:, 1].max() for c in ax.collections for p in c.get_paths())
        assert top == pytest.approx(1.0)   # clipped, not above
    mean = np.exp(np.mean(np.log([0.99, 0.4, 0.95])))
    assert weight.lines[0].get_ydata()[0] == pytest.approx(mean)   # geometric on a log axis
    dashed = [line for line in weight.lines if line.get_label().startswith("prediction")]
    assert len(dashed) == 1 and dashed[0].get_linestyle() == "--"
    matplotlib.pyplot.close(fig)


def test_length_text_draws_no_panel_for_a_group_read_only_within_training():
    """model.pos=learned is read at its training length only: a column for nope, none for it."""
    runs = [text_run(s, "fixed", 0.1) for s in (1, 2, 3)] + [text_run(s, "fixed", 0.0)
                                                              for s in (1, 2, 3)]
    for i, run in enumerate(runs):
        run.overrides["model.pos"] = "nope" if i < 3 else "learned"
        if i >= 3:
            run.summary["length_eval"].pop("128")
    keys = group_runs(runs)
    arms = style.Arms.of(keys)
    frame = Frame(arms, style.palette([length.length_arms(arms).name(k) for k in keys]))
    fig = length.plot_text(frame, runs)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["pos=nope"]
    assert len(fig.axes) == 2   # loss, and loss less the sliding window
    matplotlib.pyplot.close(fig)
