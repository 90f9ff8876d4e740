"""The figures of a report but width_transfer.png (width.py) and the length ones (length.py):
the step curves (a quantity against step, a panel per setting, a line per arm), the per-head
figure of one run, and an LR sweep's lr_transfer.png (each arm's clipped final loss against LR)
and lr_stability.png (logit growth as Wortsman et al. 2023 read it)."""

import itertools
import math
from dataclasses import dataclass
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from model.config import SATURATION_THRESHOLD, SCALES, GPTConfig, ScalingConfig
from scripts.report import stats as st
from scripts.report import style
from scripts.report.runs import (
    LR_KEY,
    SOLVED_ACCURACY,
    VARIANT_KEY,
    RunRecord,
    default_of,
    eval_series,
    group_runs,
    label,
    record_series,
)
from scripts.report.tables import DIAGNOSTICS

POSITIVE = (0.0, math.inf)
SHARE = (0.0, 1.0)
LOG_FIELDS = {"attn_max_logit", "attn_raw_max_logit", "attn_raw_var"}


@dataclass(frozen=True)
class Frame:
    """What a report's figures share: arms and looks, the step curves' seeds, levels, baseline."""

    arms: style.Arms
    looks: dict
    seeds: str = ""
    levels: Optional[dict] = None
    baseline: str = "sqrt_dk"
    which: str = "full"   # the final loss that judges a failed run (stats.LOSSES)


def decade(values: list) -> bool:
    """Whether positive values span a decade or more (a log axis then)."""
    ys = [v for v in values if v > 0]
    return bool(ys) and max(ys) >= 10 * min(ys)


def arm_label(frame: Frame, key: tuple, runs: list) -> str:
    lrs = {r.lr for r in runs}
    one = len(lrs) == 1 and math.isfinite(lr := min(lrs))
    return frame.arms.name(key) + (f", lr {lr:g}" if one else "")


def panel_grid(n: int, rows: int = 0, height: float = 2.6):
    """n panels, three a row (or `rows` rows of n columns)."""
    n_rows, n_cols = (rows, n) if rows else (math.ceil(n / 3), min(n, 3))
    return plt.subplots(n_rows, n_cols, squeeze=False, layout="constrained",
                        figsize=(max(3.6 * n_cols + 0.8, 8.0), height * n_rows + 1.6))


def draw_panel(ax, frame: Frame, members: dict, row: tuple) -> tuple[list, set]:
    """A mean line (and band) per arm, with its seeds' lines where style.seeds_drawn; each
    line's n, arms with a 0 left out."""
    series_of, bounds, log = row
    ns, zeros, drawn = [], set(), []
    for key, runs in members.items():
        series = [series_of(r) for r in runs]
        if log and any(v == 0 for _, ys in series for v in ys):
            zeros.add(frame.arms.name(key))
        if (agg := style.aggregate(series, log)) is not None:
            ordered = sorted(runs, key=lambda r: style.seed_order(r.seed))
            seeds = [(xs, [y if y > 0 or not log else math.nan for y in ys])
                     for xs, ys in map(series_of, ordered)
                     ] if style.seeds_drawn(runs, log, frame.which, frame.levels) else []
            drawn.append((key, agg, seeds))
            ns.append(len(runs))
    for i, (key, agg, seeds) in enumerate(drawn):
        style.draw_mean(ax, (agg, seeds), frame.looks[frame.arms.name(key)],
                        arm_label(frame, key, members[key]), bounds, (i, len(drawn)))
    ax.set_yscale("log" if log else "linear")
    ax.grid(alpha=0.3)
    return ns, zeros


def at(frame: Frame, groups: dict, setting: tuple) -> dict:
    return {k: g for k, g in groups.items() if frame.arms.setting(k) == setting}


def step_curves(frame: Frame, groups: dict, series_of, y: tuple, title: str):
    """y: (label, bounds of the quantity, reference levels, log y); a panel per setting."""
    ylabel, bounds, levels, log = y
    settings = frame.arms.settings(groups)
    fig, axes = panel_grid(len(settings))
    ns = []
    for ax, setting in zip(axes.flat, settings):
        ns += draw_panel(ax, frame, at(frame, groups, setting), (series_of, bounds, log))[0]
        style.reference_lines(ax, levels or {})
        if bounds == SHARE:   # a share: its whole range
            ax.set_ylim(-0.04, 1.04)
        ax.set(title=panel_title(setting), xlabel="step", ylabel=ylabel)
        ax.title.set_fontsize(9)
    geometric = "; log y: geometric mean" if log else ""
    return style.finish(fig, f"{title}{frame.seeds}\n{style.seeds_text(ns)}{geometric}"
                        f"{style.seeds_note(fig)}")


