"""scripts/plot_runs.py on small fake Hydra sweeps made here: files exist, numbers match inputs."""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scripts import plot_runs

REPO = Path(__file__).resolve().parents[1]
VOCAB = 65
N_LAYER = 2


def make_run(sweep: Path, overrides: list[str], val: list[float], *, diverged=False,
             finished=True, metrics="ok", eval_at_0=True, tokens_per_sec=1000.0, config=None):
    """A Hydra job folder; val holds the val loss of each eval (steps 0, 10, 20, ...)."""
    run = sweep / ",".join(overrides)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    scaling = next(o.split("=")[1] for o in overrides if o.startswith("scaling="))
    (run / "run.json").write_text(json.dumps(  # the layout train.py writes
        {"config": {"scaling": {"name": scaling}, **(config or {})},
         "model_config": {"vocab_size": VOCAB}, "overrides": overrides}))
    if metrics == "missing":
        return run
    lines = []
    for i, v in enumerate(val):
        step = 10 * i
        if step == 0 and not eval_at_0:
            continue
        lines.append({"kind": "train", "step": step, "loss": v + 0.1, "lr": 1e-3,
                      "tokens_per_sec": tokens_per_sec, "grad_norm": 1.0})
        lines.append({"kind": "eval", "step": step, "train_loss": v - 0.05, "val_loss": v,
                      "val_bpb": v / math.log(2), "lr": 1e-3, "tokens_per_sec": tokens_per_sec,
                      "attn_entropy": [1.0 + 0.1 * k for k in range(N_LAYER)],
                      "attn_max_logit": [v * 10 ** (k + 1) for k in range(N_LAYER)],
                      "attn_saturated": [0.01 * k for k in range(N_LAYER)]})
    text = "".join(json.dumps(r) + "\n" for r in lines) if metrics == "ok" else ""
    (run / "metrics.jsonl").write_text(text)
    if finished:
        finite = [v for v in val if math.isfinite(v)]
        (run / "summary.json").write_text(json.dumps(
            {"final_val_loss": val[-1], "best_val_loss": min(finite), "steps": 10 * len(val),
             "init_val_loss": val[0] if eval_at_0 else None,
             "tokens_per_sec": tokens_per_sec, "n_params": 1234, "diverged": diverged,
             "wall_s": 1.0}))
    return run


