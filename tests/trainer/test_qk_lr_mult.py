"""Under Adam a constant score scale s is a reparameterisation (docs/scaling.md, "The scale
under Adam"): scaling with s trains as scaling=none with W_q and W_k started sqrt(s) as large
(model.qk_init_std) and trained at sqrt(s) x the LR (optim.qk_lr_mult), weight decay / sqrt(s),
up to rounding, Adam's eps and the global gradient clip. optim.qk_lr_mult's groups and errors."""

import math

import pytest
import torch
from conftest import make_config

from model.errors import ConfigError
from trainer.build import build
from trainer.schema import OptimConfig
from trainer.step import train_step

STEPS = 50


def losses(overrides: list[str]) -> list[float]:
    """Training losses of STEPS steps, fp32, no clip, a tiny eps, in process."""
    run = build(make_config(overrides + ["optim.grad_clip=0", "optim.eps=1e-12",
                                         "optim.weight_decay=0.1", "model.bias=true"]))
    state, compute = run.state, run.compute
    return [train_step(state, compute, run.config.optim_cfg, run.config.train_cfg)[0].item()
            for _ in range(STEPS)]


def equivalent_none(s: float) -> list[str]:
    """scaling=none with W_q, W_k at sqrt(s) x GPT-2's init and LR: s q.k = (c q).(c k)."""
    c = math.sqrt(s)
    return ["scaling=none", f"model.qk_init_std={0.02 * c!r}", f"optim.qk_lr_mult={c!r}"]


@pytest.mark.parametrize("n_head,d_head", [(2, 16), (1, 64)])
def test_sqrt_dk_trains_as_none_with_its_init_and_lr_for_wq_wk(tiny, single_thread,
                                                                n_head, d_head):
    shape = [f"model.n_head={n_head}", f"model.d_head={d_head}", "trainer.max_steps=50"]
    scaled = losses(tiny + shape + ["scaling=sqrt_dk"])
    reparam = losses(tiny + shape + equivalent_none(d_head ** -0.5))
    plain = losses(tiny + shape + ["scaling=none"])
    assert max(abs(a - b) for a, b in zip(scaled, reparam)) < 1e-5
    # the check can fail: none at GPT-2's init and LR is another run
    assert max(abs(a - b) for a, b in zip(scaled, plain)) > 1e-3


def test_constant_trains_as_none_with_its_divisor_folded_in(tiny, single_thread):
    shape = ["model.n_head=2", "model.d_head=16", "trainer.max_steps=50"]
    scaled = losses(tiny + shape + ["scaling=constant", "scaling.divisor=8"])
    reparam = losses(tiny + shape + equivalent_none(1 / 8))
    assert max(abs(a - b) for a, b in zip(scaled, reparam)) < 1e-5


def rates_by_name(run) -> dict[str, tuple[float, float]]:
    """(peak lr, weight_decay) of each parameter, by its name in the model."""
    ids = {id(p): name for name, p in run.state.model.named_parameters()}
    return {ids[id(p)]: (g["initial_lr"], g["weight_decay"])
            for g in run.state.optimizer.param_groups for p in g["params"]}


@pytest.mark.parametrize("param,m", [("sp", 1.0), ("mup", 2.0)])
def test_wq_wk_groups_carry_lr_times_mult_and_decay_over_it(tiny, param, m):
    """Every parameter's rate, by name: sp's two groups (or muP's hidden matrices at lr / m and
    decay x m, m = d_model 32 / base 16), and W_q, W_k (weight, bias) at x 0.25 and / 0.25."""
    run = build(make_config(tiny + [f"param={param}", "param.base_width=16", "model.bias=true",
                                    "optim.lr=1e-3", "optim.weight_decay=0.1",
                                    "optim.qk_lr_mult=0.25"]))
    rates, shapes = rates_by_name(run), dict(run.state.model.named_parameters())
    assert len(rates) == len(shapes) == 2 + 2 * 16 + 2   # wte, wpe; 16 a block; ln_f
    for name, (lr, wd) in rates.items():
        matrix = shapes[name].dim() >= 2
        hidden = matrix and name.startswith("blocks.")   # muP's hidden matrices
        want_lr, want_wd = (1e-3 / m, 0.1 * m) if hidden else (1e-3, 0.1 if matrix else 0.0)
        if ".attn.q_proj." in name or ".attn.k_proj." in name:
            want_lr, want_wd = want_lr * 0.25, want_wd / 0.25
        assert (lr, wd) == pytest.approx((want_lr, want_wd)), name


def test_multiplier_applies_at_every_step_of_the_schedule(tiny):
    run = build(make_config(tiny + ["optim.qk_lr_mult=0.5", "optim.warmup_steps=2",
                                    "trainer.max_steps=8"]))
    state, compute = run.state, run.compute
    for _ in range(5):
        train_step(state, compute, run.config.optim_cfg, run.config.train_cfg)
        qk = [g["lr"] for g in state.optimizer.param_groups
              if any(p is state.model.blocks[0].attn.q_proj.weight for p in g["params"])]
        assert qk == [pytest.approx(state.optimizer.param_groups[0]["lr"] * 0.5)]


def test_multiplier_one_keeps_the_two_groups():
    """The default builds the same two AdamW groups as before the option existed."""
    from model.config import GPTConfig
    from model.gpt import GPT
    from trainer.build import make_optimizer
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, d_model=8, block_size=4))
    groups = make_optimizer(model, OptimConfig(), torch.device("cpu")).param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, float("nan"), float("inf")])
def test_a_bad_multiplier_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"optim\.qk_lr_mult=.* is not valid: use a positive"):
        OptimConfig(qk_lr_mult=bad)


@pytest.mark.parametrize("name,d_head,init",
                         [("reparam", 32, 0.02), ("reparam_recall", 256, 0.125)])
def test_reparam_presets_sweep_sqrt_dks_exact_equivalent(name, d_head, init):
    """experiment=reparam's none arms: W_q, W_k's init and LR each at sqrt_dk's equivalent
    (x d_head^(-1/4)) or not; every swept value builds a valid config; the header's commands
    for the other arms name the same numbers."""
    from conftest import ROOT, register_schema
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    c = d_head ** -0.25
    assert params["scaling"] == ["none"] and params["trainer.seed"] == list("12345")
    assert [float(v) for v in params["optim.qk_lr_mult"]] == [1.0, pytest.approx(c, rel=1e-15)]
    inits = [init if v == "null" else float(v) for v in params["model.qk_init_std"]]
    assert inits == [init, pytest.approx(init * c, rel=1e-15)]
    assert cfg.model.get("d_head") in (None, d_head) and cfg.trainer.precision == "fp32"
    for mult in params["optim.qk_lr_mult"]:
        OptimConfig(**{**cfg.optim, "qk_lr_mult": float(mult)})
    text = (ROOT / "configs" / "experiment" / f"{name}.yaml").read_text()
    assert f"scaling=sqrt_dk model.qk_init_std={'null' if init == 0.02 else init}" in text
    if name == "reparam":   # the clip pair at d_head 32; stage 2: one head of width 128
        assert f"model.qk_init_std={0.02 * c!r} optim.qk_lr_mult={c!r}" in text
        assert f"{0.02 * 128 ** -0.25!r}" in text and f"{128 ** -0.25!r}" in text
