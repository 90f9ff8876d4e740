"""configs/experiment/*.yaml: each preset composes to the sweep it promises and every value it
sweeps builds a valid config. A shrunken version of each (a few jobs, a few steps, a tiny
corpus) runs end to end and reports in tests/e2e/test_experiments_cli.py."""

import functools
import math
import re

import pytest
from conftest import ROOT, add_rows, derive, register_schema
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from data.config import DataConfig
from model.config import (
    NORMALISERS,
    SCALES,
    SCALINGS,
    GPTConfig,
    ParamConfig,
    ScalingConfig,
    softmax_with,
)
from trainer.schema import OptimConfig, TrainerConfig

PRESETS = ("scaling_ablation", "scaling_ablation_select")
RECALL_PRESETS = ("recall_scaling", "recall_scaling_select")   # data=recall, tested below
# each preset's seeds: the reported stage's, and the selection stage's, disjoint from them
SEEDS = {"scaling_ablation": ["1", "2", "3"], "scaling_ablation_select": ["101"],
         "recall_scaling": ["1", "2", "3", "4", "5"], "recall_scaling_select": ["101", "102"]}


def compose_preset(name: str, overrides: tuple[str, ...] = (), hydra: bool = True):
    """The preset with `overrides`; with its `hydra` node (the sweep) unless hydra=False."""
    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        return compose("config", overrides=[f"experiment={name}", *overrides],
                       return_hydra_config=hydra)


@functools.cache
def preset(name: str):
    """compose_preset(name), composed once (the tests only read it)."""
    return compose_preset(name)


def sweep_values(cfg, key: str) -> list[str]:
    return str(cfg.hydra.sweeper.params[key]).split(",")


def header(name: str) -> list[str]:
    return (ROOT / "configs" / "experiment" / f"{name}.yaml").read_text().splitlines()


def multirun_of_its_seeds(name: str):
    """The preset's composed config, checked to be a multirun of its seeds into its folder."""
    cfg = preset(name)
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


LENGTH_PRESETS = ("length_generalisation", "length_generalisation_lookup")


@pytest.mark.parametrize("name", PRESETS + RECALL_PRESETS + LENGTH_PRESETS + ("width_transfer",
                                  "normaliser_select", "normaliser_recall_select"))
def test_every_swept_value_builds_a_valid_config(name):
    """Each value of each swept key, in the preset and built into the dataclasses the run uses:
    a value the schema or a __post_init__ check refuses fails here, not an hour into the sweep.
    The i-th value of every key goes in at once (each value once, beside values of the other
    keys that the sweep pairs it with too), as Hydra applies a `key=value` override to the
    composed preset (conftest.derive); a config-group option whose file only names it (every
    configs/scaling/*.yaml and configs/param/*.yaml) is that name, any other option is
    composed."""
    params = preset(name).hydra.sweeper.params
    values = {key: str(v).split(",") for key, v in params.items()}
    for i in range(max(len(v) for v in values.values())):
        picked = tuple(f"{key}={v[i]}" for key, v in values.items() if i < len(v))
        groups = {key: value for key, value in (o.split("=") for o in picked)
                  if (ROOT / "configs" / key).is_dir()}
        named = all(OmegaConf.load(ROOT / "configs" / key / f"{value}.yaml") == {"name": value}
                    for key, value in groups.items())   # a missing option's file fails here
        cfg = (derive(preset(name), [f"{k}.name={v}" if k in groups else f"{k}={v}"
                                     for k, v in (o.split("=") for o in picked)])
               if named else compose_preset(name, picked, hydra=False))
        DataConfig(**cfg.data)
        TrainerConfig(**cfg.trainer)
        OptimConfig(**cfg.optim)
        GPTConfig(vocab_size=65, scaling=ScalingConfig(**cfg.scaling),
                  param=ParamConfig(**cfg.param), **OmegaConf.to_container(cfg.model, resolve=True))
        for override in picked:   # the value is the one composed
            key, value = override.split("=")
            got = cfg[key].name if key in groups else OmegaConf.select(cfg, key)
            assert str(got).lower() == value.lower() or float(got) == float(value), (override,
                                                                                     got)