def panel_title(setting: tuple) -> str:
    """A setting's words, a key a run left unset by its default's value where the schema has one."""
    return label([(k, default_of(k) if v is None else v) for k, v in setting], "all runs",
                 short=True)


def chance(groups) -> Optional[float]:
    """The chance accuracy 1/N that every run of the groups shares, else None."""
    found = {r.chance_accuracy for g in groups.values() for r in g}
    return found.pop() if len(found) == 1 else None


def chance_loss(groups) -> dict[str, float]:
    """{"chance ln N =": ln N}, a guess's loss, where every run is a recall run of chance 1/N."""
    if not all(r.recall for g in groups.values() for r in g) or (c := chance(groups)) is None:
        return {}   # (no runs: no chance level either)
    return {f"chance ln {1 / c:g} =": math.log(1 / c)}


def plot_losses(frame: Frame, groups: dict):
    """Validation loss, all of training in view (log y where it spans a decade or more)."""
    values = [v for runs in groups.values() for r in runs
              for v in eval_series(r, "val_loss", None)[1] if math.isfinite(v) and v > 0]
    log = decade(values)
    levels = {**(frame.levels or {}), **chance_loss(groups)}
    return step_curves(frame, groups, lambda r: eval_series(r, "val_loss", None),
                       ("val loss (nats)", (0.0, max(values, default=math.inf)), levels, log),
                       "Validation loss on the fixed sampled batches (not the tables'"
                       " whole-split loss)")


def plot_accuracy(frame: Frame, groups: dict):
    groups = {k: g for k, g in ((k, [r for r in g if r.recall]) for k, g in groups.items()) if g}
    if not groups:
        return None
    lines = {"solved": SOLVED_ACCURACY, **({"chance": c} if (c := chance(groups)) else {})}
    return step_curves(frame, groups, lambda r: eval_series(r, "val_accuracy", None),
                       ("val accuracy (fraction)", SHARE, lines, False),
                       "Validation accuracy on the fixed sampled batches")


def plot_vs_baseline(frame: Frame, groups: dict):
    base = {(frame.arms.setting(k), r.seed): r for k, g in groups.items()
            if frame.arms.name(k) == frame.baseline for r in g}
    pairs = {id(r): base.get((frame.arms.setting(k), r.seed)) for k, g in groups.items()
             for r in g}
    others = {k: g for k, g in ((k, [r for r in g if pairs[id(r)]]) for k, g in groups.items()
                                if frame.arms.name(k) != frame.baseline) if g}
    top = max((v for g in groups.values() for r in g
               for v in eval_series(r, "val_loss", None)[1] if math.isfinite(v)), default=0.0)

    def difference(run):
        mine, theirs = (dict(zip(*eval_series(x, "val_loss", None))) for x in (run, pairs[id(run)]))
        steps = sorted(set(mine) & set(theirs))
        return steps, [mine[t] - theirs[t] for t in steps]

    return step_curves(frame, others, difference, (
        f"val loss − {frame.baseline}'s (nats)", (-top, top), {"no difference": 0.0}, False),
        f"Sampled val loss minus {frame.baseline}'s at the same seed and step (below 0: lower"
        f" than {frame.baseline})") if others else None


