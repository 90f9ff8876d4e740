"""The figure contract of docs/report.md ("The figures and what they promise") on every committed
figure. Each study under docs/results/ is redrawn by the --from-csv command of its preset's
header (STUDIES, read from configs/experiment/*.yaml: the one definition of its options and
figures), docs/figures/ by scripts/scaling_stats.py and scripts/coord_check.py (from its
committed CSV); each PNG drawn is compared with the committed file
(matplotlib.testing.compare, as matplotlib tests its own figures), every committed figure is
cited in the docs, and each drawn figure is checked on its matplotlib objects:

- no empty axes; no text box overlaps another; no legend or label over a plotted point, no
  point drawn outside its panel (in display coordinates, after dodging); every text inside the
  figure;
- every loss axis says nats, an accuracy axis that it is a fraction, an LR axis which LR;
- the compared arms (all but the control) fill at least 40% of each panel's y range;
- no two lines of a panel share a label or (two arms) a colour; each arm has the one map's
  colour and marker (style.palette), the same in every figure, and a fork's new scale and
  normaliser change no committed figure; no marker wholly hidden under another line's;
- legends read as words (no number of more than 4 significant digits); no two reference lines
  share a style;
- every panel's x axis labels at least two ticks within its data;
- every band and error bar inside its quantity's range, none at n <= 2, where the title says
  "no intervals"; no line joins categorical x positions; a log axis holds no value <= 0;
- a mean of 2 seeds, and a geometric mean of seeds that split between solving and failing, is
  drawn with each seed's point;
- every group of the study's runs (its settings but seed and LR) is drawn; a point on a
  learning-rate axis lies at an LR run and, on a log y axis, is the geometric mean of its
  seeds' clipped losses (recomputed from runs.csv);
- the title names the seeds as the run set is (held out, or not), and the LR each arm is drawn
  at; lr_stability.png's line styles each mean one thing.

Figures no committed study draws are drawn from small fixtures of real shrunk runs (FIXTURES).
"""

import contextlib
import csv
import functools
import io
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import ROOT, report_in_process
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.testing.compare import compare_images

from model.config import SCALINGS
from scripts.report.style import palette

DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
CITING = ("README.md", "docs/results.md", "docs/scaling.md")   # where a figure is cited
TOLERANCE = 1.0   # RMS pixel difference (of 255) a redrawn PNG may have from the committed one
# the LRs the held-out stage's step curves are drawn at (the grid's choice, results.md)
CHOSEN_LRS = {"results/recall_headline/long": {"none": 0.00075, "sqrt_dk": 0.024}}
# fixture folder of tests/report/fixtures -> the figures no committed study draws: 20-step runs
# of experiment=length_generalisation_lookup (seeds 1-3, scaling.length fixed, log_n, ssmax)
# and of the default run with trainer.eval_lengths=[64,1024] (model.pos=nope, seeds 1-2, fixed
# and log_n, trainer.full_eval_tokens=4096); 40-step runs of experiment=normaliser_select (seed
# 101, three LRs) and of experiment=normaliser (seeds 1-3, each arm at the LR the first chose),
# every normaliser x {sqrt_dk, none} and uniform (tests/report/test_report_normaliser.py)
FIXTURES = {"length_lookup": ["diagnostics.png"],
            "length_text": ["diagnostics.png"],
            "normaliser": ["loss_vs_baseline.png", "normaliser.png"],
            "normaliser_select": ["lr_transfer.png"]}
STEP_FIGURES = ("loss_curves.png", "accuracy_curves.png", "loss_vs_baseline.png",
                "diagnostics.png", "qk_grad_norms.png")
SEED_FIGURES = (*STEP_FIGURES, "lr_transfer.png", "normaliser.png")   # whose seeds chose an LR
CONTROL = "uniform"   # the control scale: drawn beside the compared arms, not one of them
# what an axis of each quantity (a pattern of its label) must say of its unit
UNITS = (("loss", "nats"), ("accuracy", "fraction"), (r"learning rate|\bLR\b", "optim.lr"))


def redraw_commands() -> dict[str, list[str]]:
    """"results/<study>" -> the options of the command in a preset's header that redraws that
    committed folder from its own runs.csv alone (its --from-csv and --out one folder; a study
    not run yet has no runs.csv); a command goes on over the header's next lines that start
    with an option."""
    from scripts.plot_runs import command_line
    found = {}
    for preset in sorted((ROOT / "configs" / "experiment").glob("*.yaml")):
        header = [line[1:].strip() for line in itertools.takewhile(
            lambda line: line.startswith("#"), preset.read_text().splitlines())]
        for i, line in enumerate(header):
            _, command, text = line.partition("python scripts/plot_runs.py --from-csv ")
            more = itertools.takewhile(lambda m: m.startswith("--"), header[i + 1:])
            args = shlex.split(" ".join(["--from-csv", text, *more])) if command else []
            parsed = command_line().parse_args(args) if args else None
            if (parsed and not parsed.sweeps and parsed.from_csv == [parsed.out / "runs.csv"]
                    and (ROOT / parsed.out / "runs.csv").exists()):
                out = args.index("--out")   # the options: args but --from-csv's and --out's
                found[str(parsed.out.relative_to("docs"))] = args[2:out] + args[out + 2:]
    return found


STUDIES = redraw_commands()


def committed(key: str) -> list[str]:
    return FIXTURES.get(key) or sorted(p.name for p in (DOCS / key).glob("*.png"))


def cases():
    keys = [*STUDIES, "figures", "figures/coord_check", *FIXTURES]
    return [(key, name) for key in keys for name in committed(key)]


def folder(key: str) -> Path:
    return ROOT / "tests" / "report" / "fixtures" / key if key in FIXTURES else DOCS / key


def redraw(key: str, options: list[str], out: Path) -> None:
    """A study's figures drawn by its command (report_in_process prints results.md)."""
    assert report_in_process("--from-csv", folder(key) / "runs.csv", "--out", out,
                             *options) == 0, key