ALL_PRESETS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_every_preset_trains_in_float32_on_every_machine(name):
    """trainer.precision=auto is bf16 on a CPU with AMX tiles (and on GPUs): a preset left at
    auto would reproduce its committed float32 results in another precision there."""
    assert preset(name).trainer.precision == "fp32"


def test_scaling_ablation_runs_its_scales_and_the_control_where_attention_matters():
    """The scales its committed results cover (a scale added later does not edit this preset),
    with sqrt_dk, the baseline, and uniform, the control."""
    cfg = preset("scaling_ablation")
    swept = sweep_values(cfg, "scaling")
    assert set(swept) <= set(SCALINGS) and {"sqrt_dk", "uniform"} <= set(swept)
    assert cfg.trainer.max_steps == 2 * TrainerConfig().max_steps   # twice the default run
    assert cfg.optim.min_lr == 0.0        # every LR gets the same schedule shape
    assert cfg.trainer.on_nan == "stop"   # a diverged run is a result, not a crash


def test_selection_stage_is_the_same_model_on_other_seeds_over_a_factor_2_grid():
    select, report = preset("scaling_ablation_select"), preset("scaling_ablation")
    assert not set(SEEDS["scaling_ablation_select"]) & set(SEEDS["scaling_ablation"])
    assert sweep_values(select, "scaling") == sweep_values(report, "scaling")
    lrs = sorted(float(v) for v in sweep_values(select, "optim.lr"))
    assert len(lrs) >= 3 and all(b / a <= 2 for a, b in zip(lrs, lrs[1:]))
    assert {float(v) for v in sweep_values(report, "optim.lr")} <= set(lrs)
    assert select.model == report.model and select.optim.min_lr == report.optim.min_lr
    assert select.trainer.max_steps == report.trainer.max_steps   # chosen at the full horizon


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
    cfg = preset("recall_scaling")
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
    select, report = preset("recall_scaling_select"), preset("recall_scaling")
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


def test_recall_headline_is_an_lr_grid_a_factor_2_apart_on_the_headline_cell():
    """The cell recall_scaling resolved (none at d_head 256, unit-variance q and k), with
    sqrt_dk beside it, on LRs a factor 2 apart from 9.6e-2 down to at most 1e-4."""
    cfg = compose_preset("recall_headline")
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith("multirun/recall_headline/")
    assert sweep_values(cfg, "trainer.seed") == ["1", "2"]
    assert sweep_values(cfg, "model.d_head") == ["256"]
    assert sweep_values(cfg, "model.qk_init_std") == ["0.125"]
    assert sweep_values(cfg, "scaling") == ["none", "sqrt_dk"]
    lrs = sorted(float(v) for v in sweep_values(cfg, "optim.lr"))
    assert lrs[-1] == 9.6e-2 and lrs[0] <= 1e-4 and 1.2e-2 in lrs
    assert all(math.isclose(b / a, 2.0) for a, b in zip(lrs, lrs[1:]))
    assert (cfg.trainer.max_steps, cfg.trainer.eval_every, cfg.optim.min_lr) == (600, 25, 0.0)
    assert header("recall_headline")[1].startswith("# python train.py experiment=recall_headline")


def test_lr_stability_is_an_lr_grid_from_1e3_past_3e1_at_d_head_64():
    """Wortsman et al.'s setting shrunk: the default corpus, heads of width 64, AdamW (0.9,
    0.95) without weight decay, a short warm-up; LRs a factor 2 apart from 1e-3 to past 3e-1,
    the four scales here and the three bounds from the commands in its header, each valid."""
    cfg = compose_preset("lr_stability")
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith("multirun/lr_stability/")
    assert sweep_values(cfg, "trainer.seed") == ["1"]
    assert sweep_values(cfg, "scaling") == ["sqrt_dk", "none", "dk", "qk_norm"]
    lrs = sorted(float(v) for v in sweep_values(cfg, "optim.lr"))
    assert lrs[0] == 1e-3 and lrs[-1] >= 3e-1
    assert all(math.isclose(b / a, 2.0) for a, b in zip(lrs, lrs[1:]))
    assert cfg.data.source == DataConfig().source   # the default corpus
    assert cfg.model.d_model // cfg.model.n_head == 64 and cfg.model.d_head is None
    assert list(cfg.optim.betas) == [0.9, 0.95] and cfg.optim.weight_decay == 0.0
    assert cfg.optim.warmup_steps <= 0.1 * cfg.trainer.max_steps and cfg.optim.min_lr == 0.0
    text = "\n".join(header("lr_stability"))
    bounds = ("scaling.softcap=50", "optim.qk_clip=50", "trainer.z_loss=1e-4")
    assert all(f"scaling=sqrt_dk {b}" in text for b in bounds)
    assert header("lr_stability")[1].startswith("# python train.py experiment=lr_stability")
    assert ("--pair scaling.softcap=null --pair optim.qk_clip=null --pair trainer.z_loss=0"
            " --one-control") in text
    plain = compose_preset("lr_stability", hydra=False)
    for extra in ([], ["scaling.softcap=50"], ["optim.qk_clip=50"], ["trainer.z_loss=1e-4"]):
        c = derive(plain, extra)
        ScalingConfig(**OmegaConf.to_container(c.scaling))
        OptimConfig(**OmegaConf.to_container(c.optim))
        TrainerConfig(**OmegaConf.to_container(c.trainer))


