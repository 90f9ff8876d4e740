"""The width figure of an LR sweep that varies model.d_model (width_transfer.png), after
Tensor Programs V, Fig. 1: per cell (the settings but LR and width), the mean clipped loss
against LR with a line per width and its optimal LR marked, and below each seed's optimal LR
against width with the least-squares line whose slope is the table's drift
(scripts/report/width.py says how the optimum is found)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator

from scripts.report import stats as st
from scripts.report.figures import blank, suptitle
from scripts.report.runs import RunRecord, label
from scripts.report.width import cell_optima, cells, drift


def plot_width(lr_runs: list[RunRecord], which: str, path: Path) -> None:
    """Top: per cell, the mean clipped loss against LR, a line per width, its optimal LR (mean
    of the seeds' log2) marked. Bottom: each seed's optimal LR against width, log-log, and the
    fitted line of the drift."""
    by_cell = cells(lr_runs)
    cols = len(by_cell)
    fig, axes = plt.subplots(2, cols, figsize=(max(3.6 * cols, 6.0), 6.8), squeeze=False,
                             layout="constrained")
    widths = sorted({w for by_width in by_cell.values() for w in by_width})
    colours = {w: plt.cm.viridis(i / max(len(widths) - 1, 1)) for i, w in enumerate(widths)}
    for j, (key, by_width) in enumerate(by_cell.items()):
        top, bottom = axes[0][j], axes[1][j]
        optima = cell_optima(by_width, which)
        for w, runs in by_width.items():
            table = st.lr_table(runs, which)
            means = {lr: st.mean_interval(list(s.values())) for lr, s in table.items()}
            lrs = [lr for lr, m in means.items() if m is not None]
            top.plot(lrs, [means[lr].mean for lr in lrs], marker=".", color=colours[w],
                     label=f"d_model={w}")
            found = [v for v in optima[w].values() if v is not None]
            if found:
                top.axvline(2 ** (sum(found) / len(found)), color=colours[w], lw=0.8, ls=":")
            bottom.plot([w] * len(found), [2 ** v for v in found], "o", color=colours[w], ms=4)
        top.set(xscale="log", xlabel="learning rate")
        top.set_title(label(key, "all", short=True), fontsize=9)
        top.grid(alpha=0.3, which="both")
        top.legend(fontsize=7, frameon=False)
        if not bottom.lines:
            blank(bottom, f"{label(key, 'all', short=True)}:\nevery optimum at the grid's edge")
            continue
        fit = drift(optima)
        if fit.diff is not None:   # the line the table's drift comes from
            points = [(math.log2(w), v) for w, per in optima.items() for v in per.values()
                      if v is not None]
            mx = sum(x for x, _ in points) / len(points)
            my = sum(y for _, y in points) / len(points)
            ends = [min(x for x, _ in points), max(x for x, _ in points)]
            line = [2 ** (my + fit.diff.mean * (x - mx)) for x in ends]
            bottom.plot([2 ** x for x in ends], line, color="0.4", lw=1,
                        label=f"fit: {fit.diff.mean:+.2f} log2 LR per doubling")
            bottom.legend(fontsize=7, frameon=False)
        bottom.set(xscale="log", yscale="log", xlabel="d_model")
        bottom.set_xticks(widths, [str(w) for w in widths])
        bottom.yaxis.set_major_locator(LogLocator(base=2))
        bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
        bottom.minorticks_off()
        bottom.grid(alpha=0.3, which="both")
    found = [y for ax in axes[1] if ax.axison for line in ax.lines for y in line.get_ydata()]
    for ax in axes[1]:   # one y range for the row, at least a factor 4 wide: ticks to read
        if ax.axison and found:
            ax.set_ylim(min(found) / 2, max(found) * 2)
    axes[0][0].set_ylabel(f"{st.loss_name(which, lr_runs)}\n(clipped at loss at init)", fontsize=9)
    axes[1][0].set_ylabel("optimal LR, one point per seed", fontsize=9)
    suptitle(fig, "Learning rate across width: top, mean over seeds per LR, a line per width"
                  " (dotted: its optimal LR); bottom, each seed's optimal LR (parabola vertex in"
                  " log2 LR; a seed whose lowest loss is at the grid's edge has none) and the"
                  " least-squares line through them")
    fig.savefig(path, dpi=120)
    plt.close(fig)