def recording(savefig, shown: dict):
    """Figure.savefig that writes the file (savefig None: not) and keeps the figure and its path
    in `shown`."""
    def save(fig, fname, **kwargs):
        if savefig:
            savefig(fig, fname, **kwargs)
        shown[Path(fname).name] = (fig, Path(fname))
    return save


def draw(commands: dict, out: Path, write: bool = True) -> dict:
    """{key: {figure file name: (Figure, the PNG written)}} of each key's command (write False:
    figures drawn, no PNG rendered)."""
    keep, figures = Figure.savefig, {}
    try:
        for key, command in commands.items():
            shown = figures[key] = {}
            Figure.savefig = recording(keep if write else None, shown)
            with contextlib.redirect_stdout(io.StringIO()):   # results.md, tables, printed
                command(out / key.replace("/", "_"))
    finally:
        Figure.savefig = keep
        plt.close("all")
    return figures


def study_commands() -> dict:
    return {**{key: functools.partial(redraw, key, options) for key, options in STUDIES.items()},
            **{key: functools.partial(redraw, key, ["--figures", ",".join(names)])
               for key, names in FIXTURES.items()}}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Each study drawn by its command, docs/figures by its scripts."""
    from scripts import coord_check, scaling_stats
    return draw({**study_commands(),
                 "figures": lambda to: scaling_stats.draw_figures(scaling_stats.variance_table(),
                                                                  to),
                 "figures/coord_check": lambda to: coord_check.main([
                     "--from-csv", str(DOCS / "figures" / "coord_check" / "coord_check.csv"),
                     "--out", str(to)])}, tmp_path_factory.mktemp("contract"))


@functools.cache   # committed files, read once per study, not once per panel
def runs_of(key: str) -> list[dict]:
    with open(folder(key) / "runs.csv", newline="") as f:
        return list(csv.DictReader(f))


@functools.cache
def curves_of(key: str) -> list[dict]:
    path = folder(key) / "curves.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


# ------------------------------------------------------------------ what a drawn figure holds


def rendered(fig):
    """The figure drawn once on an Agg canvas (pyplot.close took its own), and its renderer."""
    if not hasattr(fig, "contract_renderer"):
        FigureCanvasAgg(fig).draw()
        fig.contract_renderer = fig.canvas.get_renderer()
    return fig.contract_renderer


def data_lines(ax):
    """The lines of the data (not axhline's or axvline's reference lines, drawn across the
    panel in axes units)."""
    return [line for line in ax.lines if all(line.get_transform() is not t for t in (
        ax.get_xaxis_transform(), ax.get_yaxis_transform()))]


def point_lines(ax) -> list:
    """The panel's data lines that draw points: a marker, or a line through two or more."""
    return [line for line in data_lines(ax)
            if line.get_marker() not in ("None", "", " ", None) or len(line.get_xdata()) > 1]


def xy_of(line) -> np.ndarray:
    """A line's finite (x, y) points, in data units."""
    xy = np.column_stack([np.asarray(line.get_xdata(), float),
                          np.asarray(line.get_ydata(), float)])
    return xy[np.isfinite(xy).all(axis=1)]


def bar_tops(ax) -> np.ndarray:
    xy = [[p.get_x() + p.get_width() / 2, p.get_height()] for c in ax.containers
          if isinstance(c, BarContainer) for p in c.patches]
    return np.array(xy, float).reshape(-1, 2)


def points(ax) -> np.ndarray:
    """Every finite (x, y) data point of the panel's lines and error bars, in data units."""
    xy = np.concatenate([np.zeros((0, 2)), *map(xy_of, point_lines(ax)), bar_tops(ax)])
    return xy[np.isfinite(xy).all(axis=1)]


def drawn_points(ax) -> np.ndarray:
    """points() where they are drawn: display coordinates, each line by its own transform (a
    line moved sideways, dodged, where it was moved to)."""
    return np.concatenate([np.zeros((0, 2)), ax.transData.transform(bar_tops(ax)),
                           *(line.get_transform().transform(xy_of(line))
                             for line in point_lines(ax))])


def has_data(ax) -> bool:
    return len(points(ax)) > 0 or any(isinstance(c, PolyCollection) for c in ax.collections)


def labelled(ax) -> list[tuple[str, object]]:
    """The panel's labelled data artists, (label, artist): lines (an error bar's label is its
    container's) and bar series."""
    found = [(c.get_label(), c.lines[0]) for c in ax.containers
             if isinstance(c, ErrorbarContainer) and c.lines[0] is not None]
    found += [(c.get_label(), c.patches[0]) for c in ax.containers
              if isinstance(c, BarContainer)]
    found += [(line.get_label(), line) for line in data_lines(ax)]
    return [(text, artist) for text, artist in found if not text.startswith("_")]


def colour(artist) -> str:
    return to_hex(artist.get_color() if isinstance(artist, Line2D) else artist.get_facecolor())


def column_title(fig, ax) -> str:
    """A panel's title, or that of the panel heading its column (a grid titles its top row)."""
    x0, y0 = ax.get_position().x0, ax.get_position().y0
    above = [a for a in fig.axes if a.get_title() and abs(a.get_position().x0 - x0) < 1e-6
             and a.get_position().y0 >= y0]
    return ax.get_title() or (min(above, key=lambda a: a.get_position().y0).get_title()
                              if above else "")


def texts(fig) -> list:
    """Every visible, non-empty text of the figure, with the tick labels a panel draws."""
    found = list(fig.texts) + ([fig._suptitle] if fig._suptitle else [])
    for legend in fig.legends:
        found += legend.get_texts()
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        found += ax.texts
        if ax.get_legend():
            found += ax.get_legend().get_texts()
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())),
                               (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                inside = lo * (1 - 1e-9) - 1e-12 <= tick.get_loc() <= hi * (1 + 1e-9) + 1e-12
                if inside and tick.label1.get_visible():
                    found.append(tick.label1)
    return [t for t in dict.fromkeys(found) if t.get_visible() and t.get_text().strip()]


def legends(fig) -> list:
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]


