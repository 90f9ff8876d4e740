"""The step-curve figures (a quantity against step, a panel per setting, a line per arm) and
the per-head figure of one run, each kept to scripts/report/style.py's contract."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import matplotlib.pyplot as plt

from model.config import SATURATION_THRESHOLD, SCALES, ScalingConfig
from scripts.report import style
from scripts.report.runs import SOLVED_ACCURACY, eval_series, label, record_series
from scripts.report.tables import DIAGNOSTICS

POSITIVE = (0.0, math.inf)
SHARE = (0.0, 1.0)
LOG_FIELDS = {"attn_max_logit", "attn_raw_max_logit", "attn_raw_var"}


@dataclass(frozen=True)
class Frame:
    """What every figure of a report shares: its arms and their looks, what the step curves'
    run set is (`seeds`), the reference levels, the baseline."""

    arms: style.Arms
    looks: dict
    seeds: str = ""
    levels: Optional[dict] = None
    baseline: str = "sqrt_dk"


def arm_label(frame: Frame, key: tuple, runs: list) -> str:
    """An arm's legend entry: its name and, where its runs share one LR, that LR."""
    lrs = {r.lr for r in runs}
    one = len(lrs) == 1 and math.isfinite(next(iter(lrs)))
    return frame.arms.name(key) + (f", lr {next(iter(lrs)):g}" if one else "")


def panel_grid(frame: Frame, groups: dict, rows: int = 0, height: float = 2.6):
    """A panel per setting, three a row (or `rows` rows, a column per setting); the settings."""
    settings = frame.arms.settings(groups)
    n_rows, n_cols = (rows, len(settings)) if rows else (math.ceil(len(settings) / 3),
                                                         min(len(settings), 3))
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, sharex=True, layout="constrained",
                             figsize=(max(3.6 * n_cols + 0.8, 8.0), height * n_rows + 1.6))
    return fig, axes, settings


def draw_panel(ax, frame: Frame, members: dict, row: tuple) -> tuple[list, set]:
    """One panel: a mean line (and band) per arm of `members` (the groups at its setting).
    row: (series of a run, bounds, log y). Returns each line's n and the arms with a 0 that
    a log axis leaves out."""
    series_of, bounds, log = row
    ns, zeros = [], set()
    for key, runs in members.items():
        series = [series_of(r) for r in runs]
        if log and any(v == 0 for _, ys in series for v in ys):
            zeros.add(frame.arms.name(key))
        agg = style.aggregate(series, log)
        if agg is not None:
            style.draw_mean(ax, agg, frame.looks[frame.arms.name(key)],
                            arm_label(frame, key, runs), bounds)
            ns.append(len(runs))
    ax.set_yscale("log" if log else "linear")
    ax.grid(alpha=0.3)
    return ns, zeros


def at(frame: Frame, groups: dict, setting: tuple) -> dict:
    return {k: g for k, g in groups.items() if frame.arms.setting(k) == setting}


def step_curves(frame: Frame, groups: dict, series_of, y: tuple, title: str):
    """y: (label, bounds of the quantity, reference levels, log y); a panel per setting."""
    ylabel, bounds, levels, log = y
    fig, axes, settings = panel_grid(frame, groups)
    ns = []
    for ax, setting in zip(axes.flat, settings):
        ns += draw_panel(ax, frame, at(frame, groups, setting), (series_of, bounds, log))[0]
        style.reference_lines(ax, levels or {})
        if bounds == SHARE:   # a share: its whole range
            ax.set_ylim(-0.04, 1.04)
        ax.set(title=panel_title(setting), xlabel="step", ylabel=ylabel)
        ax.title.set_fontsize(9)
    geometric = "; log y: geometric mean" if log else ""
    return style.finish(fig, f"{title}{frame.seeds}\n{style.seeds_text(ns)}{geometric}")


def panel_title(setting: tuple) -> str:
    return label(setting, "all runs", short=True)


def chance_loss(groups) -> dict[str, float]:
    """{"chance ln N =": ln N}, a uniform guess's loss, where every run is a recall run of
    chance accuracy 1/N; {} otherwise."""
    runs = [r for g in groups.values() for r in g]
    chance = {r.chance_accuracy for r in runs}
    if not runs or not all(r.recall for r in runs) or len(chance) != 1 or None in chance:
        return {}
    n = 1.0 / chance.pop()
    return {f"chance ln {n:g} =": math.log(n)}


