"""curves.jsonl (scripts/report/runs_csv.py): the records of the step-curve figures beside
runs.csv, so that `plot_runs.py --from-csv` draws every figure the run folders draw, and a sweep
run in stages is reported from the earlier stages' committed files plus the last stage's
folders. Figures are built, not rendered: what is compared is every line of every panel."""

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import (
    AT_100,
    NEVER,
    FakeRun,
    make_recall_run,
    make_recall_sweep,
    make_run,
    report_in_process,
    stability_sweep,
    tables_of,
)
from matplotlib.figure import Figure

from scripts.report import figures
from scripts.report import runs_csv as curves
from scripts.report.runs import load_runs


def content(fig: Figure) -> dict:
    """What a figure shows: its title, and per panel the title and every line's label and
    points."""
    panels = [(ax.get_title(), [(line.get_label(), list(line.get_xdata()),
                                 list(line.get_ydata())) for line in ax.lines])
              for ax in fig.axes if ax.get_visible() and ax.axison]
    return {"title": fig._suptitle.get_text() if fig._suptitle else "", "panels": panels}


@pytest.fixture
def drawn(monkeypatch):
    """{file name: content} of every figure a report saves (not rendered)."""
    shown = {}

    def save(fig, fname, **kwargs):
        shown[Path(fname).name] = content(fig)
        Path(fname).write_bytes(b"unrendered")

    monkeypatch.setattr(Figure, "savefig", save)
    return shown


def same_points(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-5)
        for x, y in zip(a, b))


def assert_same_figures(first: dict, second: dict) -> None:
    assert sorted(first) == sorted(second)
    for name in first:
        one, two = first[name], second[name]
        assert one["title"] == two["title"], name
        assert [(t, [label for label, _, _ in lines]) for t, lines in one["panels"]] == \
               [(t, [label for label, _, _ in lines]) for t, lines in two["panels"]], name
        for (_, lines_one), (_, lines_two) in zip(one["panels"], two["panels"]):
            for (label, x1, y1), (_, x2, y2) in zip(lines_one, lines_two):
                assert same_points(x1, x2) and same_points(y1, y2), (name, label)


def sweeps(root: Path) -> list[tuple[Path, list[str]]]:
    """A text ablation (fixed head width, so the per-logit q/k rows are drawn), a high-LR
    sweep with per-head statistics, and a recall sweep (chance level, per-head figures)."""
    text = root / "text"
    for scaling in ("sqrt_dk", "none", "dk"):
        for seed in (1, 2):
            run = make_run(text, [f"scaling={scaling}", f"trainer.seed={seed}"],
                           [4.0, 3.1234567 + 0.01 * seed, 2.5, 2.1 + 0.01 * seed], full=2.0,
                           fake=FakeRun(config={"model": {"d_head": 16, "block_size": 8}}))
            metrics = run / "metrics.jsonl"
            records = [json.loads(line) for line in metrics.read_text().splitlines()]
            for i, record in enumerate(r for r in records if r["kind"] == "eval"):
                record["attn_heads"] = {key: [[0.1 + 0.123456789 * (i + layer + head)
                                               for head in range(2)] for layer in range(2)]
                                        for key, _, _ in figures.HEAD_ROWS[:8]}
            metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [(text, ["--heads-seed", "1"]), (stability_sweep(root), []),
            (make_recall_sweep(root), [])]


def test_from_csv_with_curves_draws_the_figures_of_the_folders(tmp_path, drawn):
    names = {}
    for sweep, options in sweeps(tmp_path):
        out, again = tmp_path / f"{sweep.name}_out", tmp_path / f"{sweep.name}_again"
        assert report_in_process(sweep, "--out", out, *options) == 0
        from_folders = dict(drawn)
        drawn.clear()
        assert (out / "curves.jsonl").is_file()
        assert report_in_process("--from-csv", out / "runs.csv", "--out", again, *options) == 0
        assert tables_of((out / "results.md").read_text()) == \
               tables_of((again / "results.md").read_text())
        assert {"loss_curves.png", "diagnostics.png", "qk_grad_norms.png"} <= set(drawn)
        assert_same_figures(from_folders, drawn)
        names[sweep.name] = set(drawn)
        drawn.clear()
    assert sum(n.startswith("heads_") for n in names["text"]) == 3   # one run per scale
    assert "lr_stability.png" in names["stability"]
    assert "accuracy_curves.png" in names["t"]


