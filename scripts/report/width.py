"""Learning-rate transfer across width (Tensor Programs V, Fig. 1) for an LR sweep that also
varies model.d_model (docs/report.md, "Width"): per cell (the other settings), each width's
optimal LR per seed, its drift per doubling of width, whether wider is better at each width's
own best LR; and their figure, width_transfer.png.
"""

import math
from typing import Optional

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator
from scipy import stats

from scripts.report import stats as st
from scripts.report import style
from scripts.report.runs import LR_KEY, RunRecord, group_runs, label

WIDTH_KEY = "model.d_model"


def parabola_vertex(xs: list[float], ys: list[float]) -> float:
    """The vertex of the parabola through three points (y1 lowest), kept within [x0, x2]."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    den = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
    if den == 0:
        return x1
    num = (x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)
    return min(max(x1 - 0.5 * num / den, x0), x2)


def optimal_log2_lr(losses: dict[float, float]) -> Optional[float]:
    """log2 of a seed's optimal LR over the grid; None at the grid's edge (or below 3 LRs)."""
    lrs = sorted(lr for lr, loss in losses.items() if loss is not None and math.isfinite(loss))
    if len(lrs) < 3:
        return None
    i = min(range(len(lrs)), key=lambda k: losses[lrs[k]])
    if i in (0, len(lrs) - 1):
        return None
    around = lrs[i - 1:i + 2]
    return parabola_vertex([math.log2(lr) for lr in around], [losses[lr] for lr in around])


def cells(lr_runs: list[RunRecord]) -> dict[tuple, dict[int, list[RunRecord]]]:
    """cell key (the group key without LR and width) -> width -> its runs, widths ascending."""
    out = {}
    for key, runs in group_runs(lr_runs, drop=(LR_KEY, WIDTH_KEY)).items():
        width = {id(r): int(float(r.setting(WIDTH_KEY))) for r in runs}
        out[key] = {w: [r for r in runs if width[id(r)] == w] for w in sorted(set(width.values()))}
    return out


def per_seed(table: dict[float, dict]) -> dict:
    """{lr: {seed: loss}} -> {seed: {lr: loss}}."""
    seeds = dict.fromkeys(s for by_seed in table.values() for s in by_seed)
    return {s: {lr: by_seed[s] for lr, by_seed in table.items() if s in by_seed} for s in seeds}


def cell_optima(by_width: dict[int, list[RunRecord]], which: str) -> dict[int, dict]:
    """width -> {seed: log2 optimal LR, or None at the grid's edge}."""
    return {w: {seed: optimal_log2_lr(losses)
                for seed, losses in per_seed(st.lr_table(runs, which)).items()}
            for w, runs in by_width.items()}


def drift(optima: dict[int, dict]) -> st.Comparison:
    """Slope of log2(optimal LR) on log2(width) over every optimum, t test of 0 (n - 2 df)."""
    points = [(math.log2(w), y) for w, per in optima.items() for y in per.values()
              if y is not None]
    if len({x for x, _ in points}) < 2:
        return st.Comparison(None, None, None)
    fit, n = stats.linregress(*zip(*points)), len(points)
    if n < 3:
        return st.Comparison(st.Interval(float(fit.slope), None, n), None, None)
    half = st.t_quantile(0.5 + st.LEVEL / 2, n - 2) * fit.stderr
    p = float(fit.pvalue) if fit.stderr else float(fit.slope == 0)   # every optimum on the line
    return st.Comparison(st.Interval(float(fit.slope), float(half), n), p, None)


def lr_cell(log2_lrs: list) -> str:
    """Geometric mean of the optimal LRs over the seeds that have one, with their n."""
    values = [v for v in log2_lrs if v is not None]
    return f"{2 ** (sum(values) / len(values)):.3g} (n={len(values)})" if values else "edge"


def width_section(lr_runs: list[RunRecord], which: str) -> list[str]:
    """results.md's "## Width": two tables, one Holm family each."""
    by_cell = cells(lr_runs)
    return ["## Width", ""] + drift_table(by_cell, which) + [""] + wider_table(by_cell, which)


def drift_table(by_cell: dict, which: str) -> list[str]:
    optima = {key: cell_optima(by_width, which) for key, by_width in by_cell.items()}
    fits = [drift(o) for o in optima.values()]
    tests = [st.Comparison(c.diff, c.p, adjusted)
             for c, adjusted in zip(fits, st.holm([c.p for c in fits]))]
    widths = sorted({w for by_width in by_cell.values() for w in by_width})
    lines = ["Optimal LR per width and seed: the vertex of the parabola in log2 LR through the"
             " seed's lowest clipped loss and its two neighbours on the grid (`edge`: the lowest"
             " is the smallest or largest LR tried, no optimum); shown as the geometric mean over"
             " the seeds that have one. Drift per doubling: the least-squares slope of"
             " log2(optimal LR) against log2(d_model) through every (width, seed) optimum of the"
             " cell, ± its 95% t interval (n: the optima, n - 2 degrees of freedom); p: t-test of"
             " slope 0, Holm over the cells. A slope of -1 halves the best LR at each doubling"
             " (what Tensor Programs V reports for SP), 0 keeps it (muP).", "",
             "| cell | " + " | ".join(f"d_model={w}" for w in widths)
             + " | drift per doubling (log2 LR) | p | Holm p | reading |",
             "|---|" + "---:|" * (len(widths) + 3) + "---|"]
    for (key, o), c in zip(optima.items(), tests):
        cells_text = [lr_cell(list(o[w].values())) if w in o else "" for w in widths]
        reading = (f"not resolved ({c.diff.n} optima, no interval)"
                   if c.diff is not None and c.diff.half is None
                   else st.verdict(c, "falls with width", "rises with width"))
        lines.append(f"| {label(key, 'all')} | " + " | ".join(cells_text)
                     + f" | {c.diff.text(3) if c.diff else 'n/a'} | {st.p_text(c.p)}"
                     f" | {st.p_text(c.p_holm)} | {reading} |")
    return lines + ["", f"Family: {sum(c.p is not None for c in tests)} slope t-tests,"
                    f" Holm-adjusted together. Resolved: Holm p < {st.ALPHA:g}."]


def wider_table(by_cell: dict, which: str) -> list[str]:
    rows = [(key, narrow, wide) for key, by_width in by_cell.items()
            for narrow, wide in zip(list(by_width), list(by_width)[1:])]
    best = {(key, w): {seed: min(losses.values())   # each width at its own best LR
                       for seed, losses in per_seed(st.lr_table(runs, which)).items()}
            for key, by_width in by_cell.items() for w, runs in by_width.items()}
    pairs = [(best[key, wide], best[key, narrow]) for key, narrow, wide in rows]
    lines = ["Wider at its own best LR: per seed, the lowest clipped"
             f" {st.LOSSES[which][1]} over the LR grid, the wider width minus the narrower,"
             " paired by seed; Holm over the table.", "",
             "| cell | widths | pairs | wider − narrower | p (paired t) | Holm p | reading |",
             "|---|---|---:|---:|---:|---:|---|"]
    for (key, narrow, wide), c in zip(rows, st.family(pairs)):
        lines.append(f"| {label(key, 'all')} | {narrow} -> {wide}"
                     f" | {c.diff.n if c.diff else 0} | {c.diff.text(4) if c.diff else 'n/a'}"
                     f" | {st.p_text(c.p)} | {st.p_text(c.p_holm)}"
                     f" | {st.verdict(c, 'wider better', 'wider worse')} |")
    return lines


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
    for ax in axes[0]:   # each panel its own y range
        ax.set_ylabel(f"{st.loss_name(which, lr_runs)}\n(clipped at loss at init)", fontsize=9)
    axes[1][0].set_ylabel("optimal LR (optim.lr),\none point per seed", fontsize=9)
    ns = [len(s) for by_width in by_cell.values() for runs in by_width.values()
          for s in st.lr_table(runs, which).values()]
    return style.finish(fig, "Learning rate across width: top, mean loss per LR, a line per"
                        " width (dotted: its optimal LR); bottom, each seed's optimal LR"
                        " (parabola vertex in log2 LR; none where a seed's lowest loss is at"
                        f" the grid's edge) and the least-squares line through them;"
                        f" {style.seeds_text(ns, 'point')}{style.seeds_note(fig)}")


def width_curves(ax, by_width: dict, optima: dict, colours: dict, which: str) -> None:
    for i, (w, runs) in enumerate(by_width.items()):
        table = st.lr_table(runs, which)
        means = {lr: st.mean_interval(list(s.values())) for lr, s in table.items()}
        lrs = [lr for lr, m in means.items() if m is not None]
        seeds = [(lr, v) for lr in lrs if len(table[lr]) == 2 for v in table[lr].values()]
        style.dodge(ax, (i, len(by_width)), ax.plot(
            lrs, [means[lr].mean for lr in lrs], marker=".", color=colours[w],
            label=f"d_model={w}") + style.draw_seeds(ax, [tuple(zip(*seeds))] if seeds else [],
                                                    (colours[w], "o"), True))
        found = [v for v in optima[w].values() if v is not None]
        if found:
            ax.axvline(2 ** (sum(found) / len(found)), color=colours[w], lw=0.8, ls=":")
    ax.set(xscale="log", xlabel=style.LR_LABEL)
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