def title(fig) -> str:
    """The figure's title, its wrapped lines joined by spaces."""
    return " ".join(fig._suptitle.get_text().split()) if fig._suptitle else ""


def overlap(a, b, slack: float = 1.0) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > slack
            and min(a.y1, b.y1) - max(a.y0, b.y0) > slack)


def arm_of(text: str):
    """The arm a legend entry names (its text up to ", lr"), or None for other entries."""
    arm = text.split(" (n=")[0].split(", lr ")[0]
    return arm if arm.split(",")[0] in SCALINGS else None


def drawn_rows(fig, key: str, name: str) -> list[dict]:
    """The runs.csv rows a figure of this name draws: every row; but those of a scale its title
    says it left out, the baseline's in a figure of differences from it, and the rows never
    read past their training length in a length figure."""
    left_out = title(fig).partition("left out")[2]
    rows = [r for r in runs_of(key) if not (left_out and f" {r['scaling']}:" in left_out)]
    if name == "loss_vs_baseline.png":
        return [r for r in rows if r["scaling"] != "sqrt_dk"]
    if name.startswith("length_"):
        return [r for r in rows if any(v and int(m[1]) > int(r["trained_length"]) for c, v in
                                       r.items() if (m := re.match(r"len(\d+)_", c)))]
    return rows


def settings(key: str) -> list[str]:
    """The runs.csv columns of the settings a study varies (runs.csv: run, scaling, the
    override keys, then the measurements from final_val_loss_full on)."""
    rows = runs_of(key)
    columns = list(rows[0])[1:list(rows[0]).index("final_val_loss_full")]
    return [c for c in columns if len({r[c] for r in rows}) > 1]


def compared(key: str) -> list[str]:
    """The keys a study's tables compare arms by: the scale, the length factor, the keys of
    its --against options, and the --pair keys where --one-control makes them arms."""
    options = STUDIES.get(key, [])
    named = [part.split("=")[0] for flag, item in zip(options, options[1:])
             if flag == "--against" or (flag == "--pair" and "--one-control" in options)
             for part in item.split(",")]
    return [c for c in settings(key) if c in ("scaling", "scaling.length", *named)]


# ------------------------------------------------------------------ the checks


def empty_axes(fig) -> list[str]:
    return [f"panel {i} ({ax.get_title()!r}) has no data or is turned off"
            for i, ax in enumerate(fig.axes) if not ax.axison or not has_data(ax)]


def overlapping_texts(fig) -> list[str]:
    renderer = rendered(fig)
    boxes = [(t.get_text()[:30], t.get_window_extent(renderer)) for t in texts(fig)]
    for legend in legends(fig):   # a legend's frame against the texts outside it
        inner = {id(t) for t in legend.get_texts()}
        frame = legend.get_window_extent(renderer)
        boxes += [(f"legend frame over {t.get_text()[:30]!r}", None) for t in texts(fig)
                  if id(t) not in inner and overlap(frame, t.get_window_extent(renderer))]
    bad = [name for name, box in boxes if box is None]
    for (n1, b1), (n2, b2) in itertools.combinations([b for b in boxes if b[1]], 2):
        if overlap(b1, b2):
            bad.append(f"{n1!r} overlaps {n2!r}")
    return bad


def covered(ax, box) -> int:
    """How many of the panel's plotted points lie inside a display-space box."""
    xy = drawn_points(ax)
    return int(((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0)
                & (xy[:, 1] < box.y1)).sum())


def legend_over_points(fig) -> list[str]:
    renderer = rendered(fig)
    bad = []
    for legend, ax in itertools.product(legends(fig), fig.axes):
        if n := covered(ax, legend.get_window_extent(renderer)):
            bad.append(f"a legend covers {n} point(s) of {ax.get_title()!r}")
    return bad


def texts_over_points(fig) -> list[str]:
    """A label written inside a panel (a reference level's name, say) covers none of its points."""
    renderer, bad = rendered(fig), []
    for ax in fig.axes:
        for text in ax.texts:
            if n := covered(ax, text.get_window_extent(renderer)):
                bad.append(f"{text.get_text()[:30]!r} written over {n} point(s)")
    return bad


def points_off_the_axes(fig) -> list[str]:
    """No point is drawn outside its panel: read in display coordinates, where it is drawn (a
    dodged line is moved after autoscaling has read its data); an error bar's point 3 pixels
    inside its panel's sides, off the frame."""
    rendered(fig)
    bad = []
    for ax in fig.axes:
        xy, box = drawn_points(ax), ax.bbox
        inset = 3.0 if any(isinstance(c, ErrorbarContainer) for c in ax.containers) else -0.5
        off = ((xy[:, 0] < box.x0 + inset) | (xy[:, 0] > box.x1 - inset)   # a bar off the frame
               | (xy[:, 1] < box.y0 - 0.5) | (xy[:, 1] > box.y1 + 0.5))
        if off.any():
            bad.append(f"{int(off.sum())} point(s) of {column_title(fig, ax)!r} drawn off its"
                       " axes")
    return bad


def texts_outside(fig) -> list[str]:
    renderer, frame = rendered(fig), fig.bbox
    return [f"{t.get_text()[:40]!r} outside the figure" for t in texts(fig)
            if not (frame.x0 - 1 <= (b := t.get_window_extent(renderer)).x0 and
                    b.x1 <= frame.x1 + 1 and frame.y0 - 1 <= b.y0 and b.y1 <= frame.y1 + 1)]


def duplicate_labels(fig) -> list[str]:
    return [f"{ax.get_title()!r}: {n} lines labelled {text!r}" for ax in fig.axes
            for text, n in Counter(t for t, _ in labelled(ax)).items() if n > 1]


