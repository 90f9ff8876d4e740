"""configs/experiment/*.yaml: each preset composes to the sweep it promises, every value it
sweeps builds a valid config, and a shrunken version of each (two grid points, a few steps, a
tiny corpus) runs end to end and reports."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_train import run_cli, write_corpus

from data.config import DataConfig
from model.attention import SCALINGS, ScalingConfig
from model.gpt import GPTConfig
from trainer.schema import OptimConfig, TrainerConfig, register_configs

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("scaling_ablation", "scaling_ablation_select")
RECALL_PRESETS = ("recall_scaling", "recall_scaling_select")   # data=recall, tested below
# each preset's seeds: the reported stage's, and the selection stage's, disjoint from them
SEEDS = {"scaling_ablation": ["1", "2", "3"], "scaling_ablation_select": ["101"],
         "recall_scaling": ["1", "2", "3", "4", "5"], "recall_scaling_select": ["101", "102"]}


def compose_preset(name: str, overrides: tuple[str, ...] = ()):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        return compose("config", overrides=[f"experiment={name}", *overrides],
                       return_hydra_config=True)


def sweep_values(cfg, key: str) -> list[str]:
    return str(cfg.hydra.sweeper.params[key]).split(",")


def header(name: str) -> list[str]:
    return (ROOT / "configs" / "experiment" / f"{name}.yaml").read_text().splitlines()


def multirun_of_its_seeds(name: str):
    """The preset's composed config, checked to be a multirun of its seeds into its folder."""
    cfg = compose_preset(name)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{name}/")
    assert sweep_values(cfg, "trainer.seed") == SEEDS[name]
    return cfg


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_a_multirun_of_its_seeds_into_its_own_folder(name):
    multirun_of_its_seeds(name)
    lines = header(name)
    assert lines[1] == f"# python train.py experiment={name}"
    assert lines[2] == f"# python train.py experiment={name} hydra/launcher=joblib"
    assert any(line.startswith("# Wall time:") for line in lines)
    assert any(line.startswith(f"# Report: python scripts/plot_runs.py multirun/{name}/<time> ")
               for line in lines)
    assert not any("SCIENCE" in line for line in lines)


@pytest.mark.parametrize("name", PRESETS + RECALL_PRESETS)
def test_every_swept_value_builds_a_valid_config(name):
    """Each value of each swept key, composed into the preset and built into the dataclasses
    the run uses: a value the schema or a __post_init__ check refuses fails here, not an hour
    into the sweep."""
    params = compose_preset(name).hydra.sweeper.params
    for key, values in params.items():
        for value in str(values).split(","):
            cfg = compose_preset(name, (f"{key}={value}",))
            DataConfig(**cfg.data)
            TrainerConfig(**cfg.trainer)
            OptimConfig(**cfg.optim)
            GPTConfig(vocab_size=65, scaling=ScalingConfig(**cfg.scaling),
                      **OmegaConf.to_container(cfg.model, resolve=True))


def test_scaling_ablation_runs_every_scale_where_attention_matters():
    cfg = compose_preset("scaling_ablation")
    assert sorted(sweep_values(cfg, "scaling")) == sorted(SCALINGS)
    assert "uniform" in SCALINGS
    assert cfg.trainer.max_steps == 2 * TrainerConfig().max_steps   # twice the default run
    assert cfg.optim.min_lr == 0.0        # every LR gets the same schedule shape
    assert cfg.trainer.on_nan == "stop"   # a diverged run is a result, not a crash


def test_selection_stage_is_the_same_model_on_other_seeds_over_a_factor_2_grid():
    select, report = compose_preset("scaling_ablation_select"), compose_preset("scaling_ablation")
    assert not set(SEEDS["scaling_ablation_select"]) & set(SEEDS["scaling_ablation"])
    assert sorted(sweep_values(select, "scaling")) == sorted(SCALINGS)
    lrs = sorted(float(v) for v in sweep_values(select, "optim.lr"))
    assert len(lrs) >= 3 and all(b / a <= 2 for a, b in zip(lrs, lrs[1:]))
    assert {float(v) for v in sweep_values(report, "optim.lr")} <= set(lrs)
    assert select.model == report.model and select.optim.min_lr == report.optim.min_lr
    assert select.trainer.max_steps == report.trainer.max_steps   # chosen at the full horizon


