"""Runs that vary scaling.normaliser (docs/report.md, "Normaliser runs"), read as the preset
registers them (configs/experiment/normaliser.yaml): do sinks form (the first token's weight at
the end against the same runs at step 0), do softmax1, sink and sigmoid lower it (each minus
softmax at the same scale), and does the scale's effect on the loss (none − the baseline) change
under a normaliser (the interaction); then the sink's own weight and the residual stream's size,
descriptive. Every test pairs runs by seed, one Holm family a table; normaliser.png draws each
arm's first-token weight and final loss at the end."""

import math
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np

from model.config import NORMALISERS
from scripts.report import stats as st
from scripts.report import style
from scripts.report.figures import SHARE, arm_label, at, chance_loss, decade, init_cap, panel_title
from scripts.report.runs import NORMALISER_KEY, VARIANT_KEY, group_runs, label, varying_keys
from scripts.report.runs_csv import MASS
from scripts.report.tables import RATIO_LIMIT, cell, family_line, layer_value, ratio_text

SOFTMAX = style.OFF[NORMALISER_KEY]   # the normaliser the others are paired with
NONE = "none"   # the scale whose difference from the baseline question 3 reads
FIRST, RATE, SINK = "attn_first_mass", "attn_sink_rate", "attn_sink_weight"
WITH_SINK = ("softmax1", "sink")   # the normalisers with weight outside the keys
ACTIVATIONS = (("hidden_top1", "top-1 |h| (max over layers)"),
               ("hidden_median", "median |h| (mean over layers)"),
               ("hidden_kurtosis", "excess kurtosis (max over layers)"))


def normaliser_of(key: tuple) -> str:
    """A group's normaliser; a run written before scaling.normaliser existed used softmax."""
    return dict(key).get(NORMALISER_KEY) or SOFTMAX


def stat(run, name: str, pick: int = -1) -> Optional[float]:
    """A statistic of the run's last (pick=0: first) evaluation, combined over layers as
    runs.csv combines it; None where it was not recorded."""
    return layer_value(run.evals[pick], name, dict(MASS)[name])


def by_seed(groups: dict, name: str, pick: int = -1) -> dict:
    return {key: st.by_seed(runs, lambda r: stat(r, name, pick)) for key, runs in groups.items()}


def mean(values: dict) -> str:
    return cell(st.mean_interval(list(values.values())))


def reported(runs: list, lr_runs: list, reading) -> dict:
    """Group (its LR left out) -> the runs it is reported on, failed runs left out: in an LR
    sweep the runs at the LR chosen on other seeds (stats.held_out, as the LR tables read them),
    else every run of the group."""
    groups = ({key: h["runs"] for key, h in st.held_out(
        lr_runs, reading.which, reading.plan or st.Plan()).items()} if lr_runs
        else group_runs(runs))
    return {key: ok for key, g in groups.items()
            if (ok := [r for r in g if st.failure(r, reading.which, reading.levels) is None])}


def normaliser_sections(runs: list, lr_runs: list, reading) -> str:
    """results.md's "Normalisers" section ("" unless the runs vary scaling.normaliser)."""
    if NORMALISER_KEY not in varying_keys(runs):
        return ""
    groups = reported(runs, lr_runs, reading)
    if not any(by_seed(groups, FIRST).values()):   # no run has the statistic
        return ("\n## Normalisers\n\nNo run recorded where attention's mass goes"
                " (trainer.diagnostics=true): no normaliser tables.\n")
    lines = ["", "## Normalisers", "", "Each group on the runs it is reported on (in an LR"
             " sweep, each seed at the LR chosen on other seeds), failed runs left out; each"
             " number a mean over seeds ± the half-width of its 95% t interval; every test"
             " paired by seed, one Holm family per table. Statistics of the fixed validation"
             " batch at the first evaluation (step 0) and the last, combined over layers as"
             " runs.csv's columns are (docs/training.md, \"Evaluation\")."]
    blocks = {r.setting("model.block_size") for r in runs}
    lines += sinks_form(groups, reading.baseline, blocks.pop() if len(blocks) == 1 else None)
    lines += lowered(groups) + interaction(groups, reading)
    return "\n".join(lines + sink_weight(groups) + activations(groups)) + "\n"


