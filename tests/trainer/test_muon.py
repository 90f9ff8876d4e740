"""optim=muon (trainer/muon.py): which parameters Muon takes under every scale and normaliser,
its refusals, Float32Muon against torch.optim.Muon, the Newton-Schulz iteration by hand, the
schedule and a checkpoint's state through the combined optimizer, muP's rule, the attention
diagnostics, and (docs/scaling.md, section 10) a constant scale as W_q's and W_k's init and LR
under Muon, as under Adam (tests/trainer/test_qk_lr_mult.py). Resuming after kill -9 and
torchrun are tested in tests/e2e/test_muon_cli.py."""

import math
import re
from typing import Optional

import pytest
import torch
from conftest import copy_run, derive, make_config, records
from torch.optim._muon import _zeropower_via_newtonschulz

import train
from model.config import NORMALISERS, SCALINGS, GPTConfig, ParamConfig, ScalingConfig
from model.errors import ConfigError, UserError
from model.gpt import GPT
from trainer.build import build, make_optimizer
from trainer.muon import Float32Muon, MuonAdamW, newton_schulz
from trainer.schema import OptimConfig
from trainer.step import train_step

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
MUON = OptimConfig(name="muon")
# Muon's matrices in each block, by name: muP's hidden matrices
MATRICES = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.proj.weight",
            "mlp.fc.weight", "mlp.proj.weight")
COEFFICIENTS = (3.4445, -4.775, 2.0315)   # torch.optim.Muon's, Jordan et al. 2024


def small_model(scaling: Optional[ScalingConfig] = None, param: Optional[ParamConfig] = None,
                d_model: int = 32) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, d_model=d_model,
                         bias=True, scaling=scaling or ScalingConfig(),
                         param=param or ParamConfig()))


def owners(optimizer: MuonAdamW, model: GPT) -> dict[str, tuple[str, float, float]]:
    """Each parameter's (optimizer, peak lr, weight decay), by its name in the model."""
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: (kind, g["lr"], g["weight_decay"])
            for kind, inner in (("adamw", optimizer.adamw), ("muon", optimizer.muon))
            for g in inner.param_groups for p in g["params"]}


# ---------------------------------------------------------------- which parameters Muon takes

@pytest.mark.parametrize("scaling,normaliser",
                         [(s, "softmax") for s in SCALINGS] + [("sqrt_dk", n) for n in NORMALISERS])
def test_muon_takes_the_blocks_matrices_and_adamw_everything_else(scaling, normaliser):
    """Every parameter in exactly one optimizer: the six matrices of each block on Muon at
    muon_lr; on AdamW the embeddings (the tied read-out) decayed, and biases, norm gains,
    learned scales and sink logits not."""
    model = small_model(ScalingConfig(name=scaling, normaliser=normaliser))
    optimizer = make_optimizer(model, MUON, CPU)
    assert isinstance(optimizer, MuonAdamW) and isinstance(optimizer.muon, Float32Muon)
    got = owners(optimizer, model)
    assert sorted(got) == sorted(name for name, _ in model.named_parameters())
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and name.split(".", 2)[2] in MATRICES:
            assert got[name] == ("muon", 0.02, 0.0), name
        else:
            assert got[name] == ("adamw", 1e-3, 0.1 if p.dim() == 2 else 0.0), name
    assert sum(kind == "muon" for kind, _, _ in got.values()) == 2 * len(MATRICES)
    extra = {"learned": "log_scale", "qk_norm": "q_norm"}.get(scaling)
    if normaliser == "sink":
        extra = "sink"
    if extra:   # the vector this arm adds is there, on AdamW
        assert any(extra in name and kind == "adamw" for name, (kind, _, _) in got.items())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tokens = torch.randint(17, (4, 9), generator=torch.Generator().manual_seed(1))
    for _ in range(2):   # both optimizers step every parameter that has a gradient
        optimizer.zero_grad()
        loss = model(tokens[:, :-1], tokens[:, 1:])[1]
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad.abs().max() == 0 or not torch.equal(p, before[name]), name