def test_width_transfer_is_sp_and_mup_by_two_scales_over_8x_width_and_a_factor_2_lr_grid():
    """Tensor Programs V's Fig. 1 on the default corpus: param sp and mup, scales sqrt_dk and
    dk, d_model over at least 8x at a fixed head count (d_head grows with width), an LR grid a
    factor 2 apart, cosine to zero; base_width the default model's d_model; the staged
    commands of its header resume into one folder."""
    cfg = compose_preset("width_transfer")
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith("multirun/width_transfer/")
    assert sweep_values(cfg, "param") == ["sp", "mup"]
    assert sweep_values(cfg, "scaling") == ["sqrt_dk", "dk"]
    widths = [int(v) for v in sweep_values(cfg, "model.d_model")]
    assert widths == sorted(widths) and widths[-1] / widths[0] >= 8
    assert all(w % cfg.model.n_head == 0 for w in widths) and cfg.model.d_head is None
    lrs = sorted(float(v) for v in sweep_values(cfg, "optim.lr"))
    assert len(lrs) >= 5 and all(math.isclose(b / a, 2.0) for a, b in zip(lrs, lrs[1:]))
    assert cfg.param.base_width == ParamConfig().base_width == 128
    assert cfg.data.source == DataConfig().source and cfg.optim.min_lr == 0.0
    lines = header("width_transfer")
    assert lines[1].startswith("# python train.py experiment=width_transfer hydra/launcher=joblib")
    text = "\n".join(lines)
    assert "hydra.sweep.dir=<folder> trainer.resume=auto" in text
    assert any(line.startswith("# Wall time:") for line in lines)
    report = "# Report: python scripts/plot_runs.py <folder> --out docs/results/width_transfer"
    assert report in text


@pytest.mark.parametrize("name", LENGTH_PRESETS)
def test_length_presets_are_multiruns_of_five_seeds_that_start_with_a_command(name):
    cfg = preset(name)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweep.dir.startswith(f"multirun/{name}/")
    assert sweep_values(cfg, "trainer.seed") == ["1", "2", "3", "4", "5"]
    assert header(name)[1].startswith("# python train.py experiment=length_generalisation")
    assert cfg.scaling.name == "sqrt_dk" and cfg.trainer.on_nan == "stop"


def test_length_text_preset_sweeps_nope_and_rope_by_every_length_factor_on_the_default_run():
    cfg = preset("length_generalisation")
    assert sweep_values(cfg, "model.pos") == ["nope", "rope"]
    assert sweep_values(cfg, "scaling.length") == ["fixed", "log_n", "log_n_eval", "ssmax"]
    assert list(cfg.trainer.eval_lengths) == [64, 1024]
    default = compose_preset("length_generalisation", hydra=False)
    assert (default.data.source, default.model.block_size, default.trainer.max_steps) == (
        "shakespeare", 64, 2000)
    text = "\n".join(header("length_generalisation"))
    assert "Registered before any run" in text and "sliding window" in text
    assert "model.pos=learned scaling.length=fixed trainer.eval_lengths=[64]" in text


