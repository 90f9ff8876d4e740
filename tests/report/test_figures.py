"""The report's figures, checked by code where code can check them: every visible panel holds
data; a band or error bar stays inside the range its quantity can take; no band at n = 1; the
titles lie inside the figure; tick labels and reference labels do not overprint one another;
a recall loss figure draws its chance level; what a figure leaves out, its title says.

Each figure is drawn once (module fixture `drawn`) from small fake sweeps made to break the
rules: seeds far apart so that a t band runs below 0 or outside [0, 1], a scale with one seed,
`uniform` runs whose q and k gradients and scaled logits are 0, an LR sweep with many
settings of two keys, and one whose groups each ran one LR. savefig writes a placeholder; the
canvas is drawn here so that window extents are measured as rendered."""

import json
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from conftest import (  # noqa: E402
    N_LAYER,
    ROOT,
    STABILITY_LRS,
    curve,
    heads_run,
    make_recall_run,
    make_run,
    stability_head_value,
    stability_sweep,
    unrendered_savefig,
    width_sweep,
)
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scripts.report import figures  # noqa: E402
from scripts.report import stats as st  # noqa: E402
from scripts.report.lr_figure import plot_lr  # noqa: E402
from scripts.report.runs import group_runs, load_runs  # noqa: E402
from scripts.report.runs_csv import read_runs_csv, write_runs_csv  # noqa: E402
from scripts.report.stability_figure import plot_stability  # noqa: E402
from scripts.report.width_figure import plot_width  # noqa: E402

TOL = 1e-9
CHANCE_VALUES = 128   # data.num_values of the recall runs: chance loss ln 128 = 4.85


def edit_records(run, change) -> None:
    """Rewrites the run's metrics.jsonl with change(record) applied to every record."""
    metrics = run / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for record in records:
        change(record)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))


def no_qk_gradient(record) -> None:
    """A uniform run's train record: its q and k get no gradient (norms 0, every layer)."""
    for key in [k for k in record if k.startswith(("q_grad_norm", "k_grad_norm"))]:
        record[key] = [0.0] * len(record[key]) if isinstance(record[key], list) else 0.0


# (scale, d_head) -> final val loss of each seed; sqrt_dk at 16 spreads its seeds so that the t
# band of the mean runs below 0, none at 64 has one seed
FINALS = {("sqrt_dk", 16): [0.02, 0.05, 1.2], ("sqrt_dk", 64): [0.9, 1.0, 1.1],
          ("none", 16): [0.8, 0.85, 0.9], ("none", 64): [0.7],
          ("uniform", 16): [2.0, 2.1, 2.2], ("uniform", 64): [2.0, 2.05, 2.1]}
# sqrt_dk at 16: attention entropy and saturated share of each seed, far apart near 0 and 1
SPREAD = {1: (0.05, 0.02), 2: (2.0, 0.9), 3: (0.1, 0.05)}


def lm_sweep(root):
    """scale x head width x seed, with the per-seed spreads above. uniform: q and k gradient
    norms and scaled max logit 0, as its scores ignore q and k."""
    sweep = root / "lm"
    for (scaling, d_head), finals in FINALS.items():
        for seed, final in enumerate(finals, start=1):
            run = make_run(sweep, [f"model.d_head={d_head}", f"scaling={scaling}",
                                   f"trainer.seed={seed}"], curve(4.0, final, 5, seed),
                           variant_scale=0.0 if scaling == "uniform" else 1.0)
            if scaling == "uniform":
                edit_records(run, no_qk_gradient)
            if (scaling, d_head) == ("sqrt_dk", 16):
                entropy, saturated = SPREAD[seed]
                edit_records(run, lambda r, e=entropy, s=saturated: r.update(
                    attn_entropy=[e, e], attn_saturated=[s, s]) if r["kind"] == "eval" else None)
    return sweep


def recall_sweep(root):
    """Recall runs of chance 1/128: sqrt_dk's two seeds far apart (one solves, one does not),
    so that its loss band runs below 0; none has one seed."""
    sweep = root / "recall"
    chance = math.log(CHANCE_VALUES)
    for scaling, seed, accuracy in (("sqrt_dk", 1, [0.0, 0.3, 0.95, 1.0, 1.0]),
                                    ("sqrt_dk", 2, [0.0, 0.01, 0.05, 0.08, 0.1]),
                                    ("none", 1, [0.0, 0.2, 0.5, 0.6, 0.7])):
        run = make_recall_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"], accuracy,
                              val=[chance * (1 - a) + 0.01 for a in accuracy])
        info = json.loads((run / "run.json").read_text())
        info["config"]["data"]["num_values"] = CHANCE_VALUES
        (run / "run.json").write_text(json.dumps(info))
    return sweep


