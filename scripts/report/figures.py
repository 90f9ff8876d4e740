"""The step-curve figures of the report: small multiples of a sweep's groups over training.

A panel is a setting (one per value of the swept key, or a grid for two keys; one per scale
when the sweep varies only the scale). A line is the mean over a group's seeds; its band is the
95% Student-t interval of that mean, drawn only where n >= 2, and cut to the range the
quantity can take (a loss and an entropy are >= 0, an accuracy and a share lie in [0, 1]): a
title says where a band was cut. Every title states the n. A panel with nothing to draw is
turned off, and a title names what was not drawn and why (uniform's q and k gradients and
scaled logits are 0, which a log axis cannot show). Each scale keeps one colour, dash pattern
and marker in every figure.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np

from model.config import SATURATION_THRESHOLD
from scripts.report import stats as st
from scripts.report.runs import (
    SOLVED_ACCURACY,
    eval_series,
    label,
    record_series,
    setting_of,
    setting_order,
    variant_rank,
)
from scripts.report.tables import DIAGNOSTICS

# One colour, dash pattern and marker per scale, fixed across figures; the dashes and markers
# keep overlapping curves (sqrt_dk under learned) apart.
STYLES = {"sqrt_dk": ("C0", "-", "o"), "none": ("C1", "--", "s"), "dk": ("C2", "-.", "^"),
          "constant": ("C3", ":", "D"), "learned": ("C4", (0, (6, 2)), "v"),
          "qk_norm": ("C5", (0, (3, 1, 1, 1, 1, 1)), "P"), "uniform": ("C8", (0, (1, 1)), "x")}
ZOOM_FROM = 0.3  # loss panels show in full the steps past this fraction of the run
LOG_FIELDS = {"attn_max_logit", "attn_raw_max_logit", "attn_raw_var"}
# The range a quantity can take, which its bands are cut to (a t interval of two seeds can run
# far outside it). Differences of losses and the log rows (positive by construction) have none.
LOSS = (0.0, math.inf)
SHARE = (0.0, 1.0)
RANGES = {"attn_entropy": LOSS, "attn_saturated": SHARE, "entropy": LOSS, "saturated": SHARE}


def style(variant: str) -> dict:
    color, ls, marker = STYLES.get(variant, ("C7", "-", "."))
    # markers every fifth of the line, staggered per scale so overlapping lines show each one
    every = (0.03 * variant_rank(variant), 0.2)
    return {"color": color, "ls": ls, "marker": marker, "markevery": every, "ms": 4, "lw": 1.4}


def aggregate(series: list[tuple[list, list]], log: bool = False):
    """Seeds' (steps, values) -> steps, mean, band low, band high (NaN where n < 2). log: for
    positive quantities drawn on a log axis, the geometric mean and the interval of the mean
    log value, so that the band stays positive."""
    steps = sorted({s for xs, _ in series for s in xs})
    index = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(series), len(steps)), np.nan)  # (runs, steps)
    for row, (xs, ys) in enumerate(series):
        for x, y in zip(xs, ys):
            if math.isfinite(y) and (y > 0 or not log):
                grid[row, index[x]] = math.log(y) if log else y
    keep = ~np.all(np.isnan(grid), axis=0)
    if not keep.any():
        return None
    grid, steps = grid[:, keep], np.array(steps)[keep]
    mean = np.nanmean(grid, axis=0)
    half = np.full(len(steps), np.nan)
    for i in range(len(steps)):
        column = grid[:, i][~np.isnan(grid[:, i])]
        if len(column) >= 2:
            half[i] = st.mean_interval(list(column)).half
    lo, hi = mean - half, mean + half
    return (steps, *(np.exp([mean, lo, hi]) if log else (mean, lo, hi)))


def draw(ax, agg, variant: str, text: str, bounds=None) -> bool:
    """A mean line and its band; `bounds` (low, high), either end possibly infinite, clips the
    band to a quantity's range (an accuracy's t interval over 2 seeds can reach far outside
    [0, 1], a loss's below 0). True when the band was clipped somewhere."""
    steps, mean, lo, hi = agg
    clipped = False
    if bounds is not None:
        low, high = bounds
        clipped = bool(np.any(lo < low) or np.any(hi > high))   # NaN (n < 2) compares False
        lo, hi = np.clip(lo, low, high), np.clip(hi, low, high)
    s = style(variant)
    ax.plot(steps, mean, label=text, **s)
    if np.isfinite(lo).any():
        ax.fill_between(steps, lo, hi, color=s["color"], alpha=0.18, lw=0)
    return clipped


