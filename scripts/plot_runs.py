"""Turn sweep directories into loss curves, diagnostics, an LR-sensitivity plot and a table.

    python scripts/plot_runs.py SWEEP_DIR [SWEEP_DIR ...] --out DIR

SWEEP_DIR is a Hydra multirun folder (multirun/<date>/<time>/ holding one folder per job, each
with .hydra/overrides.yaml), any folder above such folders, or a single run directory. Every
folder holding .hydra/overrides.yaml, metrics.jsonl, summary.json or run.json is one run; the
metrics and summary formats are those of issue 4 (see the contract). Writes:

- DIR/loss_curves.png    train loss (train records) and val loss (eval records) vs step
- DIR/diagnostics.png    attn_entropy, attn_max_logit (log y), attn_saturated per layer vs step
- DIR/lr_sensitivity.png final val loss and peak max attention logit vs optim.lr (log x);
                         only when the runs vary optim.lr
- DIR/results.md         the tables below, also printed

Grouping: runs are grouped by the overrides that vary across runs, minus the seed; the variant
(the colour) is the `scaling` override, else run.json's scaling name. Seeds of a group are drawn
as the mean line with a min/max band. The table gives, per group, the number of runs, final and
best val loss as mean +- sample std over the runs that did not diverge, the number diverged, the
number still running (no summary.json: the last eval record stands in), and tokens/s.

LR sensitivity (Wortsman et al. 2023; SCIENCE.md section 5), per variant (group minus optim.lr):
the mean over the LR grid of min(loss(lr), loss_at_init) - best_loss, where loss(lr) is a run's
final val loss, clipped per run and then averaged over seeds; a diverged run counts as
loss_at_init; best_loss is the smallest such per-LR loss of the variant; loss_at_init is the run's
eval record at step 0, else ln(vocab_size) from run.json.

Runs with a missing or empty metrics.jsonl, or without any eval record, are skipped and listed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

LR_KEY = "optim.lr"
VARIANT_KEY = "scaling"
# Same order as model.attention.SCALINGS so a variant keeps its colour across figures.
VARIANT_ORDER = ("sqrt_dk", "none", "dk", "constant", "learned", "qk_norm")
DIAGNOSTICS = (("attn_entropy", "entropy (nats)", False),
               ("attn_max_logit", "max |logit|", True),
               ("attn_saturated", "saturated fraction", False))
RUN_MARKERS = (".hydra/overrides.yaml", "metrics.jsonl", "summary.json", "run.json")


# ---------------------------------------------------------------------------------------------
# 1. Reading runs
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
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

    @property
    def final_val_loss(self) -> float:
        if self.summary is not None and self.summary.get("final_val_loss") is not None:
            return float(self.summary["final_val_loss"])
        return _num(self.evals[-1].get("val_loss"))

    @property
    def best_val_loss(self) -> float:
        if self.summary is not None and self.summary.get("best_val_loss") is not None:
            return float(self.summary["best_val_loss"])
        finite = [v for v in (_num(e.get("val_loss")) for e in self.evals) if math.isfinite(v)]
        return min(finite) if finite else math.nan

    @property
    def diverged(self) -> bool:
        flagged = bool(self.summary and self.summary.get("diverged"))
        return flagged or not math.isfinite(self.final_val_loss)

    @property
    def tokens_per_sec(self) -> float:
        """summary.json's figure; for a running job the median over its train records."""
        if self.summary is not None and self.summary.get("tokens_per_sec") is not None:
            return float(self.summary["tokens_per_sec"])
        rates = [_num(t.get("tokens_per_sec")) for t in self.train]
        rates = [r for r in rates if math.isfinite(r)]
        return statistics.median(rates) if rates else math.nan

    @property
    def loss_at_init(self) -> Optional[float]:
        """The step-0 eval loss (its record, else summary's init_val_loss), else ln(vocab_size)
        from run.json (the loss of a uniform prediction), else None."""
        for e in self.evals:
            if e.get("step") == 0 and math.isfinite(_num(e.get("val_loss"))):
                return float(e["val_loss"])
        if self.summary is not None and self.summary.get("init_val_loss") is not None:
            return float(self.summary["init_val_loss"])
        vocab = _lookup(self.info, ("model_config", "vocab_size"),
                        ("config", "model", "vocab_size"), ("vocab_size",))
        return math.log(vocab) if vocab else None

    def setting(self, key: str) -> Optional[str]:
        """The value of a dotted config key: the override, else run.json's resolved config, so
        that a run that left optim.lr at its default groups with runs that set the same lr.
        Numbers are written canonically ("1e-3" and "0.001" are one value)."""
        value = self.overrides.get(key)
        if value is None:
            value = _lookup(self.info, ("config", *key.split(".")))
        if value is None or isinstance(value, (dict, list)):
            return None
        if isinstance(value, bool):
            return str(value).lower()
        try:
            return format(float(value), ".10g")
        except ValueError:
            return str(value)

    @property
    def lr(self) -> float:
        """optim.lr of the run, NaN if neither the overrides nor run.json give it."""
        lr = self.setting(LR_KEY)
        return math.nan if lr is None else float(lr)


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
    dict; "+key" counts as "key"."""
    f = run_dir / ".hydra" / "overrides.yaml"
    items = (yaml.safe_load(f.read_text()) or []) if f.exists() else info.get("overrides") or []
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+")
        if sep and not key.startswith("~") and not key.startswith("hydra."):
            out[key] = value
    return out


def read_metrics(path: Path) -> tuple[list[dict], int]:
    """Records of metrics.jsonl and the number of unreadable lines (a job may be mid-write)."""
    records, bad = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return records, bad


def _read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def load_run(run_dir: Path, notes: list) -> tuple[Optional[Run], Optional[str]]:
    """A Run, or (None, why it was skipped)."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None, "no metrics.jsonl"
    records, bad = read_metrics(metrics)
    if bad:
        notes.append(f"{run_dir}: ignored {bad} unreadable line(s) of metrics.jsonl")
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
    return Run(run_dir, overrides, str(variant), train, evals,
               _read_json(run_dir / "summary.json"), info), None