def csv_runs(sweep, path):
    """The runs of a sweep as --from-csv reads them: written to runs.csv, then read back."""
    runs, _ = load_runs([sweep])
    write_runs_csv(runs, path, "full", None)
    return read_runs_csv(path)[0]


def lr_sweep(root):
    """Six settings of two keys (long tick labels), two scales, three LRs, two seeds; at
    d_head=16 / default init none's seeds prefer different LRs, so that leave-one-out reads
    them at different LRs."""
    sweep = root / "lr"
    for d_head in (16, 32, 64):
        for init in ("null", "0.02"):
            for scaling in ("sqrt_dk", "none"):
                for lr in (1e-3, 1e-2, 1e-1):
                    for seed in (1, 2):
                        loss = 2.0 + 0.3 * (math.log10(lr) + 2) ** 2 + 0.01 * seed
                        if (d_head, init, scaling) == (16, "null", "none"):
                            loss = {(1e-2, 1): 1.5, (1e-1, 2): 1.4}.get((lr, seed), 2.5)
                        make_run(sweep, [f"model.d_head={d_head}", f"model.qk_init_std={init}",
                                         f"optim.lr={lr}", f"scaling={scaling}",
                                         f"trainer.seed={seed}"], [4.0, 3.0, loss + 0.1],
                                 full=loss)
    return sweep


def one_lr_sweep(root):
    """A second stage: each scale at one LR (its own), head widths 16 and 64, three seeds."""
    sweep = root / "one_lr"
    for scaling, lr in (("sqrt_dk", 1e-2), ("none", 1e-1)):
        for d_head in (16, 64):
            for seed in (1, 2, 3):
                loss = 2.0 + 0.05 * seed + (0.1 if scaling == "none" else 0.0)
                make_run(sweep, [f"model.d_head={d_head}", f"optim.lr={lr}",
                                 f"scaling={scaling}", f"trainer.seed={seed}"],
                         [4.0, 3.0, loss + 0.1], full=loss)
    return sweep


def stability_with_uniform(root):
    """stability_sweep plus arms enough for seven columns, as a selection stage of every scale
    has: dk, constant and learned, whose statistics grow like sqrt_dk's, and uniform, whose
    max logit is 0 at every head (it has no q or k)."""
    sweep = stability_sweep(root)
    for scaling in ("dk", "constant", "learned", "uniform"):
        for lr in STABILITY_LRS:
            for seed in (1, 2):
                run = make_run(sweep, [f"optim.lr={lr}", f"scaling={scaling}",
                                       f"trainer.seed={seed}"], [4.0, 3.0, 2.5, 2.4], full=2.4)

                def heads(record, lr=lr, seed=seed, uniform=scaling == "uniform"):
                    i = record["step"] // 10
                    record["attn_heads"] = {stat: [[
                        (0.0 if stat == "max_logit" else 1.0) if uniform else
                        stability_head_value(stat, lr, seed, (i, layer, head))
                        for head in range(2)] for layer in range(N_LAYER)]
                        for stat in ("max_logit", "entropy_norm")}
                edit_records(run, lambda r, f=heads: f(r) if r["kind"] == "eval" else None)
    return sweep


def lr_figure(runs):
    return lambda path: plot_lr(runs, "full", path, st.held_out(runs, "full", st.Plan()))


def makers(root) -> dict:
    """Figure name -> a function that draws it into a path."""
    lm = group_runs(load_runs([lm_sweep(root)])[0])
    recall = group_runs(load_runs([recall_sweep(root)])[0])
    run, _ = heads_run(root)   # uniform: its scaled logits are 0 at every head
    run.variant = "uniform"
    for e in run.evals:
        e["attn_heads"]["max_logit"] = [[0.0] * 3 for _ in range(2)]
    return {
        "loss_curves": lambda p: figures.plot_losses(lm, p, ""),
        "loss_vs_baseline": lambda p: figures.plot_vs_baseline(lm, "sqrt_dk", p, ""),
        "diagnostics": lambda p: figures.plot_diagnostics(lm, p, ""),
        "qk_grad_norms": lambda p: figures.plot_qk_grads(lm, p, ""),
        "recall_loss_curves": lambda p: figures.plot_losses(recall, p, ""),
        "accuracy_curves": lambda p: figures.plot_accuracy(recall, p, ""),
        "heads_uniform": lambda p: figures.plot_heads(run, p),
        "lr_transfer": lr_figure(csv_runs(lr_sweep(root), root / "lr.csv")),
        "lr_one_lr_per_group": lr_figure(csv_runs(one_lr_sweep(root), root / "one.csv")),
        "lr_stability": lambda p: plot_stability(
            load_runs([stability_with_uniform(root / "with_uniform")])[0], "full", p),
        "width_transfer": lambda p: plot_width(csv_runs(width_sweep(root), root / "width.csv"),
                                               "full", p),
    }


