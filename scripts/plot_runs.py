"""Figures and tables of the sweeps named on the command line.

    python scripts/plot_runs.py SWEEP_DIR [SWEEP_DIR ...] --out DIR [--loss full|sampled]
                                [--baseline sqrt_dk] [--pair KEY=VALUE ...]

SWEEP_DIR is one preset run (multirun/<preset>/<time>/, one folder per job) or a single run
folder. Only the folders named are read: name several to pool sweeps on purpose. Writes:

- DIR/results.md        the tables of scripts/report_tables.py (also printed): final losses,
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

A line is the mean over a group's seeds; its band is the 95% Student-t interval of that mean,
drawn only where n >= 2. In an LR sweep the curves show each scale at its own best LR.
Reading and grouping live in scripts/runs.py, statistics in scripts/report_stats.py.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts import report_stats as st  # noqa: E402
from scripts.report_tables import DIAGNOSTICS, markdown_report  # noqa: E402
from scripts.runs import (  # noqa: E402
    LR_KEY,
    VARIANT_ORDER,
    canonical,
    eval_series,
    group_runs,
    label,
    load_runs,
    record_series,
    setting_of,
    value_order,
    varying_keys,
)

# One colour, dash pattern and marker per scale, fixed across figures; the dashes and markers
# keep overlapping curves (sqrt_dk under learned) apart.
STYLES = {"sqrt_dk": ("C0", "-", "o"), "none": ("C1", "--", "s"), "dk": ("C2", "-.", "^"),
          "constant": ("C3", ":", "D"), "learned": ("C4", (0, (6, 2)), "v"),
          "qk_norm": ("C5", (0, (3, 1, 1, 1, 1, 1)), "P")}
ZOOM_FROM = 0.3  # loss panels show steps from this fraction of the run in full
LOG_FIELDS = {"attn_max_logit", "attn_raw_max_logit", "attn_raw_var"}


def style(variant: str) -> dict:
    color, ls, marker = STYLES.get(variant, ("C7", "-", "."))
    # markers every fifth of the line, staggered per scale so overlapping lines show each one
    every = (0.03 * _variant_rank(variant), 0.2)
    return {"color": color, "ls": ls, "marker": marker, "markevery": every, "ms": 4, "lw": 1.4}


def aggregate(series: list[tuple[list, list]]):
    """Seeds' (steps, values) -> steps, mean, band half-width (NaN where n < 2)."""
    steps = sorted({s for xs, _ in series for s in xs})
    index = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(series), len(steps)), np.nan)  # (runs, steps)
    for row, (xs, ys) in enumerate(series):
        for x, y in zip(xs, ys):
            grid[row, index[x]] = y if math.isfinite(y) else np.nan
    keep = ~np.all(np.isnan(grid), axis=0)
    if not keep.any():
        return None
    grid, steps = grid[:, keep], np.array(steps)[keep]
    n = np.sum(~np.isnan(grid), axis=0)
    mean = np.nanmean(grid, axis=0)
    half = np.full(len(steps), np.nan)
    for i in np.flatnonzero(n >= 2):
        iv = st.mean_interval(list(grid[:, i][~np.isnan(grid[:, i])]))
        half[i] = iv.half
    return steps, mean, half


def draw(ax, agg, variant: str, text: str) -> None:
    steps, mean, half = agg
    s = style(variant)
    ax.plot(steps, mean, label=text, **s)
    if np.isfinite(half).any():
        ax.fill_between(steps, mean - half, mean + half, color=s["color"], alpha=0.18, lw=0)


def seeds_note(groups: dict) -> str:
    """What a line and a band are, with the n the lines really have."""
    ns = sorted({len(runs) for runs in groups.values()})
    if ns == [1]:
        return "one seed per line (no interval)"
    if len(ns) == 1:
        return f"mean of n={ns[0]} seeds per line, band = 95% t interval"
    return f"mean of n={ns[0]}-{ns[-1]} seeds per line (legend), band = 95% t interval where n>=2"


