"""scripts/plot_runs.py on data=recall runs, fake run folders made here: steps to 0.9
validation accuracy, the runs that never get there (`not solved`), the final accuracy, the
runs.csv columns, accuracy_curves.png, --heads-seed, and the failed rule of generated data.
plot_runs runs in this process: figures built but not rendered (unrendered_figures), or not
built at all for the tests of the tables (tables_only)."""

import csv
import json
import math

import numpy as np
import pytest
from conftest import (
    AT_100,
    AT_150,
    INIT,
    NEVER,
    RECALL,
    STEP,
    T975,
    FakeRecall,
    interval,
    make_recall_run,
    make_recall_sweep,
    make_run,
    report_in_process,
    table_row,
    tables_of,
    unrendered_savefig,
)
from matplotlib.figure import Figure
from scipy.stats import ttest_rel

from scripts.report import figures, style
from scripts.report.runs import load_runs
from scripts.report.runs_csv import read_runs_csv


@pytest.fixture(scope="module")
def recall_sweep(tmp_path_factory):
    """Read only (a test that adds a run makes its own)."""
    return make_recall_sweep(tmp_path_factory.mktemp("recall"))


@pytest.fixture(scope="module")
def recall_report(recall_sweep, tmp_path_factory):
    """The report of the recall sweep, figures unrendered: (out folder, results.md, the
    figures it drew, left open to be read)."""
    out, drawn = tmp_path_factory.mktemp("recall_out"), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", unrendered_savefig)
        mp.setattr(figures.plt, "close", drawn.append)
        assert report_in_process(recall_sweep, "--out", out) == 0
    yield out, (out / "results.md").read_text(), drawn
    for fig in drawn:
        figures.plt.close(fig)


def test_steps_to_90_is_the_first_eval_at_or_above_090(tmp_path):
    """At 0.9 exactly counts; a later dip does not undo it; 0.89 is not there."""
    dips = [0.0, 0.5, 0.92, 0.4, 0.95]
    for accuracy, want in ((AT_100, 100), (AT_150, 150), (NEVER, None), (dips, 50)):
        run = make_recall_run(tmp_path / str(len(list(tmp_path.iterdir()))),
                              ["scaling=sqrt_dk", "trainer.seed=1"], accuracy)
        (loaded,), _ = load_runs([run])
        assert loaded.recall and loaded.steps_to_90 == want
    plain = make_run(tmp_path / "lm", ["scaling=dk", "trainer.seed=1"], [4.0, 2.0], full=2.0)
    (loaded,), _ = load_runs([plain])
    assert not loaded.recall and loaded.steps_to_90 is None


def test_recall_table_counts_the_runs_that_never_get_there(recall_report):
    text = recall_report[1]
    part = text.split("## Recall accuracy")[1].split("##")[0]
    sq = table_row(part, "scaling=sqrt_dk")
    # steps over the two runs that got there (100, 150); seed 3 in `not solved`
    half = T975[2] * np.std([100, 150], ddof=1) / math.sqrt(2)
    assert sq[1:4] == ["3", f"125 ± {half:.0f} (n=2)", "1"]
    assert sq[4] == f"{interval([0.998, 0.96, 0.41])} (n=3)"   # every finished run
    losses = [INIT * (1 - RECALL["sqrt_dk"][s][0][-1]) + 0.01 for s in (1, 2, 3)]
    assert sq[5] == f"{interval(losses)} (n=3)"
    none = table_row(part, "scaling=none")
    assert none[1:4] == ["3", "150 (n=1)", "2"]
    assert "`not solved`: finished runs that never got there" in part


def test_a_running_run_below_09_is_neither_solved_nor_not_solved(tmp_path, tables_only):
    sweep = tmp_path / "sweep"
    make_recall_run(sweep, ["scaling=dk", "trainer.seed=1"], AT_100)
    make_recall_run(sweep, ["scaling=dk", "trainer.seed=2"], NEVER)
    make_recall_run(sweep, ["scaling=dk", "trainer.seed=3"], [0.0, 0.3],
                    fake=FakeRecall(finished=False))
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    part = (out / "results.md").read_text().split("## Recall accuracy")[1]
    row = table_row(part, "scaling=dk")
    assert row[1:4] == ["3", "100 (n=1)", "1 (+1 still running below it)"]
    assert row[4] == f"{interval([1.0, 0.4])} (n=2)"


