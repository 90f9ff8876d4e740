"""The high-learning-rate figure of an LR sweep (lr_stability.png). Top: each arm's clipped
final loss against LR in one panel, a cross where a run failed. Below, per arm (a group of the
sweep without its LR: a scale, or a scale with a bound on its scores): the largest attention
logit over every layer and head, and the normalised attention entropy of the most one-hot head
(entropy / ln(keys): 1 uniform, 0 one-hot), against steps, at the highest LR the arm survives
(stats.survives_up_to) and at the first LR where one of its runs failed; for an arm where no
run failed, at its best LR and at the top of its grid. That is how Wortsman et
al. 2023 read attention-logit growth: the logits of the failing LR run away while those one LR
below stay bounded. Each line is one run (the lowest seed at that LR; at the failing LR, the
lowest seed that failed), drawn to its last evaluation."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt

from scripts.report import stats as st
from scripts.report.figures import blank, shows, suptitle
from scripts.report.lr_figure import init_cap, nonnegative_bars
from scripts.report.runs import LR_KEY, RunRecord, group_runs

MARKERS = "osD^vP*X"


def arm_labels(keys: list[tuple]) -> dict[tuple, str]:
    """A short name per arm: its scale, then each other key whose value is not the one most
    arms share (the bound it adds), e.g. "sqrt_dk, softcap=50"."""
    common = {k: Counter(dict(key).get(k) for key in keys).most_common(1)[0][0]
              for key in keys for k, _ in key[1:]}
    return {key: ", ".join([key[0][1]] + [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in key[1:]
                                          if v != common[k]])
            for key in keys}


def seed_order(run: RunRecord):
    return (len(str(run.seed)), str(run.seed))


def edge_runs(runs: list[RunRecord], which: str,
              levels: Optional[dict]) -> list[tuple[str, RunRecord]]:
    """(line label, run) at the arm's highest stable LR and at its first failing LR, each
    there if the arm has one; for an arm where no run failed, at its best LR (lowest mean
    clipped loss) and at the top of its grid, which it survived."""
    failed = [r for r in runs if st.failure(r, which, levels) is not None]
    if not failed:
        best = st.best_lr(st.lr_table(runs, which))
        top = max(r.lr for r in runs)
        lrs = [(f"lr {best['lr']:g}: best", best["lr"])] if best and best["lr"] != top else []
        return [(text, min((r for r in runs if r.lr == lr), key=seed_order))
                for text, lr in lrs + [(f"lr {top:g}: top of grid, no run failed", top)]]
    picks = []
    safe = st.survives_up_to(runs, which, levels)
    if safe is not None:
        run = min((r for r in runs if r.lr == safe), key=seed_order)
        picks.append((f"lr {safe:g}: highest stable", run))
    first = min(r.lr for r in failed)
    run = min((r for r in failed if r.lr == first), key=seed_order)
    return picks + [(f"lr {first:g}: first failing", run)]


def head_extreme(run: RunRecord, key: str, reduce) -> tuple[list, list]:
    """(steps, reduce over every layer and head of attn_heads[key]) over the run's evaluations;
    non-finite values (a diverging run's last records) are left out."""
    steps, values = [], []
    for e in run.evals:
        per_layer = e.get("attn_heads", {}).get(key)
        finite = [v for layer in per_layer or [] for v in layer
                  if v is not None and math.isfinite(v)]
        if finite:
            steps.append(e["step"])
            values.append(reduce(finite))
    return steps, values


ROWS = (("max_logit", max, "max attention logit\n(every layer and head)", True),
        ("entropy_norm", min, "entropy / ln(keys),\nmost one-hot head", False))


def plot_stability(lr_runs: list[RunRecord], which: str, path: Path,
                   levels: Optional[dict] = None) -> bool:
    """Draws the figure; False (nothing written) when no run has per-head statistics, or when
    no arm ran more than one LR (a stage that reports each scale at its chosen LR: there is no
    grid to read the stability on)."""
    if not any("attn_heads" in e for r in lr_runs for e in r.evals):
        return False
    arms = group_runs(lr_runs, drop=(LR_KEY,))
    if all(len({r.lr for r in runs}) < 2 for runs in arms.values()):
        return False
    names = arm_labels(list(arms))
    cols = len(arms)
    fig = plt.figure(figsize=(max(2.6 * cols, 7.0), 8.4), layout="constrained")
    grid = fig.add_gridspec(3, cols)
    top = fig.add_subplot(grid[0, :])
    tables = {key: st.lr_table(runs, which) for key, runs in arms.items()}
    for i, (key, runs) in enumerate(arms.items()):
        loss_curve(top, tables[key], runs, (names[key], i), (which, levels))
    top.set(xscale="log", xlabel="learning rate")
    top.set_ylabel(f"{st.loss_name(which, lr_runs)}\n(clipped at loss at init)", fontsize=9)
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=8, ncol=min(cols, 4), frameon=False)
    for j, (key, runs) in enumerate(arms.items()):
        picks = edge_runs(runs, which, levels)
        for i, (stat, reduce, ylabel, log) in enumerate(ROWS):
            ax = fig.add_subplot(grid[i + 1, j])
            for (text, run), style in zip(picks, (("C0", "-"), ("C3", "--"))):
                ax.plot(*head_extreme(run, stat, reduce), color=style[0], ls=style[1],
                        marker=".", lw=1.4, label=text)
            values = [v for line in ax.lines for v in line.get_ydata()]
            if not values:
                blank(ax, f"{names[key]}:\nno per-head {stat}")
                continue
            if log and not shows(values, log):   # uniform: its scores ignore q and k
                blank(ax, f"{names[key]}: {stat} 0 at every\nhead, off the log axis")
                continue
            if log:
                ax.set_yscale("log")
            else:
                ax.set_ylim(0.0, 1.05)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(names[key], fontsize=9)
            else:   # below the column, where it covers no panel or tick label
                ax.set_xlabel("step", fontsize=9)
                ax.legend(fontsize=7, frameon=False, loc="upper center",
                          bbox_to_anchor=(0.5, -0.3))
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=9)
    ns = sorted({len(s) for table in tables.values() for s in table.values()})
    loss = " ".join(st.loss_name(which, lr_runs).split())
    suptitle(fig, f"High learning rates: top, {loss} against LR per arm (mean of"
                  f" n={ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} seeds, 95% t bars cut"
                  " at 0 and at the loss at init; x: a run failed); below, one run per line at"
                  " each arm's highest stable LR and its first failing LR (where no run failed:"
                  " its best LR and the grid's top)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def loss_curve(ax, table: dict, runs: list[RunRecord], arm: tuple[str, int],
               reading: tuple[str, Optional[dict]]) -> None:
    """One arm's clipped loss against LR with its 95% bars; a cross at each LR where a run
    failed. arm: (name, index for its colour and marker); reading: (which loss, levels)."""
    (name, i), (which, levels) = arm, reading
    lrs = [lr for lr in table if st.mean_interval(list(table[lr].values()))]
    ivs = [st.mean_interval(list(table[lr].values())) for lr in lrs]
    color = f"C{i % 10}"
    ax.errorbar(lrs, [iv.mean for iv in ivs], yerr=nonnegative_bars(ivs, init_cap(runs)),
                color=color, marker=MARKERS[i % len(MARKERS)], ms=4, lw=1.3, capsize=2,
                label=name)
    bad = [k for k, lr in enumerate(lrs)
           if any(st.failure(r, which, levels) is not None for r in runs if r.lr == lr)]
    ax.plot([lrs[k] for k in bad], [ivs[k].mean for k in bad], "x", ms=9, color=color)
