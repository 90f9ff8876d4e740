"""The step-curve figures (scripts/report/figures.py) on small fake sweeps made to break the
contract's rules: seeds far apart so that a t band runs outside [0, 1], a scale with one seed,
`uniform` runs whose q and k gradients are 0 (off a log axis), recall runs at chance ln 128.
The committed studies' figures are checked in test_figure_contract.py."""

import json
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from conftest import FakeRun, curve, make_recall_run, make_run  # noqa: E402

from scripts.report import figures, style  # noqa: E402
from scripts.report.runs import group_runs, load_runs  # noqa: E402

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
                           fake=FakeRun(variant_scale=0.0 if scaling == "uniform" else 1.0))
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


def frame_of(runs, **kwargs) -> figures.Frame:
    keys = group_runs(runs)
    return figures.Frame(style.Arms.of(keys), style.Arms.of(keys).looks(keys), **kwargs)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    runs, _ = load_runs([lm_sweep(tmp_path_factory.mktemp("lm"))])
    return runs


def test_a_band_needs_three_seeds_and_stays_in_the_quantitys_range(lm):
    fig = figures.plot_diagnostics(frame_of(lm), group_runs(lm))
    title = " ".join(fig._suptitle.get_text().split())
    assert "mean of n = 1-3 seeds per line" in title and "(n = 1: no intervals)" in title
    entropy = [ax for ax in fig.axes if ax.get_ylabel().startswith("entropy")]
    for ax in entropy:   # bands cut to [0, ln 64]
        for band in ax.collections:
            ys = band.get_paths()[0].vertices[:, 1]
            assert ys.min() >= 0.0 and ys.max() <= math.log(64) + TOL
    saturated = next(ax for ax in fig.axes if ax.get_ylabel().startswith("saturated"))
    assert saturated.collections, "sqrt_dk at d_head 16 has three seeds: a band"
    ys = saturated.collections[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == 0.0 and ys.max() == 1.0   # its seeds at 0.02, 0.9, 0.05: cut
    figures.plt.close(fig)


def test_log_rows_leave_out_zeros_and_the_title_says_whose(lm):
    fig = figures.plot_qk_grads(frame_of(lm), group_runs(lm))
    title = " ".join(fig._suptitle.get_text().split())
    assert "values of 0 (a log axis cannot show them): uniform: 0 in |grad W_k|, |grad W_q|" \
        in title
    assert "/ s rows: not uniform (s learned, or 0)" in title
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        for line in ax.lines:
            ys = np.asarray(line.get_ydata(), float)
            assert (ys[np.isfinite(ys)] > 0).all()
        assert "uniform" not in [line.get_label() for line in ax.lines]
    figures.plt.close(fig)


def test_recall_loss_figure_names_the_chance_level_ln_128(tmp_path):
    runs, _ = load_runs([recall_sweep(tmp_path)])
    fig = figures.plot_losses(frame_of(runs), group_runs(runs))
    ax = fig.axes[0]
    chance = [line for line in ax.lines if line.get_label() == "chance ln 128 = 4.85"]
    assert len(chance) == 1 and chance[0].get_ydata()[0] == pytest.approx(math.log(128))
    assert ax.get_yscale() == "log"   # 4.86 down to 0.06: more than a decade, all of it shown
    assert "n = 1-2 seeds per line, no intervals" in " ".join(fig._suptitle.get_text().split())
    assert not ax.collections
    figures.plt.close(fig)


def test_loss_vs_baseline_is_each_arm_minus_the_baseline_at_its_seed(lm):
    fig = figures.plot_vs_baseline(frame_of(lm), group_runs(lm))
    by_panel = {ax.get_title(): ax for ax in fig.axes}
    none = next(line for line in by_panel["d_head=16"].lines if line.get_label() == "none")
    # the last evaluation: none's finals minus sqrt_dk's, seed by seed, averaged
    want = np.mean([a - b for a, b in zip(FINALS[("none", 16)], FINALS[("sqrt_dk", 16)])])
    assert none.get_ydata()[-1] == pytest.approx(want)
    assert "sqrt_dk" not in [line.get_label() for line in by_panel["d_head=16"].lines]
    figures.plt.close(fig)


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


def test_a_title_wraps_at_whole_words_and_fits_the_figure():
    """A run's folder name is one long token: it moves to a line of its own, never split."""
    fig = figures.plt.figure(figsize=(4, 2))
    token = "model.d_head=256,model.qk_init_std=0.125,optim.lr=0.00075,scaling=none,seed=1"
    style.suptitle(fig, f"Attention per head on the fixed validation batch, one run: {token}")
    lines = fig._suptitle.get_text().split("\n")
    assert token in lines and len(lines) >= 3
    assert " ".join(lines).split() == ("Attention per head on the fixed validation batch, one run:"
                                       f" {token}").split()
    figures.plt.close(fig)


def test_no_arm_is_drawn_with_the_failed_runs_mark():
    """lr_transfer.png marks an LR where a run failed with style.FAILED; an arm drawn with the
    same marker (uniform was 'x') would read as failed runs."""
    arms = [f"arm {i}" for i in range(40)]   # past the end of POOL
    looks = style.palette([*style.LOOKS, *arms])
    assert all(look[1] != style.FAILED for look in looks.values())
