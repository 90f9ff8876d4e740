"""The figure contract of docs/report.md, written once: an arm's colour and marker, when a band
is drawn and how far, what a title says of the seeds, how a figure is finished."""

import itertools
import math
import textwrap
from collections import Counter
from dataclasses import dataclass

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.transforms import ScaledTranslation

from model.config import SCALINGS
from scripts.report import stats as st
from scripts.report.runs import NORMALISER_KEY, VARIANT_KEY, pair_text, setting_order

# Colour, marker and dashes: one per scale of SCALINGS, in its order; other arms (a scale with a
# switch, say) take the next of EXTRA in the order of their names, then colours of tab20b: no
# colour twice in a report.
LOOKS = (("C0", "o", "-"), ("C1", "s", "--"), ("C2", "^", "-."), ("C3", "D", ":"),
         ("C4", "v", (0, (6, 2))), ("C5", "P", (0, (3, 1, 1, 1))), ("C7", "8", (0, (1, 1))),
         ("C6", "*", "-"), ("C9", "h", "--"), ("C8", "X", "-."), ("k", "d", ":"),
         ("#98df8a", "p", "-"), ("#c5b0d5", "<", "--"), ("#ff9896", ">", "-."))
FAILED = "x"   # the mark over an LR where a run failed: no arm's marker, so it reads one way only
SCALES = dict(zip(SCALINGS, LOOKS))
EXTRA = LOOKS[len(SCALINGS):]
MIN_BAND_N = 3   # a band or bar is a 95% t interval of at least 3 seeds; t(0.975, 1) is 12.7
LEVEL_STYLES = ((0, (1, 2)), (0, (4, 2)), (0, (2, 1, 1, 1)))
DODGE = 4.0   # points between the markers of neighbouring lines at one x
# Switches whatever their most common value, each with the value that turns it off; a run
# written before the key existed (None) has it off too: a normaliser sweep's lines read
# "sqrt_dk, sink", and "sqrt_dk" for softmax.
OFF = {NORMALISER_KEY: "softmax"}


def palette(arms) -> dict[str, tuple]:
    others = sorted({a for a in arms if a not in SCALES})
    more = [(to_hex(c), m, d) for c, (_, m, d) in zip(colormaps["tab20b"].colors,
                                                        itertools.cycle(LOOKS))]
    looks = {a: SCALES[a] for a in arms if a in SCALES}
    looks.update(zip(others, [*EXTRA, *more]))
    return looks


@dataclass(frozen=True)
class Arms:
    """A group's arm is its scale plus its switches, keys whose most common value is the
    default, null or 0 ("sqrt_dk, softcap=50"), keys that a comparison names (--against), and
    the keys of OFF; its other keys are its setting (a panel). An arm names each switch that is
    not at its most common value (OFF's: not off), a normaliser by its name ("none, sigmoid")."""

    switches: dict   # key -> its most common value (OFF's: its value when off)

    @classmethod
    def of(cls, keys, compared=()) -> "Arms":
        """compared: keys that are switches whatever their values (--against's)."""
        names = {k for key in keys for k, _ in key[1:]}
        common = {k: Counter(dict(key).get(k) for key in keys).most_common(1)[0][0]
                  for k in names}
        return cls({**{k: v for k, v in common.items()
                       if (k in compared if compared else v in (None, "0"))},
                    **{k: v for k, v in OFF.items() if k in names}})

    def on(self, k: str, v) -> bool:
        """Whether switch k is on at value v (not its most common value; OFF's: not off)."""
        return v not in (self.switches[k], None) if k in OFF else v != self.switches[k]

    def name(self, key: tuple) -> str:
        on = [pair_text(k, v, short=True) for k, v in key[1:]
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


def draw_mean(ax, agg, look: tuple, text: str, bounds=(-math.inf, math.inf),
              place: tuple[int, int] = (0, 1)) -> None:
    """A mean line and, where it has one, its band cut to the quantity's range `bounds`.
    place: (this line's index, the lines in its panel), so that no marker hides another's."""
    steps, mean, lo, hi = agg
    i, n = place
    every = max(len(steps) // 6, n)   # a long line marks every k-th point (k >= n) from i
    line = ax.plot(steps, mean, label=text, markevery=(i, every), **line_style(look))
    band = [ax.fill_between(steps, np.clip(lo, *bounds), np.clip(hi, *bounds), color=look[0],
                            alpha=0.18, lw=0)] if np.isfinite(lo).any() else []
    if len(steps) < 2 * every:   # a short one marks every point, its line moved sideways
        line[0].set_markevery(None)
        dodge(ax, place, [*line, *band])


def dodge(ax, place: tuple[int, int], artists) -> None:
    """Moves artists drawn in data units DODGE points sideways per line, centred on the
    panel's lines, after autoscaling has read their data."""
    i, n = place
    moved = ax.transData + ScaledTranslation((i - (n - 1) / 2) * DODGE / 72, 0,
                                             ax.figure.dpi_scale_trans)
    for artist in artists:
        artist.set_transform(moved)


def seeds_text(ns, what: str = "line") -> str:
    ns = sorted(set(ns))
    span = f"{ns[0]}" + (f"-{ns[-1]}" if len(ns) > 1 else "")
    if ns[-1] < MIN_BAND_N:
        return f"n = {span} seed{'s' if ns[-1] > 1 else ''} per {what}, no intervals"
    small = f" (n = {ns[0]}: no intervals)" if ns[0] < MIN_BAND_N else ""
    return f"mean of n = {span} seeds per {what}, 95% t interval where n >= {MIN_BAND_N}{small}"


def reference_lines(ax, levels: dict, colour: str = "0.35") -> None:
    for (name, value), dashes in zip(levels.items(), LEVEL_STYLES * 3):
        ax.axhline(value, color=colour, lw=0.9, ls=dashes, label=f"{name} {value:.2f}",
                   zorder=1)


def reference(line, ax) -> bool:
    """Whether a line is a reference level or mark, drawn across the panel (axhline, axvline)."""
    return any(line.get_transform() is t for t in (ax.get_xaxis_transform(),
                                                   ax.get_yaxis_transform()))


def has_data(ax) -> bool:
    return any(not reference(line, ax) and np.isfinite(np.asarray(line.get_ydata(), float)).any()
               for line in ax.lines) or bool(ax.collections)


def levels_near(levels: dict, values: list, log: bool) -> dict:
    """The reference levels no farther from the data than the data's own span (on the axis's
    scale): one far off would squeeze the data into a strip of the panel."""
    at = (lambda v: math.log(v)) if log else (lambda v: v)
    finite = [at(v) for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return levels
    lo, hi = min(finite), max(finite)
    span = max(hi - lo, 1e-9 * abs(hi))
    return {k: v for k, v in levels.items()
            if (v > 0 or not log) and lo - span <= at(v) <= hi + span}


def finish(fig, title: str, handles: tuple = ()):
    """Drops empty panels, puts one legend below them, writes the title."""
    for ax in [ax for ax in fig.axes if not has_data(ax)]:
        fig.delaxes(ax)
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


