"""Report on sweeps: the results tables (results.md) and figures of the run folders named.

    python scripts/plot_runs.py SWEEP_DIR [SWEEP_DIR ...] --out DIR [--loss full|sampled]
                                [--baseline sqrt_dk] [--pair KEY=VALUE ...] [--heads RUN_DIR]

SWEEP_DIR is one preset run (multirun/<preset>/<time>/, one folder per job) or a single run
folder. Only the folders named are read: name several to pool sweeps on purpose. Writes:

- DIR/results.md        the tables of scripts/report/tables.py (also printed): final losses,
                        paired differences against the baseline scale (and against KEY=VALUE
                        of each --pair), attention statistics, the LR analysis of an LR sweep
- DIR/loss_curves.png   val loss vs step, one panel per setting (per scale when the sweep
                        varies only the scale)
- DIR/loss_vs_baseline.png  the same, minus the baseline scale's loss at the same seed
- DIR/diagnostics.png   attention entropy, saturated rows, scaled and raw max logit, raw
                        Var(q.k)/d_head vs step (one column per setting)
- DIR/qk_grad_norms.png q and k projection gradient norms vs step
- DIR/lr_transfer.png   when the runs vary optim.lr: loss vs LR per setting, the best LR vs
                        the setting, and each scale's loss at its own best LR
- DIR/heads_<run>.png   with --heads RUN_DIR: that run's attention statistics per head (a
                        panel per layer, a line per head), so the one head that saturates shows

The n-gram reference levels of the runs' corpus (scripts/report/ngram.py, cached by
scripts/baselines.py) are printed above every table and drawn as dotted lines in the loss
figures; runs without a shared .hydra/config.yaml get a note instead.

A line is the mean over a group's seeds; its band is the 95% Student-t interval of that mean,
drawn only where n >= 2. In an LR sweep the curves show each scale at its own best LR.
Reading and grouping live in scripts/report/runs.py, statistics in scripts/report/stats.py.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.report import ngram  # noqa: E402
from scripts.report import stats as st  # noqa: E402
from scripts.report.figures import (  # noqa: E402
    plot_diagnostics,
    plot_heads,
    plot_losses,
    plot_qk_grads,
    plot_vs_baseline,
)
from scripts.report.lr_figure import plot_lr  # noqa: E402
from scripts.report.runs import (  # noqa: E402
    LR_KEY,
    canonical,
    group_runs,
    load_run,
    load_runs,
    value_order,
    varying_keys,
)
from scripts.report.tables import markdown_report  # noqa: E402


def parse_pairs(items: list[str], groups: dict) -> tuple[list[tuple], str]:
    """--pair KEY=VALUE items as (key, canonical value) pairs, or why one is unusable."""
    values: dict[str, set] = {}
    for key in groups:
        for k, v in key[1:]:
            values.setdefault(k, set()).add(v)
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in values:
            return [], (f"{item!r}: give KEY=VALUE with a KEY these runs vary"
                        f" ({', '.join(sorted(values)) or 'they vary only the scale'}).")
        if canonical(value) not in values[key]:
            shown = ", ".join("null" if v is None else v
                              for v in sorted(values[key], key=value_order))
            return [], f"{item!r}: {key} takes the values {shown} in these runs."
        pairs.append((key, canonical(value)))
    return pairs, ""


def draw_heads(run_dir: Path, out: Path) -> str:
    """DIR/heads_<run folder>.png for --heads RUN_DIR, and a note on what was drawn."""
    run, why = load_run(run_dir)
    name = "heads_" + re.sub(r"[^A-Za-z0-9._=-]+", "_", run_dir.resolve().name) + ".png"
    if run is None:
        return f"--heads {run_dir}: not drawn ({why})"
    if not plot_heads(run, out / name):
        return f"--heads {run_dir}: not drawn (its eval records have no attn_heads)"
    return f"per-head attention statistics of {run_dir}: {name}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep or run folders to read")
    parser.add_argument("--out", type=Path, required=True, help="folder for figures and tables")
    parser.add_argument("--loss", choices=tuple(st.LOSSES), default="full",
                        help="final loss of the tables: full = final_val_loss_full (the whole"
                        " validation split, default), sampled = final_val_loss")
    parser.add_argument("--baseline", default="sqrt_dk", help="scale the others are paired with")
    parser.add_argument("--pair", action="append", default=[], metavar="KEY=VALUE",
                        help="also pair every group with the same setting at KEY=VALUE, e.g."
                        " model.qk_init_std=null (repeatable)")
    parser.add_argument("--heads", action="append", default=[], type=Path, metavar="RUN_DIR",
                        help="also draw DIR/heads_<run>.png, the per-head attention statistics"
                        " of this run folder (repeatable)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.sweeps if not p.is_dir()]
    if missing:
        print(f"plot_runs: not a directory: {', '.join(missing)}. Pass the multirun/<preset>/"
              "<time> folder of a sweep, or a run folder.", file=sys.stderr)
        return 2
    runs, skipped = load_runs(args.sweeps)
    notes = []
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if not runs:
        print("plot_runs: no run with eval records found under "
              f"{', '.join(map(str, args.sweeps))}; point it at a sweep's folder of jobs.",
              file=sys.stderr)
        return 2
    groups = group_runs(runs)
    pairs, bad = parse_pairs(args.pair, groups)
    if bad:
        print(f"plot_runs: --pair {bad}", file=sys.stderr)
        return 2
    lr_runs = [r for r in runs if math.isfinite(r.lr)] if LR_KEY in varying_keys(runs) else []
    curves, note = groups, ""
    if lr_runs:
        curves, note = st.at_best_lr(lr_runs, args.loss), ", each scale at its own best LR"
        if not curves:
            notes.append(f"no best LR (no run has {st.LOSSES[args.loss][0]}): curves not drawn")
    levels, why = ngram.levels_of_runs([r.path for r in runs])
    if why:
        notes.append(why)
    args.out.mkdir(parents=True, exist_ok=True)
    if curves:
        plot_losses(curves, args.out / "loss_curves.png", note, levels)
        plot_vs_baseline(curves, args.baseline, args.out / "loss_vs_baseline.png", note)
        plot_diagnostics(curves, args.out / "diagnostics.png", note)
        plot_qk_grads(curves, args.out / "qk_grad_norms.png", note)
    if lr_runs:
        plot_lr(lr_runs, args.loss, args.out / "lr_transfer.png", levels)
    for run_dir in args.heads:
        notes.append(draw_heads(run_dir, args.out))
    report = markdown_report(args.sweeps, runs, groups, skipped, notes, args.loss,
                             args.baseline, lr_runs, pairs)
    if levels:
        report = ngram.above_every_table(report, ngram.levels_line(levels))
    (args.out / "results.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
