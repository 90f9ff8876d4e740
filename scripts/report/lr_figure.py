"""The learning-rate figure of an LR sweep (lr_transfer): loss against LR at each setting,
and across settings each scale's best LR, its loss at the chosen LR on held-out seeds
(stats.held_out) and its LR sensitivity. Points of different scales at one x are offset
sideways (dodge), which the title says; a summary panel with nothing to show (the LR
sensitivity when every group ran one LR: 0 by construction) is turned off, which the title
also says."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from model.config import SCALINGS
from scripts.report import stats as st
from scripts.report.figures import (
    blank,
    has_data,
    legend,
    reference_lines,
    share_y,
    style,
    suptitle,
)
from scripts.report.runs import LR_KEY, group_runs, label, setting_of, setting_order, variant_rank


def setting_axis(settings: list[tuple]):
    """x positions and tick labels of settings: the value itself (log scale) when there is a
    single numeric key such as model.d_head, else 0, 1, 2, ..."""
    try:
        if all(len(s) == 1 for s in settings):
            return [float(s[0][1]) for s in settings], settings[0][0][0], True
    except (TypeError, ValueError):
        pass
    return list(range(len(settings))), "setting", False


def plot_lr(lr_runs, which: str, path: Path, held: dict, levels=None) -> None:
    """Top: loss vs LR, one panel per setting. Bottom: best LR, loss at the chosen LR on the
    held-out seeds (held: stats.held_out of these runs) and LR sensitivity against the
    setting (the head width in lr_transfer). `levels`: the n-gram reference levels drawn on the
    loss panels, if any."""
    variants = group_runs(lr_runs, drop=(LR_KEY,))
    tables = {k: st.lr_table(g, which) for k, g in variants.items()}
    settings = sorted({setting_of(k) for k in variants}, key=setting_order)
    scales = [k[0][1] for k in variants]
    # the bottom row needs seeds held out from the LR choice: none in a one-seed sweep
    summary = any(held[k]["best"] is not None and held[k]["loss"] for k in tables)
    cols = max(len(settings), 3) if summary else len(settings)
    fig, axes = plt.subplots(2 if summary else 1, cols, figsize=(
        max(3.6 * cols, 6.0), 6.6 if summary else 3.8), squeeze=False, layout="constrained")
    for j, setting in enumerate(settings):
        ax = axes[0][j]
        for key, table in tables.items():
            if setting_of(key) == setting:
                lr_curve(ax, key[0][1], table, variants[key], scales)
        ax.set(xscale="log", xlabel="learning rate")
        lr_ticks(ax, sorted({lr for key, table in tables.items() if setting_of(key) == setting
                             for lr in table}))
        ax.set_title(label(setting, "all runs", short=True), fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"{st.loss_name(which, lr_runs)}\n(clipped at loss at init)",
                          fontsize=9)
    share_y(axes[0][:len(settings)])
    for ax in axes[0][len(settings):]:
        ax.axis("off")
    notes = []
    if summary:
        notes = summary_panels(axes[1], tables, settings, held)
        for ax in axes[1][3:]:
            ax.axis("off")
    for ax in axes.flat:   # a panel without a point to show is turned off
        if ax.axison and not has_data(ax):
            blank(ax, f"{ax.get_title()}:\nno finite point")
    for ax in [*axes[0][:len(settings)], *(axes[1][1:2] if summary else ())] if levels else ():
        if ax.axison:
            reference_lines(ax, levels)
    legend(fig, axes)
    ns = sorted({len(s) for t in tables.values() for s in t.values()})
    one_seed = "" if summary else ("; one seed per LR: best LR, held-out loss and LR "
                                   "sensitivity need seeds held out from the choice")
    suptitle(fig, "Learning rate x setting: points = mean of n="
             f"{ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} seeds, bars = 95% t"
             " interval, cut at 0 and at the loss at init (x: a seed diverged); points offset"
             f" sideways per scale for legibility{one_seed}"
             + "".join(f"\n{note}" for note in notes))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def lr_ticks(ax, lrs: list[float]) -> None:
    """The LRs tried as the x ticks of a loss-vs-LR panel, written out ("0.004"), without the
    log axis's minor labels, which overprint one another on a grid narrower than a decade;
    upright where more than five would crowd."""
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], fontsize=8, rotation=90 if len(lrs) > 5 else 0)


def dodge(variant: str, scales=()) -> float:
    """A small factor on a log x-axis per scale, so equal points and their bars stay apart;
    centred on the scales drawn (`scales`; every known scale if none given), so that their
    points straddle the x they stand for."""
    ranks = sorted({variant_rank(v) for v in scales}) or list(range(len(SCALINGS)))
    rank = variant_rank(variant)
    return 1.07 ** ((ranks.index(rank) if rank in ranks else rank) - (len(ranks) - 1) / 2)


def nonnegative_bars(ivs, cap: Optional[float] = None) -> list[list[float]]:
    """errorbar's yerr for 95% intervals of a quantity that cannot be negative (a loss, an LR
    sensitivity): the lower bar stops at 0, where a t interval of two seeds can run below it;
    `cap`: the most the quantity can be (a loss clipped at the loss at init), where the upper
    bar stops."""
    return [[min(iv.half or 0.0, iv.mean) for iv in ivs],
            [min(iv.half or 0.0, math.inf if cap is None else max(cap - iv.mean, 0.0))
             for iv in ivs]]


def init_cap(runs) -> Optional[float]:
    """The highest loss at init of the runs: a clipped loss is never above it."""
    inits = [r.loss_at_init for r in runs if r.loss_at_init is not None]
    return max(inits) if inits else None


def lr_curve(ax, variant: str, table: dict, runs, scales=()) -> None:
    lrs = [lr for lr in table if st.mean_interval(list(table[lr].values()))]
    ivs = [st.mean_interval(list(table[lr].values())) for lr in lrs]
    s = style(variant)
    xs = [lr * dodge(variant, scales) for lr in lrs]
    ax.errorbar(xs, [iv.mean for iv in ivs], yerr=nonnegative_bars(ivs, init_cap(runs)),
                label=variant, capsize=2, **{k: v for k, v in s.items() if k != "markevery"})
    div = [i for i, lr in enumerate(lrs) if any(r.diverged for r in runs if r.lr == lr)]
    ax.plot([xs[i] for i in div], [ivs[i].mean for i in div], "x", ms=9, color=s["color"])


def mixes_lrs(held_key: dict) -> bool:
    """Whether the held-out loss of a group averages seeds read at different LRs (leave one
    seed out: each seed at the LR best on the others, which the others may not agree on)."""
    return len({held_key["chosen"][seed] for seed in held_key["loss"]}) > 1


def summary_panels(axes, tables: dict, settings: list[tuple], held: dict) -> list[str]:
    """The bottom row: best LR, held-out loss and LR sensitivity per setting. A held-out loss
    whose seeds were read at different LRs is drawn hollow and said so. Returns the notes for
    the figure's title (what was not drawn, and why)."""
    xs, xlabel, numeric = setting_axis(settings)
    scales = [k[0][1] for k in tables]
    one_lr = all(len(table) <= 1 for table in tables.values())   # sensitivity 0 by construction
    mixed = False
    for key, table in tables.items():
        x = xs[settings.index(setting_of(key))] * (dodge(key[0][1], scales) if numeric else 1.0)
        best = held[key]["best"]
        loss = st.mean_interval(list(held[key]["loss"].values()))
        if best is None or loss is None:
            continue
        s = style(key[0][1])
        span = [best["lr"], *best["tied"]]  # the LRs not resolved from the best
        axes[0].errorbar([x], [best["lr"]], yerr=[[best["lr"] - min(span)],
                         [max(span) - best["lr"]]], capsize=3, color=s["color"],
                         marker=s["marker"])
        hollow = mixes_lrs(held[key])
        mixed |= hollow
        bars = nonnegative_bars([loss], init_cap(held[key]["runs"]))
        axes[1].errorbar([x], [loss.mean], yerr=bars, capsize=3, color=s["color"],
                         marker=s["marker"], mfc="none" if hollow else None)
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if sens is not None:   # None for a group of one LR (stats.sensitivity_by_seed)
            axes[2].errorbar([x], [sens.mean], yerr=nonnegative_bars([sens]), capsize=3,
                             color=s["color"], marker=s["marker"])
    join_points(axes, tables, settings, xs, numeric, held)
    titles = ("best LR (bar: LRs not resolved from it)",
              "loss at each scale's chosen LR,\nseeds that did not choose it"
              + ("\n(hollow: seeds read at different LRs)" if mixed else ""),
              "LR sensitivity (Wortsman et al. 2023)")
    ylabels = ("best LR", "held-out loss (nats)", "LR sensitivity (nats)")
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set(title=title, xlabel=xlabel)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
        setting_ticks(ax, xs, settings, numeric)
    axes[0].set_yscale("log")
    if one_lr:
        axes[2].clear()
        axes[2].axis("off")
        return ["LR sensitivity not drawn: one LR per group (0 by construction)"]
    ones = [k[0][1] for k, table in tables.items() if len(table) <= 1]
    return [f"LR sensitivity not drawn for {', '.join(dict.fromkeys(ones))}: one LR each (0 by"
            " construction)"] if ones else []