NAMES = ("loss_curves", "loss_vs_baseline", "diagnostics", "qk_grad_norms",
         "recall_loss_curves", "accuracy_curves", "heads_uniform", "lr_transfer",
         "lr_one_lr_per_group", "lr_stability", "width_transfer")
STEP_FIGURES = NAMES[:6]   # the small multiples and stat grids: a band per line


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Figure name -> the Figure as it was saved, its canvas drawn."""
    root = tmp_path_factory.mktemp("figures")
    shown = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", unrendered_savefig)
        closed = []
        mp.setattr(figures.plt, "close", closed.append)
        for name, make in makers(root).items():
            make(root / f"{name}.png")
            assert len(closed) == 1, f"{name}: no figure drawn"
            shown[name] = closed.pop()
            shown[name].canvas.draw()
    assert tuple(shown) == NAMES
    yield shown
    for fig in shown.values():
        figures.plt.close(fig)


def visible(fig):
    return [ax for ax in fig.axes if ax.axison and ax.get_visible()]


def finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float).ravel()
    return values[np.isfinite(values)]


def panel_has_data(ax) -> bool:
    """A data line (not a reference line: axhline draws in axes coordinates along x) with a
    finite point, positive on a log axis; or a collection with finite data."""
    log = ax.get_yscale() == "log"
    for line in ax.lines:
        y = finite(line.get_ydata())
        if line.get_transform() == ax.transData and ((y > 0).any() if log else y.size):
            return True
    return any(finite(path.vertices).size for c in ax.collections for path in c.get_paths())


def row_ylabel(fig, ax) -> str:
    """The y label of the panel, else of the panel in its row that carries it."""
    if ax.get_ylabel():
        return ax.get_ylabel()
    row = ax.get_subplotspec().rowspan.start
    return next((other.get_ylabel() for other in fig.axes
                 if other.get_subplotspec().rowspan.start == row and other.get_ylabel()), "")


def quantity_range(ylabel: str) -> tuple[float, float]:
    """The range a quantity can take, read from its y label."""
    text = ylabel.lower()
    if "accuracy" in text or "saturated" in text:
        return 0.0, 1.0
    difference = "−" in text or "minus" in text
    if ("loss" in text and not difference) or "entropy" in text or "sensitivity" in text:
        return 0.0, math.inf
    return -math.inf, math.inf


def band_values(ax) -> np.ndarray:
    """The y values of the bands (fill_between) and error bars drawn in a panel."""
    ys = [path.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection)
          for path in c.get_paths()]
    ys += [np.asarray(seg)[:, 1] for c in ax.collections if isinstance(c, LineCollection)
           for seg in c.get_segments()]
    return finite(np.concatenate(ys)) if ys else np.array([])


def overlapping(texts, renderer) -> list[tuple[str, str]]:
    """Pairs of the texts whose rendered boxes overlap (by more than half a pixel)."""
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts
             if t.get_visible() and t.get_text().strip()]
    found = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > 0.5 and dy > 0.5:
                found.append((a, b))
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_visible_panel_has_data(drawn, name):
    fig = drawn[name]
    assert visible(fig)
    empty = [ax.get_title() or row_ylabel(fig, ax) for ax in visible(fig)
             if not panel_has_data(ax)]
    assert not empty, f"{name}: panels without data: {empty}"


@pytest.mark.parametrize("name", NAMES)
def test_bands_and_bars_stay_inside_the_quantitys_range(drawn, name):
    fig = drawn[name]
    checked = 0
    for ax in visible(fig):
        low, high = quantity_range(row_ylabel(fig, ax))
        ys = band_values(ax)
        checked += ys.size * (math.isfinite(low) or math.isfinite(high))
        assert (ys >= low - TOL).all() and (ys <= high + TOL).all(), (
            f"{name}, {ax.get_title()!r} ({row_ylabel(fig, ax)!r}): band from {ys.min():g} to"
            f" {ys.max():g}, outside [{low}, {high}]")
    if name in ("loss_curves", "recall_loss_curves", "accuracy_curves", "diagnostics"):
        assert checked   # the fake data do make bands of a bounded quantity
        assert "clipped" in fig._suptitle.get_text() or "cut at" in fig._suptitle.get_text()


@pytest.mark.parametrize("name", STEP_FIGURES)
def test_no_band_for_a_group_of_one_seed(drawn, name):
    fig = drawn[name]
    ones = 0
    for ax in visible(fig):
        for line in ax.lines:
            if line.get_label().endswith("(n=1)"):
                ones += 1
                colour = to_rgb(line.get_color())
                bands = [c for c in ax.collections if isinstance(c, PolyCollection)
                         and np.allclose(c.get_facecolor()[0][:3], colour)]
                assert not bands, f"{name}: a band for {line.get_label()} in {ax.get_title()}"
    assert ones   # none at d_head=64 (recall: none) has one seed


@pytest.mark.parametrize("name", NAMES)
def test_titles_lie_inside_the_figure(drawn, name):
    fig = drawn[name]
    renderer = fig.canvas.get_renderer()
    titles = [fig._suptitle] + [t for ax in visible(fig)
                                for t in (ax.title, ax._left_title, ax._right_title)]
    for title in titles:
        if title is None or not title.get_text():
            continue
        box = title.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1, f"{name}: {title.get_text()!r} cut at the left"
        assert box.x1 <= fig.bbox.width + 1 and box.y1 <= fig.bbox.height + 1, (
            f"{name}: {title.get_text()!r} cut at the right or top ({box} in {fig.bbox})")


@pytest.mark.parametrize("name", NAMES)
def test_tick_and_reference_labels_do_not_overprint(drawn, name):
    fig = drawn[name]
    renderer = fig.canvas.get_renderer()
    for ax in visible(fig):
        for axis in (ax.xaxis, ax.yaxis):
            labels = axis.get_ticklabels() + axis.get_ticklabels(minor=True)
            assert not overlapping(labels, renderer), (
                f"{name}, {ax.get_title()!r}: tick labels overprint:"
                f" {overlapping(labels, renderer)}")
        assert not overlapping(ax.texts, renderer), f"{name}: {overlapping(ax.texts, renderer)}"


def drawn_ticklabels(ax) -> list:
    """The tick labels a panel draws: those with text at a tick inside its view limits."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    return [t for t in ax.xaxis.get_ticklabels() if t.get_text() and x0 <= t.get_position()[0]
            <= x1] + [t for t in ax.yaxis.get_ticklabels()
                      if t.get_text() and y0 <= t.get_position()[1] <= y1]


