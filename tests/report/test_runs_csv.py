"""runs.csv (scripts/report/runs_csv.py) carries trainer.diagnostics' mass and residual-stream
fields, combined over layers (attention mass and the median: mean; top |h| and kurtosis: max),
for the first and last evaluation; a runs.csv written before them still reads."""

import csv
from pathlib import Path

import pytest

from scripts.report.runs import RunRecord
from scripts.report.runs_csv import MASS, read_runs_csv, write_runs_csv

FIELDS = {"attn_first_mass": [0.2, 0.4], "attn_sink_rate": [0.0, 0.5],
          "attn_sink_weight": [0.1, 0.3], "hidden_top1": [3.0, 40.0], "hidden_top2": [2.0, 9.0],
          "hidden_top3": [1.5, 8.0], "hidden_median": [0.5, 0.7], "hidden_kurtosis": [1.0, 9.0]}
COMBINED = {"attn_first_mass": 0.3, "attn_sink_rate": 0.25, "attn_sink_weight": 0.2,
            "hidden_top1": 40.0, "hidden_median": 0.6, "hidden_kurtosis": 9.0}


def run(seed: int, step_0: dict) -> RunRecord:
    """A finished run of two evaluations; the last holds FIELDS times the seed."""
    last = {"step": 10, "val_loss": 2.0, "attn_entropy": [1.0, 1.2],
            **{k: [seed * v for v in values] for k, values in FIELDS.items()}}
    return RunRecord(Path(f"run_{seed}"), {"trainer.seed": str(seed)}, "sqrt_dk", [],
                     [{"step": 0, "val_loss": 3.0, **step_0}, last],
                     {"final_val_loss": 2.0, "steps": 10}, {})


def test_mass_columns_combine_the_layers_and_read_back(tmp_path):
    runs = [run(1, FIELDS), run(2, {})]   # the second's step 0 predates the mass fields
    write_runs_csv(runs, tmp_path / "runs.csv", "sampled", None)
    with open(tmp_path / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for name, value in COMBINED.items():
        assert float(rows[0][name]) == pytest.approx(value)
        assert float(rows[1][name]) == pytest.approx(2 * value)
        assert float(rows[0][f"first_{name}"]) == pytest.approx(value)
        assert rows[1][f"first_{name}"] == ""
    assert {name for name, _ in MASS} == set(COMBINED)
    back, _ = read_runs_csv(tmp_path / "runs.csv")
    assert back[1].evals[-1]["attn_sink_rate"] == [pytest.approx(0.5)]
    assert "attn_sink_rate" not in back[1].evals[0]
    # a runs.csv written before these columns existed reads, without them
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as f:
        keep = [c for c in rows[0] if not any(n in c for n in COMBINED)]
        writer = csv.DictWriter(f, keep, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    back, _ = read_runs_csv(old)
    assert len(back) == 2 and "attn_sink_rate" not in back[0].evals[-1]
    assert back[0].evals[-1]["attn_entropy"] == [pytest.approx(1.1)]