def test_the_first_group_is_adamws_and_the_schedule_scales_both():
    """The train records log the first group's LR (optim.lr's); the warm-up multiplies Muon's
    peak by the same factor: at step 1 of a 4-step warm-up, 1/4 of each."""
    model = small_model()
    optimizer = make_optimizer(model, OptimConfig(name="muon", warmup_steps=4), CPU)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: (epoch + 1) / 4)
    assert schedule.get_last_lr()[0] == pytest.approx(1e-3 / 4)
    assert [g["lr"] for g in optimizer.muon.param_groups] == [pytest.approx(0.02 / 4)]
    assert optimizer.param_groups[0] is optimizer.adamw.param_groups[0]


def test_qk_lr_mult_splits_muons_group_and_adamws():
    """W_q and W_k (weights on Muon, biases on AdamW) at x 0.25 their optimizer's LR and decay
    / 0.25: lr x decay, the shrink a step, is unchanged."""
    model = small_model()
    got = owners(make_optimizer(model, OptimConfig(name="muon", qk_lr_mult=0.25,
                                                   muon_weight_decay=0.2), CPU), model)
    assert got["blocks.1.attn.q_proj.weight"] == ("muon", 0.02 * 0.25, pytest.approx(0.8))
    assert got["blocks.1.attn.k_proj.bias"] == ("adamw", 1e-3 * 0.25, 0.0)
    assert got["blocks.1.attn.v_proj.weight"] == ("muon", 0.02, 0.2)


def test_muon_params_routes_by_name():
    model = small_model()
    cfg = OptimConfig(name="muon", muon_params=["blocks.*.attn.*_proj.weight"])
    got = owners(make_optimizer(model, cfg, CPU), model)
    assert sorted(n for n, (kind, _, _) in got.items() if kind == "muon") == [
        f"blocks.{i}.attn.{m}_proj.weight" for i in range(2) for m in "kqv"]
    assert got["blocks.0.mlp.fc.weight"][0] == "adamw"


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("key,value,says", [
    ("ns_steps", 0, "optim.ns_steps=0 is not valid: use a whole number of Newton-Schulz"),
    ("ns_steps", 100, "optim.ns_steps=100 is not valid"),
    ("adjust_lr_fn", "rms", "optim.adjust_lr_fn='rms' is not valid: choose original | "
                            "match_rms_adamw"),
    ("name", "sgd", "optim.name='sgd' is not valid: choose adamw | muon"),
    ("momentum", 1.0, "optim.momentum=1.0 is not valid: use a number in [0, 1)"),
    ("muon_lr", 0.0, "optim.muon_lr=0.0 is not valid"),
    ("muon_weight_decay", -0.1, "optim.muon_weight_decay=-0.1 is not valid"),
    ("nesterov", 1, "optim.nesterov=1 is not valid: use true or false"),
    ("muon_params", [], "optim.muon_params=[] is not valid")])
def test_a_bad_muon_value_is_refused_naming_the_key(key, value, says):
    with pytest.raises(ConfigError, match=f"^{re.escape(says)}"):
        OptimConfig(**{"name": "muon", key: value})


def test_a_vector_routed_to_muon_is_refused_naming_it():
    with pytest.raises(ConfigError) as err:
        make_optimizer(small_model(), OptimConfig(name="muon", muon_params=["blocks.*"]), CPU)
    message = str(err.value)
    assert message.startswith("optim.muon_params=['blocks.*'] is not valid: it routes "
                              "blocks.0.ln_1.weight (32,), blocks.0.ln_1.bias (32,) and ")
    assert "to Muon, which updates 2-D matrices only" in message and "\n" not in message


def test_a_pattern_that_names_nothing_is_refused():
    cfg = OptimConfig(name="muon", muon_params=["blocks.*.mlp.fc.weight", "blocks.*.qkv.weight"])
    with pytest.raises(ConfigError, match=r"\['blocks\.\*\.qkv\.weight'\] name no parameter"):
        make_optimizer(small_model(), cfg, CPU)


def test_mup_with_match_rms_adamw_is_refused_with_the_reason():
    model = small_model(param=ParamConfig(name="mup", base_width=16))
    with pytest.raises(ConfigError, match="match_rms_adamw cannot work with param=mup: .* "
                                          "grows with d_model"):
        make_optimizer(model, OptimConfig(name="muon", adjust_lr_fn="match_rms_adamw"), CPU)


