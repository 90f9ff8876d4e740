"""The figure contract of docs/report.md ("The figures and what they promise"), checked on the drawn
matplotlib objects of every committed study: each study's figures are drawn from its committed
runs.csv and curves.jsonl by the --from-csv command of its preset's header (STUDIES), and every
figure is checked (not rendered to a file: savefig keeps the Figure). The figures no committed
study draws yet are drawn from small fixtures of real shrunk runs (FIXTURES):

- no empty axes (a panel without data is dropped, not labelled empty);
- no text box overlaps another (titles, labels, tick labels, legend entries, legend frames);
- no legend box and no label inside a panel over a plotted point, and no point outside its
  panel's view;
- every text inside the figure;
- every band and error bar inside its quantity's range, and none at n <= 2, where the title
  says "no intervals";
- each arm's colour and marker are the one map's (style.palette);
- no line joins categorical x positions; a log axis holds no value <= 0 (which it would hide);
  points on a learning-rate axis lie at the learning rates run;
- the title names the seeds as the run set is (held out, or not), and the LR each arm is drawn at.
"""

import contextlib
import csv
import functools
import io
import itertools
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import ROOT, report_in_process
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from model.config import SCALINGS
from scripts.report.style import palette

RESULTS = ROOT / "docs" / "results"
# study folder -> (options of its --from-csv command, whether the step curves' seeds are held
# out from the LR choice, {arm: the LR its step curves must be drawn at})
STUDIES = {
    "lr_stability": (["--pair", "scaling.softcap=null", "--pair", "optim.qk_clip=null",
                      "--pair", "trainer.z_loss=0", "--one-control"], False, {}),
    "recall_fallback": (["--heads", "trainer.seed=2"], None, {}),
    "recall_headline": (["--heads", "scaling=none,optim.lr=7.5e-4,trainer.seed=1"], False,
                        {"none": 0.00075, "sqrt_dk": 0.024}),
    "recall_headline/long": (["--select-from", "docs/results/recall_headline/runs.csv"], True,
                             {"none": 0.00075, "sqrt_dk": 0.024}),
    "recall_scaling": (["--select-from", "docs/results/recall_scaling_select/runs.csv",
                        "--pair", "model.qk_init_std=0.02"], True, {}),
    "recall_scaling_select": ([], False, {}),
    "scaling_ablation": (["--select-from", "docs/results/scaling_ablation_select/runs.csv"],
                         True, {}),
    "scaling_ablation_select": ([], False, {}),
    "reparam": (["--against", "scaling=sqrt_dk,model.qk_init_std=null,optim.qk_lr_mult=1",
                          "--against", "scaling=none,model.qk_init_std=null,optim.qk_lr_mult=1"],
                         None, {}),
    "reparam_recall": (["--against", "scaling=sqrt_dk,model.qk_init_std=0.125,optim.qk_lr_mult=1",
                        "--against", "scaling=none,model.qk_init_std=0.125,optim.qk_lr_mult=1"],
                       None, {}),
    "width_transfer": ([], None, {}),
    "width_transfer/seed2": ([], None, {}),
    "length_generalisation": ([], None, {}),
    "length_generalisation_lookup": ([], None, {}),
    "length_lookup": ([], None, {}),
    "length_text": ([], None, {}),
}
# fixture folder of tests/report/fixtures -> the figures its runs draw (no PNG is committed):
# 20-step runs of experiment=length_generalisation_lookup (seeds 1-3, scaling.length fixed,
# log_n, ssmax) and of the default run with trainer.eval_lengths=[64,1024] (model.pos=nope,
# seeds 1-2, fixed and log_n, trainer.full_eval_tokens=4096)
FIXTURES = {"length_lookup": ["accuracy_curves.png", "diagnostics.png", "length_lookup.png",
                              "loss_curves.png", "qk_grad_norms.png"],
            "length_text": ["diagnostics.png", "length_text.png", "loss_curves.png",
                            "qk_grad_norms.png"]}