def shared_colours(fig) -> list[str]:
    """Two arms (or two lines of other labels) of a panel never share a colour; the lines of
    one arm at two LRs may."""
    bad = []
    for ax in fig.axes:
        colours = {arm_of(text) or text: colour(artist) for text, artist in labelled(ax)}
        for c, n in Counter(colours.values()).items():
            if n > 1:
                bad.append(f"{ax.get_title()!r}: {sorted(a for a in colours if colours[a] == c)}"
                           f" share the colour {c}")
    return bad


def markers_shown(line) -> np.ndarray:
    """The display positions of a line's drawn markers (its markevery kept)."""
    if line.get_marker() in ("None", "", " ", None):
        return np.zeros((0, 2))
    xy = np.column_stack([np.asarray(line.get_xdata(), float),
                          np.asarray(line.get_ydata(), float)])
    every = line.get_markevery()
    start, step = (0, 1) if every is None else (0, every) if isinstance(every, int) else every
    xy = xy[start::step]
    return line.get_transform().transform(xy[np.isfinite(xy).all(axis=1)])


def hidden_markers(fig) -> list[str]:
    """No marker lies wholly under a marker of another line: centres a quarter of a marker
    apart or closer; two hollow markers of different shapes both show."""
    rendered(fig)
    bad = []
    for ax in fig.axes:
        shown = [(text, markers_shown(line), line.get_markersize() * fig.dpi / 72,
                  (line.get_marker(), str(line.get_markerfacecolor()) == "none"))
                 for text, line in labelled(ax) if isinstance(line, Line2D)]
        for (t1, p1, s1, m1), (t2, p2, s2, m2) in itertools.combinations(shown, 2):
            if len(p1) and len(p2) and not (m1[1] and m2[1] and m1[0] != m2[0]):
                apart = np.linalg.norm(p1[:, None, :] - p2[None, :, :], axis=2)
                if n := int((apart.min(axis=1) <= 0.25 * max(s1, s2)).sum()):
                    bad.append(f"{ax.get_title()!r}: {n} marker(s) of {t1!r} hidden under"
                               f" {t2!r}'s")
    return bad


def unreadable_x_ticks(fig) -> list[str]:
    """Every panel with data labels at least two x ticks within the x range of its data."""
    rendered(fig)
    bad = []
    for ax in fig.axes:
        xs = points(ax)[:, 0]
        if len(set(xs)) < 2:
            continue
        lo, hi = xs.min(), xs.max()
        shown = [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text().strip()
                 and lo - 1e-9 * abs(lo) <= t.get_position()[0] <= hi + 1e-9 * abs(hi)]
        if len(shown) < 2:
            bad.append(f"{column_title(fig, ax)!r}: x ticks labelled within its data"
                       f" ({lo:g} to {hi:g}): {shown}")
    return bad


def share(ylabel: str) -> bool:
    """Whether a panel's quantity is a share, from 0 to 1 (an accuracy, a weight)."""
    return any(w in ylabel.lower() for w in ("accuracy", "saturated", "/ ln", "weight"))


def quantity_range(ylabel: str, key: str) -> tuple[float, float]:
    """The range a panel's quantity can take, read from its y label: a loss is at most the
    highest loss recorded (at init, as a rule)."""
    text = ylabel.lower()
    if share(text):
        return 0.0, 1.0
    if "entropy" in text:
        blocks = [float(c["settings"].get("model.block_size", 64)) for c in curves_of(key)]
        return 0.0, math.log(max(blocks or [64.0]))
    losses = [e.get("val_loss") for c in curves_of(key) for e in c["evals"]]
    losses += [float(r["init_val_loss"]) for r in runs_of(key) if r["init_val_loss"]]
    top = max(v for v in losses if v is not None and math.isfinite(v))
    if "−" in text or " - " in text:   # a difference of losses: within the losses drawn
        return -top, top
    return (0.0, top) if "loss" in text else (0.0, math.inf)   # a loss: up to the highest


def interval_artists(ax) -> list:
    return [c for c in ax.collections if isinstance(c, (PolyCollection, LineCollection))]


def ylabel_of(fig, ax) -> str:
    """A panel's y label, or that of the panel at the start of its row."""
    if ax.get_ylabel():
        return ax.get_ylabel()
    row = [a for a in fig.axes if a.get_ylabel() and abs(
        a.get_position().y0 - ax.get_position().y0) < 1e-6]
    return row[0].get_ylabel() if row else ""


def intervals_out_of_range(fig, key: str) -> list[str]:
    bad = []
    for ax in fig.axes:
        low, high = quantity_range(ylabel_of(fig, ax), key)
        for artist in interval_artists(ax):
            ys = np.concatenate([p.vertices[:, 1] for p in artist.get_paths()] or [[]])
            ys = ys[np.isfinite(ys)]
            if ys.size and (ys.min() < low - 1e-9 or ys.max() > high + 1e-9):
                bad.append(f"an interval of {ax.get_title()!r} spans {ys.min():.3g} to"
                           f" {ys.max():.3g}, outside [{low:g}, {high:g}]")
    return bad


def intervals_at_small_n(fig) -> list[str]:
    ns = [int(n) for n in re.findall(r"n\s*=\s*(\d+)", title(fig))]
    if not ns:
        return [f"the title names no n: {title(fig)[:80]!r}"]
    drawn = any(interval_artists(ax) for ax in fig.axes)
    bad = []
    if min(ns) <= 2 and drawn and "no intervals" not in title(fig):
        bad.append(f"intervals drawn at n = {min(ns)}")
    if min(ns) <= 2 and "no intervals" not in title(fig):
        bad.append(f"n = {min(ns)} without 'no intervals' in the title")
    if drawn and max(ns) <= 2:
        bad.append(f"intervals drawn where every n <= 2 ({title(fig)[:60]!r})")
    return bad