def test_a_stage_pooled_from_its_files_reports_as_the_whole_sweep(tmp_path, drawn):
    """Seeds 1-2 reported and their folders gone; seed 3 run later: the report of seed 3's
    folder with stage 1's runs.csv is the report of all three folders."""
    whole = make_recall_sweep(tmp_path / "whole")
    stage1 = tmp_path / "stage1"
    stage2 = tmp_path / "stage2"
    for run in sorted(whole.iterdir()):
        (stage2 if "trainer.seed=3" in run.name else stage1).mkdir(exist_ok=True)
        run.rename((stage2 if "trainer.seed=3" in run.name else stage1) / run.name)
    assert report_in_process(stage1, "--out", tmp_path / "s1") == 0
    for run in stage1.iterdir():   # the folders of stage 1 do not outlive its session
        for f in run.rglob("*"):
            if f.is_file():
                f.unlink()
    drawn.clear()
    assert report_in_process(stage2, "--from-csv", tmp_path / "s1" / "runs.csv",
                             "--out", tmp_path / "pooled") == 0
    pooled = dict(drawn)
    drawn.clear()
    both = make_recall_sweep(tmp_path / "again")
    assert report_in_process(both, "--out", tmp_path / "whole_out") == 0

    def rows(folder):
        with open(folder / "runs.csv", newline="") as f:
            header, *lines = list(csv.reader(f))
        return header, sorted(line[1:] for line in lines)

    def curve_lines(folder):
        return sorted(json.dumps({k: v for k, v in json.loads(line).items() if k != "run"})
                      for line in (folder / "curves.jsonl").read_text().splitlines())

    assert rows(tmp_path / "pooled") == rows(tmp_path / "whole_out")
    assert curve_lines(tmp_path / "pooled") == curve_lines(tmp_path / "whole_out")
    pooled_text = (tmp_path / "pooled" / "results.md").read_text()
    assert tables_of(pooled_text) == tables_of((tmp_path / "whole_out" / "results.md").read_text())
    assert "no reference levels: data=recall generates its sequences" in pooled_text
    assert_same_figures(pooled, drawn)


def test_without_curves_the_step_figures_are_not_drawn_and_none_are_written(tmp_path, drawn):
    sweep = make_recall_sweep(tmp_path)
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    (out / "curves.jsonl").unlink()
    drawn.clear()
    again = tmp_path / "again"
    assert report_in_process("--from-csv", out / "runs.csv", "--out", again) == 0
    assert not drawn and not (again / "loss_curves.png").exists()
    assert "step-curve figures need every run's records" in (again / "results.md").read_text()
    # pooled with a folder: runs.csv is written, and no curves.jsonl that would claim records
    more = tmp_path / "more"
    make_recall_run(more, ["scaling=dk", "trainer.seed=1"], AT_100)
    (again / "curves.jsonl").write_text("stale\n")
    assert report_in_process(more, "--from-csv", out / "runs.csv", "--out", again) == 0
    assert len((again / "runs.csv").read_text().splitlines()) == 1 + 7
    assert not (again / "curves.jsonl").exists()


def test_a_run_read_twice_or_curves_of_other_runs_are_refused(tmp_path, capsys, drawn):
    sweep = make_recall_sweep(tmp_path)
    out = tmp_path / "out"
    assert report_in_process(sweep, "--out", out) == 0
    capsys.readouterr()
    assert report_in_process(sweep, "--from-csv", out / "runs.csv", "--out", tmp_path / "x") == 2
    assert "is read twice" in capsys.readouterr().err
    lines = (out / "curves.jsonl").read_text().splitlines()
    (out / "curves.jsonl").write_text("\n".join(lines[1:]) + "\n")
    results = (out / "results.md").read_text()
    assert report_in_process("--from-csv", out / "runs.csv", "--out", out) == 2
    err = capsys.readouterr().err
    assert "curves.jsonl does not match the runs.csv beside it" in err and "delete" in err
    assert (out / "results.md").read_text() == results   # nothing written is lost
    (out / "curves.jsonl").write_text("{not json\n")
    assert report_in_process("--from-csv", out / "runs.csv", "--out", out) == 2
    assert "line 1: not a record of scripts/plot_runs.py" in capsys.readouterr().err


def test_curves_keep_the_first_and_last_evaluation_exact_and_round_the_rest(tmp_path):
    sweep = tmp_path / "s"
    make_recall_run(sweep, ["scaling=none", "trainer.seed=1"], NEVER,
                    val=[3.123456789, 2.123456789, 1.987654321, 1.5, 1.25, 1.0, 0.987654321])
    run = load_runs([sweep])[0][0]
    record = curves.curves_of(run)
    losses = [e["val_loss"] for e in record["evals"]]
    assert losses == [3.123456789, 2.12346, 1.98765, 1.5, 1.25, 1.0, 0.987654321]
    assert record["evals"][0] == {k: v for k, v in run.evals[0].items() if k != "kind"}
    assert record["train"]["step"] == [r["step"] for r in run.train]
    assert record["train"]["q_grad_norm"][1] == float(f"{0.1 * 2.123456789:.6g}")
    assert record["settings"] == {"data.num_values": "32"}
    assert curves.rounded([math.nan, {"a": 1.23456789}, 7, None])[1:] == [{"a": 1.23457}, 7,
                                                                         None]
    assert figures.fixed_scale(run) is None   # no head width: the settings hold none