@pytest.mark.parametrize("name", NAMES)
def test_legends_cover_no_other_panel_and_no_tick_label(drawn, name):
    """A legend lies inside its own panel or outside every panel; it covers no tick label."""
    fig = drawn[name]
    renderer = fig.canvas.get_renderer()
    legends = [(ax, ax.get_legend()) for ax in visible(fig) if ax.get_legend()]
    legends += [(None, legend) for legend in fig.legends]
    for owner, legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in visible(fig):
            covered = [t.get_text() for t in drawn_ticklabels(ax)
                       if box.overlaps(t.get_window_extent(renderer))]
            assert not covered, f"{name}: a legend covers tick labels {covered}"
            if ax is not owner:
                assert not box.overlaps(ax.get_window_extent(renderer)), (
                    f"{name}: a legend covers the panel {ax.get_title()!r}")


def test_lr_figure_of_a_committed_two_stage_result_keeps_its_labels_apart(tmp_path, monkeypatch):
    """docs/results/scaling_ablation's lr_transfer.png, drawn from its committed runs.csv:
    a loss-vs-LR panel narrower than a decade (the log axis's minor labels overprinted
    there), two reference levels off the panel above one near its top, and groups of one
    LR, whose sensitivity (0 by construction) is not drawn."""
    results = ROOT / "docs" / "results"
    runs, levels = read_runs_csv(results / "scaling_ablation" / "runs.csv")
    select, _ = read_runs_csv(results / "scaling_ablation_select" / "runs.csv")
    held = st.held_out(runs, "full", st.Plan(select_runs=select))
    closed = []
    monkeypatch.setattr(Figure, "savefig", unrendered_savefig)
    monkeypatch.setattr(figures.plt, "close", closed.append)
    plot_lr(runs, "full", tmp_path / "lr.png", held, levels)
    fig = closed.pop()
    fig.canvas.draw()
    test_tick_and_reference_labels_do_not_overprint({"lr": fig}, "lr")
    sensitivity = next(ax for ax in fig.axes if ax.get_title().startswith("LR sensitivity"))
    drawn_scales = {line.get_label() for line in sensitivity.lines}
    assert not drawn_scales & {"sqrt_dk", "dk", "constant", "learned"}   # one LR each
    assert "LR sensitivity not drawn for sqrt_dk, dk, constant, learned" in \
        fig._suptitle.get_text()
    figures.plt.close(fig)


