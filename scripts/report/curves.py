"""curves.jsonl, beside runs.csv: the records the step-curve figures draw, so that --from-csv
draws every figure without the run folders. One line per run, in runs.csv's order:
{"run", "settings" (FIGURE_SETTINGS from run.json), "evals" (the eval records), "train" (the
step and q and k gradient norms, as columns)}. The first and last eval record keep every digit
(the tables read them); every other number is rounded to SIGNIFICANT digits (60% of the size).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from model.errors import UserError
from scripts.report.runs import RunRecord

CURVES_FILE = "curves.jsonl"
SIGNIFICANT = 6
TRAIN_FIELDS = ("q_grad_norm", "k_grad_norm")
# RunRecord.setting keys of figures.py (the fixed score scale s, the entropy and saturation
# floors, the chance level)
FIGURE_SETTINGS = ("model.d_head", "model.d_model", "model.n_head", "model.block_size",
                   "scaling.divisor", "data.num_values")


def rounded(value):
    """value with every float rounded to SIGNIFICANT digits, through lists and dicts."""
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


def as_info(settings: dict) -> dict:
    """run.json's shape ({"config": nested keys}) of dotted settings, for RunRecord.setting."""
    config: dict = {}
    for key, value in settings.items():
        *parents, name = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return {"config": config}


def write_curves(runs: list[RunRecord], path: Path) -> None:
    with open(path, "w") as f:
        for run in runs:
            f.write(json.dumps(curves_of(run), separators=(",", ":")) + "\n")


def read_curves(path: Path, runs: list[RunRecord]) -> None:
    """Gives each run of a runs.csv its records from the curves.jsonl beside it, in place.
    A file that does not hold exactly these runs, or whose first and last evaluation steps
    differ from runs.csv's, raises a UserError: the two were not written together."""
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
        run.info = as_info(record.get("settings") or {})
        train = record.get("train") or {}
        run.train = [{"kind": "train", **dict(zip(train, row))} for row in zip(*train.values())]