def legend_looks(fig) -> list[tuple[str, str, object]]:
    """(arm, colour, marker or None where the entry shows none) of each arm's legend entry."""
    found = []
    for leg in legends(fig):
        for text, handle in zip([t.get_text() for t in leg.get_texts()], leg.legend_handles):
            if (arm := arm_of(text)) and isinstance(handle, (Line2D, LineCollection)):
                shown = isinstance(handle, Line2D) and str(handle.get_marker()).lower() != "none"
                found.append((arm, to_hex(handle.get_color()[0] if isinstance(
                    handle, LineCollection) else handle.get_color()),
                              handle.get_marker() if shown else None))
    return found


def colours_off_the_map(figures: dict) -> list[str]:
    entries = [(name, *look) for name, fig in figures.items() for look in legend_looks(fig)]
    looks = palette(sorted({arm for _, arm, *_ in entries}))
    return [f"{name}: {arm} drawn {drawn} {marker or ''}, the map says {looks[arm][:2]}"
            for name, arm, drawn, marker in entries
            if drawn != to_hex(looks[arm][0]) or marker not in (None, looks[arm][1])]


def numeric(text: str) -> bool:
    """Whether a tick label is a number (mathtext powers of ten included)."""
    return re.fullmatch(r"[-+−0-9.eE×]+", re.sub(r"\\mathdefault|\\times|[${}^,\\ ]", "",
                                                  text)) is not None


def categorical_joins(fig) -> list[str]:
    bad = []
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        categorical = labels and not all(map(numeric, labels))
        joined = [line for line in data_lines(ax) if len(line.get_xdata()) > 1
                  and line.get_linestyle() not in ("None", "", " ")]
        if categorical and joined:
            bad.append(f"{ax.get_title()!r}: a line joins categorical x positions")
    return bad


def hidden_on_log_axes(fig) -> list[str]:
    bad = []
    for ax in fig.axes:
        for line, axis in itertools.product(data_lines(ax), "xy"):
            if getattr(ax, f"get_{axis}scale")() != "log":
                continue
            values = np.asarray(getattr(line, f"get_{axis}data")(), float)
            if (values[np.isfinite(values)] <= 0).any():
                bad.append(f"{ax.get_title()!r}: a value <= 0 on a log {axis} axis (hidden)")
    return bad


def losses_a_decade_apart_on_a_linear_axis(fig) -> list[str]:
    """Losses 10x apart or more (solved runs near 0 beside failed ones) need a log y axis; a
    difference of losses ("loss − ...", 0 at step 0) is not a loss."""
    bad = []
    for ax in fig.axes:
        ys, label = points(ax)[:, 1], ax.get_ylabel()
        if ("loss" in label and "−" not in label and ax.get_yscale() == "linear" and len(ys)
                and (ys > 0).all() and ys.max() >= 10 * ys.min()):
            bad.append(f"{ax.get_title()!r}: losses {ys.min():.3g} to {ys.max():.3g} on a"
                       " linear y axis")
    return bad


def off_the_learning_rates(fig, key: str) -> list[str]:
    lrs = {float(r["optim.lr"]) for r in runs_of(key) if r.get("optim.lr")}
    bad = []
    for ax in fig.axes:
        if "learning rate" not in ax.get_xlabel():
            continue
        xs = points(ax)[:, 0]
        off = [x for x in xs if not any(math.isclose(x, lr, rel_tol=1e-9) for lr in lrs)]
        if off:
            bad.append(f"{ax.get_title()!r}: points at x = {off[:3]}, not an LR run")
    return bad


def clipped(row: dict) -> float:
    """A run's final loss clipped at its loss at init, as the LR figures read it."""
    loss, init = float(row["final_val_loss_full"]), float(row["init_val_loss"])
    return init if not math.isfinite(loss) else min(loss, init)


def arithmetic_means_on_log_axes(fig, key: str) -> list[str]:
    """On a log y axis each point of a learning-rate panel is the geometric mean of one
    group's clipped losses at that LR over its seeds (recomputed from runs.csv)."""
    columns = [c for c in settings(key) if c != "trainer.seed"]   # optim.lr among them
    seeds = {}
    for row in runs_of(key):
        seeds.setdefault(tuple(row[c] for c in columns), []).append(clipped(row))
    means = [(float(group[columns.index("optim.lr")]), math.exp(np.mean(np.log(losses))))
             for group, losses in seeds.items()] if "optim.lr" in columns else []
    bad = []
    for ax in fig.axes:
        if "learning rate" not in ax.get_xlabel() or ax.get_yscale() != "log":
            continue
        for text, line in labelled(ax):
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                if not any(math.isclose(x, lr, rel_tol=1e-9) and math.isclose(y, m, rel_tol=1e-6)
                           for lr, m in means):
                    bad.append(f"{ax.get_title()!r}: {text} at lr {x:g} drawn at {y:.4g}, not"
                               " the geometric mean of its seeds")
    return bad


def arms_not_drawn(fig, key: str, name: str) -> list[str]:
    """The figure draws a line for every group (the runs' settings but seed and LR) it should
    (drawn_rows), counted as the distinct (column of
    panels, arm) pairs of its labelled lines (a width figure's lines name widths)."""
    if name.startswith("heads_"):
        return []
    drawn = {(column_title(fig, ax), arm_of(text) or text) for ax in fig.axes
             for text, _ in labelled(ax) if arm_of(text) or text.startswith("d_model=")}
    columns = [c for c in settings(key) if c not in ("trainer.seed", "optim.lr")]
    want = {tuple(r[c] for c in columns) for r in drawn_rows(fig, key, name)}
    return [] if len(drawn) >= len(want) else [
        f"{len(drawn)} arm lines drawn for the {len(want)} groups of its runs"]


def arms_unnamed(fig, key: str, name: str) -> list[str]:
    """The figure's line labels tell apart every arm its runs compare (compared) in a setting
    (a panel): the one legend of the figure names each arm once, and a label stands for one
    arm there (--label may give one arm's values at two widths the same words)."""
    names = {arm for ax in fig.axes for text, _ in labelled(ax) if (arm := arm_of(text))}
    keys = compared(key)
    rest = [c for c in settings(key) if c not in (*keys, "trainer.seed", "optim.lr")]
    arms = {}
    for r in drawn_rows(fig, key, name):
        arms.setdefault(tuple(r[c] for c in rest), set()).add(tuple(r[c] for c in keys))
    most = max(map(len, arms.values()), default=0)
    return [] if not names or len(names) >= most else [
        f"{len(names)} arm labels ({sorted(names)}) for the {most} arms of {keys} in a setting"]


