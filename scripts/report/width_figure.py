"""width_transfer.png (after Tensor Programs V, Fig. 1): per cell, the mean loss against LR
with a line per width, and each seed's optimal LR against width with the drift's line."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator

from scripts.report import stats as st
from scripts.report import style
from scripts.report.runs import RunRecord, label
from scripts.report.width import cell_optima, cells, drift


def plot_width(lr_runs: list[RunRecord], which: str):
    by_cell = cells(lr_runs)
    fig, axes = plt.subplots(2, len(by_cell), figsize=(max(3.6 * len(by_cell), 6.0), 7.0),
                             squeeze=False, layout="constrained")
    widths = sorted({w for by_width in by_cell.values() for w in by_width})
    colours = {w: plt.cm.viridis(i / max(len(widths) - 1, 1)) for i, w in enumerate(widths)}
    for j, (key, by_width) in enumerate(by_cell.items()):
        optima = cell_optima(by_width, which)
        width_curves(axes[0][j], by_width, optima, colours, which)
        axes[0][j].set_title(label(key, "all", short=True), fontsize=9)
        optima_panel(axes[1][j], optima, colours, widths)
    found = [y for ax in axes[1] for line in ax.lines for y in line.get_ydata()]
    for ax in axes[1] if found else ():   # one y range for the row, a factor 4 wide at least
        ax.set_ylim(min(found) / 2, max(found) * 2)
    axes[0][0].set_ylabel(f"{st.loss_name(which, lr_runs)}\n(clipped at loss at init)",
                          fontsize=9)
    axes[1][0].set_ylabel("optimal LR, one point per seed", fontsize=9)
    ns = [len(s) for by_width in by_cell.values() for runs in by_width.values()
          for s in st.lr_table(runs, which).values()]
    return style.finish(fig, "Learning rate across width: top, mean loss per LR, a line per"
                        " width (dotted: its optimal LR); bottom, each seed's optimal LR"
                        " (parabola vertex in log2 LR; none where a seed's lowest loss is at"
                        f" the grid's edge) and the least-squares line through them;"
                        f" {style.seeds_text(ns, 'point')}")


def width_curves(ax, by_width: dict, optima: dict, colours: dict, which: str) -> None:
    for w, runs in by_width.items():
        table = st.lr_table(runs, which)
        means = {lr: st.mean_interval(list(s.values())) for lr, s in table.items()}
        lrs = [lr for lr, m in means.items() if m is not None]
        ax.plot(lrs, [means[lr].mean for lr in lrs], marker=".", color=colours[w],
                label=f"d_model={w}")
        found = [v for v in optima[w].values() if v is not None]
        if found:
            ax.axvline(2 ** (sum(found) / len(found)), color=colours[w], lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="learning rate")
    ax.grid(alpha=0.3, which="both")


def optima_panel(ax, optima: dict, colours: dict, widths: list) -> None:
    """Each seed's optimal LR against width, and the line of the cell's drift."""
    for w, per in optima.items():
        found = [2 ** v for v in per.values() if v is not None]
        ax.plot([w] * len(found), found, "o", color=colours[w], ms=4)
    fit = drift(optima)
    points = [(math.log2(w), v) for w, per in optima.items() for v in per.values()
              if v is not None]
    if fit.diff is not None:   # the line the table's drift comes from
        mx, my = (sum(p[i] for p in points) / len(points) for i in (0, 1))
        ends = [min(x for x, _ in points), max(x for x, _ in points)]
        ax.plot([2 ** x for x in ends], [2 ** (my + fit.diff.mean * (x - mx)) for x in ends],
                color="0.4", lw=1, label="least-squares line of the drift")
    ax.set(xscale="log", yscale="log", xlabel="d_model")
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
    ax.minorticks_off()
    ax.grid(alpha=0.3, which="both")
