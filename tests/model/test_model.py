"""Tests for model/gpt.py: config validation, initialisation, counts, loss masking, causality,
padding and positions, statistics, generation, and that every variant can learn."""

import itertools
import math

import pytest
import torch

from model.attention import MultiHeadAttention
from model.config import (
    IGNORE_INDEX,
    LENGTHS,
    NORMALISERS,
    POSITIONS,
    SCALINGS,
    GPTConfig,
    ScalingConfig,
)
from model.cpu_autocast import CPUAutocastAttention
from model.diagnostics import explain, layer_stats, qk_grad_norms
from model.errors import ConfigError, UserError
from model.generate import Sampling, generate
from model.gpt import GPT

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 17


def tiny(seed=0, attention=MultiHeadAttention, **overrides):
    torch.manual_seed(seed)
    kwargs = {"vocab_size": VOCAB, "block_size": 12, "n_layer": 2, "n_head": 2, "d_model": 16}
    kwargs.update(overrides)
    return GPT(GPTConfig(**kwargs), attention).eval()


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("kwargs, message", [
    ({"d_model": 130, "n_head": 4},
     "model.d_model=130 is not divisible by model.n_head=4; set model.d_head explicitly or "
     "change model.n_head"),
    ({"vocab_size": 0}, "model.vocab_size=0 must be a positive integer"),
    ({"n_layer": 0}, "model.n_layer=0 must be a positive integer"),
    ({"d_head": 0}, "model.d_head=0 must be a positive integer"),
    ({"dropout": 1.0}, "model.dropout=1.0 must be in [0, 1)"),
    ({"attn_impl": "flash"}, "model.attn_impl='flash' is not valid: choose one of auto, "
                             "explicit, sdpa"),
    ({"attn_gate": "channel"}, "model.attn_gate='channel' is not valid: choose one of none, "
                               "headwise, elementwise"),
    ({"d_head": 1, "scaling": ScalingConfig(qk_norm="rmsnorm")},
     "model.d_head=1 is too narrow for scaling.name=sqrt_dk with scaling.qk_norm=rmsnorm, "
     "defined for d_head >= 2"),
    ({"scaling": {"name": "dk"}}, "model.scaling must be a ScalingConfig, got dict"),
    ({"attn_impl": "sdpa", "scaling": ScalingConfig(softcap=30.0)},
     "model.attn_impl='sdpa' cannot apply scaling.softcap=30.0"),
])
def test_config_errors_name_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ConfigError) as err:
        GPTConfig(**{"vocab_size": VOCAB, **kwargs})
    assert message in str(err.value)
    assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)


def test_config_d_head_and_explicit_d_head():
    assert GPTConfig(vocab_size=VOCAB).d_head == 32
    cfg = GPTConfig(vocab_size=VOCAB, d_model=130, n_head=4, d_head=32)
    assert cfg.d_head == 32
    model = GPT(cfg)
    attn = model.blocks[0].attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.shape == (4 * 32, 130)
    assert model.blocks[0].attn.proj.weight.shape == (130, 4 * 32)


# ---------------------------------------------------------------- init and counts

def test_gpt2_initialisation_and_tied_head():
    model = tiny(d_model=64, n_layer=4, n_head=4, block_size=64, vocab_size=512)
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.wpe.weight.std().item() == pytest.approx(0.02, rel=0.05)
    attn = model.blocks[0].attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    residual = 0.02 / math.sqrt(2 * 4)
    for block in model.blocks:
        assert block.attn.proj.weight.std().item() == pytest.approx(residual, rel=0.1)
        assert block.mlp.proj.weight.std().item() == pytest.approx(residual, rel=0.1)
        assert block.mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
        for proj in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
            assert torch.equal(proj.bias, torch.zeros_like(proj.bias))



def test_default_initialisation_is_unchanged():
    """model.qk_init_std=null draws exactly GPT-2's initialisation, in the same order (values
    recorded for seed 0 from the code before the key existed, with one fused qkv weight whose
    rows were q, k, v: W_q's first row is its first, W_v's last its last): the golden curve
    stands."""
    model = tiny()
    w = model.blocks[0].attn.q_proj.weight
    assert w[0, :4].tolist() == pytest.approx(
        [-0.004467173013836145, 0.016979271546006203, -0.010736591182649136,
         0.0042006163857877254], rel=1e-6)
    assert model.blocks[1].attn.v_proj.weight[-1, -2:].tolist() == pytest.approx(
        [-0.0033161432947963476, -0.026499878615140915], rel=1e-6)
    assert model.blocks[1].attn.proj.weight[3, :2].tolist() == pytest.approx(
        [-0.001594538684003055, 0.002842479618266225], rel=1e-6)
    assert torch.randn(2).tolist() == pytest.approx([1.684773325920105, -1.6960464715957642])