# ---------------------------------------------------------------- muP under Muon

def test_mup_keeps_muons_lr_at_every_width_and_its_adam_rules_for_the_rest():
    """m = 64 / 16 = 4: Muon's matrices at muon_lr and its decay (their update's spectral norm,
    muon_lr x sqrt(max(1, rows/cols)), does not grow with width); on AdamW the embeddings and
    vectors at lr as muP says; a hidden matrix left to AdamW takes muP's lr / m, decay x m."""
    model = small_model(param=ParamConfig(name="mup", base_width=16), d_model=64)
    cfg = OptimConfig(name="muon", muon_params=["blocks.*.attn.*proj.weight"])
    got = owners(make_optimizer(model, cfg, CPU), model)
    assert got["blocks.0.attn.q_proj.weight"] == ("muon", 0.02, 0.0)
    assert got["blocks.0.mlp.fc.weight"] == ("adamw", 1e-3 / 4, pytest.approx(0.4))
    assert got["wte.weight"] == ("adamw", 1e-3, 0.1)
    assert got["blocks.0.ln_1.weight"] == ("adamw", 1e-3, 0.0)


# ---------------------------------------------------------------- the Newton-Schulz step

def test_newton_schulz_by_hand_on_a_diagonal_matrix():
    """G = diag(3, 4) (rows <= cols, as is): each singular value goes through
    p(x) = a x + b x^3 + c x^5 from x = s / |G|_F = (0.6, 0.8), five times."""
    want = []
    for x in (0.6, 0.8):
        for _ in range(5):
            x = 3.4445 * x - 4.775 * x**3 + 2.0315 * x**5
        want.append(x)
    got = newton_schulz(torch.tensor([[[3.0, 0.0], [0.0, 4.0]]]), COEFFICIENTS, 5, 1e-7,
                        torch.float64)
    assert got.flatten().tolist() == pytest.approx([want[0], 0.0, 0.0, want[1]], abs=1e-12)
    assert 0.68 < min(want) and max(want) < 1.2   # about orthogonal, not exactly (Jordan)


@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (16, 16)])
def test_newton_schulz_in_bfloat16_is_pytorchs_and_float32_is_the_same_iteration(shape):
    """Three matrices at once: in bfloat16 each is PyTorch's, bit for bit; in float32 the
    iteration in float64 to 1e-5, and not bfloat16's."""
    G = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    torch_bf16 = torch.stack([_zeropower_via_newtonschulz(g, COEFFICIENTS, 5, 1e-7) for g in G])
    assert torch.equal(newton_schulz(G, COEFFICIENTS, 5, 1e-7, torch.bfloat16), torch_bf16)
    in32 = newton_schulz(G, COEFFICIENTS, 5, 1e-7, torch.float32)
    in64 = newton_schulz(G.double(), COEFFICIENTS, 5, 1e-7, torch.float64)
    assert in32.dtype == torch.float32 and (in32 - in64).abs().max() < 1e-5
    assert 1e-4 < (in32 - torch_bf16.float()).abs().max() < 0.05   # bfloat16's rounding


class BFloat16Muon(Float32Muon):
    ns_dtype = torch.bfloat16


@pytest.mark.parametrize("nesterov,adjust,decay", [(True, "original", 0.0),
                                                   (False, "match_rms_adamw", 0.1)])
def test_float32_muon_is_pytorchs_step_but_for_the_dtype(nesterov, adjust, decay):
    """With bfloat16 for its dtype, Float32Muon's weights equal torch.optim.Muon's bit for bit
    over 3 steps (tall, wide and square matrices, two stacks of two); in float32 they differ
    by bfloat16's rounding only."""
    shapes = [(24, 8), (8, 24), (16, 16), (24, 8), (16, 16)]
    assert Float32Muon.stacks([torch.Size(s) for s in shapes]) == [[0, 3], [1], [2, 4]]

    def run(cls) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        optimizer = cls(params, lr=0.02, weight_decay=decay, nesterov=nesterov,
                        adjust_lr_fn=adjust)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            optimizer.step()
        return [p.detach() for p in params]

    pytorch, ours, in32 = run(torch.optim.Muon), run(BFloat16Muon), run(Float32Muon)
    assert all(torch.equal(a, b) for a, b in zip(pytorch, ours))
    assert all(0 < (a - b).abs().max() < 3e-3 for a, b in zip(pytorch, in32))   # 3 x lr x 0.05


