"""configs/experiment/*.yaml: each preset composes to the sweep it promises, and a shrunken
version of each (two grid points, a few steps, a tiny corpus) runs end to end and plots."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_train import SCALINGS, run_cli, write_corpus

from trainer.schema import register_configs

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("scaling_ablation", "head_width", "lr_sensitivity")
WORTSMAN_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)   # SCIENCE.md section 5


def compose_preset(name: str, overrides: tuple[str, ...] = ()):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        return compose("config", overrides=[f"experiment={name}", *overrides],
                       return_hydra_config=True)


def sweep_values(cfg, key: str) -> list[str]:
    return str(cfg.hydra.sweeper.params[key]).split(",")


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_a_multirun_into_its_own_folder(name):
    cfg = compose_preset(name)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{name}/")
    first_line = (ROOT / "configs" / "experiment" / f"{name}.yaml").read_text().splitlines()[1]
    assert first_line == f"# python train.py experiment={name}"


def test_scaling_ablation_grid():
    cfg = compose_preset("scaling_ablation")
    assert sorted(sweep_values(cfg, "scaling")) == sorted(SCALINGS)
    assert sweep_values(cfg, "trainer.seed") == ["1", "2", "3"]


@pytest.mark.parametrize("d_head, n_head", [(16, 16), (64, 4), (256, 1)])
def test_head_width_keeps_d_model_fixed(d_head, n_head):
    cfg = compose_preset("head_width", (f"model.d_head={d_head}",))
    assert sweep_values(cfg, "model.d_head") == ["16", "64", "256"]
    assert sorted(sweep_values(cfg, "scaling")) == ["constant", "dk", "none", "sqrt_dk"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert (model["d_model"], model["d_head"], model["n_head"]) == (256, d_head, n_head)


def test_lr_sensitivity_uses_the_wortsman_grid_and_optimizer():
    cfg = compose_preset("lr_sensitivity")
    assert [float(v) for v in sweep_values(cfg, "optim.lr")] == list(WORTSMAN_LRS)
    assert sorted(sweep_values(cfg, "scaling")) == ["dk", "none", "qk_norm", "sqrt_dk"]
    assert list(cfg.optim.betas) == [0.9, 0.95] and cfg.optim.grad_clip == 1.0
    assert cfg.optim.min_lr <= min(WORTSMAN_LRS)
    assert cfg.trainer.on_nan == "stop"   # a diverged run is a result, not a crash


SWEPT = ("scaling", "model.d_head", "optim.lr")
SHRUNKEN = {   # two grid points each, sized for the tiny corpus
    "scaling_ablation": ["scaling=none,qk_norm", "trainer.seed=1", "model.n_head=2"],
    "head_width": ["model.d_head=16,32", "scaling=constant"],
    "lr_sensitivity": ["scaling=none", "optim.lr=1e-3,3e-1", "model.n_head=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_shrunken_preset_runs_end_to_end_and_plots(name, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    sweep = tmp_path / "sweep"
    tiny = ["data=text", f"data.train_files=[{corpus}/train.txt]",
            f"data.val_files=[{corpus}/val.txt]", f"data.cache_dir={tmp_path}/cache",
            "model.n_layer=1", "model.d_model=32", "model.block_size=16",
            "trainer.batch_size=4", "trainer.max_steps=2", "trainer.eval_every=1",
            "trainer.eval_iters=1", "trainer.log_every=1", "trainer.ckpt_every=2",
            "trainer.sample_tokens=4", "trainer.sample_prompts=[the]", "trainer.device=cpu",
            "optim.warmup_steps=1", f"hydra.sweep.dir={sweep}"]
    proc = run_cli([f"experiment={name}", *SHRUNKEN[name], *tiny])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert len(runs) == 2
    for run in runs:
        summary = (run / "summary.json").read_text()
        assert '"steps": 2' in summary
    out = tmp_path / "plots"
    plot = subprocess.run([sys.executable, "scripts/plot_runs.py", str(sweep), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert (out / "loss_curves.png").stat().st_size > 0
    table = (out / "results.md").read_text()
    for run in runs:   # one row per run (one seed each), holding that run's final val loss
        final = json.loads((run / "summary.json").read_text())["final_val_loss"]
        swept = [p for p in run.name.split(",") if p.split("=")[0] in SWEPT]
        rows = [r for r in table.splitlines() if r.startswith("| ")
                and all(p.split("=")[0] in r for p in swept)]
        assert any(f"| {final:.4f} |" in r for r in rows), (run.name, table)
    if name == "lr_sensitivity":
        assert (out / "lr_sensitivity.png").exists()