def test_recall_loss_figure_draws_the_chance_level_ln_128(drawn):
    chance = math.log(CHANCE_VALUES)
    for ax in visible(drawn["recall_loss_curves"]):
        marks = [line for line in ax.lines if line.get_transform() != ax.transData
                 and np.allclose(line.get_ydata(), chance)]
        assert marks, f"{ax.get_title()}: no line at ln {CHANCE_VALUES}"
        assert "chance ln 128 = 4.85" in [t.get_text() for t in ax.texts]
    assert not any("chance" in t.get_text() for ax in drawn["loss_curves"].axes
                   for t in ax.texts)   # language-model runs have no chance level


def test_titles_say_what_is_not_drawn_and_which_loss_is_shown(drawn):
    for name in ("diagnostics", "qk_grad_norms"):
        assert "uniform not drawn" in drawn[name]._suptitle.get_text().replace("\n", " ")
        assert "it has no q or k" in drawn[name]._suptitle.get_text().replace("\n", " ")
    heads = drawn["heads_uniform"]
    assert "not drawn" in heads._suptitle.get_text() and "max |logit|" in \
        heads._suptitle.get_text()
    assert not any(ax.get_ylabel() == "max |logit|" for ax in heads.axes)
    baseline = drawn["loss_vs_baseline"]
    assert "sampled batches" in baseline._suptitle.get_text().replace("\n", " ")
    assert "sampled" in baseline.axes[0].get_ylabel()
    lr = drawn["lr_transfer"]._suptitle.get_text().replace("\n", " ")
    assert "offset sideways" in lr
    held = [ax for ax in drawn["lr_transfer"].axes if ax.get_title().startswith("loss at")]
    assert "different LRs" in held[0].get_title()   # none's seeds were read at 0.01 and 0.1


def test_lr_sensitivity_is_not_drawn_when_every_group_ran_one_lr(drawn):
    fig = drawn["lr_one_lr_per_group"]
    titles = [ax.get_title() for ax in visible(fig)]
    assert not any(t.startswith("LR sensitivity") for t in titles)
    assert any(t.startswith("best LR") for t in titles)
    assert "LR sensitivity not drawn: one LR per group" in fig._suptitle.get_text()


def test_gradient_per_unit_of_logit_divides_by_each_runs_fixed_scale():
    """|grad W_q| / s: s = 1/sqrt(64) for sqrt_dk at d_head 64 (from d_model / n_head when
    d_head is not set), 1 for none, 1/64 for dk, 1/divisor for constant; learned, qk_norm and
    uniform have no fixed s and get no series."""
    from pathlib import Path

    from scripts.report.figures import fixed_scale, per_logit
    from scripts.report.runs import RunRecord

    def run(variant, **settings):
        overrides = {"model.d_model": "128", "model.n_head": "2", **settings}
        return RunRecord(Path("."), overrides, variant,
                         [{"kind": "train", "step": 10, "q_grad_norm": 0.5}], [], {}, {})
    assert per_logit(run("sqrt_dk"), "q_grad_norm") == ([10], [pytest.approx(0.5 * 8)])
    assert per_logit(run("none"), "q_grad_norm") == ([10], [0.5])
    assert fixed_scale(run("dk", **{"model.d_head": "16"})) == 1 / 16
    assert fixed_scale(run("constant", **{"scaling.divisor": "4"})) == 0.25
    for variant in ("learned", "qk_norm", "uniform"):
        assert per_logit(run(variant), "q_grad_norm") == ([], [])