def clip_note(bounds) -> str:
    """What a title says when a band was cut to the quantity's range."""
    low, high = bounds
    if math.isinf(high):
        return f"bands cut at {low:g} (the quantity's floor)"
    return f"bands clipped to the quantity's range [{low:g}, {high:g}]"


def has_data(ax) -> bool:
    """Whether a panel holds a data line with a point it can show (finite; positive on a log
    axis); reference lines (axhline) do not count."""
    log = ax.get_yscale() == "log"
    for line in ax.lines:
        if line.get_transform() != ax.transData:
            continue
        y = np.asarray(line.get_ydata(), dtype=float)
        y = y[np.isfinite(y)]
        if (y > 0).any() if log else y.size:
            return True
    return False


def blank(ax, text: str) -> None:
    """Turns a panel without data off (what it holds goes: the grey lines of the other scales,
    points that cannot be shown), saying in its place why it is empty."""
    for artist in [*ax.lines, *ax.collections]:
        artist.remove()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8,
            color="0.4")


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
    settings = sorted({setting_of(k) for k in groups}, key=setting_order)
    if settings == [()]:
        cells = [(key[0][1], [(key, runs)]) for key, runs in groups.items()]
    elif all(len(s) == 1 for s in settings):
        cells = [(label(s, short=True), [(k, g) for k, g in groups.items() if setting_of(k) == s])
                 for s in settings]
    else:
        cells = None
    if cells is not None:
        return [cells[i:i + 3] for i in range(0, len(cells), 3)]
    rows = sorted({s[:1] for s in settings}, key=setting_order)
    cols = sorted({s[1:] for s in settings}, key=setting_order)
    return [[(label(r + c, short=True),
              [(k, g) for k, g in groups.items() if setting_of(k) == r + c])
             for c in cols] for r in rows]


@dataclass(frozen=True)
class YAxis:
    """What the y axis of a small-multiples figure shows, and how."""

    label: str
    title: str                    # the figure's title (the seeds note is added below it)
    zoom: bool = False            # y zoomed on the late part of training (zoom_losses)
    zero_line: bool = False       # a line at 0 (for differences)
    bounds: Optional[tuple[float, float]] = None   # the quantity's range; bands clipped to it
    keep: tuple = ()              # levels the zoom keeps in view (a recall run's chance loss)


