"""The figure contract of docs/report.md, written once: an arm's colour and marker, when a band
and the seeds are drawn, what shares a panel, what a title says of the seeds, how a figure is
finished."""

import math
import re
import textwrap
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from matplotlib.transforms import ScaledTranslation

from scripts.report import stats as st
from scripts.report.runs import NORMALISER_KEY, VARIANT_KEY, pair_text, setting_order

# An arm's colour, marker and dashes are a fixed function of its name, the same in every figure.
# The scales and the normaliser arms have their own (a normaliser's marker, its scale's dashes);
# any other name (a new scale, a switch) takes a slot of POOL from a hash of the name, the next
# free one where an arm of the same report took it: adding an arm changes no other's look.
LOOKS = {"sqrt_dk": ("C0", "o", "-"), "none": ("C1", "s", "--"), "dk": ("C2", "^", "-."),
         "constant": ("C3", "D", ":"), "learned": ("C4", "v", (0, (6, 2))),
         "qk_norm": ("C5", "P", (0, (3, 1, 1, 1))), "uniform": ("C7", "8", (0, (1, 1))),
         "sqrt_dk, softmax1": ("C8", "X", "-"), "none, softmax1": ("#637939", "X", "--"),
         "sqrt_dk, sink": ("C9", "h", "-"), "none, sink": ("#393b79", "h", "--"),
         "sqrt_dk, sigmoid": ("C6", "*", "-"), "none, sigmoid": ("#7b4173", "*", "--")}
POOL = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "k",
        "#843c39", "#5254a3", "#8ca252", "#ad494a", "#ce6dbd", "#6baed6", "#fd8d3c", "#9e9ac8",
        "#c49c94", "#e7ba52", "#74c476", "#f781bf", "#a65628", "#6b6ecf")
MARKERS = ("o", "s", "^", "D", "v", "P", "h", "X", "p", "<", ">", "d", "*", "H")
DASHES = ("-", "--", "-.", ":", (0, (6, 2)), (0, (3, 1, 1, 1)))
FAILED = "x"   # the mark over an LR where a run failed: no arm's marker, so it reads one way only
CONTROLS = ("uniform",)   # scales drawn to compare with, never squeezing the arms compared
LR_LABEL = "peak learning rate (optim.lr)"   # what an LR axis reads: the schedule's peak
MIN_BAND_N = 3   # a band or bar is a 95% t interval of at least 3 seeds; t(0.975, 1) is 12.7
# A reference level's look: black, thin, dashes that no arm's line has (DASHES, LOOKS), so that
# no arm (the control's grey dots) reads as a level.
LEVEL_STYLES = ((0, (2, 3)), (0, (7, 3)), (0, (7, 2, 1, 2)), (0, (12, 3)), (0, (10, 2, 1, 2)),
                (0, (3, 2, 1, 2, 1, 2)))
LEVEL_LOOK = {"color": "k", "lw": 0.8}
DODGE = 4.0   # points between the markers of neighbouring lines at one x
# Switches whatever their most common value, each with the value that turns it off; a run
# written before the key existed (None) has it off too: a normaliser sweep's lines read
# "sqrt_dk, sink", and "sqrt_dk" for softmax.
OFF = {NORMALISER_KEY: "softmax"}