SHRUNKEN = {   # two grid points each, one seed, sized for the tiny corpus
    "scaling_ablation": ["scaling=none,uniform", "model.n_head=2", "optim.lr=1e-3"],
    # two seeds: the report reads each seed's loss at the LR chosen on the other seed
    "scaling_ablation_select": ["scaling=none", "optim.lr=1e-3,3e-2", "model.d_head=8",
                                "trainer.seed=1,2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_shrunken_preset_runs_end_to_end_and_reports(name, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    sweep = tmp_path / "sweep"
    tiny = ["data=text", f"data.train_files=[{corpus}/train.txt]",
            f"data.val_files=[{corpus}/val.txt]", f"data.cache_dir={tmp_path}/cache",
            "model.n_layer=1", "model.d_model=32", "model.block_size=16",
            "trainer.batch_size=4", "trainer.max_steps=2", "trainer.eval_every=1",
            "trainer.eval_iters=1", "trainer.log_every=1", "trainer.ckpt_every=2",
            "trainer.sample_tokens=4", "trainer.sample_prompts=[the]", "trainer.device=cpu",
            "optim.warmup_steps=1", f"hydra.sweep.dir={sweep}"]
    seed = [] if any(o.startswith("trainer.seed=") for o in SHRUNKEN[name]) else ["trainer.seed=1"]
    proc = run_cli([f"experiment={name}", *SHRUNKEN[name], *tiny, *seed])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert len(runs) == math.prod(o.count(",") + 1 for o in SHRUNKEN[name])
    out = tmp_path / "report"
    report = subprocess.run([sys.executable, "scripts/plot_runs.py", str(sweep), "--out",
                             str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    table = (out / "results.md").read_text()
    has_full = all("final_val_loss_full" in json.loads((r / "summary.json").read_text())
                   for r in runs)
    if name == "scaling_ablation_select" and not has_full:   # no best LR to draw the curves at
        assert "curves not drawn" in table.split("## Notes")[1]
    else:
        assert (out / "loss_curves.png").stat().st_size > 0
    varied = [o.split("=")[0] for o in SHRUNKEN[name] if "," in o]
    for run in runs if "trainer.seed" not in varied else []:
        # one seed: one row per run, holding its whole-split loss or saying it is missing
        summary = json.loads((run / "summary.json").read_text())
        swept = [p for p in run.name.split(",") if p.split("=")[0] in varied]
        rows = [r for r in table.splitlines() if r.startswith("| scaling=")
                and all(p.split("=")[0] in r for p in swept)]
        full = summary.get("final_val_loss_full")
        want = (f"| {full:.4f} (n=1) |" if full is not None
                else "| missing: 1 of 1 runs lack final_val_loss_full |")
        # a 2-step run ends above the corpus's unigram level: failed, listed, left out of means
        failed = table.split("## Failed runs")[1] if "## Failed runs" in table else ""
        assert any(want in r for r in rows) or run.name in failed, (run.name, table)
    if name == "scaling_ablation_select":
        assert (out / "lr_transfer.png").stat().st_size > 0
        lr_rows = [r for r in table.split("## Learning rate")[1].splitlines()
                   if r.startswith("| scaling=none | 2 |")]   # the variant over its 2 LRs
        assert len(lr_rows) == 1, table


# ---------------------------------------------------------------------------------------------
# recall_scaling: the scales x head width x q, k init on data=recall, and its LR selection stage
# ---------------------------------------------------------------------------------------------

RECALL_SCALES = ["sqrt_dk", "none", "dk", "qk_norm", "uniform"]


@pytest.mark.parametrize("name", RECALL_PRESETS)
def test_recall_preset_is_a_multirun_of_its_seeds_on_the_recall_task(name):
    cfg = multirun_of_its_seeds(name)
    assert cfg.data.source == "recall" and cfg.data.task == "copy"
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model) == (2, 2, 64)  # model=recall
    assert sweep_values(cfg, "scaling") == RECALL_SCALES
    assert cfg.optim.min_lr == 0.0 and cfg.trainer.on_nan == "stop"
    lines = header(name)
    assert (lines[1] + " ").startswith(f"# python train.py experiment={name} ")
    assert any(line.startswith("# Wall time:") for line in lines)
    assert any(line.startswith(f"# Report: python scripts/plot_runs.py multirun/{name}/<time> ")
               for line in lines)


def test_recall_scaling_sweeps_head_width_and_unit_variance_init():
    cfg = compose_preset("recall_scaling")
    assert sweep_values(cfg, "model.d_head") == ["16", "64", "256"]
    stds = [float(v) for v in sweep_values(cfg, "model.qk_init_std")]
    assert stds == [0.02, 1 / math.sqrt(cfg.model.d_model)]   # GPT-2's; unit-variance q, k
    assert list(cfg.hydra.sweeper.params)[0] == "trainer.seed"   # seed-major
    # the header's commands run each scale once, at the LR of stage 1's results.md
    text = " ".join(line.lstrip("# ").rstrip("\\ ") for line in header("recall_scaling"))
    pairs = re.findall(r"scaling=([a-z_,]+) optim\.lr=([0-9.e-]+)", text)
    chosen = {scale: float(lr) for scales, lr in pairs for scale in scales.split(",")}
    assert sum(len(scales.split(",")) for scales, _ in pairs) == len(RECALL_SCALES)
    assert chosen == {"sqrt_dk": 1.2e-2, "none": 1.2e-2, "dk": 1.2e-2, "uniform": 3e-3,
                      "qk_norm": 9.6e-2}
    best = (ROOT / "docs" / "results" / "recall_scaling_select" / "results.md").read_text()
    for scale, lr in chosen.items():
        row = rf"^\| scaling={scale} \| \d+ \| {lr:g}( \(grid edge\))? \|"
        assert re.search(row, best, re.M), scale


def test_recall_selection_stage_is_d_head_64_init_002_on_other_seeds_over_a_factor_2_grid():
    select, report = compose_preset("recall_scaling_select"), compose_preset("recall_scaling")
    assert not set(sweep_values(select, "trainer.seed")) & set(sweep_values(report,
                                                                           "trainer.seed"))
    assert sweep_values(select, "model.d_head") == ["64"]
    assert sweep_values(select, "model.qk_init_std") == ["0.02"]
    lrs = sorted(float(v) for v in sweep_values(select, "optim.lr"))
    assert len(lrs) >= 5 and all(b / a <= 2 for a, b in zip(lrs, lrs[1:]))
    assert lrs[0] < report.optim.lr < lrs[-1]   # data=recall's own LR inside the grid
    assert select.model == report.model and select.optim == report.optim
    assert select.trainer == report.trainer   # chosen at the reported horizon
    assert sweep_values(select, "scaling") == RECALL_SCALES


@pytest.mark.slow
def test_shrunken_recall_stages_run_end_to_end_and_report(tmp_path):
    """Stage 1 at two LRs and two seeds, stage 2 read at the LR stage 1 chose, 2 steps each;
    the command-line overrides replace the presets' sweeps, as the headers' commands do."""
    small = ["trainer.max_steps=2", "trainer.eval_every=1", "trainer.eval_iters=1",
             "trainer.log_every=1", "trainer.ckpt_every=2", "trainer.device=cpu",
             "optim.warmup_steps=1", "data.val_sequences=64"]
    stage1, stage2 = tmp_path / "select", tmp_path / "report"
    proc = run_cli(["experiment=recall_scaling_select", "scaling=none,sqrt_dk",
                    "optim.lr=1e-3,3e-2", "model.d_head=8", f"hydra.sweep.dir={stage1}",
                    *small])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(stage1.glob("*/summary.json"))) == 2 * 2 * 2
    proc = run_cli(["experiment=recall_scaling", "scaling=none", "optim.lr=1e-3,3e-2",
                    "model.d_head=8,16", "trainer.seed=3", f"hydra.sweep.dir={stage2}", *small])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = list(stage2.glob("*/summary.json"))
    assert len(runs) == 2 * 2 * 2   # LR x d_head x init
    assert all("final_val_accuracy" in json.loads(r.read_text()) for r in runs)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    for args in ([str(stage1), "--out", str(out1)],
                 [str(stage2), "--out", str(out2), "--select-from", str(out1 / "runs.csv"),
                  "--pair", "model.qk_init_std=0.02", "--heads-seed", "3"]):
        report = subprocess.run([sys.executable, "scripts/plot_runs.py", *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert report.returncode == 0, report.stderr[-2000:]
    for out in (out1, out2):
        text = (out / "results.md").read_text()
        assert "## Recall accuracy" in text and "## Learning rate" in text
        assert "no reference levels: data=recall generates its sequences" in text
        assert "steps_to_90" in (out / "runs.csv").read_text().splitlines()[0]
    text = (out2 / "results.md").read_text()
    assert "chosen on the runs of" in text
    assert "against `model.qk_init_std=0.02`" in text
    assert (out2 / "accuracy_curves.png").stat().st_size > 0
    assert len(list(out2.glob("heads_*.png"))) == 2 * 2   # d_head x init, at the chosen LR