STEP_FIGURES = ("loss_curves.png", "accuracy_curves.png", "loss_vs_baseline.png",
                "diagnostics.png", "qk_grad_norms.png")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{study: {figure file name: Figure}}, drawn by the study's command (not rendered)."""
    figures, out = {}, tmp_path_factory.mktemp("contract")
    keep = Figure.savefig
    try:
        for study, (options, _, _) in STUDIES.items():
            shown = figures[study] = {}
            Figure.savefig = lambda fig, fname, shown=shown, **kw: shown.update(
                {Path(fname).name: fig})
            with contextlib.redirect_stdout(io.StringIO()):   # results.md, printed
                code = report_in_process("--from-csv", folder(study) / "runs.csv", "--out",
                                         out / study.replace("/", "_"), *options)
            assert code == 0, study
    finally:
        Figure.savefig = keep
        plt.close("all")
    return figures


def cases():
    return [(study, name) for study in STUDIES for name in committed(study)]


def folder(study: str) -> Path:
    return ROOT / "tests" / "report" / "fixtures" / study if study in FIXTURES else RESULTS / study


def committed(study: str) -> list[str]:
    return FIXTURES.get(study) or sorted(p.name for p in (RESULTS / study).glob("*.png"))


@functools.cache   # committed files, read once per study, not once per panel
def runs_of(study: str) -> list[dict]:
    with open(folder(study) / "runs.csv", newline="") as f:
        return list(csv.DictReader(f))


@functools.cache
def curves_of(study: str) -> list[dict]:
    path = folder(study) / "curves.jsonl"
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
    """The lines drawn in data coordinates (not axhline's reference lines)."""
    return [line for line in ax.lines if line.get_transform() == ax.transData
            and not line.get_label().startswith("_ref")]


def points(ax) -> np.ndarray:
    """Every finite (x, y) data point of the panel's lines and error bars, in data units."""
    xy = [np.column_stack([np.asarray(line.get_xdata(), float),
                           np.asarray(line.get_ydata(), float)]) for line in data_lines(ax)
          if line.get_marker() not in ("None", "", " ", None) or len(line.get_xdata()) > 1]
    xy = [a for a in xy if a.size]
    if not xy:
        return np.zeros((0, 2))
    xy = np.concatenate(xy)
    return xy[np.isfinite(xy).all(axis=1)]


def has_data(ax) -> bool:
    return len(points(ax)) > 0 or any(isinstance(c, PolyCollection) for c in ax.collections)


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
    xy = ax.transData.transform(points(ax)) if len(points(ax)) else np.zeros((0, 2))
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
    bad = []
    for ax in fig.axes:
        xy = points(ax)
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        tol = 1e-9 * max(abs(y0), abs(y1), 1e-300)
        off = (xy[:, 1] < y0 - tol) | (xy[:, 1] > y1 + tol) | (xy[:, 0] < x0) | (xy[:, 0] > x1)
        if off.any():
            bad.append(f"{int(off.sum())} point(s) of {ax.get_title()!r} off its axes")
    return bad


def texts_outside(fig) -> list[str]:
    renderer, frame = rendered(fig), fig.bbox
    return [f"{t.get_text()[:40]!r} outside the figure" for t in texts(fig)
            if not (frame.x0 - 1 <= (b := t.get_window_extent(renderer)).x0 and
                    b.x1 <= frame.x1 + 1 and frame.y0 - 1 <= b.y0 and b.y1 <= frame.y1 + 1)]


def quantity_range(ylabel: str, study: str) -> tuple[float, float]:
    """The range a panel's quantity can take, read from its y label: a loss is at most the
    highest loss recorded (at init, as a rule)."""
    text = ylabel.lower()
    if "accuracy" in text or "saturated" in text or "/ ln" in text or "weight" in text:
        return 0.0, 1.0
    if "entropy" in text:
        blocks = [float(c["settings"].get("model.block_size", 64)) for c in curves_of(study)]
        return 0.0, math.log(max(blocks or [64.0]))
    losses = [e.get("val_loss") for c in curves_of(study) for e in c["evals"]]
    losses += [float(r["init_val_loss"]) for r in runs_of(study) if r["init_val_loss"]]
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


def intervals_out_of_range(fig, study: str) -> list[str]:
    bad = []
    for ax in fig.axes:
        low, high = quantity_range(ylabel_of(fig, ax), study)
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


def arm_of(text: str):
    """The arm a legend entry names (its text up to ", lr"), or None for other entries."""
    arm = text.split(" (n=")[0].split(", lr ")[0]
    return arm if arm.split(",")[0] in SCALINGS else None