def palette(arms) -> dict[str, tuple]:
    """Each arm's look: LOOKS's, else POOL's slot crc32(name) or the next free one (names in
    sorted order); past POOL's end, its colours again with other markers."""
    looks, taken = {a: LOOKS[a] for a in arms if a in LOOKS}, set()
    for arm in sorted(set(arms) - set(looks)):
        start, n = zlib.crc32(arm.encode()) % len(POOL), len(POOL)
        i = next(i for i in [*((start + k) % n for k in range(n)), *range(n, n + len(arms))]
                 if i not in taken)
        taken.add(i)
        looks[arm] = (POOL[i % n], MARKERS[(i + i // n) % len(MARKERS)], DASHES[i % len(DASHES)])
    return looks


@dataclass(frozen=True)
class Arms:
    """A group's arm is its scale plus its switches, keys whose most common value is the
    default, null or 0 ("sqrt_dk, softcap=50"), keys that a comparison names (--against), and
    the keys of OFF; its other keys are its setting (a panel). An arm names each switch that is
    not at its most common value (OFF's: not off), a normaliser by its name ("none, sigmoid")."""

    switches: dict   # key -> its most common value (OFF's: its value when off)
    labels: dict = field(default_factory=dict)   # "key=value" -> its words (--label)

    @classmethod
    def of(cls, keys, compared=(), labels=None) -> "Arms":
        """compared: keys that are switches whatever their values (--against's)."""
        names = {k for key in keys for k, _ in key[1:]}
        common = {k: Counter(dict(key).get(k) for key in keys).most_common(1)[0][0]
                  for k in names}
        return cls({**{k: v for k, v in common.items()
                       if (k in compared if compared else v in (None, "0"))},
                    **{k: v for k, v in OFF.items() if k in names}}, labels or {})

    def on(self, k: str, v) -> bool:
        """Whether switch k is on at value v (not its most common value; OFF's: not off)."""
        return v not in (self.switches[k], None) if k in OFF else v != self.switches[k]

    def name(self, key: tuple) -> str:
        on = [self.labels.get(f"{k}={v}") or pair_text(k, v, short=True) for k, v in key[1:]
              if k in self.switches and self.on(k, v)]
        return ", ".join([dict(key)[VARIANT_KEY], *on])

    def setting(self, key: tuple) -> tuple:
        return tuple((k, v) for k, v in key[1:] if k not in self.switches)

    def settings(self, keys) -> list[tuple]:
        return sorted({self.setting(k) for k in keys}, key=setting_order)

    def looks(self, keys) -> dict:
        return palette([self.name(k) for k in keys])


def line_style(look: tuple) -> dict:
    colour, marker, dashes = look
    return {"color": colour, "marker": marker, "ls": dashes, "ms": 4, "lw": 1.4}


def aggregate(series: list[tuple[list, list]], log: bool = False):
    """Seeds' (x, values) -> (x, mean, band); band NaN below MIN_BAND_N; log: geometric."""
    steps = sorted({s for xs, _ in series for s in xs})
    index = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(series), len(steps)), np.nan)   # (runs, steps)
    for row, (xs, ys) in enumerate(series):
        for x, y in zip(xs, ys):
            if math.isfinite(y) and (y > 0 or not log):
                grid[row, index[x]] = math.log(y) if log else y
    keep = ~np.all(np.isnan(grid), axis=0)
    if not keep.any():
        return None
    grid, steps = grid[:, keep], np.array(steps)[keep]
    half = np.array([st.mean_interval(list(c[~np.isnan(c)])).half
                     if (~np.isnan(c)).sum() >= MIN_BAND_N else np.nan for c in grid.T], float)
    mean = np.nanmean(grid, axis=0)
    out = np.array([mean, mean - half, mean + half])
    return (steps, *(np.exp(out) if log else out))


def draw_mean(ax, data: tuple, look: tuple, text: str, bounds=(-math.inf, math.inf),
              place: tuple[int, int] = (0, 1)) -> None:
    """A mean line and, where it has one, its band cut to the quantity's range `bounds`; data:
    (aggregate's (x, mean, lo, hi), the seeds' (x, values) it is the mean of where they are
    drawn (seeds_drawn), else ()). place: (this line's index, the lines in its panel), so that
    no marker hides another's."""
    (steps, mean, lo, hi), seeds = data
    i, n = place
    every = max(len(steps) // 6, n)   # a long line marks every k-th point (k >= n) from i
    line = ax.plot(steps, mean, label=text, markevery=(i, every), **line_style(look))
    band = [ax.fill_between(steps, np.clip(lo, *bounds), np.clip(hi, *bounds), color=look[0],
                            alpha=0.18, lw=0)] if np.isfinite(lo).any() else []
    short = len(steps) < 2 * every
    drawn = draw_seeds(ax, seeds, look, short)
    if short:   # a short one marks every point, its line moved sideways
        line[0].set_markevery(None)
        dodge(ax, place, [*line, *band, *drawn])


def outcome(run, which: str, levels) -> tuple[bool, bool]:
    """Whether a run failed and whether it solved the task (recall runs; else never)."""
    return st.failure(run, which, levels) is not None, run.steps_to_90 is not None


def seeds_drawn(runs: list, log: bool, which: str, levels) -> bool:
    """Whether a mean of these runs is drawn with each seed's value: a mean of 2, or a mean of
    seeds that split between solving and failing (a mean that is neither's; log: geometric)."""
    return len(runs) == 2 or len({outcome(r, which, levels) for r in runs}) > 1


def seeds_note(fig) -> str:
    """What a title says of the seeds drawn beside their means (draw_seeds), if any."""
    seeds = [line for ax in fig.axes for line in ax.lines if line.get_label() == "_seed"]
    how = "hollow markers" if any(s.get_marker() != "None" for s in seeds) else "thin lines"
    return (f"; {how}: each seed, where a mean is of 2 or of seeds that split between solving"
            " and failing") if seeds else ""


def seed_order(seed) -> tuple:
    """Seeds in numeric order (2 before 10), the order their values are drawn in."""
    return len(str(seed)), str(seed)


def draw_seeds(ax, series, look: tuple, short: bool) -> list:
    """Each seed's (x, values): hollow markers beside a mean that marks every point (short),
    else thin lines."""
    how = ({"ls": "none", "marker": look[1], "mfc": "none", "ms": 3.5, "mew": 0.8} if short
           else {"lw": 0.6, "alpha": 0.5})
    return [a for xs, ys in series for a in ax.plot(xs, ys, color=look[0], label="_seed", **how)]


def dodge(ax, place: tuple[int, int], artists) -> None:
    """Moves artists drawn in data units DODGE points sideways per line, centred on the
    panel's lines, after autoscaling has read their data."""
    i, n = place
    moved = ax.transData + ScaledTranslation((i - (n - 1) / 2) * DODGE / 72, 0,
                                             ax.figure.dpi_scale_trans)
    for artist in artists:
        artist.set_transform(moved)
    # x margins that hold the outermost move, a marker (a cross: 9 points) and a bar's cap,
    # on a panel taken as 0.8 of its share of the figure before the layout
    reach, wide = (n - 1) / 2 * DODGE + 6, ax.get_position().width * ax.figure.get_figwidth() * 58
    ax.margins(x=max(ax.margins()[0], reach / max(wide - 2 * reach, 1)))


def seeds_text(ns, what: str = "line") -> str:
    ns = sorted(set(ns))
    span = f"{ns[0]}" + (f"-{ns[-1]}" if len(ns) > 1 else "")
    if ns[-1] < MIN_BAND_N:
        return f"n = {span} seed{'s' if ns[-1] > 1 else ''} per {what}, no intervals"
    small = f" (n = {ns[0]}: no intervals)" if ns[0] < MIN_BAND_N else ""
    return f"mean of n = {span} seeds per {what}, 95% t interval where n >= {MIN_BAND_N}{small}"


def reference_lines(ax, levels: dict) -> None:
    """Levels across the panel, each name its own dashes in the figure (finish)."""
    for name, value in levels.items():
        ax.axhline(value, **LEVEL_LOOK, label=f"{name} {value:.2f}", zorder=1)


def reference(line, ax) -> bool:
    """Whether a line is a reference level or mark, drawn across the panel (axhline, axvline)."""
    return any(line.get_transform() is t for t in (ax.get_xaxis_transform(),
                                                   ax.get_yaxis_transform()))


def has_data(ax) -> bool:
    return any(not reference(line, ax) and np.isfinite(np.asarray(line.get_ydata(), float)).any()
               for line in ax.lines) or bool(ax.collections)


def within(values: list, others: dict, log: bool) -> tuple[dict, dict]:
    """others (name -> value, or a (low, high) range: levels, controls) split into those that
    may share a panel with `values`, nearest first while the values keep half its span (40% of
    its height with the axis's margins), and those that may not: one far off would squeeze the
    values into a strip of the panel."""
    at = (lambda v: math.log(v)) if log else (lambda v: v)
    ends = {k: [at(x) for x in np.atleast_1d(v) if math.isfinite(x) and (x > 0 or not log)]
            for k, v in others.items()}
    finite = [at(v) for v in values if math.isfinite(v) and (v > 0 or not log)]
    lo, hi = (min(finite), max(finite)) if finite else (math.inf, -math.inf)
    span, near = hi - lo, {}
    for name in sorted(others, key=lambda k: max([lo - e for e in ends[k]] + [
            e - hi for e in ends[k]], default=math.inf)):
        if ends[name] and max(hi, *ends[name]) - min(lo, *ends[name]) <= 2 * span:
            near[name] = others[name]
            lo, hi = min(lo, *ends[name]), max(hi, *ends[name])
    return near, {k: v for k, v in others.items() if k not in near}


def edge_note(far: dict, values: list) -> str:
    """The levels and controls left off a panel (within), named with their values above or
    below its axis: a line of the panel's title."""
    top, sides = max(values, default=math.inf), {"above": [], "below": []}
    for name, v in far.items():
        low, high = (f"{x:#.3g}" for x in (np.min(v), np.max(v)))
        sides["above" if float(low) > top else "below"].append(
            f"{name} {low}" + (f" to {high}" if high != low else ""))
    return "".join("\n" + textwrap.fill(f"{side} the axis: {', '.join(items)}", 56)
                   for side, items in sides.items() if items)


def finish(fig, title: str, handles: tuple = ()):
    """Drops empty panels, gives each reference level's name its own dashes, puts one legend
    below the panels, writes the title."""
    for ax in [ax for ax in fig.axes if not has_data(ax)]:
        fig.delaxes(ax)
    names = {}
    for ax, line in ((ax, line) for ax in fig.axes for line in ax.lines):
        if reference(line, ax) and not line.get_label().startswith("_"):
            i = names.setdefault(re.sub(r"[-\d.]+$", "", line.get_label()), len(names))
            line.set(ls=LEVEL_STYLES[i % len(LEVEL_STYLES)], lw=LEVEL_LOOK["lw"],
                     color=(LEVEL_LOOK["color"], "0.5")[i // len(LEVEL_STYLES) % 2])
    entries = {h.get_label(): h for h in handles}
    for handle, text in ((h, t) for ax in (fig.axes if not handles else ())
                         for h, t in zip(*ax.get_legend_handles_labels())):
        entries.setdefault(text, handle)
    if entries:
        widest = max(len(t) for t in entries) * 0.075 + 0.7   # inches an entry takes
        fig.legend(list(entries.values()), list(entries), loc="outside lower center",
                   ncol=max(1, min(len(entries), int(fig.get_figwidth() / widest))),
                   fontsize=8, frameon=False)
    suptitle(fig, title)
    return fig


def suptitle(fig, text: str, fontsize: float = 10) -> None:
    """The title, wrapped at whole words to fit the figure's width."""
    width = max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    renderer = fig.canvas.get_renderer()
    while True:
        lines = [textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
                 for line in text.split("\n")]
        title = fig.suptitle("\n".join(lines), fontsize=fontsize)
        if width <= 20 or title.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        width = int(width * 0.9)