def table_row(text: str, label: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in\n{text}")


def fmt(values, digits=4):
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def run_script(*args):
    return subprocess.run([sys.executable, "scripts/plot_runs.py", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def ablation(tmp_path):
    """scaling x seed sweep: one diverged run, one still running, one missing, one empty."""
    sweep = tmp_path / "multirun" / "2026-11-29" / "13-00-00"
    vals = {("sqrt_dk", 0): [4.17, 1.95, 2.0], ("sqrt_dk", 1): [4.17, 2.6, 2.1],
            ("sqrt_dk", 2): [4.17, 1.7, 1.9],
            ("none", 0): [4.17, 3.0, 2.8], ("none", 1): [4.17, 2.7, 2.9]}
    rates = {0: 1000.0, 1: 1100.0, 2: 1300.0}
    for (scaling, seed), v in vals.items():
        make_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"], v,
                 tokens_per_sec=rates[seed], finished=(scaling, seed) != ("sqrt_dk", 2))
    running = sweep / "scaling=sqrt_dk,trainer.seed=2" / "metrics.jsonl"
    running.write_text(running.read_text() + '{"kind": "train", "st')  # caught mid-write
    # diverged, flagged by the summary although its last loss is still finite
    make_run(sweep, ["scaling=none", "trainer.seed=2"], [4.17, 9.0, 12.0], diverged=True)
    make_run(sweep, ["scaling=dk", "trainer.seed=0"], [4.17, 2.0], metrics="missing")
    make_run(sweep, ["scaling=dk", "trainer.seed=1"], [4.17, 2.0], metrics="empty")
    return tmp_path / "multirun", vals, rates


def test_ablation_table_matches_inputs(ablation, tmp_path):
    root, vals, rates = ablation
    out = tmp_path / "out"
    proc = run_script(root, "--out", out)
    assert proc.returncode == 0, proc.stderr
    for name in ("loss_curves.png", "diagnostics.png", "results.md"):
        assert (out / name).stat().st_size > 0
    assert not (out / "lr_sensitivity.png").exists()  # no LR axis in this sweep
    text = (out / "results.md").read_text()
    assert text in proc.stdout

    sq = table_row(text, "scaling=sqrt_dk")
    assert sq[1] == "3"
    assert sq[2] == fmt([vals[("sqrt_dk", s)][-1] for s in range(3)])  # partial: last eval
    assert sq[3] == fmt([min(vals[("sqrt_dk", s)]) for s in range(3)])
    assert sq[4:6] == ["0", "1"]
    # tokens/s: summary's for finished runs, the median of train records for the running one
    assert sq[6] == fmt(list(rates.values()), 0)

    no = table_row(text, "scaling=none")
    assert no[1] == "3"
    assert no[2] == fmt([2.8, 2.9]) and no[3] == fmt([2.8, 2.7])  # the diverged run left out
    assert no[4:6] == ["1", "0"]

    skipped = text.split("## Skipped")[1]
    assert "scaling=dk,trainer.seed=0: no metrics.jsonl" in skipped
    assert "scaling=dk,trainer.seed=1: empty metrics.jsonl" in skipped
    assert "scaling=dk" not in text.split("## Skipped")[0].split("## Still running")[0]
    assert "skipped" in proc.stderr and "no metrics.jsonl" in proc.stderr
    assert "scaling=sqrt_dk,trainer.seed=2" in text.split("## Still running")[1]
    assert "ignored 1 unreadable line(s)" in text.split("## Notes")[1]


def test_diagnostics_table_matches_inputs(ablation, tmp_path):
    root, vals, _ = ablation
    out = tmp_path / "out"
    assert run_script(root, "--out", out).returncode == 0
    text = (out / "results.md").read_text().split("## Attention diagnostics")[1]
    entropy = f"{np.mean([1.0 + 0.1 * k for k in range(N_LAYER)]):.3f}"
    saturated = f"{np.mean([0.01 * k for k in range(N_LAYER)]):.3f}"
    top = 10 ** N_LAYER   # make_run's max logit of the last layer is val * 10**N_LAYER
    sq = table_row(text, "scaling=sqrt_dk")
    assert sq[1:5] == ["0", entropy, saturated, f"{4.17 * top:.4g}"]
    last = np.mean([vals[("sqrt_dk", s)][-1] for s in range(3)])   # the partial run included
    assert sq[5:9] == ["20", entropy, saturated, f"{last * top:.4g}"]
    no = table_row(text, "scaling=none")   # the diverged run included: its logits are data
    assert no[8] == f"{np.mean([2.8, 2.9, 12.0]) * top:.4g}"


@pytest.fixture
def lr_sweep(tmp_path):
    """scaling x lr x seed; loss_at_init from step 0 for qk_norm, from ln(vocab) for none."""
    sweep = tmp_path / "multirun" / "2026-11-29" / "14-00-00"
    lrs = (1e-3, 1e-2, 1e-1)
    final = {("none", 1e-3): [2.0, 2.2], ("none", 1e-2): [1.8, 1.9],
             ("none", 1e-1): [None, 4.5],  # seed 0 diverged; seed 1 above ln(65) = 4.17
             ("qk_norm", 1e-3): [2.1, 2.0], ("qk_norm", 1e-2): [1.6, 1.7],
             ("qk_norm", 1e-1): [1.9, 2.3]}
    init = {"none": math.log(VOCAB), "qk_norm": 4.0}
    for (scaling, lr), losses in final.items():
        for seed, loss in enumerate(losses):
            ov = [f"scaling={scaling}", f"optim.lr={lr}", f"trainer.seed={seed}"]
            if loss is None:
                make_run(sweep, ov, [4.0, 30.0, math.inf], diverged=True, eval_at_0=False)
            else:
                make_run(sweep, ov, [init[scaling], 3.0, loss], eval_at_0=scaling == "qk_norm")
    return tmp_path / "multirun", lrs, final, init


def expected_sensitivity(lrs, final, init, scaling):
    per_lr = [np.mean([init if x is None else min(x, init) for x in final[(scaling, lr)]])
              for lr in lrs]
    best = min(per_lr)
    return np.mean([p - best for p in per_lr]), best, lrs[int(np.argmin(per_lr))], per_lr


def test_lr_sweep_sensitivity_matches_definition(lr_sweep, tmp_path):
    root, lrs, final, init = lr_sweep
    out = tmp_path / "out"
    proc = run_script(root, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "lr_sensitivity.png").stat().st_size > 0
    text = (out / "results.md").read_text()
    lr_part = text.split("## LR sensitivity")[1]
    for scaling in ("none", "qk_norm"):
        sens, best, best_lr, per_lr = expected_sensitivity(lrs, final, init[scaling], scaling)
        row = table_row(lr_part, f"scaling={scaling}")
        n_div = sum(x is None for lr in lrs for x in final[(scaling, lr)])
        assert row[1:] == [f"{sens:.4f}", f"{best:.4f}", f"{best_lr:g}", "3/3", str(n_div), "0"]
        grid = [r for r in lr_part.splitlines() if r.startswith(f"| scaling={scaling} |")][1]
        assert re.findall(r"\d+\.\d{4}", grid) == [f"{p:.4f}" for p in per_lr]
    assert "(1 div.)" in lr_part
    # the main table groups by scaling and lr, seeds aggregated
    row = table_row(text, "scaling=qk_norm, optim.lr=0.01")
    assert row[1] == "2" and row[2] == fmt([1.6, 1.7])
    assert table_row(text, "scaling=none, optim.lr=0.1")[2:5] == [fmt([4.5]), fmt([3.0]), "1"]


def test_lr_sensitivity_example_by_hand():
    """Worked by hand: losses (2, 1, init) at three LRs, init 4 -> mean(1, 0, 3) = 4/3."""
    runs = []
    for lr, loss, div in ((1e-3, 2.0, False), (1e-2, 1.0, False), (1e-1, 7.0, True)):
        runs.append(plot_runs.Run(Path("."), {"optim.lr": str(lr)}, "none", [],
                                  [{"kind": "eval", "step": 0, "val_loss": 4.0},
                                   {"kind": "eval", "step": 5, "val_loss": loss}],
                                  {"final_val_loss": loss, "diverged": div}, {}))
    s = plot_runs.lr_sensitivity(runs)
    assert s["best"] == 1.0 and s["best_lr"] == 1e-2
    assert s["sensitivity"] == pytest.approx(4 / 3)


def test_single_run_dir_and_bad_input(tmp_path):
    run = make_run(tmp_path / "one", ["scaling=dk", "trainer.seed=0"], [4.17, 2.0, 1.5])
    shutil.rmtree(run / ".hydra")  # overrides then come from run.json
    out = tmp_path / "out"
    proc = run_script(run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert table_row((out / "results.md").read_text(), "scaling=dk")[1:4] == ["1", "1.5000",
                                                                                "1.5000"]
    assert run_script(tmp_path / "nope", "--out", out).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_script(empty, "--out", out)
    assert proc.returncode == 2 and "no run" in proc.stderr


def test_lr_left_at_default_groups_with_the_same_lr_set_explicitly(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep, ["scaling=dk", "optim.lr=1e-2", "trainer.seed=0"], [4.0, 2.0])
    make_run(sweep, ["scaling=dk", "trainer.seed=1"], [4.0, 2.5], config={"optim": {"lr": 0.01}})
    make_run(sweep, ["scaling=dk", "optim.lr=0.1", "trainer.seed=0"], [4.0, 3.0])
    out = tmp_path / "out"
    assert run_script(sweep, "--out", out).returncode == 0
    text = (out / "results.md").read_text()
    assert table_row(text, "scaling=dk, optim.lr=0.01")[1:3] == ["2", fmt([2.0, 2.5])]
    assert table_row(text, "scaling=dk, optim.lr=0.1")[1:3] == ["1", "3.0000"]