def panels(groups: dict) -> list[list[tuple[str, list]]]:
    """Panel grid: rows of (title, [(group key, runs), ...]). A panel is a setting: with one
    setting key, one panel per value, three to a row; with more, the first key picks the row
    and the others the column. A sweep of scales alone gets one panel per scale."""
    settings = sorted({setting_of(k) for k in groups}, key=_order)
    if settings == [()]:
        cells = [(key[0][1], [(key, runs)]) for key, runs in groups.items()]
    elif all(len(s) == 1 for s in settings):
        cells = [(label(s, short=True), [(k, g) for k, g in groups.items() if setting_of(k) == s])
                 for s in settings]
    else:
        cells = None
    if cells is not None:
        return [cells[i:i + 3] for i in range(0, len(cells), 3)]
    rows = sorted({s[:1] for s in settings}, key=_order)
    cols = sorted({s[1:] for s in settings}, key=_order)
    return [[(label(r + c, short=True),
              [(k, g) for k, g in groups.items() if setting_of(k) == r + c])
             for c in cols] for r in rows]


def _order(pairs):
    return [value_order(v) for _, v in pairs]


def small_multiples(groups, series_of, ylabel: str, title: str, path: Path,
                    zoom: bool = False, zero_line: bool = False) -> None:
    grid = panels(groups)
    n_cols = max(len(row) for row in grid)
    fig, axes = plt.subplots(len(grid), n_cols, figsize=(max(3.6 * n_cols + 0.6, 8.0),
                             2.6 * len(grid) + 1.3), sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    mixed_n = len({len(g) for g in groups.values()}) > 1
    per_scale = len(groups) == sum(len(row) for row in grid) and not setting_of(next(iter(groups)))
    for i, row in enumerate(grid):
        for j in range(n_cols):
            ax = axes[i][j]
            if j >= len(row):
                ax.axis("off")
                continue
            title_ij, members = row[j]
            if per_scale:  # the other scales in grey, for context
                for key, runs in groups.items():
                    agg = aggregate([series_of(r) for r in runs])
                    if agg is not None and key != members[0][0]:
                        ax.plot(agg[0], agg[1], color="0.82", lw=0.8, zorder=0)
            for key, runs in members:
                agg = aggregate([series_of(r) for r in runs])
                if agg is not None:
                    v = key[0][1]
                    draw(ax, agg, v, f"{v} (n={len(runs)})" if mixed_n else v)
            ax.set_title(title_ij, fontsize=9)
            ax.grid(alpha=0.3)
            if zero_line:
                ax.axhline(0.0, color="k", lw=0.8)
            ax.set_xlabel("step")
            ax.xaxis.set_tick_params(labelbottom=True)  # a panel may have none below it
            if j == 0:
                ax.set_ylabel(ylabel)
    if zoom:
        zoom_losses(axes.flat[0], groups, series_of)
    legend(fig, axes)
    context = " (grey: the other scales)" if per_scale else ""
    fig.suptitle(f"{title}{context}\n{seeds_note(groups)}", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def zoom_losses(ax, groups, series_of) -> None:
    """Shared y-range over the last ZOOM_FROM of the run: the early drop from the loss at init
    runs off the top, so that the differences late in training show."""
    lows, highs = [], []
    for runs in groups.values():
        agg = aggregate([series_of(r) for r in runs])
        if agg is None:
            continue
        steps, mean, half = agg
        late = np.isfinite(mean) & (steps >= ZOOM_FROM * steps.max()) & (steps > 0)
        if late.any():
            lows.append(np.nanmin((mean - np.nan_to_num(half))[late]))
            highs.append(np.nanmax(mean[late]))
    if lows:
        pad = 0.05 * (max(highs) - min(lows) or 1.0)
        ax.set_ylim(min(lows) - pad, max(highs) + pad)


def legend(fig, axes) -> None:
    """One short legend above the panels, one entry per scale."""
    entries = {}
    for ax in np.ravel(axes):
        for handle, text in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(text, handle)
    if entries:
        order = sorted(entries, key=lambda t: _variant_rank(t.split(" ")[0]))
        fits = max(2, int(fig.get_figwidth() / 1.25))  # entries a row at this width
        fig.legend([entries[t] for t in order], order, loc="outside lower center",
                   ncol=min(len(order), fits), fontsize=8, frameon=False)


def _variant_rank(v: str) -> int:
    return VARIANT_ORDER.index(v) if v in VARIANT_ORDER else len(VARIANT_ORDER)


def plot_losses(groups, path: Path, note: str) -> None:
    small_multiples(groups, lambda r: eval_series(r, "val_loss", None),
                    "val loss (nats)", f"Validation loss on the sampled batches{note};"
                    f" y zoomed on the last {1 - ZOOM_FROM:.0%} of training", path, zoom=True)


def plot_vs_baseline(groups, baseline: str, path: Path, note: str) -> None:
    """Each scale's val loss minus the baseline's at the same setting, seed and step: the band
    is the 95% interval of the paired difference, so a lead is real where it clears 0."""
    base = {(setting_of(k), r.seed): r for k, g in groups.items() if k[0][1] == baseline
            for r in g}
    setting = {id(r): setting_of(k) for k, g in groups.items() for r in g}

    def difference(run):
        other = base.get((setting[id(run)], run.seed))
        if other is None:
            return [], []
        mine, theirs = (dict(zip(*eval_series(x, "val_loss", None))) for x in (run, other))
        steps = sorted(set(mine) & set(theirs))
        return steps, [mine[t] - theirs[t] for t in steps]

    others = {k: g for k, g in groups.items() if k[0][1] != baseline
              and any(difference(r)[0] for r in g)}
    if others:
        small_multiples(others, difference, f"val loss − {baseline} (nats)",
                        f"Val loss minus {baseline}'s at the same seed and step{note};"
                        f" below 0 = lower than {baseline}", path, zero_line=True)


def reducer(how: str):
    return max if how == "max" else (lambda xs: sum(xs) / len(xs))


def stat_grid(groups, rows: list[tuple], title: str, path: Path, tied: tuple = ()) -> None:
    """One row per statistic (name, y label, series of a run, log y), one column per setting;
    the rows named in `tied` share one y-range."""
    settings = sorted({setting_of(k) for k in groups}, key=_order)
    width = max(3.4 * len(settings) + 1.0, 8.0)  # one setting: wide enough for six scales
    fig, axes = plt.subplots(len(rows), len(settings), squeeze=False, sharex=True,
                             figsize=(width, 2.1 * len(rows) + 1.2), layout="constrained")
    mixed_n = len({len(g) for g in groups.values()}) > 1
    for i, (name, ylabel, series_of, log) in enumerate(rows):
        for j, setting in enumerate(settings):
            ax = axes[i][j]
            for key, runs in groups.items():
                agg = aggregate([series_of(r) for r in runs]) if setting_of(key) == setting \
                    else None
                if agg is not None:
                    v = key[0][1]
                    draw(ax, agg, v, f"{v} (n={len(runs)})" if mixed_n else v)
            if not ax.lines:
                ax.text(0.5, 0.5, f"{name}\nnot recorded", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="0.4")
            elif log:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if i == 0 and setting:
                ax.set_title(label(setting, short=True), fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
        share_y(axes[i])
    share_y([ax for i, row in enumerate(rows) if row[0] in tied for ax in axes[i]])
    for ax in axes[-1]:
        ax.set_xlabel("step")
    legend(fig, axes)
    fig.suptitle(f"{title}\n{seeds_note(groups)}", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def share_y(row_axes) -> None:
    """One y-range for the drawn panels of a row, so that columns compare."""
    used = [ax for ax in row_axes if ax.lines]
    if len(used) > 1:
        lo = min(ax.get_ylim()[0] for ax in used)
        hi = max(ax.get_ylim()[1] for ax in used)
        for ax in used:
            ax.set_ylim(lo, hi)


def plot_diagnostics(groups, path: Path, note: str) -> None:
    rows = [(name, f"{heading}\n({how} over layers)",
             lambda r, n=name, h=how: eval_series(r, n, reducer(h)), name in LOG_FIELDS)
            for name, heading, how in DIAGNOSTICS]
    # the scaled and the raw max logit on one y-range: the gap between them is the scale
    stat_grid(groups, rows, f"Attention on the fixed validation batch{note}", path,
              tied=("attn_max_logit", "attn_raw_max_logit"))


def plot_qk_grads(groups, path: Path, note: str) -> None:
    rows = [(f"{s}_grad_norm", f"|grad W_{s}|\n(mean over layers)",
             lambda r, s=s: record_series(r, f"{s}_grad_norm"), True) for s in ("q", "k")]
    stat_grid(groups, rows, f"Gradient norm of the q and k projections{note}", path)


# ---------------------------------------------------------------------------------------------
# Learning-rate sweeps
# ---------------------------------------------------------------------------------------------


def at_best_lr(lr_runs, which: str) -> dict:
    """Group key without the LR -> the runs of that group at its own best LR."""
    out = {}
    for key, vruns in group_runs(lr_runs, drop=(LR_KEY,)).items():
        best = st.best_lr(st.lr_table(vruns, which))
        if best is not None:
            out[key] = [r for r in vruns if r.lr == best["lr"]]
    return out


def setting_axis(settings: list[tuple]):
    """x positions and tick labels of settings: the value itself (log scale) when there is a
    single numeric key such as model.d_head, else 0, 1, 2, ..."""
    try:
        if all(len(s) == 1 for s in settings):
            return [float(s[0][1]) for s in settings], settings[0][0][0], True
    except (TypeError, ValueError):
        pass
    return list(range(len(settings))), "setting", False


def plot_lr(lr_runs, which: str, path: Path) -> None:
    """Top: loss vs LR, one panel per setting. Bottom: best LR, loss at the best LR and LR
    sensitivity against the setting (the head width in lr_transfer)."""
    variants = group_runs(lr_runs, drop=(LR_KEY,))
    tables = {k: st.lr_table(g, which) for k, g in variants.items()}
    settings = sorted({setting_of(k) for k in variants}, key=_order)
    cols = max(len(settings), 3)
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 6.6), squeeze=False,
                             layout="constrained")
    for j, setting in enumerate(settings):
        ax = axes[0][j]
        for key, table in tables.items():
            if setting_of(key) == setting:
                lr_curve(ax, key[0][1], table, variants[key])
        ax.set(xscale="log", xlabel="learning rate")
        ax.set_title(label(setting, "all runs", short=True), fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"{st.LOSSES[which][1]}\n(clipped at loss at init)", fontsize=8)
    share_y(axes[0][:len(settings)])
    for ax in axes[0][len(settings):]:
        ax.axis("off")
    summary_panels(axes[1], tables, settings)
    for ax in axes[1][3:]:
        ax.axis("off")
    legend(fig, axes)
    ns = sorted({len(s) for t in tables.values() for s in t.values()})
    fig.suptitle("Learning rate x setting: points = mean of n="
                 f"{ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} seeds, bars = 95% t"
                 " interval (x: a seed diverged)", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dodge(variant: str) -> float:
    """A small factor on a log x-axis per scale, so equal points and their bars stay apart."""
    return 1.07 ** (_variant_rank(variant) - 2.5)


def lr_curve(ax, variant: str, table: dict, runs) -> None:
    lrs = [lr for lr in table if st.mean_interval(list(table[lr].values()))]
    ivs = [st.mean_interval(list(table[lr].values())) for lr in lrs]
    s = style(variant)
    xs = [lr * dodge(variant) for lr in lrs]
    ax.errorbar(xs, [iv.mean for iv in ivs], yerr=[iv.half or 0.0 for iv in ivs],
                label=variant, capsize=2, **{k: v for k, v in s.items() if k != "markevery"})
    div = [i for i, lr in enumerate(lrs) if any(r.diverged for r in runs if r.lr == lr)]
    ax.plot([xs[i] for i in div], [ivs[i].mean for i in div], "x", ms=9, color=s["color"])


def summary_panels(axes, tables: dict, settings: list[tuple]) -> None:
    xs, xlabel, numeric = setting_axis(settings)
    for key, table in tables.items():
        x = xs[settings.index(setting_of(key))] * (dodge(key[0][1]) if numeric else 1.0)
        best = st.best_lr(table)
        if best is None:
            continue
        s = style(key[0][1])
        span = [best["lr"], *best["tied"]]  # the LRs not resolved from the best
        axes[0].errorbar([x], [best["lr"]], yerr=[[best["lr"] - min(span)],
                         [max(span) - best["lr"]]], capsize=3, color=s["color"],
                         marker=s["marker"])
        loss = best["loss"]
        axes[1].errorbar([x], [loss.mean], yerr=[loss.half or 0.0], capsize=3,
                         color=s["color"], marker=s["marker"])
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if sens is not None:
            axes[2].errorbar([x], [sens.mean], yerr=[sens.half or 0.0], capsize=3,
                             color=s["color"], marker=s["marker"])
    join_points(axes, tables, settings, xs, numeric)
    titles = ("best LR (bar: LRs not resolved from it)", "loss at each scale's own best LR",
              "LR sensitivity (Wortsman et al. 2023)")
    for ax, title in zip(axes, titles):
        ax.set(title=title, xlabel=xlabel)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
        if numeric:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs] if numeric else
                      [label(s, short=True) for s in settings], fontsize=7)
    axes[0].set_yscale("log")


def join_points(axes, tables, settings, xs, numeric: bool) -> None:
    """Lines through each scale's points across settings, so a trend reads at a glance."""
    by_variant: dict[str, list] = {}
    for key, table in tables.items():
        best = st.best_lr(table)
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if best is not None:
            x = xs[settings.index(setting_of(key))] * (dodge(key[0][1]) if numeric else 1.0)
            by_variant.setdefault(key[0][1], []).append(
                (x, best["lr"], best["loss"].mean,
                 sens.mean if sens else math.nan))
    for variant, points in by_variant.items():
        points.sort()
        s = style(variant)
        for ax, col in zip(axes, (1, 2, 3)):
            ax.plot([p[0] for p in points], [p[col] for p in points], color=s["color"],
                    ls=s["ls"], lw=1.2, label=variant)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


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
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.sweeps if not p.is_dir()]
    if missing:
        print(f"plot_runs: not a directory: {', '.join(missing)}. Pass the multirun/<preset>/"
              "<time> folder of a sweep, or a run folder.", file=sys.stderr)
        return 2
    runs, skipped, notes = load_runs(args.sweeps)
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
        curves, note = at_best_lr(lr_runs, args.loss), ", each scale at its own best LR"
        if not curves:
            notes.append(f"no best LR (no run has {st.LOSSES[args.loss][0]}): curves not drawn")
    args.out.mkdir(parents=True, exist_ok=True)
    if curves:
        plot_losses(curves, args.out / "loss_curves.png", note)
        plot_vs_baseline(curves, args.baseline, args.out / "loss_vs_baseline.png", note)
        plot_diagnostics(curves, args.out / "diagnostics.png", note)
        plot_qk_grads(curves, args.out / "qk_grad_norms.png", note)
    if lr_runs:
        plot_lr(lr_runs, args.loss, args.out / "lr_transfer.png")
    report = markdown_report(args.sweeps, runs, groups, skipped, notes, args.loss,
                             args.baseline, lr_runs, pairs)
    (args.out / "results.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
