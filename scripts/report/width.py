"""Learning-rate transfer across width (Tensor Programs V, Fig. 1) for an LR sweep that also
varies model.d_model (docs/report.md, "Width"): per cell (the other settings), each width's
optimal LR per seed (a parabola's vertex in log2 LR), its drift per doubling of width (one
least-squares line through every optimum, Holm over the cells), and whether wider is better at
each width's own best LR (paired by seed, Holm over the table). Its figure: width_figure.py.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from scripts.report import stats as st
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


def slope(xs: list[float], ys: list[float]) -> Optional[float]:
    """Least-squares slope of ys against xs; None below two distinct xs."""
    if len(set(xs)) < 2:
        return None
    return float(np.polyfit(xs, ys, 1)[0])


def cells(lr_runs: list[RunRecord]) -> dict[tuple, dict[int, list[RunRecord]]]:
    """cell key (the group key without LR and width) -> width -> its runs, widths ascending."""
    out: dict[tuple, dict[int, list[RunRecord]]] = {}
    for key, runs in group_runs(lr_runs, drop=(LR_KEY, WIDTH_KEY)).items():
        for r in runs:
            out.setdefault(key, {}).setdefault(int(float(r.setting(WIDTH_KEY))), []).append(r)
    return {key: dict(sorted(by_width.items())) for key, by_width in out.items()}


def per_seed(table: dict[float, dict]) -> dict:
    """{lr: {seed: loss}} -> {seed: {lr: loss}}."""
    out: dict = {}
    for lr, seeds in table.items():
        for seed, loss in seeds.items():
            out.setdefault(seed, {})[lr] = loss
    return out


def cell_optima(by_width: dict[int, list[RunRecord]], which: str) -> dict[int, dict]:
    """width -> {seed: log2 optimal LR, or None at the grid's edge}."""
    return {w: {seed: optimal_log2_lr(losses)
                for seed, losses in per_seed(st.lr_table(runs, which)).items()}
            for w, runs in by_width.items()}


def drift(optima: dict[int, dict]) -> st.Comparison:
    """The slope of log2(optimal LR) against log2(width) through every optimum (n of them),
    with its t interval and test of slope 0 (n - 2 df); no interval below three optima."""
    points = [(math.log2(w), y) for w, per in optima.items() for y in per.values()
              if y is not None]
    xs, ys = np.array([x for x, _ in points]), np.array([y for _, y in points])
    n = len(points)
    if len(set(xs.tolist())) < 2:
        return st.Comparison(None, None, None)
    b, a = np.polyfit(xs, ys, 1)
    if n < 3:
        return st.Comparison(st.Interval(float(b), None, n), None, None)
    sxx = float(np.sum((xs - xs.mean()) ** 2))
    se = math.sqrt(float(np.sum((ys - (a + b * xs)) ** 2)) / (n - 2) / sxx)
    half = st.t_quantile(0.5 + st.LEVEL / 2, n - 2) * se
    if se == 0:   # every optimum on the line
        p = 1.0 if b == 0 else 0.0
    else:
        p = float(2 * st.stats.t.sf(abs(b / se), n - 2))
    return st.Comparison(st.Interval(float(b), half, n), p, None)


def best_loss_by_seed(runs: list[RunRecord], which: str) -> dict:
    """seed -> its lowest clipped loss over the LR grid (the loss at that width's own best LR)."""
    return {seed: min(losses.values())
            for seed, losses in per_seed(st.lr_table(runs, which)).items()}


def lr_cell(log2_lrs: list) -> str:
    """Geometric mean of the optimal LRs over the seeds that have one, with their n."""
    values = [v for v in log2_lrs if v is not None]
    if not values:
        return "edge"
    return f"{2 ** (sum(values) / len(values)):.3g} (n={len(values)})"


def width_section(lr_runs: list[RunRecord], which: str) -> list[str]:
    """results.md's "## Width": the optimum per width and its drift per doubling, and whether
    wider is better at its own best LR, each table one Holm family."""
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
    pairs, rows = [], []
    for key, by_width in by_cell.items():
        ws = list(by_width)
        for narrow, wide in zip(ws, ws[1:]):
            rows.append((key, narrow, wide))
            pairs.append((best_loss_by_seed(by_width[wide], which),
                          best_loss_by_seed(by_width[narrow], which)))
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