def colours_off_the_map(figures: dict) -> list[str]:
    entries = [(name, leg, text, handle) for name, fig in figures.items()
               for leg in legends(fig)
               for text, handle in zip([t.get_text() for t in leg.get_texts()],
                                       leg.legend_handles)]
    arms = sorted({arm for *_, text, _ in entries if (arm := arm_of(text))})
    looks = palette(arms)
    bad = []
    for name, _, text, handle in entries:
        arm = arm_of(text)
        if arm is None or not isinstance(handle, (Line2D, LineCollection)):
            continue
        colour, marker = looks[arm][:2]
        drawn = to_hex(handle.get_color()[0] if isinstance(handle, LineCollection)
                       else handle.get_color())
        shown = isinstance(handle, Line2D) and str(handle.get_marker()).lower() != "none"
        if drawn != to_hex(colour) or (shown and handle.get_marker() != marker):
            bad.append(f"{name}: {arm} drawn {drawn}"
                       f" {handle.get_marker() if shown else ''}, the map says {colour} {marker}")
    return bad


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


def off_the_learning_rates(fig, study: str) -> list[str]:
    lrs = {float(r["optim.lr"]) for r in runs_of(study) if r.get("optim.lr")}
    bad = []
    for ax in fig.axes:
        if ax.get_xlabel() != "learning rate":
            continue
        xs = points(ax)[:, 0]
        off = [x for x in xs if not any(math.isclose(x, lr, rel_tol=1e-9) for lr in lrs)]
        if off:
            bad.append(f"{ax.get_title()!r}: points at x = {off[:3]}, not an LR run")
    return bad


def claims(fig) -> list[str]:
    """What a title says is absent is absent: no q or k means no q, k or q.k row."""
    bad = []
    if "no q or k" in title(fig):
        rows = [ax.get_ylabel() for ax in fig.axes if re.search(r"\bq\b|\bk\b|q\.k",
                                                                 ax.get_ylabel())]
        if rows:
            bad.append(f"says 'no q or k' and draws {rows}")
    return bad


def run_set(fig, name: str, held_out, lrs: dict) -> list[str]:
    """A step figure's title names the seeds as they are; an arm is drawn at its LR."""
    if name not in STEP_FIGURES or held_out is None:
        return []
    text = " ".join(title(fig).split())
    says_held = re.search(r"(?<!not )held[- ]out", text) is not None
    bad = []
    if says_held != held_out or (not held_out and "not held out" not in text):
        bad.append(f"seeds {'held out' if held_out else 'not held out'}, title: {text[:120]!r}")
    labels = [t.get_text() for leg in legends(fig) for t in leg.get_texts()]
    for arm, lr in lrs.items():
        shown = [s for s in labels if arm_of(s) == arm]
        if shown and not any(s.startswith(f"{arm}, lr {lr:g}") for s in shown):
            bad.append(f"{arm} not labelled as drawn at lr {lr:g}: {labels}")
    return bad


# ------------------------------------------------------------------ the tests


def test_every_committed_figure_is_drawn_and_every_drawn_figure_is_committed(drawn):
    for study in STUDIES:
        assert sorted(drawn[study]) == committed(study), study


@pytest.mark.parametrize("study, name", cases())
def test_the_figure_keeps_the_contract(drawn, study, name):
    fig = drawn[study].get(name)
    assert fig is not None, f"{study}/{name} is committed but not drawn"
    _, held_out, lrs = STUDIES[study]
    problems = (empty_axes(fig) + overlapping_texts(fig) + legend_over_points(fig)
                + texts_over_points(fig)
                + points_off_the_axes(fig) + texts_outside(fig)
                + intervals_out_of_range(fig, study) + intervals_at_small_n(fig)
                + categorical_joins(fig) + hidden_on_log_axes(fig)
                + losses_a_decade_apart_on_a_linear_axis(fig)
                + off_the_learning_rates(fig, study) + claims(fig)
                + run_set(fig, name, held_out, lrs))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("study", list(STUDIES))
def test_each_arm_has_the_one_maps_colour_and_marker_in_every_figure(drawn, study):
    problems = colours_off_the_map(drawn[study])
    assert not problems, "\n".join(problems)