def test_runs_csv_has_steps_to_90_empty_when_not_solved(recall_report):
    with open(recall_report[0] / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    columns = list(rows[0])
    assert columns.index("steps_to_90") == columns.index("final_val_accuracy") + 1
    by = {(r["scaling"], r["trainer.seed"]): r for r in rows}
    assert [by[("sqrt_dk", s)]["steps_to_90"] for s in "123"] == ["100", "150", ""]
    assert [by[("none", s)]["steps_to_90"] for s in "123"] == ["150", "", ""]
    assert by[("none", "3")]["final_val_accuracy"] == "0.35"
    assert by[("none", "3")]["last_val_accuracy"] == "0.4"


def test_recall_tables_rebuilt_from_the_csv_are_the_same(tmp_path, tables_only):
    recall_sweep = make_recall_sweep(tmp_path)
    make_recall_run(recall_sweep, ["scaling=none", "trainer.seed=4"], [0.0, 0.3],
                    fake=FakeRecall(finished=False))
    out, again = tmp_path / "out", tmp_path / "again"
    assert report_in_process(recall_sweep, "--out", out) == 0
    assert report_in_process("--from-csv", out / "runs.csv", "--out", again) == 0
    first, second = ((d / "results.md").read_text() for d in (out, again))
    assert "(+1 still running below it)" in first
    assert tables_of(first) == tables_of(second)
    assert first.split("\n", 3)[3] == second.split("\n", 3)[3]   # all but "Sweeps read"


def test_accuracy_curves_are_drawn_for_recall_runs_only(recall_report, tmp_path,
                                                        unrendered_figures):
    out, _, shown = recall_report
    assert (out / "accuracy_curves.png").stat().st_size > 0
    fig = next(f for f in shown if "Validation accuracy" in f._suptitle.get_text())
    ax = fig.axes[0]   # the one panel: sqrt_dk's mean curve over the three seeds, and the lines
    curve = [line for line in ax.lines if line.get_label() == "sqrt_dk"][0]
    assert list(curve.get_xdata()) == [i * STEP for i in range(7)]
    assert list(curve.get_ydata()) == pytest.approx(
        np.mean([RECALL["sqrt_dk"][s][0] for s in (1, 2, 3)], axis=0))
    marks = {round(line.get_ydata()[0], 4) for line in ax.lines if len(line.get_xdata()) == 2}
    assert marks == {0.9, round(1 / 32, 4)}
    assert ax.get_ylim() == pytest.approx((-0.04, 1.04))   # an accuracy's range, not its band's
    lm = tmp_path / "lm"
    make_run(lm, ["scaling=dk", "trainer.seed=1"], [4.0, 2.0], full=2.0)
    assert report_in_process(lm, "--out", tmp_path / "lm_out") == 0
    assert not (tmp_path / "lm_out" / "accuracy_curves.png").exists()
    assert "## Recall accuracy" not in (tmp_path / "lm_out" / "results.md").read_text()


def test_an_accuracy_band_is_clipped_to_0_1():
    """Three seeds at 0.2, 0.6 and 1.0: the t interval (+-0.99) reaches outside [0, 1]."""
    fig, ax = figures.plt.subplots()
    agg = style.aggregate([([0, 25], [0.0, 0.2]), ([0, 25], [0.0, 0.6]), ([0, 25], [0.0, 1.0])])
    style.draw_mean(ax, (agg, ()), style.LOOKS["sqrt_dk"], "sqrt_dk", bounds=(0.0, 1.0))
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 0.0 and band.max() == 1.0
    figures.plt.close(fig)


def test_recall_runs_have_no_reference_levels_and_say_which_failed_rule_applies(
        tmp_path, tables_only):
    """The report reads the recall data config and does not look for an n-gram cache; a run
    that ends above its step-0 loss fails (left out of the loss table and the pairs), and
    still counts in the recall table."""
    sweep = tmp_path / "sweep"
    for seed, final in ((1, 0.2), (2, 0.3), (3, 0.25)):
        make_recall_run(sweep, ["scaling=sqrt_dk", f"trainer.seed={seed}"], [0.0, 0.95, 1.0],
                        val=[INIT, 1.0, final])
    for seed, final in ((1, 0.5), (2, 0.7), (3, INIT + 0.2)):   # seed 3 ends above its init
        make_recall_run(sweep, ["scaling=none", f"trainer.seed={seed}"], [0.0, 0.5, 0.4],
                        val=[INIT, 2.0, final])
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    text = (out / "results.md").read_text()
    assert "no reference levels: data=recall generates its sequences" in text
    assert ("above its own step-0 loss (data=recall generates its sequences: there is no"
            " corpus and no n-gram reference level, so the unigram rule does not apply)") in text
    assert "Reference levels" not in text
    assert table_row(text, "scaling=none")[5] == "1"   # failed
    assert "scaling=none,trainer.seed=3: final loss 3.7000 above its step-0 loss" in text
    recall = table_row(text.split("## Recall accuracy")[1], "scaling=none")
    assert recall[3] == "3" and recall[5] == f"{interval([0.5, 0.7, INIT + 0.2])} (n=3)"
    # pairs on the loss, over the seeds where neither run failed (1, 2): one Holm family
    pair = table_row(text.split("## Paired differences")[1], "all", "none")
    p = ttest_rel([0.5, 0.7], [0.2, 0.3]).pvalue
    assert pair[2:6] == ["2", interval([0.3, 0.4]), f"{p:.3g}", f"{p:.3g}"]


def test_heads_seed_draws_one_run_per_cell(tmp_path, tables_only, unrendered_figures):
    sweep = tmp_path / "sweep"
    heads = {"entropy": [[1.0, 2.0]], "saturated": [[0.1, 0.2]], "max_logit": [[3.0, 4.0]],
             "raw_max_logit": [[3.0, 4.0]], "raw_var": [[1.0, 1.0]]}
    for d_head in (16, 64):
        for scaling in ("sqrt_dk", "none"):
            for seed in (1, 2):
                run = make_recall_run(sweep, [f"model.d_head={d_head}", f"scaling={scaling}",
                                              f"trainer.seed={seed}"], AT_100)
                metrics = run / "metrics.jsonl"
                records = [json.loads(line) for line in metrics.read_text().splitlines()]
                for r in records:
                    if r["kind"] == "eval":
                        r["attn_heads"] = heads
                metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out, "--heads-seed", "2") == 0
    drawn = sorted(p.name for p in out.glob("heads_*.png"))
    assert drawn == sorted(f"heads_model.d_head={d}_scaling={s}_trainer.seed=2.png"
                           for d in (16, 64) for s in ("sqrt_dk", "none"))
    assert report_in_process(sweep, "--out", tmp_path / "o9", "--heads-seed", "9") == 0
    notes = (tmp_path / "o9" / "results.md").read_text().split("## Notes")[1]
    assert notes.count("has no run of that seed") == 4


def test_a_runs_csv_without_the_accuracy_columns_still_reads(recall_report, tmp_path,
                                                             tables_only):
    """runs.csv files written before steps_to_90 and last_val_accuracy existed (committed
    stage-1 results, read by --select-from) read as runs without those numbers."""
    with open(recall_report[0] / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as f:
        keep = [c for c in rows[0] if c not in ("steps_to_90", "last_val_accuracy")]
        writer = csv.DictWriter(f, keep, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    runs, _ = read_runs_csv(old)
    assert len(runs) == 6 and all(r.recall and r.steps_to_90 is None for r in runs)
    assert report_in_process("--from-csv", old, "--out", tmp_path / "again") == 0