def test_qk_init_std_sets_q_and_k_only():
    """qk_init_std = 1/sqrt(d_model) = 1/16: the q and k rows have that std, v and the output
    projection keep GPT-2's, and unit-variance inputs give q, k components of variance ~1."""
    C, H = 256, 4
    model = tiny(d_model=C, n_head=H, n_layer=2, qk_init_std=1 / 16)
    x = torch.randn(4096, C, generator=torch.Generator().manual_seed(0))
    for block in model.blocks:
        attn = block.attn  # W_q, W_k, W_v: (C, C) each
        assert attn.q_proj.weight.std().item() == pytest.approx(1 / 16, rel=0.01)
        assert attn.k_proj.weight.std().item() == pytest.approx(1 / 16, rel=0.01)
        assert attn.v_proj.weight.std().item() == pytest.approx(0.02, rel=0.01)
        assert attn.proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.02)
        with torch.no_grad():
            q, k = (x @ p.weight.T for p in (attn.q_proj, attn.k_proj))  # (N, C)
        assert q.var().item() == pytest.approx(1.0, rel=0.05)
        assert k.var().item() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("value", [0.0, -0.1, float("nan"), True, "0.1"])
def test_qk_init_std_must_be_positive_or_null(value):
    with pytest.raises(ConfigError, match=r"model.qk_init_std=.* must be null \(GPT-2's 0.02"):
        GPTConfig(vocab_size=VOCAB, qk_init_std=value)

def test_learned_scale_and_qk_gains_keep_their_init():
    model = tiny(scaling=ScalingConfig("learned"))
    assert torch.allclose(model.blocks[1].attn.scale().flatten(), torch.full((2,), 8 ** -0.5))
    model = tiny(scaling=ScalingConfig("qk_norm"))
    assert torch.equal(model.blocks[0].attn.q_norm.weight, torch.ones(8))


def test_num_params():
    V, T, L, C = VOCAB, 12, 2, 16
    model = tiny()
    per_layer = (2 * 2 * C  # two LayerNorms
                 + 3 * (C * C + C) + C * C + C  # q, k, v and output projections
                 + 4 * C * C + 4 * C + 4 * C * C + C)  # MLP
    total = V * C + T * C + L * per_layer + 2 * C  # tied head counted once; final LayerNorm
    assert model.num_params() == total


# ---------------------------------------------------------------- forward and loss

def test_loss_ignores_padding_targets():
    model = tiny()
    idx = torch.randint(0, VOCAB, (3, 10), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(idx, -1, dims=1)
    targets[0, 6:] = IGNORE_INDEX
    targets[2, :3] = IGNORE_INDEX
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 10, VOCAB) and logits.dtype == torch.float32
    keep = targets != IGNORE_INDEX
    expected = -logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0][keep]
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-6)
    assert model(idx)[1] is None


def test_sequence_longer_than_block_size_is_rejected():
    with pytest.raises(ValueError, match="exceeds model.block_size=12"):
        tiny()(torch.zeros(1, 13, dtype=torch.long))


@pytest.mark.parametrize("attn_impl", ["explicit", "sdpa"])
def test_model_is_causal(attn_impl):
    model = tiny(attn_impl=attn_impl)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (2, 12), generator=gen)
    logits = model(idx)[0]
    idx2 = idx.clone()
    idx2[:, 7:] = torch.randint(0, VOCAB, (2, 5), generator=gen)
    logits2 = model(idx2)[0]
    assert torch.equal(logits[:, :7], logits2[:, :7])
    assert not torch.allclose(logits[:, 7:], logits2[:, 7:])


@pytest.mark.parametrize("name", SCALINGS)
def test_left_padding_gives_the_unpadded_logits(name):
    """pos = cumsum(valid) - 1: a left-padded row computes what it computes unpadded,
    whatever the pad tokens are."""
    model = tiny(scaling=ScalingConfig(name), attn_impl="sdpa")
    gen = torch.Generator().manual_seed(0)
    row = torch.randint(0, VOCAB, (1, 7), generator=gen)
    alone = model(row)[0]
    padded = torch.cat([torch.randint(0, VOCAB, (1, 5), generator=gen), row], dim=1)
    other = torch.randint(0, VOCAB, (1, 12), generator=gen)
    idx = torch.cat([padded, other])  # (2, 12)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, :5] = False
    logits = model(idx, valid_mask=valid)[0]
    assert (logits[0, 5:] - alone[0]).abs().max() <= 1e-5
    assert (logits[1] - model(other)[0][0]).abs().max() <= 1e-5
    assert logits.isfinite().all()