def test_bf16_runs_step_with_pytorchs_own_muon():
    optimizer = make_optimizer(small_model(), MUON, CPU, precision="bf16")
    assert type(optimizer.muon) is torch.optim.Muon and optimizer.name == "Muon + AdamW"


def test_a_loaded_state_keeps_the_schedule_reaching_both_optimizers():
    """load_state_dict gives each optimizer new group dicts; MuonAdamW lists those, so the
    schedule's next LR reaches Muon (a resumed run would otherwise train at a frozen LR)."""
    model = small_model()
    first = make_optimizer(model, MUON, CPU)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    first.step()
    again = make_optimizer(model, MUON, CPU)
    again.load_state_dict(first.state_dict())
    schedule = torch.optim.lr_scheduler.LambdaLR(again, lambda epoch: 0.5)
    assert schedule.get_last_lr() == [pytest.approx(5e-4)] * 2 + [pytest.approx(0.01)]
    assert [g["lr"] for g in again.muon.param_groups] == [pytest.approx(0.01)]
    state = again.muon.state[model.blocks[0].attn.q_proj.weight]["momentum_buffer"]
    assert torch.equal(state, first.muon.state[model.blocks[0].attn.q_proj.weight][
        "momentum_buffer"])


# ---------------------------------------------------------------- runs

def test_an_adamw_checkpoint_is_refused_under_muon_and_its_folder_kept(tiny_cfg, tiny_run,
                                                                        tmp_path):
    """AdamW's state (two moments per parameter) is no Muon momentum: the resume stops before
    anything is written, naming optim.name."""
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"optim\.name: [^;]*, now 'muon'"):
        train.train(derive(tiny_cfg, ["optim.name=muon", "trainer.max_steps=12",
                                      "trainer.resume=auto"]), run_dir)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_checkpoint_from_before_optim_muon_resumes_under_adamw_only(tiny_cfg, tiny_run,
                                                                     tmp_path):
    """A checkpoint whose config lacks optim.name and Muon's keys was trained by AdamW: it
    resumes at their defaults, and under optim=muon is refused, naming optim.name."""
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    last = run_dir / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=False)
    for key in ("name", "muon_lr", "muon_weight_decay", "momentum", "nesterov", "ns_steps",
                "adjust_lr_fn", "muon_params"):
        del ckpt["config"]["optim"][key]
    torch.save(ckpt, last)
    with pytest.raises(UserError, match=r"optim\.name: [^;]*, now 'muon'"):
        train.train(derive(tiny_cfg, ["optim.name=muon", "trainer.max_steps=12",
                                      "trainer.resume=auto"]), run_dir)
    summary = train.train(derive(tiny_cfg, ["trainer.max_steps=12", "trainer.resume=auto"]),
                          run_dir)
    assert summary["steps"] == 12


def test_muon_trains_with_qk_clip_and_z_loss_and_logs_each_heads_largest_logit(tiny_cfg,
                                                                               tmp_path):
    """MuonClip (QK-Clip after the Muon step, Kimi K2) at a threshold the heads pass, the
    z-loss and the diagnostics: the loss falls, the clip counts, and every evaluation records
    each head's largest logit, as under AdamW."""
    extra = ["optim.qk_clip=0.05", "trainer.z_loss=1e-3", "trainer.diagnostics=true"]
    for name in ("adamw", "muon"):
        train.train(derive(tiny_cfg, [f"optim.name={name}", *extra]), tmp_path / name)
    adamw, muon = records(tmp_path / "adamw", "eval"), records(tmp_path / "muon", "eval")
    assert [r["step"] for r in muon] == [r["step"] for r in adamw] == [0, 4, 8]
    for r in muon:
        assert len(r["attn_heads"]["max_logit"]) == 2   # layers
        assert all(len(heads) == 2 and all(math.isfinite(m) for m in heads)
                   for heads in r["attn_heads"]["max_logit"])
    assert muon[-1]["val_loss"] < muon[0]["val_loss"] - 0.1
    assert sum(map(sum, muon[-1]["attn_heads"]["qk_clip_count"])) > 0
    assert muon[-1]["val_loss"] != adamw[-1]["val_loss"]