def stat_grid(frame: Frame, groups: dict, rows: list[tuple], title: str,
              x: tuple = ("step", False, None)):
    """A row per statistic (y label, series of a run, bounds, log y[, reference levels]), a
    column per setting. x: (label, log x, extra(ax, row, groups) drawn in each panel)."""
    settings = frame.arms.settings(groups)
    fig, axes = panel_grid(len(settings), rows=len(rows), height=2.1)
    ns, zeros, (xlabel, xlog, extra) = [], {}, x
    for (i, (ylabel, *row)), (j, setting) in itertools.product(enumerate(rows),
                                                               enumerate(settings)):
        ax, members = axes[i][j], at(frame, groups, setting)
        n, zero = draw_panel(ax, frame, members, tuple(row[:3]))
        ns += n
        for arm in zero:
            zeros.setdefault(arm, set()).add(ylabel.split("\n")[0])
        style.reference_lines(ax, row[3] if row[3:] else {})
        if extra:
            extra(ax, i, members)
        if xlog:   # the x values drawn as the ticks
            value_ticks(ax, sorted({x for line in ax.lines if not style.reference(line, ax)
                                    for x in line.get_xdata()}))
        ax.set_title(panel_title(setting) if i == 0 else "", fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)   # each panel its own y range
        ax.set(xlabel=xlabel if i == len(rows) - 1 else "")
    left = "; ".join(f"{arm}: 0 in {', '.join(sorted(r))}" for arm, r in zeros.items())
    return style.finish(fig, f"{title}{frame.seeds}\n{style.seeds_text(ns)}"
                        + ("; log rows: geometric mean" if any(r[3] for r in rows) else "")
                        + style.seeds_note(fig)
                        + (f"\nleft out of the log rows, values of 0 (a log axis cannot show"
                           f" them): {left}" if left else ""))


def plot_diagnostics(frame: Frame, groups: dict):
    bounds = {"attn_entropy": (0.0, entropy_ceiling(groups)), "attn_saturated": SHARE}
    rows = [(f"{heading}\n({how} over layers)",
             lambda r, n=name, h=how: eval_series(r, n, max if h == "max"
                                                  else lambda v: sum(v) / len(v)),
             bounds.get(name, POSITIVE), name in LOG_FIELDS)
            for name, heading, how in DIAGNOSTICS]
    return stat_grid(frame, groups, rows, "Attention on the fixed validation batch")


def entropy_ceiling(groups) -> float:
    """ln(block_size), the largest entropy over a query's keys."""
    blocks = [float(b) for g in groups.values() for r in g if (b := r.setting("model.block_size"))]
    return math.log(max(blocks)) if blocks else math.inf


NOT_A_NUMBER = ("learned", "qk_norm", "uniform")   # a scale per head, norms first, or zero


