"""Read the run folders of sweeps and group them. A run folder is what train.py writes
(trainer/run_dir.py): run.json, metrics.jsonl, summary.json (absent while the run is going) and,
for a Hydra job, .hydra/overrides.yaml. Runs group by the keys whose values differ across the
runs read, minus the seed (the repeats); `scaling`, the score scale or "variant", comes first.
"""

import dataclasses
import functools
import json
import math
import os
import re
import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional

import yaml

from model.config import SCALINGS
from model.errors import UserError
from trainer.files import read_metrics

LR_KEY = "optim.lr"
SEED_KEY = "trainer.seed"
VARIANT_KEY = "scaling"
NORMALISER_KEY = "scaling.normaliser"   # the key the normaliser group (normaliser=sink) sets
SOLVED_ACCURACY = 0.9   # data=recall: solved at the first evaluation this accurate
RUN_MARKERS = (".hydra/overrides.yaml", "metrics.jsonl", "summary.json", "run.json")
# How a run was executed or read after training, not what it trains: never a setting to group by.
EXECUTION_KEYS = ("trainer.threads", "trainer.resume", "trainer.eval_lengths")
LENGTH_FIELDS = ("loss", "sliding_loss", "accuracy", "right_key_weight")   # of "length_eval"


@dataclass
class RunRecord:
    path: Path
    overrides: dict  # key -> value string, as written on the command line (seed included)
    variant: str
    train: list  # train records, in file order
    evals: list  # eval records, in file order
    summary: Optional[dict]  # None while the run is still going
    info: dict  # run.json, {} if absent

    partial = property(lambda self: self.summary is None)   # no summary.json: still going

    def summary_value(self, name: str, kind=float):
        """A field of summary.json as `kind`; None without a summary or such a field."""
        value = (self.summary or {}).get(name)
        return None if value is None else kind(value)

    @property
    def final_val_loss_sampled(self) -> float:
        """Loss on the fixed sampled validation batches at the end (last eval if running)."""
        value = self.summary_value("final_val_loss")
        return _num(self.evals[-1].get("val_loss")) if value is None else value

    @property
    def best_val_loss(self) -> float:
        finite = [v for v in (_num(e.get("val_loss")) for e in self.evals) if math.isfinite(v)]
        value = self.summary_value("best_val_loss")
        return value if value is not None else min(finite, default=math.nan)

    diverged = property(lambda self: bool((self.summary or {}).get("diverged"))
                        or not math.isfinite(self.final_val_loss_sampled))

    @property
    def tokens_per_sec(self) -> float:
        """summary.json's figure; for a running job the median over its train records."""
        value = self.summary_value("tokens_per_sec")
        rates = [r for r in (_num(t.get("tokens_per_sec")) for t in self.train) if math.isfinite(r)]
        return value if value is not None else statistics.median(rates) if rates else math.nan

    @property
    def loss_at_init(self) -> Optional[float]:
        """The step-0 eval loss, else init_val_loss, else ln(vocab_size), else None."""
        for e in self.evals:
            if e.get("step") == 0 and math.isfinite(_num(e.get("val_loss"))):
                return float(e["val_loss"])
        if (init := self.summary_value("init_val_loss")) is not None:
            return init
        vocab = _lookup(self.info, ("model_config", "vocab_size"),
                        ("config", "model", "vocab_size"), ("vocab_size",))
        return math.log(vocab) if vocab else None

    @property
    def recall(self) -> bool:
        """Whether the run scores accuracy (data=recall); other data have no accuracy fields."""
        return (any(e.get("val_accuracy") is not None for e in self.evals)
                or self.summary_value("final_val_accuracy") is not None)

    @property
    def steps_to_90(self) -> Optional[int]:
        """The first eval step with val_accuracy >= SOLVED_ACCURACY; None if none got there."""
        steps = [int(e["step"]) for e in self.evals
                 if _num(e.get("val_accuracy")) >= SOLVED_ACCURACY]
        return min(steps) if steps else None

    @property
    def chance_accuracy(self) -> Optional[float]:
        """1 / data.num_values, the accuracy of a guess; None where run.json lacks it."""
        return 1.0 / float(values) if (values := self.setting("data.num_values")) else None

    def setting(self, key: str) -> Optional[str]:
        """A dotted key's value, canonical: the override, else run.json's config (a default
    groups with the runs that set it), else curves.jsonl's "settings"."""
        value = self.overrides.get(key)
        return canonical(value if value is not None else _lookup(
            self.info, ("config", *key.split(".")), ("settings", key)))

    lr = property(lambda self: math.nan if (lr := self.setting(LR_KEY)) is None else float(lr))

    @cached_property   # read per cell by the length tables and figures
    def lengths(self) -> dict:
        """summary.json's "length_eval" as runs.csv's columns: len{n}_{field} and, per position
        bucket lo-hi, len{n}_b{lo}_{hi}_{field} (docs/report.md, "Length runs")."""
        out = {}
        for n, record in ((self.summary or {}).get("length_eval") or {}).items():
            for part, values in [("", record), *((f"b{b.replace('-', '_')}_", v)
                                                 for b, v in record.get("buckets", {}).items())]:
                out.update({f"len{n}_{part}{k}": float(values[k]) for k in LENGTH_FIELDS
                            if values.get(k) is not None})
        return out

    @property
    def trained_length(self) -> Optional[int]:
        """The longest training row: model.block_size tokens, or on the lookup task
        data.seq_len - 1 pairs (the last token is the query); None without length_eval."""
        pairs = self.setting("data.task") == "kv"
        value = self.setting("data.seq_len" if pairs else "model.block_size")
        return int(value) - pairs if self.lengths and value is not None else None

    @property
    def seed(self) -> Optional[str]:
        """What pairs runs of different groups (same data order and init)."""
        return self.setting(next((k for k in self.overrides if is_seed_key(k)), SEED_KEY))