def sinks_form(groups: dict, baseline: str, block: Optional[str]) -> list[str]:
    """Question 1: the first token's weight at the end minus at step 0, the registered arm
    (softmax at the baseline scale) a family of its own, every other arm another."""
    registered = {k: g for k, g in groups.items()
                  if dict(k)[VARIANT_KEY] == baseline and normaliser_of(k) == SOFTMAX}
    others = {k: g for k, g in groups.items() if k not in registered}
    uniform = (f" (uniform weights over T = {block} keys: H_T / T ="
               f" {sum(1 / i for i in range(1, int(block) + 1)) / int(block):.4f})"
               if block else "")
    return ["", "### Do sinks form?", "", f"The first token's weight (`{FIRST}`) at the end"
            f" minus at step 0{uniform}, paired by seed: `resolved above step 0` (sinks form)"
            " where the Holm p is below 0.05, else `not resolved` with the interval's upper end"
            " as the bound on the rise. The sink rate (`attn_sink_rate`, Gu et al. 2024: the"
            " share of heads and sequences whose first-token weight over the first 64 rows"
            f" exceeds 0.3) beside it. The registered arm, softmax at `{baseline}`:", ""] + (
        change_table(registered) + ["", "Every other arm, a family of its own:", ""]
        + change_table(others))