def setting_ticks(ax, xs: list, settings: list[tuple], numeric: bool) -> None:
    """The settings as x ticks: the values on a log-2 axis (no minor labels between them), or
    each setting's values one above the other with the keys in the axis label, so that the
    labels of many settings stay short; turned upright when they would still crowd."""
    if numeric:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(xs, [f"{x:g}" for x in xs], fontsize=9)
        return
    texts = ["\n".join("default" if v is None else str(v) for _, v in s) or "all runs"
             for s in settings]
    keys = [k.rsplit(".", 1)[-1] for k, _ in settings[0]]
    ax.set_xlabel(", ".join(keys) or "setting")
    widest = max(len(line) for text in texts for line in text.split("\n"))
    crowded = len(settings) * widest > 42   # about what a panel's width holds at 8 points
    ax.set_xticks(xs, texts, fontsize=8, rotation=90 if crowded else 0)


def join_points(axes, tables, settings, xs, numeric: bool, held: dict) -> None:
    """Lines through each scale's points across settings, so a trend reads at a glance."""
    by_variant: dict[str, list] = {}
    for key, table in tables.items():
        best = held[key]["best"]
        loss = st.mean_interval(list(held[key]["loss"].values()))
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if best is not None and loss is not None:
            x = xs[settings.index(setting_of(key))] * (
                dodge(key[0][1], [k[0][1] for k in tables]) if numeric else 1.0)
            by_variant.setdefault(key[0][1], []).append(
                (x, best["lr"], loss.mean, sens.mean if sens else math.nan))
    for variant, points in by_variant.items():
        points.sort()
        s = style(variant)
        for ax, col in zip(axes, (1, 2, 3)):
            if any(math.isfinite(p[col]) for p in points):   # a one-LR group: no sensitivity
                ax.plot([p[0] for p in points], [p[col] for p in points], color=s["color"],
                        ls=s["ls"], lw=1.2, label=variant)
