"""The figures of an LR sweep: lr_transfer.png, each arm's clipped final loss against LR (where
an arm ran two LRs or more), and lr_stability.png, per arm the largest attention logit and the
most one-hot head's normalised entropy against step at its highest stable and first failing LR
(its best and the grid's top where none failed), as Wortsman et al. 2023 read logit growth.
"""

from __future__ import annotations

import math
from typing import Optional

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from scripts.report import stats as st
from scripts.report import style
from scripts.report.figures import Frame, panel_grid, panel_title
from scripts.report.runs import LR_KEY, RunRecord, group_runs


def lr_ticks(ax, lrs: list[float], most: int = 8) -> None:
    """The LRs tried as the x ticks, written out and upright (every k-th where more than
    `most` would crowd)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    every = math.ceil(len(lrs) / most)
    ax.set_xticks(lrs, [f"{lr:g}" if i % every == 0 else "" for i, lr in enumerate(lrs)],
                  fontsize=8, rotation=90)


def init_cap(runs) -> float:
    """The highest loss at init of the runs: a clipped loss is never above it."""
    return max((r.loss_at_init for r in runs if r.loss_at_init is not None), default=math.inf)


def lr_curve(ax, frame: Frame, key: tuple, runs: list, reading: tuple) -> list[int]:
    """One arm's mean clipped loss against LR with its 95% bars (n >= 3); a cross where a run
    failed. reading: (which loss, levels). Returns the n of each point."""
    which, levels = reading
    table = st.lr_table(runs, which)
    lrs = [lr for lr in table if st.mean_interval(list(table[lr].values()))]
    ivs = [st.mean_interval(list(table[lr].values())) for lr in lrs]
    look = frame.looks[frame.arms.name(key)]
    ax.errorbar(lrs, [iv.mean for iv in ivs], yerr=style.bars(ivs, (0.0, init_cap(runs))),
                label=frame.arms.name(key), capsize=2, **style.line_style(look))
    bad = [i for i, lr in enumerate(lrs)
           if any(st.failure(r, which, levels) is not None for r in runs if r.lr == lr)]
    ax.plot([lrs[i] for i in bad], [ivs[i].mean for i in bad], "x", ms=9, color=look[0])
    return [iv.n for iv in ivs]


def plot_lr(frame: Frame, lr_runs: list[RunRecord], which: str):
    """lr_transfer.png; None where every arm ran one LR (no curve to read)."""
    arms = group_runs(lr_runs, drop=(LR_KEY,))
    if all(len({r.lr for r in g}) < 2 for g in arms.values()):
        return None
    fig, axes, settings = panel_grid(frame, arms, height=3.2)
    ns = []
    for i, setting in enumerate(settings):
        ax = axes.flat[i]
        for key, runs in arms.items():
            if frame.arms.setting(key) == setting:
                ns += lr_curve(ax, frame, key, runs, (which, frame.levels))
        style.reference_lines(ax, frame.levels or {})
        lr_ticks(ax, sorted({r.lr for k, g in arms.items() if frame.arms.setting(k) == setting
                             for r in g}))
        ax.set(title=panel_title(setting), xlabel="learning rate",
               ylabel=f"{st.loss_name(which, lr_runs)}\n(clipped at the loss at init)")
        ax.title.set_fontsize(9)
        ax.yaxis.label.set_fontsize(9)
        ax.grid(alpha=0.3)
    return style.finish(fig, "Final loss against learning rate, every seed of the sweep (the"
                        f" seeds that choose each LR); {style.seeds_text(ns, 'point')} (bars cut"
                        " at 0 and the loss at init); x: a run failed")


def seed_order(run: RunRecord):
    return (len(str(run.seed)), str(run.seed))


def edge_runs(runs: list[RunRecord], which: str, levels: Optional[dict]) -> list:
    """(LR, run) at the arm's highest stable LR and at its first failing LR (its lowest seed
    that failed); where no run failed, at its best LR and the top of its grid."""
    failed = [r for r in runs if st.failure(r, which, levels) is not None]
    if not failed:
        best = st.best_lr(st.lr_table(runs, which))
        top = max(r.lr for r in runs)
        lrs = ([best["lr"]] if best and best["lr"] != top else []) + [top]
        return [(lr, min((r for r in runs if r.lr == lr), key=seed_order)) for lr in lrs]
    safe = st.survives_up_to(runs, which, levels)
    picks = [] if safe is None else [
        (safe, min((r for r in runs if r.lr == safe), key=seed_order))]
    first = min(r.lr for r in failed)
    return picks + [(first, min((r for r in failed if r.lr == first), key=seed_order))]


def head_extreme(run: RunRecord, key: str, reduce) -> tuple[list, list]:
    """(steps, reduce over every layer and head of attn_heads[key]), finite values only."""
    steps, values = [], []
    for e in run.evals:
        finite = [v for layer in e.get("attn_heads", {}).get(key) or [] for v in layer
                  if v is not None and math.isfinite(v)]
        if finite:
            steps.append(e["step"])
            values.append(reduce(finite))
    return steps, values


ROWS = (("max_logit", max, "max attention logit\n(every layer and head)", True),
        ("entropy_norm", min, "entropy / ln(keys),\nmost one-hot head", False))
EDGES = ("-", "--")   # the stable (or best) LR's run, the failing (or top) LR's


def plot_stability(frame: Frame, lr_runs: list[RunRecord], which: str):
    """lr_stability.png; None when no run has per-head statistics or no arm ran two LRs."""
    arms = group_runs(lr_runs, drop=(LR_KEY,))
    if not any("attn_heads" in e for r in lr_runs for e in r.evals) or all(
            len({r.lr for r in g}) < 2 for g in arms.values()):
        return None
    fig, axes = plt.subplots(2, len(arms), squeeze=False, sharex="col", layout="constrained",
                             figsize=(max(2.4 * len(arms), 7.0), 6.0))
    for j, (key, runs) in enumerate(arms.items()):
        picks = edge_runs(runs, which, frame.levels)
        look = frame.looks[frame.arms.name(key)]
        for i, (stat, reduce, ylabel, log) in enumerate(ROWS):
            ax = axes[i][j]
            for (lr, run), dashes in zip(picks, EDGES):
                steps, values = head_extreme(run, stat, reduce)
                values = [v if v > 0 or not log else math.nan for v in values]
                ax.plot(steps, values, **{**style.line_style(look), "ls": dashes,
                                          "markevery": max(1, len(steps) // 5)})
            ax.set(yscale="log" if log else "linear", xlabel="step" if i else "")
            ax.set_ylim(*((None, None) if log else (0.0, 1.05)))
            ax.set_ylabel(ylabel if j == 0 else "", fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][j].set_title(f"{frame.arms.name(key)}\nlr " + " / ".join(
            f"{lr:g}" for lr, _ in picks), fontsize=8)
    return finish_stability(fig, frame, list(arms))


def finish_stability(fig, frame: Frame, keys: list[tuple]):
    """The legend (each arm, and what solid and dashed mean) and the title."""
    handles = [Line2D([], [], label=frame.arms.name(k), **style.line_style(
        frame.looks[frame.arms.name(k)])) for k in keys]
    handles += [Line2D([], [], color="0.3", ls=d, label=text) for d, text in zip(EDGES, (
        "highest stable LR (no failure: best LR)", "first failing LR (no failure: grid's top)"))]
    return style.finish(fig, "Attention at high learning rates, each arm at two LRs (column"
                        " titles): the lowest seed at the LR, at the failing LR its lowest seed"
                        " that failed; one run per line, n = 1, no intervals", handles)
