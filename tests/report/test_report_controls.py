"""The report's controls: n-gram reference levels above every table of results.md and as
labelled lines in the loss figures, and the per-head figure (scripts/plot_runs.py --heads)."""

import json
import math

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from conftest import heads_run, make_run  # noqa: E402

from scripts import plot_runs  # noqa: E402
from scripts.report import figures, ngram, style  # noqa: E402

LEVELS = {"unigram": 3.32, "bigram": 2.51, "trigram": 2.06}


def test_reference_lines_are_named_in_the_legend_not_written_over_the_panel():
    fig, ax = plt.subplots()
    ax.plot([0, 10], [1.9, 2.4])
    style.reference_lines(ax, LEVELS)
    drawn = sorted(line.get_ydata()[0] for line in ax.lines[1:])
    assert drawn == [2.06, 2.51, 3.32] and not ax.texts
    assert ax.get_legend_handles_labels()[1] == ["unigram 3.32", "bigram 2.51",
                                                  "trigram 2.06"]
    plt.close(fig)


def test_the_levels_line_goes_above_every_table_once():
    markdown = "# r\n\ntext\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## s\n\n| c |\n|---|\n| 3 |\n"
    line = ngram.levels_line(LEVELS)
    out = ngram.above_every_table(markdown, line).split("\n")
    assert out.count(line) == 2
    for i, row in enumerate(out):
        if row.startswith("| a") or row.startswith("| c"):
            assert out[i - 2] == line and out[i - 1] == ""
    assert line.endswith("unigram 3.3200, bigram 2.5100, trigram 2.0600.")


def test_plot_heads_draws_every_head_of_every_layer(tmp_path):
    run, value = heads_run(tmp_path)
    fig = figures.plot_heads(run, "a run")
    axes = fig.axes
    assert len(axes) == 5 * 2  # statistics x layers, row by row
    for i, ax in enumerate(axes):
        layer = i % 2
        heads = [line for line in ax.lines if len(line.get_xdata()) == 3]
        assert len(heads) == 3
        for head, line in enumerate(heads):
            assert list(line.get_xdata()) == [0, 5, 10]
            assert list(line.get_ydata()) == [value(s, layer, head) for s in (0, 5, 10)]
        assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 9
    uniform = sum(math.log(t) for t in range(1, 9)) / 8
    marks = [line.get_ydata()[0] for line in axes[0].lines if len(line.get_xdata()) == 2]
    assert marks == [pytest.approx(uniform)]
    marks = [line.get_ydata()[0] for line in axes[2].lines if len(line.get_xdata()) == 2]
    assert marks == [pytest.approx(1 / 8)]
    assert "one run: a run (n = 1, no intervals)" in " ".join(fig._suptitle.get_text().split())
    run.evals = [{k: v for k, v in e.items() if k != "attn_heads"} for e in run.evals]
    assert figures.plot_heads(run, "a run") is None
    plt.close(fig)


def test_a_constant_head_statistic_draws_flat_when_its_last_digits_wobble(tmp_path):
    """Uniform attention's entropy is one number at every step; curves.jsonl keeps it to 6
    significant digits except at the first and last evaluation, so a figure drawn from it sees
    3.5977 and 3.59770 +- 1e-6. Autoscaled, that wobble filled the panel as steps; the panel
    keeps the range an exactly constant line gets (a few % around it) either way."""
    run, _ = heads_run(tmp_path, block_size=96)
    exact = sum(math.log(t) for t in range(1, 97)) / 96
    for i, e in enumerate(run.evals):
        wobble = 0.0 if i in (0, len(run.evals) - 1) else float(f"{exact:.6g}") - exact
        e["attn_heads"]["entropy"] = [[exact + wobble] * 3 for _ in range(2)]
    fig = figures.plot_heads(run, "a run")
    for ax in fig.axes[:2]:   # the entropy row, both layers
        lo, hi = ax.get_ylim()
        assert lo < exact < hi and hi - lo >= 0.05 * exact, (lo, hi)


def test_plot_runs_prints_the_corpus_levels_above_every_table(english, tmp_path,
                                                              unrendered_figures):
    sweep = tmp_path / "sweep"
    for scaling in ("sqrt_dk", "uniform"):
        run = make_run(sweep, [f"scaling={scaling}", "trainer.seed=1"], [4.2, 3.0, 2.5],
                       full=2.5)
        (run / ".hydra" / "config.yaml").write_text(
            "data:\n" + "".join(f"  {key}: {json.dumps(value)}\n"
                                for key, value in vars(english).items()))
    out = tmp_path / "out"
    assert plot_runs.main([str(sweep), "--out", str(out), "--heads", str(run)]) == 0
    report = (out / "results.md").read_text().split("\n")
    line = ngram.levels_line(ngram.reference_levels(english))
    tables = [i for i, row in enumerate(report)
              if row.startswith("|") and not report[i - 1].startswith("|")]
    assert len(tables) >= 3
    assert all(report[i - 2] == line for i in tables)
    assert "its eval records have no attn_heads" in "\n".join(report)
    assert (out / "loss_curves.png").is_file()