def fixed_scale(run) -> Optional[float]:
    """The run's score scale s where it is a fixed number, else None."""
    d_model, n_head = run.setting("model.d_model"), run.setting("model.n_head")
    d_head = run.setting("model.d_head") or (d_model and n_head and int(d_model) // int(n_head))
    normed = run.setting("scaling.qk_norm") not in (None, "none")   # a norm before the scale
    if d_head is None or run.variant not in SCALES or run.variant in NOT_A_NUMBER or normed:
        return None
    scaling = ScalingConfig(run.variant, divisor=float(run.setting("scaling.divisor") or 8.0),
                            attn_mult=float(run.setting("scaling.attn_mult") or 1.0))
    return SCALES[run.variant](int(d_head), scaling, int(d_model or GPTConfig.d_model))


def per_logit(run, name: str) -> tuple[list, list]:
    """A q or k gradient norm / s: dL/dW_q = s sum dL/dz k x^T for logits z = s q.k."""
    if (scale := fixed_scale(run)) is None:
        return [], []
    steps, values = record_series(run, name)
    return steps, [v / scale for v in values]


def plot_qk_grads(frame: Frame, groups: dict):
    rows = [(f"|grad W_{s}|\n(mean over layers)",
             lambda r, s=s: record_series(r, f"{s}_grad_norm"), POSITIVE, True) for s in "qk"]
    rows += [(f"|grad W_{s}| / s\n(per unit of logit)",
              lambda r, s=s: per_logit(r, f"{s}_grad_norm"), POSITIVE, True) for s in "qk"]
    free = sorted({frame.arms.name(k) for k, g in groups.items()
                   if any(fixed_scale(r) is None for r in g)})
    why = f"; / s rows: not {', '.join(free)} (s learned, or 0)" if free else ""
    return stat_grid(frame, groups, rows, "Gradient norm of the q and k projections; s = the"
                     f" score scale{why}")


# The rows of the per-head figure: attn_heads key, y label, log y.
HEAD_ROWS = (("entropy", "entropy (nats)", False),
             ("entropy_norm", "entropy / ln(keys)\n(1 uniform, 0 one-hot)", False),
             ("saturated", f"saturated rows\n(max weight > {SATURATION_THRESHOLD})", False),
             ("max_logit", "max |logit|", True), ("raw_max_logit", "max |q.k|, raw", True),
             ("raw_var", "Var(q.k) / d_head, raw", True), ("q_norm", "mean |q|", True),
             ("k_norm", "mean |k|", True), ("qk_clip_count", "QK-Clips so far", False),
             ("scale", "learned scale g_h", False))


def head_series(run, key: str, layer: int, head: int) -> tuple[list, list]:
    points = [(e["step"], e["attn_heads"][key][layer][head]) for e in run.evals
              if key in e.get("attn_heads", {})]
    return [s for s, _ in points], [v for _, v in points]


def plot_heads(run, name: str):
    """One run's statistics per head, a panel per layer; None without attn_heads."""
    last = next((e["attn_heads"] for e in reversed(run.evals) if "attn_heads" in e), None)
    if last is None:
        return None
    n_layer, n_head = len(last["entropy"]), len(last["entropy"][0])
    rows = [row for row in HEAD_ROWS if row[0] in last and any(
        math.isfinite(v) and (v > 0 if row[2] else v != 0) for layer in range(n_layer)
        for h in range(n_head) for v in head_series(run, row[0], layer, h)[1])]
    dropped = [r[1].split("\n")[0] for r in HEAD_ROWS if r[0] in last and r not in rows]
    block = run.setting("model.block_size")
    fig, axes = plt.subplots(len(rows), n_layer, squeeze=False,
                             figsize=(max(3.0 * n_layer + 1.0, 7.0), 2.0 * len(rows) + 1.6),
                             layout="constrained")
    for (i, row), layer in itertools.product(enumerate(rows), range(n_layer)):
        head_panel(axes[i][layer], run, row, (layer, n_head), int(block) if block else None)
        axes[i][layer].set_title(f"layer {layer}" if i == 0 else "", fontsize=10)
        axes[i][layer].set(ylabel=row[1] if layer == 0 else "",
                           xlabel="step" if i == len(rows) - 1 else "")
        axes[i][layer].yaxis.label.set_fontsize(9)
    left = f"\n0 or missing at every head, not drawn: {', '.join(dropped)}" if dropped else ""
    return style.finish(fig, f"Attention per head on the fixed validation batch, one run: {name}"
                        f" (n = 1, no intervals){left}")


def head_panel(ax, run, row: tuple, where: tuple[int, int], T: Optional[int]) -> None:
    """A layer's panel: a line per head, uniform attention's entropy, the floor 1/T."""
    (key, _, log), (layer, n_head) = row, where
    log = log and decade([v for h in range(n_head) for v in head_series(run, key, layer, h)[1]
                          if math.isfinite(v)])
    for head in range(n_head):
        steps, values = head_series(run, key, layer, head)
        values = [v if not log or v > 0 else math.nan for v in values]
        ax.plot(steps, values, color=f"C{head % 10}", lw=1.3, label=f"head {head}")
    style.reference_lines(ax, {"entropy": {"uniform attention": sum(map(math.log, range(
        1, T + 1))) / T}, "saturated": {"floor 1/T": 1 / T}}.get(key, {}) if T else {})
    ax.set_yscale("log" if log else "linear")
    if not log:
        ax.ticklabel_format(axis="y", useOffset=False)
        hold_flat(ax)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=9)


def hold_flat(ax, agree: float = 1e-4) -> None:
    """Lines that agree to `agree` (curves.jsonl's rounding) drawn as a flat line."""
    values = [v for line in ax.lines if line.get_transform() == ax.transData
              for v in line.get_ydata() if math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 0.0)
    centre = (lo + hi) / 2
    if 0 < hi - lo <= agree * abs(centre):
        ax.set_ylim(centre - 0.055 * abs(centre), centre + 0.055 * abs(centre))


