"""model.attn_gate (model/attention.py, merge_heads): each head's output times sigmoid(x W_g),
x the layer's input (the block's normalised input), before the output projection (Qiu et al.
2025): by hand, by both paths under every normaliser and mask, through the diagnostics, and in
muP's hidden matrices (model/mup.py)."""

import math

import pytest
import torch
from test_attention import ATOL, MASK_KINDS, mask_kwargs, run_both

from model import mup
from model.attention import MultiHeadAttention
from model.config import NORMALISERS, SDPA_NORMALISERS, GPTConfig, ParamConfig, ScalingConfig
from model.diagnostics import explain, layer_stats
from model.gpt import GPT

pytestmark = pytest.mark.usefixtures("single_thread")

LN3 = math.log(3.0)   # sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4


def one_token_layer(gate: str, normaliser: str, impl: str) -> MultiHeadAttention:
    """C = 2 and two coordinates of head output in all: 2 heads of width 1 (headwise) or 1 of
    width 2 (elementwise). W_q = 0 (every logit 0), W_v and the output projection the identity,
    no biases, W_g = diag(1, -1)."""
    H = 2 if gate == "headwise" else 1
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=2, n_head=H, d_head=2 // H,
                                       bias=False, attn_gate=gate, attn_impl=impl,
                                       scaling=ScalingConfig(normaliser=normaliser)))
    with torch.no_grad():
        mha.q_proj.weight.zero_()
        mha.v_proj.weight.copy_(torch.eye(2))
        mha.proj.weight.copy_(torch.eye(2))
        mha.gate.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    return mha


@pytest.mark.parametrize("normaliser, impl", [
    (n, impl) for n in NORMALISERS for impl in ("explicit", "sdpa")
    if impl == "explicit" or n in SDPA_NORMALISERS])   # sigmoid: explicit only
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_by_hand(gate, normaliser, impl):
    """One token x = (ln 3, ln 3): its only key is itself, of logit 0, so attention gives v = x
    times the weight of that key: 1 under softmax; 1/(1 + e^0) = 1/2 under softmax1 and sink
    (b = 0 at the start) and sigmoid(0 - ln 1) = 1/2 under sigmoid. The gate multiplies the two
    output coordinates by sigmoid(ln 3) = 3/4 and sigmoid(-ln 3) = 1/4."""
    weight = 1.0 if normaliser == "softmax" else 0.5
    y = one_token_layer(gate, normaliser, impl)(torch.full((1, 1, 2), LN3))
    assert y.flatten().tolist() == pytest.approx([weight * LN3 * 0.75, weight * LN3 * 0.25])


def test_headwise_gives_one_factor_per_head_and_elementwise_one_per_coordinate():
    """W_g's rows: n_head (headwise) or n_head * d_head (elementwise); with W_g = 0 and no bias
    every factor is sigmoid(0) = 1/2, so the gated output is the ungated one halved (the
    projection's bias aside)."""
    config = dict(vocab_size=1, d_model=12, n_head=3, bias=False, attn_impl="explicit")
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    plain = MultiHeadAttention(GPTConfig(**config))
    for gate, rows in (("headwise", 3), ("elementwise", 12)):
        gated = MultiHeadAttention(GPTConfig(**config, attn_gate=gate))
        gated.load_state_dict(plain.state_dict(), strict=False)
        assert gated.gate.weight.shape == (rows, 12) and gated.gate.bias is None
        with torch.no_grad():
            gated.gate.weight.zero_()
        assert torch.allclose(gated(x), plain(x) / 2, atol=1e-7)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("normaliser", SDPA_NORMALISERS)
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_explicit_equals_sdpa(gate, normaliser, kind):
    """Output and input gradient of both paths, W_g's bias included, under every mask."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3, attn_gate=gate,
                                       scaling=ScalingConfig(normaliser=normaliser)))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 12, generator=gen)
    (y_e, g_e), (y_s, g_s) = run_both(mha, x, mask_kwargs(kind, 2, 6, gen))
    assert (y_e - y_s).abs().max() <= ATOL and (g_e - g_s).abs().max() <= ATOL


def test_explain_gates_as_forward_does():
    """The diagnostics' own forward (explain) applies the gate: its output is forward's."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3,
                                       attn_gate="elementwise"))
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(explain(mha, x).y, mha(x), atol=ATOL)


@pytest.mark.parametrize("normaliser", list(NORMALISERS))
def test_the_sink_diagnostics_read_the_weights_the_gate_leaves_alone(normaliser):
    """The gate scales each head's output, not its weights: the first layer, whose input the
    gate cannot reach, has the same first-token mass and sink rate gated or not (the gate
    removed from the same model), and the later layer sees the changed residual."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, d_model=16,
                          attn_gate="headwise", scaling=ScalingConfig(normaliser=normaliser)))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.gate.weight.normal_(0.0, 2.0)
    idx = torch.randint(11, (2, 16), generator=torch.Generator().manual_seed(1))
    gated = layer_stats(model, idx)
    for block in model.blocks:
        block.attn.gate = None
    plain = layer_stats(model, idx)
    for key in ("first_mass", "sink_rate", "entropy"):
        assert torch.equal(gated[0][key], plain[0][key]), key
    assert not torch.allclose(gated[1]["first_mass"], plain[1]["first_mass"])


# ---------------------------------------------------------------- muP's hidden matrices

def test_mup_finds_the_gate_among_its_hidden_matrices():
    """W_g (headwise: n_head x C, its fan-in grows with the width) is a 2-D parameter inside a
    block, so muP's derived list holds it, after each layer's attention projections."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=16,
                          attn_gate="headwise", param=ParamConfig("mup", base_width=8)))
    names = {id(p): n for n, p in model.named_parameters()}
    kinds = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.proj", "attn.gate", "mlp.fc",
             "mlp.proj")
    assert [names[id(p)] for p in mup.hidden_matrices(model)] == [
        f"blocks.{i}.{kind}.weight" for i in range(2) for kind in kinds]