def claims(fig) -> list[str]:
    """What a title says is absent is absent: no q or k means no q, k or q.k row."""
    bad = []
    if "no q or k" in title(fig):
        rows = [ax.get_ylabel() for ax in fig.axes if re.search(r"\bq\b|\bk\b|q\.k",
                                                                 ax.get_ylabel())]
        if rows:
            bad.append(f"says 'no q or k' and draws {rows}")
    return bad


def axes_without_units(fig) -> list[str]:
    """Every loss axis says nats; an accuracy axis, that it is a fraction; a learning-rate
    axis, which LR (optim.lr, the schedule's peak)."""
    return [f"{column_title(fig, ax)!r}: {text!r} does not say {unit}" for ax in fig.axes
            for text in (ax.get_xlabel(), ax.get_ylabel()) for what, unit in UNITS
            if re.search(what, text, re.IGNORECASE) and unit not in text]


def rgb(colours) -> set[str]:
    """The colours of an artist's colour array, without alpha."""
    return {to_hex(c) for c in np.atleast_2d(colours) if len(c)} if len(colours) else set()


def squeezed_arms(fig) -> list[str]:
    """The compared arms (every arm but the control: its lines, seed points, bands and bars, by
    their colour) fill at least 40% of each panel's height: a control or reference level far
    from them goes to its own panel or to the axis's edge. A share drawn over its whole range,
    0 to 1, is drawn so on purpose."""
    rendered(fig)
    bad = []
    for ax in fig.axes:
        if share(ylabel_of(fig, ax)) and np.ptp(ax.get_ylim()) >= 1:
            continue
        arms = {colour(line) for text, line in labelled(ax) if isinstance(line, Line2D)
                and (arm := arm_of(text)) and arm.split(",")[0] != CONTROL}
        ys = [line.get_transform().transform(xy_of(line))[:, 1] for line in data_lines(ax)
              if colour(line) in arms]
        ys += [c.get_transform().transform(path.vertices)[:, 1] for c in ax.collections
               if (rgb(c.get_facecolor()) | rgb(c.get_edgecolor())) & arms
               for path in c.get_paths() if len(path.vertices)]
        ys = np.concatenate([np.zeros(0), *ys])
        ys = ys[np.isfinite(ys)]
        if len(ys) and 1 < np.ptp(ys) < 0.4 * ax.bbox.height:
            bad.append(f"{column_title(fig, ax)!r}: the compared arms fill"
                       f" {np.ptp(ys) / ax.bbox.height:.0%} of the panel's height")
    return bad


def legends_not_words(fig) -> list[str]:
    """Legends read as words: no number of more than 4 significant digits (0.005946035575)."""
    return [f"legend entry {text!r}" for leg in legends(fig)
            for text in (t.get_text() for t in leg.get_texts())
            if any(len(m.replace(".", "").lstrip("0")) > 4
                   for m in re.findall(r"\d+(?:\.\d+)?", text))]


def shared_level_styles(fig) -> list[str]:
    """No two reference lines (levels, marks across a panel) of other names share a colour and
    dash pattern (a name is its label less a trailing value), nor one an arm's dash pattern."""
    names = {}
    for ax in fig.axes:
        for line in ax.lines:
            if line not in data_lines(ax) and not line.get_label().startswith("_"):
                look = (colour(line), line.get_linestyle(), str(line._unscaled_dash_pattern))
                names.setdefault(look, set()).add(re.sub(r"[-\d.]+$", "", line.get_label()))
    arms = {dashes(line): line.get_label() for ax in fig.axes for line in data_lines(ax)
            if line.get_linestyle() not in ("-", "None")}
    return [f"reference lines {sorted(n)} share the style {look}" for look, n in names.items()
            if len(n) > 1] + [f"reference line {line.get_label()!r} dashed as {arms[d]!r}"
                              for ax in fig.axes for line in ax.lines if line not in
                              data_lines(ax) and not line.get_label().startswith("_")
                              and (d := dashes(line)) in arms]


def dashes(line) -> str:
    """A line's dash pattern as it reads: dots (no dash longer than 1.5 widths) all alike."""
    on = line._unscaled_dash_pattern[1] or ()
    return "dots" if on and max(on[::2]) <= 1.5 else str(on)


def outcome(row: dict) -> tuple[bool, bool]:
    """A run's outcome: whether it failed, and whether it solved the task (recall runs)."""
    return row["failed"] == "true", bool(row.get("steps_to_90"))


@functools.cache
def seed_groups(key: str, lr_axis: bool) -> list[tuple]:
    """(LR, each seed's value, whether its seeds split between solving and failing) per group
    of the study's runs (its settings but seed): the clipped loss on a learning-rate axis, else
    the final loss of the runs that did not fail."""
    columns = [c for c in settings(key) if c != "trainer.seed"]
    groups = {}
    for row in runs_of(key):
        if lr_axis or row["failed"] != "true":
            groups.setdefault(tuple(row[c] for c in columns), []).append(row)
    return [(float(rows[0].get("optim.lr") or math.nan),
             [clipped(r) if lr_axis else float(r["final_val_loss_full"]) for r in rows],
             len({outcome(r) for r in rows}) > 1) for rows in groups.values()]


def own_lines(ax) -> set:
    """The lines that are part of a container (an error bar's data line and caps)."""
    return {id(line) for c in ax.containers if isinstance(c, ErrorbarContainer)
            for line in (c.lines[0], *c.lines[1]) if line is not None}


