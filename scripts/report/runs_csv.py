"""The files beside results.md from which `plot_runs.py --from-csv` rebuilds a report
(docs/report.md, "runs.csv and --from-csv"): runs.csv, a row per run with every number of the
tables (repr, which reads back to the same float; empty: missing), and curves.jsonl, the records
the step curves draw, a line per run: {"run", "settings" (FIGURE_SETTINGS), "evals", "train"
(step, q and k gradient norms)}, all but the first and last eval rounded to SIGNIFICANT digits."""

import csv
import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Optional

from model.errors import UserError
from scripts.report import stats as st
from scripts.report.runs import SEED_KEY, VARIANT_KEY, RunRecord, is_seed_key
from scripts.report.tables import DIAGNOSTICS, layer_value

FINAL = ("final_val_loss_full", "final_val_loss", "init_val_loss", "failed",
         "final_val_accuracy", "steps_to_90", "best_val_loss", "diverged", "finished", "steps",
         "tokens_per_sec", "full_eval_targets", "full_eval_split_targets")
FIRST_COLUMN = FINAL[0]  # the swept keys are the columns between `run` and this one
# where attention's mass goes and the residual stream's size (trainer/diagnose.py), combined
# over layers as DIAGNOSTICS are; in runs.csv only, absent from runs.csv files written before them
MASS = (("attn_first_mass", "mean"), ("attn_sink_rate", "mean"), ("attn_sink_weight", "mean"),
        ("hidden_top1", "max"), ("hidden_median", "mean"), ("hidden_kurtosis", "max"))
COMBINED = (*((name, how) for name, _, how in DIAGNOSTICS), *MASS)
ATTN = tuple(name for name, _ in COMBINED)
EVALS = ("first_eval_step", *(f"first_{a}" for a in ATTN), "last_eval_step",
         "last_val_accuracy", *ATTN)
OPTIONAL = ("steps_to_90", "last_val_accuracy", "full_eval_targets", "full_eval_split_targets",
            *(c for name, _ in MASS for c in (name, f"first_{name}")))
REF_PREFIX = "ref_"
LENGTH_COLUMN = re.compile(r"len\d+_")   # RunRecord.lengths, after `trained_length`


def swept_keys(runs: list[RunRecord]) -> list[str]:
    """`scaling`, then every override key of the runs and the seed, in alphabetical order."""
    keys = {k for r in runs for k in r.overrides} - {VARIANT_KEY}
    return [VARIANT_KEY, *sorted(keys | ({SEED_KEY} if not any(map(is_seed_key, keys)) else set()))]


def number(x) -> str:
    if x is None or isinstance(x, bool):
        return "" if x is None else str(x).lower()
    return repr(int(x)) if isinstance(x, int) else repr(float(x))


def row_of(run: RunRecord, keys: list[str], lengths: list[str], reading: tuple) -> list[str]:
    """reading: (which loss, levels)."""
    (which, levels), steps = reading, run.summary_value("steps")
    settings = [run.variant if k == VARIANT_KEY else run.setting(k) for k in keys]
    final = [run.summary_value("final_val_loss_full"), run.final_val_loss_sampled,
             run.loss_at_init, st.failure(run, which, levels) is not None,
             run.summary_value("final_val_accuracy"), run.steps_to_90, run.best_val_loss,
             run.diverged, not run.partial, None if steps is None else int(steps),
             run.tokens_per_sec, *(run.summary_value(c, int) for c in FINAL[-2:])]
    first, last = run.evals[0], run.evals[-1]
    accuracy = last.get("val_accuracy")
    attn = [[layer_value(e, name, how) for name, how in COMBINED] for e in (first, last)]
    evals = [first.get("step"), *attn[0], last.get("step"),
             None if accuracy is None else float(accuracy), *attn[1]]
    length = [run.trained_length, *map(run.lengths.get, lengths)] if lengths else []
    return [str(run.path), *("null" if v is None else v for v in settings),
            *map(number, [*final, *evals, *length, *(levels or {}).values()])]


def write_runs_csv(runs: list[RunRecord], path: Path, which: str, levels: Optional[dict]) -> None:
    keys = swept_keys(runs)
    lengths = list(dict.fromkeys(c for r in runs for c in r.lengths))
    refs = [REF_PREFIX + name for name in (levels or {})]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", *keys, *FINAL, *EVALS, *(["trained_length"] if lengths else []),
                      *lengths, *refs])
        out.writerows(row_of(run, keys, lengths, (which, levels)) for run in runs)