def test_explicit_and_sdpa_models_agree_with_padding():
    explicit, sdpa = tiny(attn_impl="explicit"), tiny(attn_impl="sdpa")
    idx = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(3, 12, dtype=torch.bool)
    valid[0, :4] = False
    valid[2, 9:] = False
    assert (explicit(idx, valid_mask=valid)[0] - sdpa(idx, valid_mask=valid)[0]).abs().max() \
        <= 1e-5


def test_dropout_only_in_training():
    model = tiny(dropout=0.3)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(idx)[0], model(idx)[0])
    model.train()
    assert not torch.allclose(model(idx)[0], model(idx)[0])


# ---------------------------------------------------------------- attention statistics

def test_attention_stats_are_each_layers_own_on_its_input():
    """Layer l's statistics are its attention module's, on layer l's input (the output of the
    blocks before it) with the padding mask."""
    idx = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(3, 12, dtype=torch.bool)
    valid[1, :6] = False
    model = tiny()
    stats = layer_stats(model, idx, valid)
    assert len(stats) == 2
    with torch.no_grad():
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        x = model.wte(idx) + model.wpe(pos)
        for block, layer in zip(model.blocks, stats, strict=True):
            assert set(layer) == {"entropy", "entropy_norm", "max_logit", "saturated",
                                  "raw_var", "raw_max_logit", "q_norm", "k_norm",
                                  "first_mass", "sink_score", "sink_rate", "sink_weight"}
            assert all(v.shape == (2,) and v.isfinite().all() for v in layer.values())
            info = explain(block.attn, block.ln_1(x), causal=True, valid_mask=valid)
            for key in info.stats:
                assert torch.allclose(layer[key], info.stats[key], atol=1e-6), key
            x = block(x, valid)
    # the mask reaches every layer: without it the padded row changes the statistics
    unmasked = layer_stats(model, idx)
    assert not torch.allclose(unmasked[1]["entropy"], stats[1]["entropy"])


def test_attention_stats_ignore_dropout_keep_rng_and_mode():
    """With dropout on and the model in training mode, the statistics are those of eval mode,
    draw nothing from the global RNG, and leave the model in training mode."""
    idx = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    model = tiny(dropout=0.5)
    reference = layer_stats(model.eval(), idx)
    model.train()
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    stats = layer_stats(model, idx)
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)
    for a, b in zip(stats, reference, strict=True):
        for key in a:
            assert torch.equal(a[key], b[key]), key


# ---------------------------------------------------------------- generation

