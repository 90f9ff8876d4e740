"""Runs evaluated past their training length (trainer.eval_lengths), read from runs.csv's len*
columns (docs/report.md, "Length runs"): the lookup task's weight on the right key and accuracy
per number of pairs n, with the registered prediction of the fixed factor; text's loss by
position bucket against the fixed factor and against the sliding-window reference."""

import math
import re
import statistics
from dataclasses import replace
from functools import partial
from typing import Optional

from scripts.report import stats as st
from scripts.report import style
from scripts.report.figures import SHARE, chance, init_cap, stat_grid
from scripts.report.runs import VARIANT_KEY, group_runs, label
from scripts.report.tables import cell, paired_table, ratio_text

LENGTH_KEY = "scaling.length"
FIXED = "fixed"   # scaling.length's default, g(n) = 1: what the other factors are paired with
COLUMN = re.compile(r"len(\d+)_(?:b(\d+)_(\d+)_)?([a-z_]+)")
WEIGHT = "right_key_weight"


def columns(runs: list, field: str) -> list[tuple[int, int, int]]:
    """(n, first, last) of the runs' len* columns of `field`, sorted; 0, 0: the whole n."""
    found = {COLUMN.fullmatch(c).groups() for r in runs for c in r.lengths}
    return sorted((int(n), int(lo or 0), int(hi or 0)) for n, lo, hi, f in found if f == field)


def value(run, n: int, field: str, bucket: tuple = (0, 0)) -> Optional[float]:
    return run.lengths.get(f"len{n}_{f'b{bucket[0]}_{bucket[1]}_' if bucket[0] else ''}{field}")


def beyond(runs: list, field: str, past: bool = True) -> list[tuple[int, int, int]]:
    """The columns of `field` past the runs' training length (within it: past=False)."""
    trained = runs[0].trained_length or math.inf
    return [(n, lo, hi) for n, lo, hi in columns(runs, field) if ((hi or n) > trained) == past]


def predicted(run, n: int) -> Optional[float]:
    """The registered prediction under `fixed`, p(n) = e^D / (e^D + n - 1), with D the mean of
    ln((n' - 1) p / (1 - p)) over the run's n' within training (p: its weight at n')."""
    fit = [(m, value(run, m, WEIGHT)) for m, _, _ in beyond([run], WEIGHT, False) if m > 1]
    if not fit or not all(0 < p < 1 for _, p in fit):
        return None
    d = statistics.fmean(math.log((m - 1) * p / (1 - p)) for m, p in fit)
    return math.exp(d) / (math.exp(d) + n - 1)


def is_reference(key: tuple, runs: list, baseline: str) -> bool:
    """Whether a group is the baseline scale at the fixed factor: the prediction's arm."""
    return dict(key)[VARIANT_KEY] == baseline and runs[0].setting(LENGTH_KEY) in (None, FIXED)


def length_sections(runs: list, baseline: str) -> str:
    """results.md's length sections for the runs with len* columns ("" without any)."""
    groups = {k: g for k, g in group_runs(runs).items() if any(r.lengths for r in g)}
    lines = lookup_section(groups, baseline) if columns(runs, WEIGHT) else []
    lines += text_section(groups) if columns(runs, "sliding_loss") else []
    return "\n".join(lines) + "\n" if lines else ""


def lookup_section(groups: dict, baseline: str) -> list[str]:
    cells = [(key, n, [st.mean_interval([value(r, n, f) for r in runs]) for f in
                       ("accuracy", WEIGHT)]) for key, runs in groups.items()
             for n, _, _ in columns(runs, "accuracy")]
    accuracy = {key + (("n", str(n)),): st.by_seed(runs, lambda r, n=n: value(r, n, "accuracy"))
                for key, runs in groups.items() for n, _, _ in beyond(runs, "accuracy")}
    return ["", "## Length: lookup", "", "Per group and number of pairs n, over every finished"
            " run: the accuracy of the answer and the weight the query gives the right pair (its"
            " best head), mean ± 95% t interval.", "", "| group | n | runs | accuracy | weight on"
            " the right key |", "|---|---:|---:|---:|---:|",
            *(f"| {label(key)} | {n} | {a.n} | {cell(a)} | {cell(w, None)} |"
              for key, n, (a, w) in cells)] + prediction_table(groups, baseline) + [
        "", f"Accuracy past the training length, paired by seed against `{LENGTH_KEY}={FIXED}`"
        " at the same other settings:", ""] + paired_table(accuracy, ((LENGTH_KEY, FIXED),),
                                                           "accuracy")