def load_runs(roots: list[Path]) -> tuple[list[Run], list[str], list[str]]:
    """All runs under the roots, the skipped ones ("path: reason") and notes."""
    runs, skipped, notes = [], [], []
    for root in roots:
        for run_dir in find_run_dirs(root):
            run, why = load_run(run_dir, notes)
            if run is None:
                skipped.append(f"{run_dir}: {why}")
            else:
                runs.append(run)
    return runs, skipped, notes


# ---------------------------------------------------------------------------------------------
# 2. Grouping and statistics
# ---------------------------------------------------------------------------------------------


def is_seed_key(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def varying_keys(runs: list[Run]) -> list[str]:
    """Override keys (seed excluded) whose value differs between runs, in a stable order."""
    keys = sorted({k for r in runs for k in r.overrides if not is_seed_key(k)})
    return [k for k in keys if len({r.setting(k) for r in runs}) > 1]


def _value_order(value):
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _variant_order(variant: str):
    rank = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return (rank, variant)


def group_runs(runs: list[Run], drop: tuple = ()) -> dict[tuple, list[Run]]:
    """Group key: (("scaling", variant), (key, value), ...) over the varying keys not in drop."""
    keys = [k for k in varying_keys(runs) if k != VARIANT_KEY and k not in drop]
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        key = ((VARIANT_KEY, r.variant),) + tuple((k, r.setting(k)) for k in keys)
        groups.setdefault(key, []).append(r)
    order = sorted(groups, key=lambda g: (_variant_order(g[0][1]),
                                          [_value_order(v) for _, v in g[1:]]))
    return {g: groups[g] for g in order}


def group_label(key: tuple) -> str:
    return ", ".join(f"{k}={'default' if v is None else v}" for k, v in key)


def mean_std(values: list[float]) -> Optional[tuple[float, Optional[float]]]:
    """Mean and sample std (n - 1); std None for a single value; None for no values."""
    if not values:
        return None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def lr_sensitivity(runs: list[Run]) -> Optional[dict]:
    """Wortsman et al. 2023 LR sensitivity of one variant's runs across their LR grid.

    Returns {"per_lr": {lr: clipped loss mean over seeds}, "best": best_loss, "best_lr",
    "sensitivity", "diverged": {lr: count}}, or None when a run has no loss_at_init.
    """
    by_lr: dict[float, list[float]] = {}
    diverged: dict[float, int] = {}
    for r in runs:
        init = r.loss_at_init
        if init is None:
            return None
        loss = init if r.diverged else min(r.final_val_loss, init)
        by_lr.setdefault(r.lr, []).append(loss)
        diverged[r.lr] = diverged.get(r.lr, 0) + int(r.diverged)
    per_lr = {lr: statistics.fmean(v) for lr, v in sorted(by_lr.items())}
    best_lr = min(per_lr, key=per_lr.get)
    best = per_lr[best_lr]
    return {"per_lr": per_lr, "best": best, "best_lr": best_lr,
            "sensitivity": statistics.fmean(v - best for v in per_lr.values()),
            "diverged": diverged}


# ---------------------------------------------------------------------------------------------
# 3. The Markdown report
# ---------------------------------------------------------------------------------------------


def _fmt(ms: Optional[tuple[float, Optional[float]]], digits: int = 4) -> str:
    if ms is None:
        return "n/a"
    mean, std = ms
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def results_table(groups: dict[tuple, list[Run]]) -> list[str]:
    lines = ["| group | seeds | final val loss | best val loss | diverged | still running"
             " | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, runs in groups.items():
        ok = [r for r in runs if not r.diverged]
        rates = [r.tokens_per_sec for r in runs if math.isfinite(r.tokens_per_sec)]
        lines.append(
            f"| {group_label(key)} | {len(runs)} | {_fmt(mean_std([r.final_val_loss for r in ok]))}"
            f" | {_fmt(mean_std([r.best_val_loss for r in ok]))}"
            f" | {sum(r.diverged for r in runs)} | {sum(r.partial for r in runs)}"
            f" | {_fmt(mean_std(rates), 0)} |")
    return lines


def diagnostics_table(groups: dict[tuple, list[Run]]) -> list[str]:
    """Attention at the first and the last evaluation of each group: mean over layers of the
    entropy and saturated-row fraction, max over layers of max |logit|; mean over seeds."""
    lines = ["## Attention diagnostics (first and last evaluation)", "",
             "Entropy and saturated fraction: mean over layers; max logit: max over layers;"
             " each the mean over the group's runs.", "",
             "| group | step | entropy | saturated | max logit | step | entropy | saturated"
             " | max logit |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, runs in groups.items():
        cells = []
        for pick in (0, -1):
            records = [r.evals[pick] for r in runs if r.evals and "attn_entropy" in r.evals[pick]]
            if not records:
                cells += ["n/a"] * 4
                continue
            entropy = statistics.fmean(statistics.fmean(map(_num, e["attn_entropy"]))
                                       for e in records)
            saturated = statistics.fmean(statistics.fmean(map(_num, e["attn_saturated"]))
                                         for e in records)
            max_logit = statistics.fmean(max(map(_num, e["attn_max_logit"])) for e in records)
            cells += [str(records[0].get("step")), f"{entropy:.3f}", f"{saturated:.3f}",
                      f"{max_logit:.4g}"]
        lines.append(f"| {group_label(key)} | " + " | ".join(cells) + " |")
    return lines


def lr_tables(runs: list[Run]) -> list[str]:
    variants = group_runs(runs, drop=(LR_KEY,))
    lrs = sorted({r.lr for r in runs})
    # "LRs" says how much of the grid a variant has: on a partial sweep the number is provisional
    head = ["| variant | LR sensitivity | best loss | best lr | LRs | diverged | still running |"]
    head.append("|---|---:|---:|---:|---:|---:|---:|")
    grid = ["| variant | " + " | ".join(f"lr={lr:g}" for lr in lrs) + " |",
            "|---|" + "---:|" * len(lrs)]
    for key, vruns in variants.items():
        s = lr_sensitivity(vruns)
        if s is None:
            head.append(f"| {group_label(key)} | n/a (no loss_at_init) | | | | | |")
            continue
        head.append(f"| {group_label(key)} | {s['sensitivity']:.4f} | {s['best']:.4f}"
                    f" | {s['best_lr']:g} | {len(s['per_lr'])}/{len(lrs)}"
                    f" | {sum(s['diverged'].values())} | {sum(r.partial for r in vruns)} |")
        cells = []
        for lr in lrs:
            if lr not in s["per_lr"]:
                cells.append("")
                continue
            div = s["diverged"][lr]
            cells.append(f"{s['per_lr'][lr]:.4f}" + (f" ({div} div.)" if div else ""))
        grid.append(f"| {group_label(key)} | " + " | ".join(cells) + " |")
    return (["## LR sensitivity (Wortsman et al. 2023; SCIENCE.md section 5)", ""] + head
            + ["", "Final val loss per learning rate (mean over seeds, each clipped at its"
               " loss_at_init; a diverged run counts as loss_at_init):", ""] + grid)


def markdown_report(roots, runs, groups, skipped, notes, has_lr: bool, lr_runs) -> str:
    lines = ["# Sweep results", "", "Sweeps: " + ", ".join(f"`{r}`" for r in roots), "",
             "Final and best val loss: mean ± sample std over the runs of the group that did not"
             " diverge; still-running runs use their last eval record.", ""]
    lines += results_table(groups)
    lines += [""] + diagnostics_table(groups)
    if has_lr:
        lines += [""] + lr_tables(lr_runs)
    partial = [r for r in runs if r.partial]
    if partial:
        lines += ["", "## Still running (no summary.json)", ""]
        lines += [f"- {r.path} (last eval at step {r.evals[-1].get('step')})" for r in partial]
    lines += ["", "## Skipped", ""] + ([f"- {s}" for s in skipped] or ["- none"])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# 4. Figures
# ---------------------------------------------------------------------------------------------


def _aggregate(series: list[tuple[list, list]]):
    """Seeds -> (steps, mean, min, max) over the union of steps, ignoring non-finite values."""
    steps = sorted({s for xs, _ in series for s in xs})
    if not steps:
        return None
    index = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(series), len(steps)), np.nan)  # (runs, steps)
    for row, (xs, ys) in enumerate(series):
        for x, y in zip(xs, ys):
            grid[row, index[x]] = y if math.isfinite(y) else np.nan
    keep = ~np.all(np.isnan(grid), axis=0)
    if not keep.any():
        return None
    g = grid[:, keep]
    return (np.array(steps)[keep], np.nanmean(g, axis=0), np.nanmin(g, axis=0),
            np.nanmax(g, axis=0))


def _styles(groups: dict[tuple, list[Run]]) -> dict[tuple, dict]:
    """One colour per variant; within a variant, lighter shades and other dashes per group."""
    variants = sorted({k[0][1] for k in groups}, key=_variant_order)
    base = {}
    for v in variants:
        rank = _variant_order(v)[0]
        extra = len(VARIANT_ORDER) + variants.index(v)  # unknown variants after the known six
        base[v] = f"C{rank if rank < len(VARIANT_ORDER) else extra}"
    styles, seen = {}, {}
    dashes = ("-", "--", "-.", ":")
    for key in groups:
        v = key[0][1]
        i = seen.get(v, 0)
        seen[v] = i + 1
        n = sum(1 for k in groups if k[0][1] == v)
        rgb = np.array(matplotlib.colors.to_rgb(base[v]))
        shade = rgb + (1 - rgb) * (0.6 * i / max(n - 1, 1) if n > 1 else 0.0)
        styles[key] = {"color": tuple(shade), "ls": dashes[i % len(dashes)]}
    return styles


def _draw(ax, agg, style, label):
    steps, mean, lo, hi = agg
    ax.plot(steps, mean, label=label, **style)
    ax.fill_between(steps, lo, hi, color=style["color"], alpha=0.2, lw=0)


def plot_losses(groups, path: Path) -> None:
    styles = _styles(groups)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for key, runs in groups.items():
        train = [([t["step"] for t in r.train], [_num(t.get("loss")) for t in r.train])
                 if r.train else
                 ([e["step"] for e in r.evals], [_num(e.get("train_loss")) for e in r.evals])
                 for r in runs]
        val = [([e["step"] for e in r.evals], [_num(e.get("val_loss")) for e in r.evals])
               for r in runs]
        for ax, series in zip(axes, (train, val)):
            agg = _aggregate(series)
            if agg is not None:
                _draw(ax, agg, styles[key], f"{group_label(key)} (n={len(runs)})")
    inits = [r.loss_at_init for rs in groups.values() for r in rs if r.loss_at_init]
    for ax, title in zip(axes, ("train loss (train records)", "val loss (eval records)")):
        ax.set(xlabel="step", ylabel="cross-entropy (nats)", title=title)
        if inits:  # a diverging run should not squash every other curve
            ax.set_ylim(top=1.15 * max(inits))
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("mean over seeds, band = min/max")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_diagnostics(groups, path: Path) -> None:
    styles = _styles(groups)
    n_layer = max((len(e.get(name) or []) for rs in groups.values() for r in rs
                   for e in r.evals for name, _, _ in DIAGNOSTICS), default=0)
    cols = max(n_layer, 1)
    fig, axes = plt.subplots(3, cols, figsize=(3.6 * cols + 3, 8.5), squeeze=False)
    for row, (name, ylabel, log) in enumerate(DIAGNOSTICS):
        for layer in range(n_layer):
            ax = axes[row][layer]
            for key, runs in groups.items():
                series = []
                for r in runs:
                    has = [e for e in r.evals if len(e.get(name) or []) > layer]
                    series.append(([e["step"] for e in has], [_num(e[name][layer]) for e in has]))
                agg = _aggregate(series)
                if agg is not None:
                    _draw(ax, agg, styles[key], group_label(key))
            if log:
                ax.set_yscale("log")
            elif name == "attn_saturated":
                ax.set_ylim(-0.02, 1.02)  # a fraction: keep layers and runs comparable
            else:
                ax.set_ylim(bottom=0.0)
            ax.set(title=f"layer {layer}", xlabel="step", ylabel=ylabel)
            ax.grid(alpha=0.3)
    if n_layer == 0:
        axes[0][0].text(0.5, 0.5, "no attention diagnostics in these runs", ha="center")
    else:
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _peak_logit(run: Run) -> float:
    """Largest finite max |logit| over every eval record and layer of a run."""
    vals = [_num(x) for e in run.evals for x in (e.get("attn_max_logit") or [])]
    vals = [v for v in vals if math.isfinite(v)]
    return max(vals) if vals else math.nan


def plot_lr(runs: list[Run], path: Path) -> None:
    variants = group_runs(runs, drop=(LR_KEY,))
    styles = _styles(variants)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    for key, vruns in variants.items():
        style, label = styles[key], group_label(key)
        s = lr_sensitivity(vruns)
        if s is not None:
            lrs = list(s["per_lr"])
            ax1.plot(lrs, list(s["per_lr"].values()), marker="o",
                     label=f"{label} (sens. {s['sensitivity']:.3f})", **style)
            div = [lr for lr in lrs if s["diverged"][lr]]
            ax1.plot(div, [s["per_lr"][lr] for lr in div], "x", ms=10, color=style["color"])
        by_lr: dict[float, list[float]] = {}
        for r in vruns:
            by_lr.setdefault(r.lr, []).append(_peak_logit(r))
        lrs = sorted(by_lr)
        peaks = [np.nanmax(by_lr[lr]) if np.isfinite(by_lr[lr]).any() else np.nan for lr in lrs]
        ax2.plot(lrs, peaks, marker="o", label=label, **style)
    ax1.set(xscale="log", xlabel="learning rate (optim.lr)",
            ylabel="final val loss (clipped at loss_at_init)",
            title="final val loss vs LR (x: a seed diverged)")
    ax2.set(xscale="log", yscale="log", xlabel="learning rate (optim.lr)",
            ylabel="peak max |attention logit|", title="attention-logit growth vs LR")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 5. Command line
# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep or run directories")
    parser.add_argument("--out", type=Path, required=True, help="folder for figures and table")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.sweeps if not p.is_dir()]
    if missing:
        print(f"plot_runs: not a directory: {', '.join(missing)}. Pass the multirun/<date>/<time>"
              " folder of a sweep, or a run directory.", file=sys.stderr)
        return 2

    runs, skipped, notes = load_runs(args.sweeps)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if not runs:
        print("plot_runs: no run with eval records found under "
              f"{', '.join(map(str, args.sweeps))}.", file=sys.stderr)
        return 2
    groups = group_runs(runs)
    has_lr = LR_KEY in varying_keys(runs)
    lr_runs = [r for r in runs if math.isfinite(r.lr)]
    args.out.mkdir(parents=True, exist_ok=True)
    plot_losses(groups, args.out / "loss_curves.png")
    plot_diagnostics(groups, args.out / "diagnostics.png")
    if has_lr:
        plot_lr(lr_runs, args.out / "lr_sensitivity.png")
    report = markdown_report(args.sweeps, runs, groups, skipped, notes, has_lr, lr_runs)
    (args.out / "results.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