def test_batched_greedy_generation_equals_unbatched():
    model = tiny(seed=3, block_size=8)
    prompts = [[1], [2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [15, 16]]
    batched = generate(model, prompts, Sampling(9, temperature=0.0))
    for prompt, out in zip(prompts, batched, strict=True):
        assert out == generate(model, [prompt], Sampling(9, temperature=0.0))[0]
        assert len(out) == 9
    assert len({tuple(o) for o in batched}) > 1  # the rows really differ


def test_greedy_generation_is_the_argmax_loop():
    """Reference: nanoGPT's loop, unpadded, cropping the context to block_size."""
    model = tiny(seed=1, block_size=6)
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    for _ in range(7):
        logits = model(idx[:, -6:])[0]
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert generate(model, [[3, 1, 4, 1, 5]], Sampling(7, temperature=0.0)) == [idx[0, 5:].tolist()]


def test_sampling_is_reproducible_and_top_k_one_is_greedy():
    model = tiny(seed=2)
    prompts = [[1, 2], [3]]
    a = generate(model, prompts, Sampling(6, temperature=1.0, seed=7))
    assert a == generate(model, prompts, Sampling(6, temperature=1.0, seed=7))
    assert a != generate(model, prompts, Sampling(6, temperature=1.0, seed=8))
    greedy = generate(model, prompts, Sampling(6, temperature=0.0))
    assert generate(model, prompts, Sampling(6, temperature=0.8, top_k=1)) == greedy
    assert all(0 <= t < VOCAB for row in a for t in row)


def test_top_k_restricts_samples():
    model = tiny(seed=2)
    logits = model(torch.tensor([[4, 5]]))[0][0, -1]
    allowed = set(torch.topk(logits, 3).indices.tolist())
    samples = {generate(model, [[4, 5]], Sampling(1, temperature=5.0, top_k=3, seed=seed))[0][0]
               for seed in range(40)}
    assert samples <= allowed and len(samples) > 1


@pytest.mark.parametrize("prompts, kwargs, message", [
    ([[1], []], {}, "every prompt needs at least one token"),
    ([[1]], {"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
    ([[1]], {"top_k": 0}, "top_k=0 must be null or a positive integer"),
])
def test_generate_rejects_bad_arguments(prompts, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        generate(tiny(), prompts, Sampling(2, **kwargs))


# ---------------------------------------------------------------- learning

@pytest.mark.parametrize("name", SCALINGS)
def test_two_layer_model_overfits_one_batch(name):
    model = tiny(seed=0, scaling=ScalingConfig(name), d_model=32).train()
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (4, 13), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(60):   # every scaling is below 0.1 by step 35 and at its ~0.03 floor by 60
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, f"{name}: loss {loss.item():.3f} after 60 steps"


def test_qk_grad_norms_of_model_layers():
    model = tiny().train()
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    norms = [qk_grad_norms(block.attn) for block in model.blocks]
    assert all(isinstance(block.attn, MultiHeadAttention) for block in model.blocks)
    assert all(q > 0 and k > 0 for q, k in norms)


def test_gpt_builds_the_attention_it_is_given():
    """GPT builds model/attention.py's MultiHeadAttention for every attn_impl unless the caller
    passes a speed route (trainer/build.py chooses it), with the same weights; attention_name
    names the class for the start line."""
    for impl in ("auto", "explicit", "sdpa"):
        model = tiny(attn_impl=impl)
        assert model.attention_name == "MultiHeadAttention"
        assert all(type(b.attn) is MultiHeadAttention for b in model.blocks)
    route = tiny(attention=CPUAutocastAttention)
    assert route.attention_name == "CPUAutocastAttention"
    assert all(type(b.attn) is CPUAutocastAttention for b in route.blocks)
    plain = tiny().state_dict()
    assert all(torch.equal(v, plain[k]) for k, v in route.state_dict().items())


# The switches of the scale's neighbourhood, one arm each: a norm on q and k without a gain
# under modded-nanogpt's constant, the output gate both ways, and sqrt_dmodel's bug
SWITCHES = {"qk_norm": {"scaling": {"name": "constant", "divisor": 1 / 0.12,
                                    "qk_norm": "rmsnorm", "qk_norm_gain": False}},
            "headwise": {"attn_gate": "headwise"}, "elementwise": {"attn_gate": "elementwise"},
            "sqrt_dmodel": {"scaling": {"name": "sqrt_dmodel"}}}


def switched(switch: str, **scaling) -> dict:
    """GPTConfig keyword arguments of SWITCHES[switch], with more ScalingConfig keys."""
    keys = dict(SWITCHES[switch])
    return {**keys, "scaling": ScalingConfig(**{**keys.get("scaling", {}), **scaling})}


@pytest.mark.parametrize("switch", SWITCHES)
def test_two_layer_model_overfits_one_batch_with_each_switch(switch):
    model = tiny(seed=0, d_model=32, **switched(switch)).train()
    idx = torch.randint(0, VOCAB, (4, 13), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(60):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, f"{switch}: loss {loss.item():.3f} after 60 steps"


# Every position and length option together, each pair with one normaliser in turn: each
# switch meets every normaliser three times and every position and length pair once
SETTINGS = [(pos, length, list(NORMALISERS)[i % len(NORMALISERS)]) for i, (pos, length) in
            enumerate(itertools.product(POSITIONS, LENGTHS))]


@pytest.mark.parametrize("pos, length, normaliser", SETTINGS)
@pytest.mark.parametrize("switch", SWITCHES)
def test_each_switch_steps_and_reloads_under_every_normaliser_position_and_length(
        switch, pos, length, normaliser):
    """One AdamW step with finite gradients for every parameter, then the weights loaded into a
    fresh model give the same logits: every combination builds, trains and resumes."""
    keys = switched(switch, normaliser=normaliser, length=length)
    model = tiny(seed=0, pos=pos, d_model=16, **keys).train()
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    again = tiny(seed=1, pos=pos, d_model=16, **keys)
    again.load_state_dict(model.state_dict())
    assert torch.equal(again(idx)[0], model.eval()(idx)[0])
