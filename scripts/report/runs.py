"""Read the run folders of sweeps and group them. A run folder is what train.py writes
(trainer/run_dir.py): run.json, metrics.jsonl, summary.json (when the run ended: without it the
run is still going) and, for a job of a Hydra sweep, .hydra/overrides.yaml. Runs group by the
keys whose values differ across the runs read, minus the seed (the repeats); `scaling`, the
score scale or "variant", is always the first part of a group's key.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from model.config import SCALINGS
from model.errors import UserError
from trainer.files import read_metrics

LR_KEY = "optim.lr"
SEED_KEY = "trainer.seed"
VARIANT_KEY = "scaling"
# data=recall: a run has solved the task at its first evaluation with val_accuracy at least
# this (runs.csv's steps_to_90; docs/report.md, "Recall runs")
SOLVED_ACCURACY = 0.9
RUN_MARKERS = (".hydra/overrides.yaml", "metrics.jsonl", "summary.json", "run.json")
# Overrides that say how a run was executed, not what it computes: never a setting to group by
# (a sweep continued on one thread, or resumed, holds the same runs as one that was not).
EXECUTION_KEYS = ("trainer.threads", "trainer.resume")


@dataclass
class RunRecord:
    path: Path
    overrides: dict  # key -> value string, as written on the command line (seed included)
    variant: str
    train: list  # train records, in file order
    evals: list  # eval records, in file order
    summary: Optional[dict]  # None while the run is still going
    info: dict  # run.json, {} if absent

    @property
    def partial(self) -> bool:
        return self.summary is None

    def summary_value(self, name: str) -> Optional[float]:
        """A number of summary.json; None when the run has no summary or no such field."""
        value = (self.summary or {}).get(name)
        return None if value is None else float(value)

    def summary_count(self, name: str) -> Optional[int]:
        """An integer field of summary.json (a count); None when absent."""
        value = (self.summary or {}).get(name)
        return None if value is None else int(value)

    @property
    def final_val_loss_sampled(self) -> float:
        """Loss on the fixed sampled validation batches at the end (last eval if running)."""
        value = self.summary_value("final_val_loss")
        return _num(self.evals[-1].get("val_loss")) if value is None else value

    @property
    def best_val_loss(self) -> float:
        value = self.summary_value("best_val_loss")
        if value is not None:
            return value
        finite = [v for v in (_num(e.get("val_loss")) for e in self.evals) if math.isfinite(v)]
        return min(finite) if finite else math.nan

    @property
    def diverged(self) -> bool:
        flagged = bool(self.summary and self.summary.get("diverged"))
        return flagged or not math.isfinite(self.final_val_loss_sampled)

    @property
    def tokens_per_sec(self) -> float:
        """summary.json's figure; for a running job the median over its train records."""
        value = self.summary_value("tokens_per_sec")
        if value is not None:
            return value
        rates = [r for r in (_num(t.get("tokens_per_sec")) for t in self.train) if math.isfinite(r)]
        return statistics.median(rates) if rates else math.nan

    @property
    def loss_at_init(self) -> Optional[float]:
        """The step-0 eval loss (its record, else summary's init_val_loss), else ln(vocab_size)
        from run.json (the loss of a uniform prediction), else None."""
        for e in self.evals:
            if e.get("step") == 0 and math.isfinite(_num(e.get("val_loss"))):
                return float(e["val_loss"])
        if self.summary_value("init_val_loss") is not None:
            return self.summary_value("init_val_loss")
        vocab = _lookup(self.info, ("model_config", "vocab_size"),
                        ("config", "model", "vocab_size"), ("vocab_size",))
        return math.log(vocab) if vocab else None

    @property
    def recall(self) -> bool:
        """Whether the run scores accuracy (data=recall): val_accuracy in an eval record, or
        final_val_accuracy in summary.json. Other data have no accuracy fields at all."""
        return (any(e.get("val_accuracy") is not None for e in self.evals)
                or self.summary_value("final_val_accuracy") is not None)

    @property
    def steps_to_90(self) -> Optional[int]:
        """The first eval step whose val_accuracy is at least SOLVED_ACCURACY; None when no
        evaluation got there (not solved, or not yet while the run is going)."""
        steps = [int(e["step"]) for e in self.evals
                 if _num(e.get("val_accuracy")) >= SOLVED_ACCURACY]
        return min(steps) if steps else None

    @property
    def chance_accuracy(self) -> Optional[float]:
        """1 / data.num_values, the accuracy of a guess (docs/data.md, "Recall task"); None
        when run.json does not give it."""
        values = self.setting("data.num_values")
        return 1.0 / float(values) if values else None

    def setting(self, key: str) -> Optional[str]:
        """The value of a dotted config key: the override, else run.json's resolved config, so
        that a run that left optim.lr at its default groups with runs that set the same lr.
        Numbers are written canonically ("1e-3" and "0.001" are one value)."""
        value = self.overrides.get(key)
        if value is None:
            value = _lookup(self.info, ("config", *key.split(".")))
        return canonical(value)

    @property
    def lr(self) -> float:
        """optim.lr of the run, NaN if neither the overrides nor run.json give it."""
        lr = self.setting(LR_KEY)
        return math.nan if lr is None else float(lr)

    @property
    def seed(self) -> Optional[str]:
        """The run's seed: what pairs runs of different groups (same data order and init)."""
        for key in self.overrides:
            if is_seed_key(key):
                return self.setting(key)
        return self.setting(SEED_KEY)