def canonical(value) -> Optional[str]:
    """A config value as a comparable string ("1e-3" == "0.001"); null as None."""
    if value is None or value == "null" or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    try:
        return format(float(value), ".10g")
    except ValueError:
        return str(value)


def _num(x) -> float:
    """A JSON number (or null / NaN / Infinity) as a float; null becomes NaN."""
    return math.nan if x is None else float(x)


def _lookup(d: dict, *paths):
    for path in paths:
        node = d
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node


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
    """.hydra/overrides.yaml (else run.json's) as a dict, less Hydra and EXECUTION_KEYS; the
    normaliser group's choice under its key, NORMALISER_KEY, however it was set."""
    f = run_dir / ".hydra" / "overrides.yaml"
    items = (yaml.safe_load(f.read_text()) or []) if f.exists() else info.get("overrides") or []
    parts = [(key.lstrip("+"), sep, value) for key, sep, value in
             (str(item).partition("=") for item in items)]
    return {NORMALISER_KEY if key == "normaliser" else key: value for key, sep, value in parts
            if sep and not key.startswith(("~", "hydra.")) and key not in EXECUTION_KEYS}


def load_run(run_dir: Path) -> tuple[Optional[RunRecord], Optional[str]]:
    """A RunRecord, or (None, why it was skipped); metrics.jsonl read as train.py reads it."""
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
    info, summary = (json.loads(f.read_text()) if f.exists() else None
                     for f in (run_dir / "run.json", run_dir / "summary.json"))
    info = info or {}
    overrides = read_overrides(run_dir, info)
    variant = overrides.get(VARIANT_KEY) or _lookup(
        info, ("config", "scaling", "name"), ("model_config", "scaling", "name")) or "unknown"
    train = [r for r in records if r.get("kind") == "train"]
    return RunRecord(run_dir, overrides, str(variant), train, evals, summary, info), None


def load_runs(roots: list[Path]) -> tuple[list[RunRecord], list[str]]:
    runs, skipped = [], []
    for run_dir in (d for root in roots for d in find_run_dirs(root)):
        run, why = load_run(run_dir)
        runs += [run] if run is not None else []
        skipped += [] if run is not None else [f"{run_dir}: {why}"]
    return runs, skipped


def is_seed_key(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def varying_keys(runs: list[RunRecord]) -> list[str]:
    """Override keys (seed excluded) whose value differs between runs, sorted."""
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
    return [value_order(v) for _, v in pairs]


def group_runs(runs: list[RunRecord], drop: tuple = ()) -> dict[tuple, list[RunRecord]]:
    """Group key: (("scaling", variant), (key, value), ...) over the varying keys."""
    keys = [k for k in varying_keys(runs) if k != VARIANT_KEY and k not in drop]
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        key = ((VARIANT_KEY, r.variant),) + tuple((k, r.setting(k)) for k in keys)
        groups.setdefault(key, []).append(r)
    place = {v: (i, v) for i, v in enumerate(SCALINGS)}
    order = sorted(groups, key=lambda g: (place.get(g[0][1], (len(SCALINGS), g[0][1])),
                                          setting_order(g[1:])))
    return {g: groups[g] for g in order}


def label(pairs, default: str = "", short: bool = False) -> str:
    """"key=value, ..." (short: the last part of each dotted key), or `default`."""
    return ", ".join(pair_text(k, v, short) for k, v in pairs) or default


@functools.cache
def default_of(key: str) -> Optional[str]:
    """A dotted key's default in trainer/schema.py's config (canonical); None where it has no
    plain one (null, required, a factory, not a field)."""
    from trainer.schema import GROUPS
    group, _, name = key.partition(".")
    found = [f.default for f in dataclasses.fields(GROUPS[group]) if f.name == name] \
        if group in GROUPS else []
    return canonical(found[0]) if found and found[0] is not dataclasses.MISSING \
        and isinstance(found[0], (bool, int, float, str)) else None


def pair_text(key: str, value: Optional[str], short: bool = False) -> str:
    """One setting as label writes it; a normaliser by its name alone ("sink"), which says it;
    short: a number of 5 decimals or more to 4 significant digits (0.005946035575: 0.005946)."""
    if key == NORMALISER_KEY and value is not None:
        return value
    if short and re.fullmatch(r"-?[0-9]*\.[0-9]{5,}", value or ""):   # a raw float: 4 digits
        value = f"{float(value):.4g}"
    return f"{key.rsplit('.', 1)[-1] if short else key}={'default' if value is None else value}"


def eval_series(run: RunRecord, name: str, reduce) -> tuple[list, list]:
    """(steps, values) of an eval-record field; a per-layer list is reduced by `reduce`."""
    records = [(e["step"], v) for e in run.evals if (v := e.get(name)) not in (None, [])]
    return ([s for s, _ in records], [reduce([_num(x) for x in v]) if isinstance(v, list)
                                      else _num(v) for _, v in records])


def record_series(run: RunRecord, name: str) -> tuple[list, list]:
    """(steps, values) of a scalar field of the train records, else of the eval records."""
    has = next((h for records in (run.train, run.evals)
                if (h := [r for r in records if r.get(name) is not None])), [])
    return [r["step"] for r in has], [_num(r[name]) for r in has]
