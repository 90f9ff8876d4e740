"""runs.csv: one row per run with every number the tables and the LR figures are made of, so
that a reader can recompute each interval, and so that `plot_runs.py --from-csv` rebuilds them.
docs/report.md ("runs.csv and --from-csv") lists the columns. Numbers are written with Python's
repr, which reads back to the same float, so the tables rebuilt from the CSV equal the sweep's
digit for digit; an empty cell is a missing value. The OPTIONAL columns may be absent from a
runs.csv written before they existed: its runs read as runs without accuracy or target counts.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from model.errors import UserError
from scripts.report import stats as st
from scripts.report.curves import CURVES_FILE, read_curves
from scripts.report.runs import SEED_KEY, VARIANT_KEY, RunRecord, is_seed_key
from scripts.report.tables import DIAGNOSTICS, layer_value

FINAL = ("final_val_loss_full", "final_val_loss", "init_val_loss", "failed",
         "final_val_accuracy", "steps_to_90", "best_val_loss", "diverged", "finished", "steps",
         "tokens_per_sec", "full_eval_targets", "full_eval_split_targets")
FIRST_COLUMN = FINAL[0]  # the swept keys are the columns between `run` and this one
ATTN = tuple(name for name, _, _ in DIAGNOSTICS)
EVALS = ("first_eval_step", *(f"first_{a}" for a in ATTN), "last_eval_step",
         "last_val_accuracy", *ATTN)
# columns a reader does not require
OPTIONAL = ("steps_to_90", "last_val_accuracy", "full_eval_targets", "full_eval_split_targets")
REF_PREFIX = "ref_"


def swept_keys(runs: list[RunRecord]) -> list[str]:
    """Every override key of the runs, `scaling` first and the seed always, then the others in
    alphabetical order."""
    keys = sorted({k for r in runs for k in r.overrides} - {VARIANT_KEY})
    if not any(is_seed_key(k) for k in keys):
        keys = sorted([*keys, SEED_KEY])
    return [VARIANT_KEY, *keys]


def number(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x).lower()
    return repr(int(x)) if isinstance(x, int) else repr(float(x))


def diagnostics(record: dict) -> list[Optional[float]]:
    return [layer_value(record, name, how) for name, _, how in DIAGNOSTICS]


def row_of(run: RunRecord, keys: list[str], which: str, levels: Optional[dict]) -> list[str]:
    settings = [run.variant if k == VARIANT_KEY else run.setting(k) for k in keys]
    steps = run.summary_value("steps")
    final = [run.summary_value("final_val_loss_full"), run.final_val_loss_sampled,
             run.loss_at_init, st.failure(run, which, levels) is not None,
             run.summary_value("final_val_accuracy"), run.steps_to_90, run.best_val_loss,
             run.diverged, not run.partial, None if steps is None else int(steps),
             run.tokens_per_sec, *map(run.summary_count, FINAL[-2:])]
    first, last = run.evals[0], run.evals[-1]
    accuracy = last.get("val_accuracy")
    evals = [first.get("step"), *diagnostics(first), last.get("step"),
             None if accuracy is None else float(accuracy), *diagnostics(last)]
    refs = list((levels or {}).values())
    return [str(run.path), *("null" if v is None else v for v in settings),
            *map(number, [*final, *evals, *refs])]


def write_runs_csv(runs: list[RunRecord], path: Path, which: str, levels: Optional[dict]) -> None:
    keys = swept_keys(runs)
    refs = [REF_PREFIX + name for name in (levels or {})]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", *keys, *FINAL, *EVALS, *refs])
        for run in runs:
            out.writerow(row_of(run, keys, which, levels))


@dataclass
class CsvRun(RunRecord):
    """A run rebuilt from its row of runs.csv: the numbers RunRecord derives from the run folder's
    records are read from the row instead (and the eval records hold the layer-combined
    statistics as one-element lists, which the tables combine back to the same value)."""

    row: dict = field(default_factory=dict)
    with_curves: bool = False  # evals and train read from the curves.jsonl beside runs.csv

    @property
    def final_val_loss_sampled(self) -> float:
        return self.row["final_val_loss"]

    @property
    def best_val_loss(self) -> float:
        return self.row["best_val_loss"]

    @property
    def diverged(self) -> bool:
        return self.row["diverged"]

    @property
    def tokens_per_sec(self) -> float:
        return self.row["tokens_per_sec"]

    @property
    def loss_at_init(self) -> Optional[float]:
        return self.row["init_val_loss"]

    @property
    def steps_to_90(self) -> Optional[int]:
        return self.row.get("steps_to_90")


def parse(text: str, column: str, line: int, path: Path):
    """A cell as a bool, int, float or None (empty); a one-paragraph error otherwise."""
    if text in ("true", "false"):
        return text == "true"
    if text == "":
        return None
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        raise UserError(f"{path}, line {line}: column {column} holds {text!r}, not a number."
                        " runs.csv is written by scripts/plot_runs.py; regenerate it from the"
                        " sweep folders rather than editing it by hand.") from None


def read_runs_csv(path: Path) -> tuple[list[RunRecord], Optional[dict]]:
    """The runs of a runs.csv and the reference levels it was judged against (None if absent),
    with their records from the curves.jsonl beside it where there is one (curves.py). A file
    that is not such a CSV raises a UserError naming the file and what is wrong."""
    if not path.is_file():
        raise UserError(f"{path}: no such file. Pass the runs.csv that scripts/plot_runs.py"
                        " wrote beside a results.md.")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0] if rows else []
    missing = [c for c in ("run", VARIANT_KEY, *FINAL, *EVALS)
               if c not in header and c not in OPTIONAL]
    if missing:
        raise UserError(f"{path} is not a runs.csv of scripts/plot_runs.py: it lacks the"
                        f" column(s) {', '.join(missing)}. Pass the runs.csv written beside a"
                        " results.md, or the sweep folders themselves.")
    keys = header[1:header.index(FIRST_COLUMN)]
    runs, levels = [], None
    for line, cells in enumerate(rows[1:], start=2):
        if len(cells) != len(header):
            raise UserError(f"{path}, line {line}: {len(cells)} cells for {len(header)}"
                            " columns. Regenerate runs.csv from the sweep folders.")
        row = dict(zip(header, cells))
        values = {c: parse(row[c], c, line, path) for c in header[len(keys) + 1:]}
        values = {c: math.nan if v is None and c in ("final_val_loss", "best_val_loss",
                                                     "tokens_per_sec") else v
                  for c, v in values.items()}
        levels = {c[len(REF_PREFIX):]: v for c, v in values.items()
                  if c.startswith(REF_PREFIX)} or None
        runs.append(csv_run(row, keys, values))
    if (path.parent / CURVES_FILE).is_file():
        read_curves(path.parent / CURVES_FILE, runs)
        for run in runs:
            run.with_curves = True
    return runs, levels


def has_curves(run: RunRecord) -> bool:
    """Whether the run has every record the step-curve figures draw: a run read from its
    folder, or from a runs.csv with its curves.jsonl."""
    return not isinstance(run, CsvRun) or run.with_curves


def csv_run(row: dict, keys: list[str], values: dict) -> CsvRun:
    overrides = {k: row[k] for k in keys if k != VARIANT_KEY}
    first = {"step": values["first_eval_step"]}
    last = {"step": values["last_eval_step"]}
    if values.get("last_val_accuracy") is not None:   # a recall run: RunRecord.recall reads it
        last["val_accuracy"] = values["last_val_accuracy"]
    for name in ATTN:
        for record, column in ((first, f"first_{name}"), (last, name)):
            if values[column] is not None:
                record[name] = [values[column]]
    summary = None
    if values["finished"]:
        summary = {name: values[name] for name in
                   ("final_val_loss_full", "final_val_accuracy", "steps", *FINAL[-2:])
                   if values.get(name) is not None}
    return CsvRun(Path(row["run"]), overrides, row[VARIANT_KEY], [], [first, last], summary,
                  {}, row=values)