# ---------------------------------------------------------------- the scale under Muon

STEPS = 50


def losses(overrides: list[str]) -> list[float]:
    """Training losses of STEPS Muon steps, fp32, no gradient clip, a tiny eps, in process."""
    run = build(make_config(overrides + [
        "optim=muon", "optim.grad_clip=0", "optim.eps=1e-12", "optim.weight_decay=0.1",
        "optim.muon_weight_decay=0.1", "model.bias=true", f"trainer.max_steps={STEPS}"]))
    state, compute = run.state, run.compute
    return [train_step(state, compute, run.config.optim_cfg, run.config.train_cfg)[0].item()
            for _ in range(STEPS)]


def equivalent_none(s: float) -> list[str]:
    """scaling=none with W_q, W_k at sqrt(s) x GPT-2's init and LR (Muon's for the weights,
    AdamW's for the biases), weight decay / sqrt(s): s q.k = (c q).(c k)."""
    c = math.sqrt(s)
    return ["scaling=none", f"model.qk_init_std={0.02 * c!r}", f"optim.qk_lr_mult={c!r}"]


@pytest.mark.parametrize("n_head,d_head", [(2, 16), (1, 64)])
def test_sqrt_dk_trains_under_muon_as_none_with_its_init_and_lr_for_wq_wk(tiny, n_head, d_head):
    """d_head 16: c = 1/2, and every product is exact; 64: c = 0.354, float32's rounding."""
    shape = [f"model.n_head={n_head}", f"model.d_head={d_head}"]
    scaled = losses(tiny + shape + ["scaling=sqrt_dk"])
    reparam = losses(tiny + shape + equivalent_none(d_head ** -0.5))
    plain = losses(tiny + shape + ["scaling=none"])
    assert max(abs(a - b) for a, b in zip(scaled, reparam)) < 1e-5
    # the check can fail: none at GPT-2's init and Muon's LR is another run
    assert max(abs(a - b) for a, b in zip(scaled, plain)) > 1e-3


@pytest.mark.parametrize("bound", ["optim.qk_clip=0.05", "scaling.softcap=0.1"])
def test_the_equivalence_holds_through_qk_clip_and_a_soft_cap(tiny, bound):
    """Both act on the logit s q.k, which the two runs compute alike: QK-Clip multiplies W_q^h
    and W_k^h by one factor (U = c W survives each clip), the soft-cap bends the product."""
    shape = ["model.n_head=2", "model.d_head=16"]
    scaled = losses(tiny + shape + [bound, "scaling=sqrt_dk"])
    reparam = losses(tiny + shape + [bound] + equivalent_none(16 ** -0.5))
    unbounded = losses(tiny + shape + ["scaling=sqrt_dk"])
    assert max(abs(a - b) for a, b in zip(scaled, reparam)) < 1e-5
    assert max(abs(a - b) for a, b in zip(scaled, unbounded)) > 1e-3   # the bound acted


def test_one_fused_qkv_matrix_would_break_the_equivalence():
    """W_q, W_k, W_v orthogonalised apart: W_q's update ignores how large its gradient is, so
    U = c W_q gets c x W's step at c x the LR. Orthogonalised as one stacked matrix, the
    q rows' update depends on the v rows' size, and a gradient c^-1 as large changes it."""
    gen = torch.Generator().manual_seed(0)
    g_q, g_k, g_v = (torch.randn(16, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    c = 0.5

    def orth(g: torch.Tensor) -> torch.Tensor:
        return newton_schulz(g[None], COEFFICIENTS, 5, 1e-7, torch.float64)[0]

    assert torch.allclose(orth(g_q / c), orth(g_q), atol=1e-12)
    fused, fused_u = orth(torch.cat([g_q, g_k, g_v])), orth(torch.cat([g_q / c, g_k / c, g_v]))
    assert (fused_u[:16] - fused[:16]).abs().max() > 0.05