def canonical(value) -> Optional[str]:
    """A config value as a string that compares across spellings: numbers in one format
    ("1e-3" == "0.001"), booleans lower-case, null (and non-scalars) as None."""
    if value is None or value == "null" or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    try:
        return format(float(value), ".10g")
    except ValueError:
        return str(value)


def _num(x) -> float:
    """JSON number (or null / NaN / Infinity) as a float; null becomes NaN."""
    return math.nan if x is None else float(x)


def _lookup(d: dict, *paths):
    for path in paths:
        node = d
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def find_run_dirs(root: Path) -> list[Path]:
    """Every folder under root (root included) that holds a run; run folders are not entered."""
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if any((here / m).exists() for m in RUN_MARKERS):
            found.append(here)
            dirnames.clear()
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return found


def read_overrides(run_dir: Path, info: dict) -> dict:
    """.hydra/overrides.yaml (a YAML list of "key=value"), else run.json's "overrides", as a
    dict; "+key" counts as "key". Hydra's own keys and EXECUTION_KEYS are left out."""
    f = run_dir / ".hydra" / "overrides.yaml"
    items = (yaml.safe_load(f.read_text()) or []) if f.exists() else info.get("overrides") or []
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+")
        if (sep and not key.startswith("~") and not key.startswith("hydra.")
                and key not in EXECUTION_KEYS):
            out[key] = value
    return out


def _read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def load_run(run_dir: Path) -> tuple[Optional[RunRecord], Optional[str]]:
    """A RunRecord, or (None, why it was skipped). metrics.jsonl is read by train.py's own rule: a
    torn last line (a job caught mid-write) is dropped, a bad line before it skips the run."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None, "no metrics.jsonl"
    try:
        records = read_metrics(metrics)
    except UserError as e:
        return None, str(e)
    if not records:
        return None, "empty metrics.jsonl"
    evals = [r for r in records if r.get("kind") == "eval"]
    if not evals:
        return None, "no eval record yet"
    info = _read_json(run_dir / "run.json") or {}
    overrides = read_overrides(run_dir, info)
    variant = overrides.get(VARIANT_KEY) or _lookup(
        info, ("config", "scaling", "name"), ("model_config", "scaling", "name")) or "unknown"
    train = [r for r in records if r.get("kind") == "train"]
    return RunRecord(run_dir, overrides, str(variant), train, evals,
               _read_json(run_dir / "summary.json"), info), None


def load_runs(roots: list[Path]) -> tuple[list[RunRecord], list[str]]:
    """All runs under the roots, and the skipped ones ("path: reason")."""
    runs, skipped = [], []
    for root in roots:
        for run_dir in find_run_dirs(root):
            run, why = load_run(run_dir)
            if run is None:
                skipped.append(f"{run_dir}: {why}")
            else:
                runs.append(run)
    return runs, skipped


# Grouping


def is_seed_key(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def varying_keys(runs: list[RunRecord]) -> list[str]:
    """Override keys (seed excluded) whose value differs between runs, in a stable order."""
    keys = sorted({k for r in runs for k in r.overrides if not is_seed_key(k)})
    return [k for k in keys if len({r.setting(k) for r in runs}) > 1]


def value_order(value):
    """Sort key for a setting's value: the default first, then numbers by size, then strings."""
    if value is None:
        return (-1, 0.0, "")
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def setting_order(pairs) -> list:
    """Sort key for a setting, ((key, value), ...): by its values, in value_order."""
    return [value_order(v) for _, v in pairs]


def variant_order(variant: str):
    """A scale's place in model.config.SCALINGS (unknown ones after), for every table."""
    return (SCALINGS.index(variant) if variant in SCALINGS else len(SCALINGS), variant)


def group_runs(runs: list[RunRecord], drop: tuple = ()) -> dict[tuple, list[RunRecord]]:
    """Group key: (("scaling", variant), (key, value), ...) over the varying keys not in drop,
    ordered by variant, then by the values of the other keys."""
    keys = [k for k in varying_keys(runs) if k != VARIANT_KEY and k not in drop]
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        key = ((VARIANT_KEY, r.variant),) + tuple((k, r.setting(k)) for k in keys)
        groups.setdefault(key, []).append(r)
    order = sorted(groups, key=lambda g: (variant_order(g[0][1]),
                                          [value_order(v) for _, v in g[1:]]))
    return {g: groups[g] for g in order}


def setting_of(key: tuple) -> tuple:
    """A group key without its variant: the setting at which variants are compared."""
    return key[1:]


def label(pairs, default: str = "", short: bool = False) -> str:
    """"key=value, ..." for (key, value) pairs; `default` when there are none. short: the last
    part of each dotted key ("d_head=16" for model.d_head), for panel titles."""
    text = ", ".join(f"{k.rsplit('.', 1)[-1] if short else k}={'default' if v is None else v}"
                     for k, v in pairs)
    return text or default


def eval_series(run: RunRecord, name: str, reduce) -> tuple[list, list]:
    """(steps, values) of an eval-record field; a per-layer list is reduced by `reduce`."""
    steps, values = [], []
    for e in run.evals:
        value = e.get(name)
        if value is None or (isinstance(value, list) and not value):
            continue
        steps.append(e["step"])
        values.append(reduce([_num(v) for v in value]) if isinstance(value, list) else _num(value))
    return steps, values


def record_series(run: RunRecord, name: str) -> tuple[list, list]:
    """(steps, values) of a scalar field from the train records, else from the eval records
    (the q/k gradient norms are logged with the train records)."""
    for records in (run.train, run.evals):
        has = [r for r in records if r.get(name) is not None]
        if has:
            return [r["step"] for r in has], [_num(r[name]) for r in has]
    return [], []