def small_multiples(groups, series_of, y: YAxis, path: Path, levels=None) -> None:
    """One panel per setting (panels), one line per scale: the mean over seeds of
    series_of(run) with its 95% band; `levels`: reference lines drawn in every panel."""
    ylabel, title, bounds = y.label, y.title, y.bounds
    grid = panels(groups)
    n_cols = max(len(row) for row in grid)
    fig, axes = plt.subplots(len(grid), n_cols, figsize=(max(3.6 * n_cols + 0.6, 8.0),
                             2.6 * len(grid) + 1.3), sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    mixed_n = len({len(g) for g in groups.values()}) > 1
    clipped, empty = False, []
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
            drawn = [(key, runs, agg) for key, runs in members
                     if (agg := aggregate([series_of(r) for r in runs])) is not None]
            for key, runs, agg in drawn:
                v = key[0][1]
                clipped |= draw(ax, agg, v, f"{v} (n={len(runs)})" if mixed_n else v, bounds)
            if not drawn:
                empty.append(ax)
            ax.set_title(title_ij, fontsize=9)
            ax.grid(alpha=0.3)
            if y.zero_line:
                ax.axhline(0.0, color="k", lw=0.8)
            ax.set_xlabel("step")
            ax.xaxis.set_tick_params(labelbottom=True)  # a panel may have none below it
            if j == 0:
                ax.set_ylabel(ylabel)
    if y.zoom:
        zoom_losses(axes.flat[0], groups, series_of, bounds, y.keep)
    if bounds is not None and all(map(math.isfinite, bounds)):   # the axes are shared
        pad = 0.04 * (bounds[1] - bounds[0])
        axes.flat[0].set_ylim(bounds[0] - pad, bounds[1] + pad)
    for ax in empty:
        blank(ax, f"{ax.get_title()}: nothing to draw")
    for ax in axes.flat:
        if levels and ax.axison:
            reference_lines(ax, levels)
    legend(fig, axes)
    context = " (grey: the other scales)" if per_scale else ""
    cut = f"; {clip_note(bounds)}" if clipped else ""
    suptitle(fig, f"{title}{context}\n{seeds_note(groups)}{cut}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def suptitle(fig, text: str, fontsize: float = 10) -> None:
    """The figure's title, each line wrapped to the figure's width so that none is cut off:
    wrapped at an estimate of the characters a line holds, then, where the rendered title is
    still wider than the figure (wide letters), at fewer until it fits."""
    width = max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    get_renderer = getattr(fig.canvas, "get_renderer", None)   # Agg and its kin
    while True:
        title = fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")),
                             fontsize=fontsize)
        if get_renderer is None or width <= 20 or \
                title.get_window_extent(get_renderer()).width <= 0.98 * fig.bbox.width:
            return
        width = int(width * 0.9)


def zoom_losses(ax, groups, series_of, bounds=None, keep=()) -> None:
    """Shared y-range over the steps past the first ZOOM_FROM of the run: the early drop from
    the loss at init runs off the top, so that the differences late in training show. The bands
    count as cut to `bounds`; the levels in `keep` stay in view."""
    lows, highs = list(keep), list(keep)
    for runs in groups.values():
        agg = aggregate([series_of(r) for r in runs])
        if agg is None:
            continue
        steps, mean, lo, _ = agg
        late = np.isfinite(mean) & (steps >= ZOOM_FROM * steps.max()) & (steps > 0)
        if late.any():
            low = np.nanmin(np.where(np.isfinite(lo), lo, mean)[late])
            lows.append(low if bounds is None else max(low, bounds[0]))
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
        order = sorted(entries, key=lambda t: variant_rank(t.split(" ")[0]))
        fits = max(2, int(fig.get_figwidth() / 1.25))  # entries a row at this width
        fig.legend([entries[t] for t in order], order, loc="outside lower center",
                   ncol=min(len(order), fits), fontsize=8, frameon=False)


def reference_lines(ax, levels: dict[str, float]) -> None:
    """The n-gram reference levels (scripts/report/ngram.py), or a recall run's chance, as
    labelled horizontal lines; a level outside the panel's y-range is named in its corner
    instead, so the zoom stays. A label goes above its line, or below it where a level just
    above or the panel's top would overprint it."""
    lo, hi = ax.get_ylim()
    near = 0.08 * (hi - lo)
    inside = sorted(v for v in levels.values() if lo <= v <= hi)
    off = [f"{name} {value:.2f} {'above' if value > hi else 'below'}"
           for name, value in levels.items() if not lo <= value <= hi]
    corner = hi - near * (len(off) + 1)   # the corner's lines reach down to about here
    for name, value in levels.items():
        if lo <= value <= hi:
            crowded = value > hi - near or any(value < v < value + near for v in inside)
            left = bool(off) and value > corner   # the corner's text would cover it
            ax.axhline(value, color="0.35", lw=0.9, ls=(0, (1, 2)), zorder=1)
            ax.text(0.01 if left else 0.99, value, f"{name} {value:.2f}",
                    transform=ax.get_yaxis_transform(), ha="left" if left else "right",
                    va="top" if crowded else "bottom", fontsize=9, color="0.3")
    if off:
        ax.text(0.99, 0.98, "\n".join(off), transform=ax.transAxes, ha="right", va="top",
                fontsize=9, color="0.3")
    ax.set_ylim(lo, hi)


def chance_loss(groups) -> dict[str, float]:
    """{"chance ln N =": ln N} when every run is a data=recall run and they agree on the chance
    accuracy 1/N (N = data.num_values): the loss of a uniform guess among the N answers, which
    a run that learned nothing sits at; {} otherwise."""
    runs = [r for g in groups.values() for r in g]
    chance = {r.chance_accuracy for r in runs}
    if not runs or not all(r.recall for r in runs) or len(chance) != 1 or None in chance:
        return {}
    n = 1.0 / chance.pop()
    return {f"chance ln {n:g} =": math.log(n)}


def plot_losses(groups, path: Path, note: str, levels=None) -> None:
    """Validation loss per setting; `levels`: the n-gram reference levels to draw, if any.
    Recall runs also get their chance level ln(num_values) (chance_loss), kept in the zoom."""
    chance = chance_loss(groups)
    small_multiples(groups, lambda r: eval_series(r, "val_loss", None),
                    YAxis("val loss (nats)", f"Validation loss on the sampled batches{note};"
                          f" y zoomed on the last {1 - ZOOM_FROM:.0%} of training", zoom=True,
                          bounds=LOSS, keep=tuple(chance.values())),
                    path, {**(levels or {}), **chance} or None)


def plot_accuracy(groups, path: Path, note: str) -> bool:
    """Validation accuracy of the data=recall runs per setting, with the solved threshold and
    the chance accuracy (1/data.num_values, when the runs agree on it) as labelled lines.
    False (nothing drawn) when no run has accuracy."""
    recall = {key: [r for r in runs if r.recall] for key, runs in groups.items()}
    recall = {key: runs for key, runs in recall.items() if runs}
    if not recall:
        return False
    lines = {"solved": SOLVED_ACCURACY}
    chance = {r.chance_accuracy for runs in recall.values() for r in runs}
    if len(chance) == 1 and None not in chance:
        lines["chance"] = chance.pop()
    small_multiples(recall, lambda r: eval_series(r, "val_accuracy", None),
                    YAxis("val accuracy", f"Validation accuracy on the sampled batches{note};"
                          f" solved: first evaluation at >= {SOLVED_ACCURACY:g}", bounds=SHARE),
                    path, levels=lines)
    return True


def plot_vs_baseline(groups, baseline: str, path: Path, note: str) -> None:
    """Each scale's val loss minus the baseline's at the same setting, seed and step: the band
    is the 95% interval of the paired difference, so a lead is real where it clears 0. The
    loss is the eval records' val_loss, on the fixed sampled batches (not the tables'
    whole-split loss), as the title and the y label say; a difference has no range to cut."""
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
        small_multiples(others, difference,
                        YAxis(f"sampled val loss − {baseline} (nats)",
                              f"Val loss on the sampled batches (not the tables' whole-split"
                              f" loss) minus {baseline}'s at the same seed and step{note};"
                              f" below 0 = lower than {baseline}", zero_line=True), path)


def reducer(how: str):
    return max if how == "max" else (lambda xs: sum(xs) / len(xs))


def stat_grid(groups, rows: list[tuple], title: str, path: Path, tied: tuple = ()) -> None:
    """One row per statistic (name, y label, series of a run, log y), one column per setting;
    the rows named in `tied` share one y-range. A row's bands are cut to its statistic's range
    (RANGES); a panel with nothing to draw is turned off, saying why; a scale that a log row
    cannot show (every value 0) is named in the title (not_drawn)."""
    settings = sorted({setting_of(k) for k in groups}, key=setting_order)
    width = max(3.4 * len(settings) + 1.0, 8.0)  # one setting: wide enough for six scales
    fig, axes = plt.subplots(len(rows), len(settings), squeeze=False, sharex=True,
                             figsize=(width, 2.1 * len(rows) + 1.2), layout="constrained")
    mixed_n = len({len(g) for g in groups.values()}) > 1
    clipped = []   # the headings of the rows where a band was cut
    for i, (name, ylabel, series_of, log) in enumerate(rows):
        bounds = None if log else RANGES.get(name)
        for j, setting in enumerate(settings):
            ax = axes[i][j]
            for key, runs in groups.items():
                agg = aggregate([series_of(r) for r in runs], log) \
                    if setting_of(key) == setting else None
                if agg is not None:
                    v = key[0][1]
                    if draw(ax, agg, v, f"{v} (n={len(runs)})" if mixed_n else v, bounds):
                        clipped.append(ylabel.split("\n")[0])
            if log and ax.lines:
                ax.set_yscale("log")
                fit_to_lines(ax)
            ax.grid(alpha=0.3)
            if i == 0 and setting:
                ax.set_title(label(setting, short=True), fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
        share_y(axes[i])
    share_y([ax for i, row in enumerate(rows) if row[0] in tied for ax in axes[i]])
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for i, (_, ylabel, series_of, _) in enumerate(rows):
        for j, setting in enumerate(settings):
            if not axes[i][j].lines:
                recorded = any(math.isfinite(v) for key, runs in groups.items()
                               if setting_of(key) == setting for r in runs
                               for v in series_of(r)[1])
                blank(axes[i][j], f"{ylabel.splitlines()[0]}:\n"
                      f"{'0 in every run, off the log axis' if recorded else 'not recorded'}")
    legend(fig, axes)
    geometric = "; log rows: geometric mean" if any(row[3] for row in rows) else ""
    cut = (f"; bands clipped to the quantity's range ({', '.join(dict.fromkeys(clipped))})"
           if clipped else "")
    missing = not_drawn(groups, rows)
    suptitle(fig, f"{title}\n{seeds_note(groups)}{geometric}{cut}"
                  + (f"\n{missing}" if missing else ""))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def not_drawn(groups, rows: list[tuple]) -> str:
    """The scales that log rows leave out: recorded there, but never above 0, which a log axis
    cannot show (uniform's scores ignore q and k: its scaled logits and its q and k gradients
    are 0); "" when none. A scale left out of every log row is named without the rows."""
    found: dict[str, dict[str, list]] = {}   # variant -> row heading -> its values
    log_rows = [row for row in rows if row[3]]
    for _, ylabel, series_of, _ in log_rows:
        for key, runs in groups.items():
            values = found.setdefault(key[0][1], {}).setdefault(ylabel.splitlines()[0], [])
            values += [v for r in runs for v in series_of(r)[1] if math.isfinite(v)]
    notes = []
    for variant, by_row in found.items():
        left = [heading for heading, values in by_row.items()
                if values and not any(v > 0 for v in values)]
        if not left:
            continue
        where = "" if len(left) == len(log_rows) else f" in {', '.join(left)}"
        why = "it has no q or k (its values are 0" if variant == "uniform" else "(all 0"
        notes.append(f"{variant} not drawn{where}: {why}, off the log axis)")
    return "; ".join(notes)


def fit_to_lines(ax, factor: float = 4.0) -> None:
    """A log panel's y-range: the lines' range widened by `factor` each way. A band of two
    seeds (t = 12.7) can span decades; it runs off the panel instead of flattening the lines."""
    values = np.concatenate([line.get_ydata() for line in ax.lines])
    values = values[np.isfinite(values) & (values > 0)]
    if values.size:
        ax.set_ylim(values.min() / factor, values.max() * factor)


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


def fixed_scale(run) -> Optional[float]:
    """The run's score scale s where it is one number for the whole run (sqrt_dk, none, dk,
    constant), else None: learned and qk_norm change theirs (a learned factor, a learned gain
    after a norm) and uniform's is 0."""
    d_head = run.setting("model.d_head")
    if d_head is None:
        d_model, n_head = run.setting("model.d_model"), run.setting("model.n_head")
        if d_model is None or n_head is None:
            return None
        d_head = int(d_model) // int(n_head)
    d_head = int(d_head)
    divisor = float(run.setting("scaling.divisor") or 8.0)
    return {"sqrt_dk": d_head ** -0.5, "none": 1.0, "dk": 1.0 / d_head,
            "constant": 1.0 / divisor}.get(run.variant)


def per_logit(run, name: str) -> tuple[list, list]:
    """A q or k gradient norm divided by the run's fixed scale s: dL/dW_q = s sum dL/dz k x^T
    for the logits z = s q.k, so the quotient is the gradient per unit of logit, the quantity
    the saturation argument is about. Empty where s is not one number (fixed_scale)."""
    scale = fixed_scale(run)
    if scale is None:
        return [], []
    steps, values = record_series(run, name)
    return steps, [v / scale for v in values]


def plot_qk_grads(groups, path: Path, note: str) -> None:
    rows = [(f"{s}_grad_norm", f"|grad W_{s}|\n(mean over layers)",
             lambda r, s=s: record_series(r, f"{s}_grad_norm"), True) for s in ("q", "k")]
    rows += [(f"{s}_grad_per_logit", f"|grad W_{s}| / s\n(per unit of logit)",
              lambda r, s=s: per_logit(r, f"{s}_grad_norm"), True) for s in ("q", "k")]
    free = sorted({k[0][1] for k, runs in groups.items()
                   if any(fixed_scale(r) is None for r in runs)}, key=variant_rank)
    why = (f"; / s rows: {', '.join(free)} not drawn (s is learned, or 0)" if free else "")
    stat_grid(groups, rows, f"Gradient norm of the q and k projections{note}; s = the score"
              f" scale{why}", path)


# The rows of the per-head figure: attn_heads key, y label, log y.
HEAD_ROWS = (("entropy", "entropy (nats)", False),
             ("entropy_norm", "entropy / ln(keys)\n(1 uniform, 0 one-hot)", False),
             ("saturated", f"saturated rows\n(max weight > {SATURATION_THRESHOLD})", False),
             ("max_logit", "max |logit|", True),
             ("raw_max_logit", "max |q.k|, raw", True),
             ("raw_var", "Var(q.k) / d_head, raw", True),
             ("q_norm", "mean |q|", True),
             ("k_norm", "mean |k|", True),
             ("qk_clip_count", "QK-Clips so far", False),
             ("scale", "learned scale g_h", False))


def head_series(run, key: str, layer: int, head: int) -> tuple[list, list]:
    """(steps, values) of one head's statistic over the run's eval records."""
    points = [(e["step"], e["attn_heads"][key][layer][head]) for e in run.evals
              if key in e.get("attn_heads", {})]
    return [s for s, _ in points], [v for _, v in points]


def shows(values: list, log: bool) -> bool:
    """Whether values hold one a panel can show: finite and not 0 (above 0 on a log axis)."""
    return any(math.isfinite(v) and (v > 0 if log else v != 0) for v in values)


def plot_heads(run, path: Path) -> bool:
    """Per-head attention statistics of one run (metrics.jsonl's attn_heads): a row per
    statistic, a panel per layer, a line per head over training. Marks the entropy of uniform
    attention over a full causal window (mean over rows i = 1..T of ln i, T = block_size) and
    the floor of the saturated share (1/T: the first row sees one key). A statistic that is 0
    or missing at every head (uniform's scaled max logit: its scores ignore q and k) gets no
    row, and the title names it; a layer without a value to show gets an empty panel, off.
    False if the run has no attn_heads."""
    last = next((e["attn_heads"] for e in reversed(run.evals) if "attn_heads" in e), None)
    if last is None:
        return False
    n_layer, n_head = len(last["entropy"]), len(last["entropy"][0])

    def layer_values(key: str, layer: int) -> list:
        return [v for head in range(n_head) for v in head_series(run, key, layer, head)[1]]

    present = [row for row in HEAD_ROWS if row[0] in last]
    rows = [row for row in present if any(shows(layer_values(row[0], layer), row[2])
                                          for layer in range(n_layer))]
    dropped = [row[1].splitlines()[0] for row in present if row not in rows]
    block = run.setting("model.block_size")
    T = int(block) if block else None
    fig, axes = plt.subplots(len(rows), n_layer, squeeze=False, sharex=True,
                             figsize=(max(3.0 * n_layer + 1.0, 7.0), 2.0 * len(rows) + 1.3),
                             layout="constrained")
    for i, (key, ylabel, log) in enumerate(rows):
        for layer in range(n_layer):
            ax = axes[i][layer]
            if not shows(layer_values(key, layer), log):
                blank(ax, f"{ylabel.splitlines()[0]}, layer {layer}:\n0 or missing")
                continue
            head_panel(ax, run, (key, log), (layer, n_head), T)
            if i == 0:
                ax.set_title(f"layer {layer}", fontsize=10)
            if layer == 0:
                ax.set_ylabel(ylabel, fontsize=9)
        share_y(axes[i])
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=9)
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncol=min(n_head, 8), fontsize=9,
               frameon=False)
    why = " (uniform: it has no q or k)" if run.variant == "uniform" else ""
    left = f"\nnot drawn, 0 or missing at every head: {', '.join(dropped)}{why}" if dropped \
        else ""
    suptitle(fig, f"Attention per head: {run.path.name} ({run.variant}); fixed validation "
                  f"batch{f', block_size {T}' if T else ''}{left}")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def head_panel(ax, run, stat: tuple[str, bool], where: tuple[int, int], T) -> None:
    """One layer's panel of the per-head figure: a line per head and the row's marks.
    stat: (statistic, log y); where: (layer, number of heads)."""
    (key, log), (layer, n_head) = stat, where
    for head in range(n_head):
        ax.plot(*head_series(run, key, layer, head), color=f"C{head % 10}", lw=1.3,
                label=f"head {head}")
    if log:
        ax.set_yscale("log")
    else:
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no "+2.548"
    if key == "entropy" and T:
        uniform = sum(math.log(t) for t in range(1, T + 1)) / T
        ax.axhline(uniform, color="0.35", lw=0.9, ls=(0, (1, 2)))
        ax.text(0.01, uniform, "uniform attention", transform=ax.get_yaxis_transform(),
                ha="left", va="top", fontsize=9, color="0.3")
    if key == "saturated" and T:
        ax.axhline(1 / T, color="0.35", lw=0.9, ls=(0, (1, 2)))
        ax.text(0.01, 1 / T, "floor 1/T", transform=ax.get_yaxis_transform(),
                ha="left", va="bottom", fontsize=9, color="0.3")
    if not log:
        hold_flat(ax)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=9)


def hold_flat(ax, agree: float = 1e-4) -> None:
    """A linear panel whose lines agree to `agree` of their value but not exactly (a constant
    quantity, such as uniform attention's entropy, read from curves.jsonl, which rounds its last
    digits) gets the range matplotlib gives an exactly constant line, 5.5% each side (5%, then
    its margin): autoscaled, the wobble in the last digits would fill the panel as steps."""
    values = [v for line in ax.lines for v in line.get_ydata() if math.isfinite(v)]
    if not values:
        return
    lo, hi = min(values), max(values)
    centre = (lo + hi) / 2
    if 0 < hi - lo <= agree * abs(centre):
        ax.set_ylim(centre - 0.055 * abs(centre), centre + 0.055 * abs(centre))