def value_ticks(ax, values: list[float], most: int = 8) -> None:
    """The x values drawn (the LRs tried, say) as upright ticks of a log axis, every k-th
    labelled where more than `most` would crowd: every panel its own."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    every = math.ceil(len(values) / most)
    ax.set_xticks(values, [f"{v:g}" if i % every == 0 else "" for i, v in enumerate(values)],
                  fontsize=8, rotation=90)


def init_cap(runs) -> float:
    return max((r.loss_at_init for r in runs if r.loss_at_init is not None), default=math.inf)


def lr_curve(ax, frame: Frame, key: tuple, runs: list, reading: tuple) -> list[int]:
    """One arm's mean clipped loss against LR (geometric on a log axis: style.aggregate), its
    seeds' where style.seeds_drawn, a cross where a run failed; dodged sideways by its place
    among the panel's arms."""
    which, log, place = reading
    table = st.lr_table(runs, which)
    seeds = sorted({s for by_seed in table.values() for s in by_seed}, key=str)
    agg = style.aggregate([tuple(zip(*((lr, t[s]) for lr, t in table.items() if s in t)))
                           for s in seeds], log)
    if agg is None:
        return []
    lrs, mean, lo, hi = agg
    cap, look = init_cap(runs), frame.looks[frame.arms.name(key)]
    yerr = np.nan_to_num([mean - np.clip(lo, 0.0, cap), np.clip(hi, 0.0, cap) - mean])
    bars = ax.errorbar(lrs, mean, yerr=yerr if yerr.any() else None, capsize=2,
                       label=frame.arms.name(key), **style.line_style(look))
    at_lr = {lr: [r for r in runs if r.lr == lr] for lr in lrs}
    shown = [(lr, v) for lr in lrs if style.seeds_drawn(at_lr[lr], log, which, frame.levels)
             for _, v in sorted(table[lr].items(), key=lambda sv: style.seed_order(sv[0]))
             if v > 0 or not log]
    drawn = style.draw_seeds(ax, [tuple(zip(*shown))] if shown else [], look, True)
    bad = [i for i, lr in enumerate(lrs)
           if any(st.failure(r, which, frame.levels) is not None for r in at_lr[lr])]
    crosses = ax.plot(lrs[bad], mean[bad], style.FAILED, ms=9, color=look[0])
    style.dodge(ax, place, [bars.lines[0], *bars.lines[1], *bars.lines[2], *crosses, *drawn])
    return [len(table[lr]) for lr in lrs]


def control_apart(members: dict, which: str) -> list[dict]:
    """A panel's arms, the controls (style.CONTROLS) in a panel of their own where they would
    squeeze the others (style.within)."""
    values = {k: [v for by_seed in st.lr_table(g, which).values() for v in by_seed.values()]
              for k, g in members.items()}
    controls = [k for k in members if dict(k)[VARIANT_KEY] in style.CONTROLS and values[k]]
    others = [v for k, vs in values.items() if k not in controls for v in vs]
    far = style.within(others, {k: values[k] for k in controls},
                       decade([v for vs in values.values() for v in vs]))[1]
    if not others or not far:
        return [members]
    return [{k: g for k, g in members.items() if k not in far}, {k: members[k] for k in far}]


def plot_lr(frame: Frame, lr_runs: list[RunRecord], which: str, plan: st.Plan = st.Plan()):
    """lr_transfer.png; None where every arm ran one LR (no curve to read). plan: where each LR
    was chosen (the title says whether these seeds are held out)."""
    arms = group_runs(lr_runs, drop=(LR_KEY,))
    if all(len({r.lr for r in g}) < 2 for g in arms.values()):
        return None
    panels = [(setting, part, i > 0) for setting in frame.arms.settings(arms)
              for i, part in enumerate(control_apart(at(frame, arms, setting), which))]
    fig, axes = panel_grid(len(panels), height=3.2)
    ns = []
    for ax, (setting, members, apart) in zip(axes.flat, panels):
        ys = [v for g in members.values() for by_seed in st.lr_table(g, which).values()
              for v in by_seed.values() if v > 0]
        log = decade(ys)
        for i, (key, runs) in enumerate(members.items()):
            ns += lr_curve(ax, frame, key, runs, (which, log, (i, len(members))))
        near, far = style.within(ys, {**(frame.levels or {}), **chance_loss(members)}, log)
        style.reference_lines(ax, near)
        value_ticks(ax, sorted({r.lr for g in members.values() for r in g}))
        control = f": {', '.join(map(frame.arms.name, members))}, the control" if apart else ""
        ax.set(title=panel_title(setting) + control + style.edge_note(far, ys),
               xlabel=style.LR_LABEL, yscale="log" if log else "linear",
               ylabel=f"{st.loss_name(which, lr_runs)}\n(clipped at the loss at init)")
        ax.title.set_fontsize(9)
        ax.yaxis.label.set_fontsize(9)
        ax.grid(alpha=0.3)
    bars = " (bars cut at 0 and the loss at init)" if any(
        c.has_yerr for ax in fig.axes for c in ax.containers) else ""
    geometric = "; log y: geometric mean" if any(
        ax.get_yscale() == "log" for ax in fig.axes) else ""
    return style.finish(fig, f"Final loss against learning rate, every seed of the sweep"
                        f" ({lr_seeds(plan, lr_runs)}); {style.seeds_text(ns, 'point')}"
                        f"{geometric}{bars}{style.seeds_note(fig)};"
                        f" {style.FAILED}: a run failed")