def prediction_table(groups: dict, baseline: str) -> list[str]:
    rows = [(key, n, *(st.by_seed(runs, lambda r, n=n, g=get: g(r, n)) for get in
                       (lambda r, n: value(r, n, WEIGHT), predicted)))
            for key, runs in groups.items() if is_reference(key, runs, baseline)
            for n, _, _ in beyond(runs, WEIGHT)]
    lines = ["", f"The registered prediction for `{baseline}` at `{LENGTH_KEY}={FIXED}` past the"
             " training length, p(n) = e^D / (e^D + n - 1) with D per run the mean over its n"
             " within training of ln((n - 1) p / (1 - p)) (p: its weight), paired by seed on log"
             " weight, one Holm family:", "",
             "| group | n | pairs | measured weight | predicted weight | ratio measured /"
             " predicted | p (paired t, log) | Holm p | reading |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (key, n, a, b), c in zip(rows, st.family([(a, b) for *_, a, b in rows], log=True)):
        means = " | ".join(cell(st.mean_interval(list(v.values())), None) for v in (a, b))
        lines.append(f"| {label(key)} | {n} | {c.diff.n if c.diff else 0} | {means}"
                     f" | {ratio_text(c)} | {st.p_text(c.p)} | {st.p_text(c.p_holm)} | "
                     + st.verdict(c, "below the prediction", "above the prediction",
                                  "not resolved from the prediction, ") + " |")
    return lines + ([] if rows else ["", "No run of that arm has a weight past training."])


def text_section(groups: dict) -> list[str]:
    lines = ["", "## Length: text", "", "Loss by position bucket, paired by seed against the"
             f" same other settings at `{LENGTH_KEY}={FIXED}`: within the training length, then"
             " past it (one Holm family each).", ""]
    for past in (False, True):
        loss = {key + (("length", str(n)), ("positions", f"{lo}-{hi}")): st.by_seed(
            runs, lambda r, n=n, b=(lo, hi): value(r, n, "loss", b))
            for key, runs in groups.items() for n, lo, hi in beyond(runs, "loss", past) if lo}
        lines += paired_table(loss, ((LENGTH_KEY, FIXED),), "loss") + [""]
    rows = [(key, n, (lo, hi)) for key, runs in groups.items()
            for n, lo, hi in beyond(runs, "sliding_loss") if lo]
    tests = st.family([tuple(st.by_seed(groups[key], lambda r, f=f, n=n, b=b: value(r, n, f, b))
                             for f in ("loss", "sliding_loss")) for key, n, b in rows])
    return lines + [
        "Past the training length, each group's loss minus its own sliding-window loss (the same"
        " model seeing only its last block_size tokens), paired by seed, one Holm family: `uses"
        " the extra context` where resolved below it, `blow-up` where resolved above it.", "",
        "| group | length | positions | pairs | loss − sliding-window loss | p (paired t)"
        " | Holm p | reading |", "|---|---:|---|---:|---:|---:|---:|---|", *(
            f"| {label(key)} | {n} | {lo}-{hi} | {c.diff.n if c.diff else 0} | {cell(c.diff)}"
            f" | {st.p_text(c.p)} | {st.p_text(c.p_holm)} | "
            + st.verdict(c, "uses the extra context", "blow-up", c.diff and c.diff.half and
                         f"interval up to {c.diff.mean + c.diff.half:+.4f}; " or "") + " |"
            for (key, n, (lo, hi)), c in zip(rows, tests))]


def length_arms(arms: style.Arms) -> style.Arms:
    """The report's arms with the length factor as a switch: a line per factor, each named."""
    return style.Arms({**arms.switches, LENGTH_KEY: None}, arms.labels)


def series(run, field: str, get=value) -> tuple[list, list]:
    """(n, get(run, n, field)) over the run's n with a value of `field`."""
    points = [(n, get(run, n, field)) for n, lo, _ in columns([run], field) if not lo]
    return [n for n, v in points if v is not None], [v for _, v in points if v is not None]


def plot_lookup(frame, runs: list):
    """length_lookup.png: weight on the right key (and prediction), accuracy."""
    groups = {k: g for k, g in group_runs(runs).items() if columns(g, WEIGHT)}
    rows = [("weight on the right key\n(its best head)", lambda r: series(r, WEIGHT), SHARE, True),
            ("accuracy (fraction)", lambda r: series(r, "accuracy"), SHARE, False,
             {"chance": c} if (c := chance(groups)) else {})]
    frame = replace(frame, arms=length_arms(frame.arms))
    return stat_grid(frame, groups, rows, "Lookup past the training length, on the evaluation"
                     " rows of each n; dashed: the registered prediction e^D / (e^D + n − 1), D"
                     " fitted within training", ("pairs n", True, partial(prediction, frame))
                     ) if groups else None


def prediction(frame, ax, row: int, members: dict) -> None:
    """The mean over the baseline's runs at the fixed factor of their predicted weight."""
    for key, group in members.items() if row == 0 else ():   # the reference arm's only
        if is_reference(key, group, frame.baseline) and (agg := style.aggregate([series(
                r, WEIGHT, lambda r, n, _: predicted(r, n)) for r in group], log=True)):
            ax.plot(*agg[:2], color="0.2", ls="--", lw=1.2,   # not an arm's colour
                    label=f"prediction for {frame.arms.name(key)}")


def plot_text(frame, runs: list):
    """length_text.png: the loss by position, and less the sliding-window loss."""
    groups = {k: g for k, g in group_runs(runs).items() if beyond(g, "sliding_loss")}
    top = init_cap([r for g in groups.values() for r in g])
    rows = [("val loss (nats)", lambda r: by_position(r, "loss"), (0.0, top), False),
            ("loss − its sliding-\nwindow loss (nats)", lambda r: by_position(r, None),
             (-top, top), False, {"the sliding window at": 0.0})]
    return stat_grid(replace(frame, arms=length_arms(frame.arms)), groups, rows,
                     "Validation loss by position past the training length, on an even subset"
                     " of the val split (sliding window: the same model seeing only the last"
                     " block_size tokens)", ("last position of the bucket", True, None)
                     ) if groups else None


def by_position(run, field: Optional[str]) -> tuple[list, list]:
    """(last position, value) by bucket of the longest n; None: loss - sliding."""
    n = max(n for n, lo, _ in columns([run], "loss") if lo)
    buckets = [(lo, hi) for m, lo, hi in columns([run], "loss") if m == n and lo]
    values = [[value(run, n, f, b) for f in ((field,) if field else ("loss", "sliding_loss"))]
              for b in buckets]
    return [hi for _, hi in buckets], [v[0] if field else v[0] - v[1] for v in values]