def test_length_lookup_preset_is_one_nope_layer_on_kv_trained_to_64_pairs():
    cfg = preset("length_generalisation_lookup")
    assert (cfg.data.source, cfg.data.task, cfg.data.seq_len, cfg.data.min_pairs) == (
        "recall", "kv", 65, 2)
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.pos) == (1, 1, "nope")
    assert sweep_values(cfg, "model.pos") == ["nope"]
    assert sweep_values(cfg, "scaling.length") == ["fixed", "log_n", "ssmax"]
    assert list(cfg.trainer.eval_lengths) == [16, 32, 64, 256, 1024, 2048]
    assert cfg.trainer.max_steps == 600 and cfg.model.block_size == 65


# ---------------------------------------------------------------------------------------------
# normaliser: the normalisers x {sqrt_dk, none} on the default recipe and the recall headline
# cell, each stage 1 choosing the LRs on a seed stage 2 does not report
# ---------------------------------------------------------------------------------------------

NORMALISER_PRESETS = {"normaliser": "normaliser_select",
                      "normaliser_recall": "normaliser_recall_select"}
# the normalisers their committed results cover: a normaliser added later edits neither preset
NORMALISER_ARMS = ["softmax", "softmax1", "sink", "sigmoid"]


@pytest.mark.parametrize("report", NORMALISER_PRESETS)
def test_normaliser_stages_cross_their_normalisers_with_sqrt_dk_and_none(report):
    select = NORMALISER_PRESETS[report]
    for name in (report, select):
        cfg = preset(name)
        assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
        assert cfg.hydra.sweep.dir.startswith(f"multirun/{name}/")
        assert sweep_values(cfg, "scaling") == ["sqrt_dk", "none"]
        assert sweep_values(cfg, "scaling.normaliser") == NORMALISER_ARMS
        assert set(NORMALISER_ARMS) <= set(NORMALISERS)   # each still one a run can name
        assert cfg.trainer.diagnostics is True and cfg.trainer.on_nan == "stop"
        assert cfg.optim.min_lr == 0.0   # one schedule shape at every LR
        lines = header(name)
        assert any("scaling=uniform scaling.normaliser=softmax" in line for line in lines) \
            or name == report   # the control's command is stage 1's
        assert any(line.startswith("# Report: python scripts/plot_runs.py ") for line in lines)
    sel, rep = preset(select), preset(report)
    assert sweep_values(sel, "trainer.seed") == ["101"]
    assert sweep_values(rep, "trainer.seed") == ["1", "2", "3", "4", "5"]
    assert sel.model == rep.model and sel.data == rep.data
    assert sel.trainer.max_steps == rep.trainer.max_steps   # chosen at the full horizon
    lrs = sorted(float(v) for v in sweep_values(sel, "optim.lr"))
    assert len(lrs) >= 4 and all(b / a <= 4 for a, b in zip(lrs, lrs[1:]))


def test_a_scale_and_a_normaliser_added_to_their_tables_edit_no_study(monkeypatch):
    """docs/scaling.md, "Adding a scale" and "Adding a normaliser": with a row more in SCALES
    and in NORMALISERS (and SDPA_NORMALISERS), every preset that sweeps scales or normalisers
    still composes to its committed arms, each arm still builds, and this file's tests of them
    pass unchanged."""
    add_rows(monkeypatch, scales={"sqrt_dk_again": SCALES["sqrt_dk"]},
             normalisers={"softmax_plus1": softmax_with}, sdpa=("softmax_plus1",))
    assert "sqrt_dk_again" in SCALINGS and "softmax_plus1" in NORMALISERS   # as seen below
    test_scaling_ablation_runs_its_scales_and_the_control_where_attention_matters()
    test_selection_stage_is_the_same_model_on_other_seeds_over_a_factor_2_grid()
    for report in NORMALISER_PRESETS:
        test_normaliser_stages_cross_their_normalisers_with_sqrt_dk_and_none(report)
    for name in ("scaling_ablation", "normaliser_select", "normaliser_recall_select"):
        test_every_swept_value_builds_a_valid_config(name)


def test_normaliser_text_is_the_default_recipe_and_recall_the_headline_cell():
    text, recall = preset("normaliser"), preset("normaliser_recall")
    assert text.data.source != "recall" and text.model.d_model == 128
    assert text.trainer.max_steps == TrainerConfig().max_steps
    assert recall.data.source == "recall"
    params = recall.hydra.sweeper.params
    assert (str(params["model.d_head"]), float(params["model.qk_init_std"])) == ("256", 0.125)