def lr_seeds(plan: st.Plan, lr_runs: list[RunRecord]) -> str:
    """What lr_transfer.png's title says of its seeds: whether they chose the LR."""
    if plan.select_runs is not None:
        return "each arm's LR chosen on an earlier stage's runs, these seeds held out"
    if plan.leave_one_out:
        return "the seeds that choose each LR, not held out"
    return ("seeds " + ", ".join(sorted({str(r.seed) for r in lr_runs if plan.selects(r.seed)}))
            + " choose each LR; the others held out")


def lowest_seed(runs: list[RunRecord], lr: float) -> tuple[float, RunRecord]:
    return lr, min((r for r in runs if r.lr == lr), key=lambda r: style.seed_order(r.seed))


def edge_runs(runs: list[RunRecord], which: str, levels: Optional[dict]) -> list:
    """(LR, its lowest seed's run, dashes): solid at the highest LR at and below which no run
    failed (the grid's top where none did), dashed at the lowest LR where one failed."""
    failed = [r for r in runs if st.failure(r, which, levels) is not None]
    safe = st.survives_up_to(runs, which, levels)
    return ([(*lowest_seed(runs, safe), EDGES[0][0])] if safe is not None else []) + (
        [(*lowest_seed(failed, min(r.lr for r in failed)), EDGES[1][0])] if failed else [])


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
EDGES = (("-", "highest LR at and below which no run failed"),
         ("--", "lowest LR at which a run failed"))   # one meaning each


def plot_stability(frame: Frame, lr_runs: list[RunRecord], which: str):
    """lr_stability.png; None when no run has per-head statistics or no arm ran two LRs."""
    arms = group_runs(lr_runs, drop=(LR_KEY,))
    if not any("attn_heads" in e for r in lr_runs for e in r.evals) or all(
            len({r.lr for r in g}) < 2 for g in arms.values()):
        return None
    fig, axes = plt.subplots(2, len(arms), squeeze=False, layout="constrained",
                             figsize=(max(2.4 * len(arms), 7.0), 6.0))
    for j, (key, runs) in enumerate(arms.items()):
        picks = edge_runs(runs, which, frame.levels)
        look = frame.looks[frame.arms.name(key)]
        for i, (stat, reduce, ylabel, log) in enumerate(ROWS):
            ax = axes[i][j]
            for k, (lr, run, dashes) in enumerate(picks):
                steps, values = head_extreme(run, stat, reduce)
                values = [v if v > 0 or not log else math.nan for v in values]
                ax.plot(steps, values, label=f"{frame.arms.name(key)}, lr {lr:g}", **{
                    **style.line_style(look), "ls": dashes,
                    "markevery": (k, max(len(steps) // 5, len(picks)))})
            ax.set(yscale="log" if log else "linear", xlabel="step" if i else "")
            ax.set_ylim(*((None, None) if log else (0.0, 1.05)))
            ys = [y for line in ax.lines for y in line.get_ydata() if y > 0]
            if log and ys and max(ys) < 1e3 * min(ys):   # under 3 decades: 5s labelled too
                ax.yaxis.set_major_locator(LogLocator(subs=(1, 5)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylabel(ylabel if j == 0 or log else "", fontsize=9)   # log: its own range
            ax.grid(alpha=0.3)
        axes[0][j].set_title(f"{frame.arms.name(key)}\nlr " + " / ".join(
            f"{lr:g}" for lr, *_ in picks), fontsize=8)
    return finish_stability(fig, frame, list(arms))


def finish_stability(fig, frame: Frame, keys: list[tuple]):
    handles = [Line2D([], [], label=frame.arms.name(k), **{**style.line_style(   # dashes: LR
        frame.looks[frame.arms.name(k)]), "ls": "-"}) for k in keys]
    handles += [Line2D([], [], color="0.3", ls=d, label=text) for d, text in EDGES]
    return style.finish(fig, "Attention at high learning rates, each arm at its highest stable LR"
                        " and, where a run failed, its first failing LR (column titles): the"
                        " lowest seed at the LR, at the failing LR its lowest seed that failed;"
                        " one run per line, n = 1, no intervals", handles)
