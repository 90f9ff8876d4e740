"""The learning-rate figure of an LR sweep (lr_transfer): loss against LR at each setting,
and across settings each scale's best LR, its loss at the chosen LR on held-out seeds
(stats.held_out) and its LR sensitivity."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from scripts.report import stats as st
from scripts.report.figures import legend, reference_lines, share_y, style, suptitle
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
    # the bottom row needs seeds held out from the LR choice: none in a one-seed sweep
    summary = any(held[k]["best"] is not None and held[k]["loss"] for k in tables)
    cols = max(len(settings), 3) if summary else len(settings)
    fig, axes = plt.subplots(2 if summary else 1, cols, figsize=(
        max(3.6 * cols, 6.0), 6.6 if summary else 3.8), squeeze=False, layout="constrained")
    for j, setting in enumerate(settings):
        ax = axes[0][j]
        for key, table in tables.items():
            if setting_of(key) == setting:
                lr_curve(ax, key[0][1], table, variants[key])
        ax.set(xscale="log", xlabel="learning rate")
        ax.set_title(label(setting, "all runs", short=True), fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"{st.LOSSES[which][1]}\n(clipped at loss at init)", fontsize=9)
    share_y(axes[0][:len(settings)])
    for ax in axes[0][len(settings):]:
        ax.axis("off")
    if summary:
        summary_panels(axes[1], tables, settings, held)
        for ax in axes[1][3:]:
            ax.axis("off")
    for ax in [*axes[0][:len(settings)], *(axes[1][1:2] if summary else ())] if levels else ():
        reference_lines(ax, levels)
    legend(fig, axes)
    ns = sorted({len(s) for t in tables.values() for s in t.values()})
    one_seed = "" if summary else ("; one seed per LR: best LR, held-out loss and LR "
                                   "sensitivity need seeds held out from the choice")
    suptitle(fig, "Learning rate x setting: points = mean of n="
             f"{ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} seeds, bars = 95% t"
             f" interval, cut at 0 (x: a seed diverged){one_seed}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dodge(variant: str) -> float:
    """A small factor on a log x-axis per scale, so equal points and their bars stay apart."""
    return 1.07 ** (variant_rank(variant) - 2.5)


def nonnegative_bars(ivs) -> list[list[float]]:
    """errorbar's yerr for 95% intervals of a quantity that cannot be negative (a loss, an LR
    sensitivity): the lower bar stops at 0, where a t interval of two seeds can run below it."""
    return [[min(iv.half or 0.0, iv.mean) for iv in ivs], [iv.half or 0.0 for iv in ivs]]


def lr_curve(ax, variant: str, table: dict, runs) -> None:
    lrs = [lr for lr in table if st.mean_interval(list(table[lr].values()))]
    ivs = [st.mean_interval(list(table[lr].values())) for lr in lrs]
    s = style(variant)
    xs = [lr * dodge(variant) for lr in lrs]
    ax.errorbar(xs, [iv.mean for iv in ivs], yerr=nonnegative_bars(ivs),
                label=variant, capsize=2, **{k: v for k, v in s.items() if k != "markevery"})
    div = [i for i, lr in enumerate(lrs) if any(r.diverged for r in runs if r.lr == lr)]
    ax.plot([xs[i] for i in div], [ivs[i].mean for i in div], "x", ms=9, color=s["color"])


def summary_panels(axes, tables: dict, settings: list[tuple], held: dict) -> None:
    xs, xlabel, numeric = setting_axis(settings)
    for key, table in tables.items():
        x = xs[settings.index(setting_of(key))] * (dodge(key[0][1]) if numeric else 1.0)
        best = held[key]["best"]
        loss = st.mean_interval(list(held[key]["loss"].values()))
        if best is None or loss is None:
            continue
        s = style(key[0][1])
        span = [best["lr"], *best["tied"]]  # the LRs not resolved from the best
        axes[0].errorbar([x], [best["lr"]], yerr=[[best["lr"] - min(span)],
                         [max(span) - best["lr"]]], capsize=3, color=s["color"],
                         marker=s["marker"])
        axes[1].errorbar([x], [loss.mean], yerr=nonnegative_bars([loss]), capsize=3,
                         color=s["color"], marker=s["marker"])
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if sens is not None:
            axes[2].errorbar([x], [sens.mean], yerr=nonnegative_bars([sens]), capsize=3,
                             color=s["color"], marker=s["marker"])
    join_points(axes, tables, settings, xs, numeric, held)
    titles = ("best LR (bar: LRs not resolved from it)",
              "loss at each scale's chosen LR,\nseeds that did not choose it",
              "LR sensitivity (Wortsman et al. 2023)")
    for ax, title in zip(axes, titles):
        ax.set(title=title, xlabel=xlabel)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
        if numeric:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs] if numeric else
                      [label(s, short=True) for s in settings], fontsize=9)
    axes[0].set_yscale("log")


def join_points(axes, tables, settings, xs, numeric: bool, held: dict) -> None:
    """Lines through each scale's points across settings, so a trend reads at a glance."""
    by_variant: dict[str, list] = {}
    for key, table in tables.items():
        best = held[key]["best"]
        loss = st.mean_interval(list(held[key]["loss"].values()))
        sens = st.mean_interval(list(st.sensitivity_by_seed(table).values()))
        if best is not None and loss is not None:
            x = xs[settings.index(setting_of(key))] * (dodge(key[0][1]) if numeric else 1.0)
            by_variant.setdefault(key[0][1], []).append(
                (x, best["lr"], loss.mean, sens.mean if sens else math.nan))
    for variant, points in by_variant.items():
        points.sort()
        s = style(variant)
        for ax, col in zip(axes, (1, 2, 3)):
            ax.plot([p[0] for p in points], [p[col] for p in points], color=s["color"],
                    ls=s["ls"], lw=1.2, label=variant)