def seeds_alone(fig, key: str) -> list[str]:
    """A mean of 2 seeds, and a geometric mean of seeds that split between solving and failing,
    is drawn with each seed's point: an unlabelled point of its colour at its x. On a
    learning-rate or final-loss panel each mean is matched to the group of runs.csv it is the
    mean of; on a step panel of a figure whose title says n = 2, each line needs two."""
    ns = {int(n) for n in re.findall(r"n\s*=\s*(\d+)", title(fig))}
    bad = []
    for ax in fig.axes:
        lr_axis, log = "learning rate" in ax.get_xlabel(), ax.get_yscale() == "log"
        means = [(t, line) for t, line in labelled(ax) if isinstance(line, Line2D)
                 and (arm_of(t) or t.startswith("d_model="))]
        seeds = [line for line in data_lines(ax) if line.get_label().startswith("_")
                 and id(line) not in own_lines(ax)]
        for text, line in means:
            spots = [xy_of(s) for s in seeds if colour(s) == colour(line)]
            if ax.get_xlabel() == "step":
                if ns == {2} and len(spots) < 2:
                    bad.append(f"{column_title(fig, ax)!r}: {text} a mean of 2 seeds alone")
                continue
            if not lr_axis and "final val loss" not in ylabel_of(fig, ax):
                continue
            spots = np.concatenate([np.zeros((0, 2)), *spots])
            for (x, y), (lr, values, split) in itertools.product(
                    xy_of(line), seed_groups(key, lr_axis)):
                mean = math.exp(np.mean(np.log(values))) if log else np.mean(values)
                if ((lr_axis and not math.isclose(x, lr, rel_tol=1e-9))
                        or not math.isclose(y, mean, rel_tol=1e-6)
                        or not (len(values) == 2 or (log and split))):
                    continue
                alone = [v for v in values if not any(math.isclose(px, x, rel_tol=1e-9)
                                                      and math.isclose(py, v, rel_tol=1e-6)
                                                      for px, py in spots)]
                if alone:
                    bad.append(f"{column_title(fig, ax)!r}: {text} at x = {x:g} drawn as the"
                               f" mean of {len(values)} seeds{' that split' * split} without"
                               f" each seed's point ({alone})")
    return bad


def arm_parts(row: dict, key: str) -> set:
    """A runs.csv row's arm as the figures name it, as a set of its parts: its scale, and each
    key it is compared by at other than its most common value (short_key=value)."""
    common = {c: Counter(r[c] for r in runs_of(key)).most_common(1)[0][0] for c in compared(key)}
    return {row["scaling"], *(f"{c.rsplit('.', 1)[-1]}={row[c]}" for c in compared(key)
                              if c != "scaling" and row[c] != common[c])}


def stability_styles(fig, key: str, name: str) -> list[str]:
    """lr_stability.png's line styles mean one thing each: solid, an arm's highest LR at and
    below which no run failed; dashed, its lowest LR where one failed; the legend says so, with
    no second meaning."""
    if name != "lr_stability.png":
        return []
    bad = [f"legend entry {t!r} gives its style a second meaning" for leg in legends(fig)
           for t in (x.get_text() for x in leg.get_texts()) if re.search(r"\(.*:.*\)", t)]
    bad += [f"legend entry {h.get_label()!r} drawn {h.get_linestyle()!r}: an arm's entry is"
            " solid, dashes mean the LR" for leg in legends(fig) for h in leg.legend_handles
            if h.get_linestyle() not in ("-", "None") and h.get_marker() not in ("None", "")]
    for ax in fig.axes:
        for text, line in labelled(ax):
            arm, _, lr = text.rpartition(", lr ")
            rows = [r for r in runs_of(key) if arm_parts(r, key) == set(arm.split(", "))]
            lrs = sorted({float(r["optim.lr"]) for r in rows})
            failed = {float(r["optim.lr"]) for r in rows if r["failed"] == "true"}
            stable = max((x for x in lrs if not any(f <= x for f in failed)), default=None)
            first = min(failed, default=None)
            want = {"-": stable, "--": first}.get(line.get_linestyle())
            if want is None or not math.isclose(float(lr), want):
                bad.append(f"{text!r} drawn {line.get_linestyle()!r}: solid is the highest"
                           f" stable LR ({stable}), dashed the first failing ({first})")
    return bad


def held_out(key: str):
    """Whether the seeds drawn are held out from the LR choice (None: no LR chosen)."""
    if "--select-from" in STUDIES.get(key, []):
        return True
    return False if len({r.get("optim.lr") for r in runs_of(key)}) > 1 else None


def run_set(fig, name: str, key: str) -> list[str]:
    """A title names the seeds as they are, held out or not; a step figure's arm is drawn at its
    LR."""
    if name not in SEED_FIGURES or (held := held_out(key)) is None:
        return []
    text = " ".join(title(fig).split())
    says_held = re.search(r"(?<!not )held[- ]out", text) is not None
    bad = []
    if says_held != held or (not held and "not held out" not in text):
        bad.append(f"seeds {'held out' if held else 'not held out'}, title: {text[:120]!r}")
    labels = [t.get_text() for leg in legends(fig) for t in leg.get_texts()]
    for arm, lr in CHOSEN_LRS.get(key, {}).items():
        shown = [s for s in labels if arm_of(s) == arm]
        if shown and not any(s.startswith(f"{arm}, lr {lr:g}") for s in shown):
            bad.append(f"{arm} not labelled as drawn at lr {lr:g}: {labels}")
    return bad


def any_figure(fig) -> list[str]:
    return (empty_axes(fig) + overlapping_texts(fig) + legend_over_points(fig)
            + texts_over_points(fig) + points_off_the_axes(fig) + texts_outside(fig)
            + categorical_joins(fig) + hidden_on_log_axes(fig) + duplicate_labels(fig)
            + shared_colours(fig) + hidden_markers(fig) + unreadable_x_ticks(fig)
            + axes_without_units(fig) + squeezed_arms(fig) + legends_not_words(fig)
            + shared_level_styles(fig))