def plot_losses(frame: Frame, groups: dict):
    """Validation loss, all of training in view (log y where it spans a decade or more)."""
    values = [v for runs in groups.values() for r in runs
              for v in eval_series(r, "val_loss", None)[1] if math.isfinite(v) and v > 0]
    log = bool(values) and max(values) >= 10 * min(values)
    levels = {**(frame.levels or {}), **chance_loss(groups)}
    return step_curves(frame, groups, lambda r: eval_series(r, "val_loss", None),
                       ("val loss (nats)", (0.0, max(values, default=math.inf)), levels, log),
                       "Validation loss on the fixed sampled batches (not the tables'"
                       " whole-split loss)")


def plot_accuracy(frame: Frame, groups: dict):
    groups = {k: [r for r in g if r.recall] for k, g in groups.items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    lines = {"solved": SOLVED_ACCURACY}
    chance = {r.chance_accuracy for g in groups.values() for r in g}
    if len(chance) == 1 and None not in chance:
        lines["chance"] = chance.pop()
    return step_curves(frame, groups, lambda r: eval_series(r, "val_accuracy", None),
                       ("val accuracy", SHARE, lines, False),
                       "Validation accuracy on the fixed sampled batches")


def plot_vs_baseline(frame: Frame, groups: dict):
    """Each arm's sampled val loss minus the baseline arm's at the same setting, seed, step."""
    base = {(frame.arms.setting(k), r.seed): r for k, g in groups.items()
            if frame.arms.name(k) == frame.baseline for r in g}
    pairs = {id(r): base.get((frame.arms.setting(k), r.seed)) for k, g in groups.items()
             for r in g}
    others = {k: [r for r in g if pairs[id(r)]] for k, g in groups.items()
              if frame.arms.name(k) != frame.baseline}
    others = {k: g for k, g in others.items() if g}
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


def stat_grid(frame: Frame, groups: dict, rows: list[tuple], title: str):
    """A row per statistic (y label, series of a run, bounds, log y), a column per setting;
    a log row leaves out values of 0, and the title says whose."""
    fig, axes, settings = panel_grid(frame, groups, rows=len(rows), height=2.1)
    ns, zeros = [], {}
    for i, (ylabel, *row) in enumerate(rows):
        for j, setting in enumerate(settings):
            n, zero = draw_panel(axes[i][j], frame, at(frame, groups, setting), tuple(row))
            ns += n
            for arm in zero:
                zeros.setdefault(arm, set()).add(ylabel.split("\n")[0])
            axes[i][j].set_title(panel_title(setting) if i == 0 else "", fontsize=9)
            axes[i][j].set_ylabel(ylabel if j == 0 else "", fontsize=8)
            axes[i][j].set_xlabel("step" if i == len(rows) - 1 else "")
    left = "; ".join(f"{arm}: 0 in {', '.join(sorted(r))}" for arm, r in zeros.items())
    return style.finish(fig, f"{title}{frame.seeds}\n{style.seeds_text(ns)}; log rows:"
                        " geometric mean" + (f"\nleft out of the log rows, values of 0 (a log"
                                             f" axis cannot show them): {left}" if left else ""))


def plot_diagnostics(frame: Frame, groups: dict):
    bounds = {"attn_entropy": (0.0, entropy_ceiling(groups)), "attn_saturated": SHARE}
    rows = [(f"{heading}\n({how} over layers)",
             lambda r, n=name, h=how: eval_series(r, n, max if h == "max" else mean),
             bounds.get(name, POSITIVE), name in LOG_FIELDS)
            for name, heading, how in DIAGNOSTICS]
    return stat_grid(frame, groups, rows, "Attention on the fixed validation batch")


def mean(values: list) -> float:
    return sum(values) / len(values)


def entropy_ceiling(groups) -> float:
    """ln(block_size), the most an entropy over the keys of a query can be."""
    blocks = [float(b) for g in groups.values() for r in g
              if (b := r.setting("model.block_size"))]
    return math.log(max(blocks)) if blocks else math.inf


NOT_A_NUMBER = ("learned", "qk_norm", "uniform")   # a scale per head, norms first, or zero


def fixed_scale(run) -> Optional[float]:
    """The run's score scale s where it is fixed (not learned, qk_norm, uniform), else None."""
    d_head = run.setting("model.d_head")
    if d_head is None:
        d_model, n_head = run.setting("model.d_model"), run.setting("model.n_head")
        if d_model is None or n_head is None:
            return None
        d_head = int(d_model) // int(n_head)
    if run.variant not in SCALES or run.variant in NOT_A_NUMBER:
        return None
    scaling = ScalingConfig(run.variant, divisor=float(run.setting("scaling.divisor") or 8.0),
                            attn_mult=float(run.setting("scaling.attn_mult") or 1.0))
    return SCALES[run.variant](int(d_head), scaling)


def per_logit(run, name: str) -> tuple[list, list]:
    """A q or k gradient norm / the fixed scale s: dL/dW_q = s sum dL/dz k x^T for logits
    z = s q.k, so the quotient is the gradient per unit of logit."""
    scale = fixed_scale(run)
    if scale is None:
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


def shows(values: list, log: bool) -> bool:
    """Whether a value is finite and not 0 (above 0 on a log axis)."""
    return any(math.isfinite(v) and (v > 0 if log else v != 0) for v in values)


def plot_heads(run, name: str):
    """One run's statistics per head: a row per statistic (none for one 0 or missing at every
    head: the title names it), a panel per layer, a line per head; None without attn_heads."""
    last = next((e["attn_heads"] for e in reversed(run.evals) if "attn_heads" in e), None)
    if last is None:
        return None
    n_layer, n_head = len(last["entropy"]), len(last["entropy"][0])
    rows = [row for row in HEAD_ROWS if row[0] in last and shows(
        [v for l in range(n_layer) for h in range(n_head)
         for v in head_series(run, row[0], l, h)[1]], row[2])]
    dropped = [r[1].split("\n")[0] for r in HEAD_ROWS if r[0] in last and r not in rows]
    block = run.setting("model.block_size")
    fig, axes = plt.subplots(len(rows), n_layer, squeeze=False, sharex=True,
                             figsize=(max(3.0 * n_layer + 1.0, 7.0), 2.0 * len(rows) + 1.6),
                             layout="constrained")
    for i, row in enumerate(rows):
        for layer in range(n_layer):
            head_panel(axes[i][layer], run, row, (layer, n_head), int(block) if block else None)
            axes[i][layer].set_title(f"layer {layer}" if i == 0 else "", fontsize=10)
            axes[i][layer].set_ylabel(row[1] if layer == 0 else "", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    left = f"\n0 or missing at every head, not drawn: {', '.join(dropped)}" if dropped else ""
    return style.finish(fig, f"Attention per head on the fixed validation batch, one run: {name}"
                        f" (n = 1, no intervals){left}")


def head_panel(ax, run, row: tuple, where: tuple[int, int], T: Optional[int]) -> None:
    """A layer's panel: a line per head, uniform attention's entropy and the floor 1/T."""
    (key, _, log), (layer, n_head) = row, where
    values = [v for h in range(n_head) for v in head_series(run, key, layer, h)[1]
              if math.isfinite(v) and v > 0]
    log = log and bool(values) and max(values) >= 10 * min(values)   # a decade, else linear
    for head in range(n_head):
        steps, values = head_series(run, key, layer, head)
        values = [v if not log or v > 0 else math.nan for v in values]
        ax.plot(steps, values, color=f"C{head % 10}", lw=1.3, label=f"head {head}")
    if key == "entropy" and T:
        style.reference_lines(ax, {"uniform attention": sum(map(math.log, range(1, T + 1))) / T})
    if key == "saturated" and T:
        style.reference_lines(ax, {"floor 1/T": 1 / T})
    ax.set_yscale("log" if log else "linear")
    if not log:
        ax.ticklabel_format(axis="y", useOffset=False)
        hold_flat(ax)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=9)


def hold_flat(ax, agree: float = 1e-4) -> None:
    """A panel whose lines agree to `agree` but not exactly (a constant read from curves.jsonl's
    rounded digits) gets an exactly constant line's range, so the rounding shows no steps."""
    values = [v for line in ax.lines if line.get_transform() == ax.transData
              for v in line.get_ydata() if math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 0.0)
    centre = (lo + hi) / 2
    if 0 < hi - lo <= agree * abs(centre):
        ax.set_ylim(centre - 0.055 * abs(centre), centre + 0.055 * abs(centre))