def change_table(groups: dict) -> list[str]:
    start, end = by_seed(groups, FIRST, 0), by_seed(groups, FIRST)
    rates = [by_seed(groups, RATE, pick) for pick in (0, -1)]
    tests = st.family([(end[k], start[k]) for k in groups])
    lines = ["| group | pairs | first-token weight, step 0 | at the end | end − step 0 | p"
             " (paired t) | Holm p | sink rate, step 0 | at the end | reading |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for key, c in zip(groups, tests):
        bound = (f"interval up to {c.diff.hi:+.4f}; "
                 if c.diff is not None and c.diff.half is not None else "")
        reading = st.verdict(c, "resolved below step 0", "resolved above step 0", bound)
        lines.append(f"| {label(key)} | {c.diff.n if c.diff else 0} | {mean(start[key])}"
                     f" | {mean(end[key])} | {cell(c.diff)} | {st.p_text(c.p)}"
                     f" | {st.p_text(c.p_holm)} | {mean(rates[0][key])} | {mean(rates[1][key])}"
                     f" | {reading} |")
    rows = [(None, None, c) for c in tests]
    return lines + ["", family_line(rows, "")] if groups else ["No such runs."]


def softmax_twin(key: tuple, groups: dict) -> Optional[tuple]:
    """The group of the same scale and other keys under softmax."""
    rest = [(k, v) for k, v in key if k != NORMALISER_KEY]
    return next((k for k in groups if normaliser_of(k) == SOFTMAX
                 and [(n, v) for n, v in k if n != NORMALISER_KEY] == rest), None)


def lowered(groups: dict) -> list[str]:
    """Question 2: each other normaliser minus softmax at the same scale on the first token's
    weight, one family; the sink rate's difference beside it, not tested."""
    rows = [(k, twin) for k in groups if normaliser_of(k) != SOFTMAX
            and (twin := softmax_twin(k, groups)) is not None]
    end, rate, start = by_seed(groups, FIRST), by_seed(groups, RATE), by_seed(groups, FIRST, 0)
    moved = {k: {s: v - start[k][s] for s, v in end[k].items() if s in start[k]} for k in groups}
    tests = st.family([(end[k], end[twin]) for k, twin in rows])
    lines = ["", "### Do softmax1, sink and sigmoid lower it?", "", "Each normaliser's"
             " first-token weight at the end minus softmax's at the same scale and seed; beside"
             " it the same gap less the gap at step 0 (softmax1's and sink's extra slot takes"
             " weight from every key before any training), and the sink rate's, not tested:", "",
             "| group | pairs | first-token weight | softmax's | group − softmax | p (paired t)"
             " | Holm p | reading | gap less its step-0 gap | sink rate − softmax's |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for (key, twin), c in zip(rows, tests):
        lines.append(f"| {label(key)} | {c.diff.n if c.diff else 0} | {mean(end[key])}"
                     f" | {mean(end[twin])} | {cell(c.diff)} | {st.p_text(c.p)}"
                     f" | {st.p_text(c.p_holm)}"
                     f" | {st.verdict(c, 'lower than softmax', 'higher than softmax')}"
                     f" | {cell(st.paired_difference(moved[key], moved[twin]))}"
                     f" | {cell(st.paired_difference(rate[key], rate[twin]))} |")
    return lines + ["", family_line([(None, None, c) for c in tests], "")] if rows else (
        lines[:4] + ["No normaliser but softmax has a softmax group at its scale."])


def scale_effect(groups: dict, reading, log: bool) -> dict:
    """(other keys, normaliser) -> {seed: loss of none − loss of the baseline scale} (log:
    ln(none / baseline)), over the groups that have both scales."""
    loss = {k: st.by_seed(g, lambda r: st.final_loss(r, reading.which)) for k, g in groups.items()}
    out = {}
    for key in groups:
        if dict(key)[VARIANT_KEY] != NONE:
            continue
        base = ((VARIANT_KEY, reading.baseline), *key[1:])
        if base in loss:
            a, b = loss[key], loss[base]
            out[key[1:]] = {s: (math.log(a[s] / b[s]) if log else a[s] - b[s])
                            for s in st.common_seeds(a, b) if not log or a[s] > 0 < b[s]}
    return out


def interaction(groups: dict, reading) -> list[str]:
    """Question 3: none − the baseline scale per normaliser, and its difference from softmax's
    (the interaction), one family; the same on log loss, a family of its own."""
    name, base = st.LOSSES[reading.which][1], reading.baseline
    diff, ratio = (scale_effect(groups, reading, log) for log in (False, True))
    rows = [(k, twin) for k in diff if normaliser_of(k) != SOFTMAX
            and (twin := softmax_twin(k, diff)) is not None]
    tests, logs = (st.family([(d[k], d[twin]) for k, twin in rows]) for d in (diff, ratio))
    lines = ["", "### Does the scale's effect change with the normaliser?", "",
             f"Per normaliser, the {name} of `{NONE}` minus that of `{base}` (and their ratio),"
             " paired by seed, and that difference minus softmax's (the interaction), paired by"
             f" seed. A row where either normaliser's ratio {NONE} / {base} is above"
             f" {RATIO_LIMIT:g} or below 1/{RATIO_LIMIT:g} reads the log loss's test"
             " (ratio of ratios, with its 95% interval); the others read the difference. The"
             " family-wise interval, of the test the row reads, holds for the whole family at"
             " once (Bonferroni): a change past it is excluded for every normaliser together.",
             "",
             f"| normaliser | pairs | {NONE} − {base} | ratio {NONE} / {base} | ({NONE} − {base})"
             " − softmax's | family-wise 95% interval | p (paired t) | Holm p | ratio of ratios"
             " | p (paired t, log) | Holm p, log | reading |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [effect_row(key, diff, ratio, None, None) for key in diff
              if normaliser_of(key) == SOFTMAX]
    lines += [effect_row(key, diff, ratio, twin, (c, lc, len(rows)))
              for (key, twin), c, lc in zip(rows, tests, logs)]
    return lines + ["", family_line([(None, None, c) for c in tests], ""),
                    family_line([(None, None, c) for c in logs], " of log loss")] if diff \
        else lines[:4] + [f"No normaliser has both `{NONE}` and `{base}` runs."]


def effect_row(key: tuple, diff: dict, ratio: dict, twin: Optional[tuple], tests) -> str:
    """A row of question 3; twin and tests (difference, log, the family's size) None: softmax's,
    the reference."""
    geo = st.mean_interval(list(ratio[key].values()))
    text = (f"| {label(key, SOFTMAX)} | {len(diff[key])} | {mean(diff[key])}"
            f" | {'n/a' if geo is None else f'{math.exp(geo.mean):.4g}'}")
    if tests is None:
        return text + " | reference | | | | | | | |"
    c, lc, m = tests
    far = any(abs(ratio_mean(ratio, k)) > math.log(RATIO_LIMIT) for k in (key, twin))
    words = ("lower than softmax's", "higher than softmax's")
    reading = (st.verdict(lc, *words) + f" (log loss test: more than {RATIO_LIMIT:g}x apart)"
               if far else st.verdict(c, *words))
    read = lc if far else c   # the test the row reads, and so its family-wise interval
    wide = st.simultaneous(read.diff, m) if read.diff is not None else None
    span = ("n/a" if wide is None or wide.half is None else
            f"ratio {math.exp(wide.lo):.4g} to {math.exp(wide.hi):.4g}" if far else
            f"{wide.lo:+.4f} to {wide.hi:+.4f}")
    return (text + f" | {cell(c.diff)} | {span} | {st.p_text(c.p)} | {st.p_text(c.p_holm)}"
            f" | {ratio_text(lc)} | {st.p_text(lc.p)} | {st.p_text(lc.p_holm)} | {reading} |")


def ratio_mean(ratio: dict, key: tuple) -> float:
    values = list(ratio[key].values())
    return sum(values) / len(values) if values else 0.0


def sink_weight(groups: dict) -> list[str]:
    """The weight outside the keys (softmax1's +1, sink's learned logit), descriptive."""
    mine = {k: g for k, g in groups.items() if normaliser_of(k) in WITH_SINK}
    start, end = by_seed(mine, SINK, 0), by_seed(mine, SINK)
    return ["", "### The sink's own weight", "", f"`{SINK}`, the mean weight outside the keys"
            " (1 − Σ w: softmax1's extra 0 logit, sink's learned logit), mean over layers;"
            " descriptive, not tested.", "", "| group | runs | step 0 | at the end |",
            "|---|---:|---:|---:|", *(f"| {label(k)} | {len(g)} | {mean(start[k])}"
                                       f" | {mean(end[k])} |" for k, g in mine.items())]


def activations(groups: dict) -> list[str]:
    """The residual stream's size at the end (Sun et al. 2024), descriptive."""
    values = [by_seed(groups, name) for name, _ in ACTIVATIONS]
    return ["", "### The residual stream", "", "The size of the residual stream h after each"
            " block at the last evaluation (Sun et al. 2024: top-1 and median of |h| per"
            " sequence, averaged) and the excess kurtosis of its entries (0 for a Gaussian);"
            " descriptive, not tested.", "",
            "| group | runs | " + " | ".join(text for _, text in ACTIVATIONS) + " |",
            "|---|---:|" + "---:|" * len(ACTIVATIONS), *(
                f"| {label(k)} | {len(g)} | " + " | ".join(
                    cell(st.mean_interval(list(v[k].values())), None) if v[k]
                    else "not recorded" for v in values) + " |" for k, g in groups.items())]


# ------------------------------------------------------------------ normaliser.png

SPACING = 0.2   # between the arms of one normaliser on the x axis


def positions(members: dict) -> tuple[dict, list[str]]:
    """Each arm's x: its normaliser's place in NORMALISERS' order, arms of one normaliser side
    by side; the normalisers drawn."""
    order = [n for n in NORMALISERS if any(normaliser_of(k) == n for k in members)]
    x = {}
    for i, n in enumerate(order):
        keys = [k for k in members if normaliser_of(k) == n]
        x.update({k: i + (j - (len(keys) - 1) / 2) * SPACING for j, k in enumerate(keys)})
    return x, order


def arm_points(ax, frame, members: dict, y: tuple, place: tuple) -> list[int]:
    """A point per arm at its place (positions), its mean over seeds with the 95% t interval
    (n >= 3) cut to `bounds` (log: geometric) and its seeds' where style.seeds_drawn; the n of
    each."""
    (value, bounds, log), (x, order) = y, place
    ns = []
    for key in sorted(members, key=x.get):   # the legend in the order of the x axis
        runs = [r for r in sorted(members[key], key=lambda r: style.seed_order(r.seed))
                if (v := value(r)) is not None and math.isfinite(v)]
        if (agg := style.aggregate([([0], [value(r)]) for r in runs], log)) is None:
            continue
        _, m, lo, hi = (np.asarray(a, float) for a in agg)
        yerr = np.nan_to_num([m - np.clip(lo, *bounds), np.clip(hi, *bounds) - m])
        look = frame.looks[frame.arms.name(key)]
        ax.errorbar([x[key]], m, yerr=yerr if yerr.any() else None, capsize=3,
                    label=arm_label(frame, key, members[key]), **{**style.line_style(look),
                                                                  "ls": "none"})
        if style.seeds_drawn(runs, log, frame.which, frame.levels):
            style.draw_seeds(ax, [([x[key]] * len(runs), [value(r) for r in runs])], look, True)
        ns.append(len(runs))
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_yscale("log" if log else "linear")
    ax.grid(alpha=0.3, axis="y")
    return ns


def plot_normaliser(frame, groups: dict, which: str):
    """normaliser.png: per arm at the end of training, the first token's weight (with the
    baseline's at step 0) and the final loss (with the reference levels), a row per setting."""
    groups = {k: ok for k, g in groups.items()
              if (ok := [r for r in g if st.failure(r, which, frame.levels) is None])}
    if not any(stat(r, FIRST) is not None for g in groups.values() for r in g):
        return None
    settings = frame.arms.settings(groups)
    fig, axes = plt.subplots(len(settings), 2, squeeze=False, layout="constrained",
                             figsize=(10.0, 3.2 * len(settings) + 1.8))
    ns, logs = [], []
    for (left, right), setting in zip(axes, settings):
        members = at(frame, groups, setting)
        where = "" if len(settings) == 1 else f", {panel_title(setting)}"
        ns += mass_panel(left, frame, members, positions(members))
        log, off = loss_panel(right, frame, members, which, positions(members))
        logs.append(log)
        left.set_title(f"first token's weight at the end{where}", fontsize=9)
        right.set_title(f"final loss{where}{off}", fontsize=9)
    arms = {c.get_label(): c for ax in axes[:, 0] for c in ax.containers}
    levels = {line.get_label(): line for ax in fig.axes for line in ax.lines
              if style.reference(line, ax)}
    return style.finish(fig, "Each arm at the end of training by normaliser: where attention's"
                        f" mass goes and the loss{frame.seeds}\n{style.seeds_text(ns, 'arm')};"
                        " failed runs left out" + ("; log y: geometric mean" if any(logs) else "")
                        + style.seeds_note(fig),
                        (*arms.values(), *levels.values()))


SHARES = ("softmax", "softmax1", "sink")   # rows sum to 1 or less: a weight is a row's share


def mass_panel(ax, frame, members: dict, place: tuple) -> list[int]:
    """The first token's weight per arm, and the baseline's mean at step 0; each arm's n."""
    ns = arm_points(ax, frame, members, (lambda r: stat(r, FIRST), SHARE, False), place)
    ax.set_xticks(range(len(place[1])), [n if n in SHARES else f"{n}\n(absolute weight)"
                                         for n in place[1]])
    start = [stat(r, FIRST, 0) for k, g in members.items()
             if frame.arms.name(k) == frame.baseline for r in g]
    if start and None not in start:
        style.reference_lines(ax, {f"{frame.baseline}'s mean at step 0 =": float(np.mean(start))})
    ax.set_ylabel("first token's weight\n(attn_first_mass, mean over layers)", fontsize=9)
    return ns


def loss_panel(ax, frame, members: dict, which: str, place: tuple) -> tuple[bool, str]:
    """The final loss per arm (log y where 10x apart or more), the controls and reference levels
    near it; log y?, and the lines of the panel's title that name, with their values, those that
    would squeeze it (style.edge_note)."""
    runs = [r for g in members.values() for r in g]
    loss = {k: [v for r in g if (v := st.final_loss(r, which)) is not None] for k, g in
            members.items()}
    controls = {frame.arms.name(k): loss[k] for k in members
                if dict(k)[VARIANT_KEY] in style.CONTROLS and loss[k]}
    compared = [v for k in members if frame.arms.name(k) not in controls for v in loss[k]]
    log = decade([v for vs in loss.values() for v in vs])
    bounds = (0.0, init_cap(runs))
    near, far = style.within(compared, {**controls, **(frame.levels or {}),
                                        **chance_loss(members)}, log)
    arm_points(ax, frame, {k: g for k, g in members.items() if frame.arms.name(k) not in far},
               (lambda r: st.final_loss(r, which), bounds, log), place)
    style.reference_lines(ax, {k: v for k, v in near.items() if k not in controls})
    ax.set_ylabel(st.loss_name(which, runs), fontsize=9)
    return log, style.edge_note(far, compared)