def study_figure(fig, key: str, name: str) -> list[str]:
    """The checks that read the study's runs.csv and curves.jsonl, and the seeds in titles."""
    return (intervals_out_of_range(fig, key) + intervals_at_small_n(fig)
            + losses_a_decade_apart_on_a_linear_axis(fig) + off_the_learning_rates(fig, key)
            + arithmetic_means_on_log_axes(fig, key) + arms_not_drawn(fig, key, name)
            + arms_unnamed(fig, key, name) + seeds_alone(fig, key)
            + stability_styles(fig, key, name) + claims(fig) + run_set(fig, name, key))


# ------------------------------------------------------------------ the tests


def test_every_committed_study_is_redrawn_by_a_command_of_its_presets_header():
    studies = {str(p.parent.relative_to(DOCS)) for p in RESULTS.rglob("results.md")}
    assert set(STUDIES) == studies


def test_every_committed_figure_is_drawn_and_every_drawn_figure_is_committed(drawn):
    for key in [*STUDIES, "figures", "figures/coord_check"]:
        assert sorted(drawn[key]) == committed(key), key
        assert key == "figures" or key.startswith("figures/") or 1 <= len(drawn[key]) <= 3, key


def test_every_figure_the_report_draws_is_checked_on_a_study_or_fixture(drawn):
    from scripts.plot_runs import FIGURES
    assert set(FIGURES) <= {name for key in drawn for name in drawn[key]}


@pytest.mark.parametrize("key, name", cases())
def test_the_figure_keeps_the_contract(drawn, key, name):
    fig = drawn[key][name][0]
    problems = any_figure(fig) + (study_figure(fig, key, name) if key != "figures" and
                                  not key.startswith("figures/") else [])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("key, name", [c for c in cases() if c[0] not in FIXTURES])
def test_the_committed_png_is_what_the_code_draws(drawn, key, name):
    assert compare_images(str(DOCS / key / name), str(drawn[key][name][1]), TOLERANCE) is None


@pytest.mark.parametrize("key, name", [c for c in cases() if c[0] not in FIXTURES])
def test_every_committed_figure_is_cited_in_the_docs(key, name):
    """Cited by its path (`docs/results/<study>/<figure>`), not only in results.md's list."""
    text = "\n".join((ROOT / path).read_text() for path in CITING)
    assert f"{key}/{name}" in text


@pytest.mark.parametrize("key", [*STUDIES, *FIXTURES])
def test_each_arm_has_the_one_maps_colour_and_marker_in_every_figure(drawn, key):
    problems = colours_off_the_map({name: fig for name, (fig, _) in drawn[key].items()})
    assert not problems, "\n".join(problems)


def test_an_arm_looks_the_same_in_every_figure_of_every_study(drawn):
    """Sibling figures (length_text and length_lookup, reparam and reparam_recall) included:
    one colour per arm, one marker where its legend entry shows one."""
    colours, markers = {}, {}
    for key, figures in drawn.items():
        for name, (fig, _) in figures.items():
            for arm, colour_, marker in legend_looks(fig):
                colours.setdefault(arm, {}).setdefault(colour_, set()).add(f"{key}/{name}")
                if marker:
                    markers.setdefault(arm, {}).setdefault(marker, set()).add(f"{key}/{name}")
    problems = [f"{arm}: {seen}" for looks in (colours, markers) for arm, seen in looks.items()
                if len(seen) > 1]
    assert not problems, "\n".join(problems)


def fingerprint(fig) -> list:
    """What a figure draws, artist by artist, as JSON: its title, each panel's texts, scales and
    limits, each line's label, look and points, each collection's colours, the legends'
    entries."""
    found = [title(fig), [t.get_text() for leg in legends(fig) for t in leg.get_texts()]]
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale(),
                  ax.get_yscale(), [*ax.get_xlim(), *ax.get_ylim()],
                  [t.get_text() for t in ax.texts]]
        found += [[line.get_label(), colour(line), str(line.get_marker()),
                   str(line._unscaled_dash_pattern), xy_of(line).tolist()] for line in ax.lines]
        found += [[type(c).__name__, [to_hex(x) for x in c.get_facecolor()],
                   [to_hex(x) for x in c.get_edgecolor()]] for c in ax.collections]
    return json.loads(json.dumps(found, default=float))


# A fork adds a scale and a normaliser as docs/scaling.md says: a row last in model/config.py's
# SCALES and NORMALISERS, before anything that reads them is imported. It then draws every
# committed study's figures (not rendered) and prints their fingerprints.
FORK = """
import functools, json, sys
from model import config
config.SCALES["fork_scale"] = config.Scale(lambda d, c, C: 0.5)
config.SCALINGS = tuple(config.SCALES)
config.NORMALISERS["fork_normaliser"] = config.NORMALISERS["softmax"]
import test_figure_contract as contract
from scripts import plot_runs
plot_runs.write_report = lambda *args: None   # the figures only
figures = contract.draw({key: functools.partial(contract.redraw, key, options)
                         for key, options in contract.STUDIES.items()}, contract.Path(sys.argv[1]),
                        write=False)
print(json.dumps({f"{key}/{name}": contract.fingerprint(fig) for key, drawn in figures.items()
                  for name, (fig, _) in drawn.items()}))
"""


def test_a_forks_new_scale_and_normaliser_change_no_committed_figure(drawn, tmp_path):
    """Looks follow an arm's name, not its place in SCALINGS: a fork's new scale and normaliser
    redraw every committed study's figures as they are, artist by artist."""
    done = subprocess.run([sys.executable, "-c", FORK, str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "report")])})
    assert done.returncode == 0, done.stderr[-3000:]
    fork = json.loads(done.stdout.splitlines()[-1])
    changed = [f"{key}/{name}" for key in STUDIES for name, (fig, _) in drawn[key].items()
               if fork[f"{key}/{name}"] != fingerprint(fig)]
    assert not changed, f"{len(changed)} of the committed figures change: {changed}"