@dataclass
class CsvRun(RunRecord):
    """A run rebuilt from its row of runs.csv (evals hold the layer-combined statistics as
    one-element lists, which the tables combine back to the same value)."""

    row: dict = field(default_factory=dict)
    with_curves: bool = False  # evals and train read from the curves.jsonl beside runs.csv
    final_val_loss_sampled = property(lambda self: self.row["final_val_loss"])
    best_val_loss = property(lambda self: self.row["best_val_loss"])
    diverged = property(lambda self: self.row["diverged"])
    tokens_per_sec = property(lambda self: self.row["tokens_per_sec"])
    loss_at_init = property(lambda self: self.row["init_val_loss"])
    steps_to_90 = property(lambda self: self.row.get("steps_to_90"))
    trained_length = property(lambda self: self.row.get("trained_length"))
    lengths = cached_property(lambda self: {c: v for c, v in self.row.items()
                                     if LENGTH_COLUMN.match(c) and v is not None})


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
    """The runs of a runs.csv (with the curves.jsonl beside it) and their reference levels
    (None if absent); a UserError naming what is wrong with the file."""
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
        values.update({c: math.nan for c in ("final_val_loss", "best_val_loss", "tokens_per_sec")
                       if values.get(c, 0) is None})
        levels = {c[len(REF_PREFIX):]: v for c, v in values.items()
                  if c.startswith(REF_PREFIX)} or None
        runs.append(csv_run(row, keys, values))
    if (path.parent / CURVES_FILE).is_file():
        read_curves(path.parent / CURVES_FILE, runs)
        for run in runs:
            run.with_curves = True
    return runs, levels


def has_curves(run: RunRecord) -> bool:
    return not isinstance(run, CsvRun) or run.with_curves


def csv_run(row: dict, keys: list[str], values: dict) -> CsvRun:
    overrides = {k: row[k] for k in keys if k != VARIANT_KEY}
    first = {"step": values["first_eval_step"]}
    last = {"step": values["last_eval_step"]}
    if values.get("last_val_accuracy") is not None:   # a recall run: RunRecord.recall reads it
        last["val_accuracy"] = values["last_val_accuracy"]
    for name in ATTN:
        for record, column in ((first, f"first_{name}"), (last, name)):
            if values.get(column) is not None:
                record[name] = [values[column]]
    summary = {name: values[name] for name in ("final_val_loss_full", "final_val_accuracy",
                                                "steps", *FINAL[-2:])
               if values.get(name) is not None} if values["finished"] else None
    return CsvRun(Path(row["run"]), overrides, row[VARIANT_KEY], [], [first, last], summary,
                  {}, row=values)


CURVES_FILE = "curves.jsonl"
SIGNIFICANT = 6
TRAIN_FIELDS = ("q_grad_norm", "k_grad_norm")
# the settings figures.py reads: the fixed score scale s, entropy and saturation floors, chance
FIGURE_SETTINGS = ("model.d_head", "model.d_model", "model.n_head", "model.block_size",
                   "scaling.divisor", "data.num_values")


def rounded(value):
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def curves_of(run: RunRecord) -> dict:
    evals = [{k: v for k, v in e.items() if k != "kind"} for e in run.evals]
    middle = [rounded(e) for e in evals[1:-1]]
    ends = evals[:1] + middle + evals[1:][-1:]
    rows = [r for r in run.train if any(r.get(k) is not None for k in TRAIN_FIELDS)]
    train = {k: rounded([r.get(k) for r in rows]) for k in ("step", *TRAIN_FIELDS)}
    settings = {k: v for k in FIGURE_SETTINGS if (v := run.setting(k)) is not None}
    return {"run": str(run.path), "settings": settings, "evals": ends, "train": train}


def write_curves(runs: list[RunRecord], path: Path) -> None:
    with open(path, "w") as f:
        for run in runs:
            f.write(json.dumps(curves_of(run), separators=(",", ":")) + "\n")


def read_curves(path: Path, runs: list[RunRecord]) -> None:
    """Gives the runs of a runs.csv their curves.jsonl records; a UserError on a mismatch."""
    curves = {}
    for line, text in enumerate(path.read_text().splitlines(), start=1):
        try:
            record = json.loads(text)
            curves[record["run"]] = record
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{path}, line {line}: not a record of scripts/plot_runs.py"
                            " (a JSON object with run, evals and train). Regenerate it with"
                            " its runs.csv from the sweep folders, or delete it to read"
                            " runs.csv alone.") from None
    same_runs = set(curves) == {str(r.path) for r in runs}
    for run in runs:
        record = curves.get(str(run.path)) or {}
        evals = record.get("evals") or []
        steps = [run.evals[0].get("step"), run.evals[-1].get("step")]
        if not same_runs or [e.get("step") for e in evals[:1] + evals[-1:]] != steps:
            raise UserError(f"{path} does not match the runs.csv beside it ({run.path}: no"
                            " record, or other first and last evaluation steps). Write both"
                            " with one report of the sweep folders, or delete curves.jsonl to"
                            " read runs.csv alone.")
        run.evals = [{"kind": "eval", **e} for e in evals]
        run.info = {"settings": record.get("settings") or {}}   # RunRecord.setting reads it
        train = record.get("train") or {}
        run.train = [{"kind": "train", **dict(zip(train, row))} for row in zip(*train.values())]
