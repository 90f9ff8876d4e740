"""scaling.qk_norm and scaling.qk_norm_gain (model/config.py, model/attention.py): a norm on each
head's q and k before any scale, so every scale combines with it; `scaling=qk_norm` keeps its
numbers; the norm sits before RoPE; the cap s D max|g_q g_k| that a head can reach
(model/diagnostics.py, logit_cap); and scaling=sqrt_dmodel, the 1/sqrt(d_model) bug."""

import math

import pytest
import torch
import torch.nn as nn
from test_attention import ATOL, BY_HAND, MASK_KINDS, make_mha, mask_kwargs, qk_by_hand, run_both

from model.attention import MultiHeadAttention
from model.config import SDPA_NORMALISERS, GPTConfig, ScalingConfig
from model.diagnostics import explain, logit_cap
from model.errors import ConfigError
from model.rope import Rotary, rotate

pytestmark = pytest.mark.usefixtures("single_thread")

SCALES_WITH_A_NORM = ("sqrt_dk", "none", "dk", "constant", "learned", "sqrt_dmodel")


# ------------------------------------------------- scaling=qk_norm keeps its committed numbers

# y.square().sum() of this module's forward, float64, before scaling.qk_norm existed (the
# `qk_norm` scale's branch of MultiHeadAttention at commit c38ab29), on both paths
OLD_QK_NORM = {"layernorm": 7.108403339586858, "rmsnorm": 8.332293598268091}


def old_recipe(scaling: ScalingConfig, impl: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, n_head=2, d_model=8, attn_impl=impl,
                                       scaling=scaling)).double()
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 2.0)
        mha.k_norm.weight.uniform_(0.5, 2.0)
    return mha


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_the_qk_norm_scale_is_sqrt_dk_after_a_norm_with_a_gain_bit_for_bit(norm, impl):
    """scaling=qk_norm gives what it gave before the axis existed, and sqrt_dk with
    scaling.qk_norm=<its norm> (gain on) is the same module: the same parameter names (old
    checkpoints load) and the same output, bit for bit."""
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    old = old_recipe(ScalingConfig("qk_norm", norm=norm), impl)
    new = old_recipe(ScalingConfig("sqrt_dk", qk_norm=norm), impl)
    assert old(x).square().sum().item() == pytest.approx(OLD_QK_NORM[norm], rel=1e-12)
    assert list(old.state_dict()) == list(new.state_dict())
    assert torch.equal(old(x), new(x))


# ---------------------------------------------------------------- every scale takes a norm

@pytest.mark.parametrize("gain", [True, False])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("name", SCALES_WITH_A_NORM)
def test_every_scale_combines_with_a_norm_by_hand(name, norm, gain):
    """softmax(s(D) * norm(q).norm(k)): the norm over each head's D (with the module's gains,
    or none under qk_norm_gain=false), then the scale of BY_HAND, both by hand."""
    B, T, C, H, D = 2, 5, 32, 2, 16
    mha = make_mha(name, d_model=C, n_head=H, d_head=D, seed=3, qk_norm=norm, qk_norm_gain=gain)
    assert (mha.q_norm.weight is None) == (not gain)
    assert sum(p.numel() for p in mha.q_norm.parameters()) == D * gain
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        q, k = qk_by_hand(mha, x)
        s = (mha.log_scale.exp().view(H, 1, 1) if name == "learned"
             else BY_HAND[name](D, mha.scaling, C))
        logits = (q @ k.transpose(-2, -1)) * s  # (B, H, T, T)
        info = explain(mha, x, causal=False)
    assert (info.weights - logits.softmax(-1)).abs().max() <= ATOL


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("normaliser", SDPA_NORMALISERS)
@pytest.mark.parametrize("name", ["constant", "dk", "learned"])
def test_a_norm_without_a_gain_explicit_equals_sdpa(name, normaliser, kind):
    """modded-nanogpt's and parameter-golf's form (RMSNorm, no gain, a constant or learned
    scale) by both paths, with gradients, under every SDPA normaliser and mask."""
    mha = make_mha(name, d_model=16, n_head=2, d_head=8, qk_norm="rmsnorm", qk_norm_gain=False,
                   divisor=1 / 0.12, normaliser=normaliser)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 16, generator=gen)
    (y_e, g_e), (y_s, g_s) = run_both(mha, x, mask_kwargs(kind, 2, 7, gen))
    assert (y_e - y_s).abs().max() <= ATOL and (g_e - g_s).abs().max() <= ATOL


@pytest.mark.parametrize("scaling, message", [
    (dict(name="qk_norm", qk_norm="rmsnorm"),
     "scaling.qk_norm/qk_norm_gain=('rmsnorm', True) is not valid: scaling=qk_norm is sqrt_dk "
     "after scaling.norm with a gain"),
    (dict(name="qk_norm", qk_norm_gain=False),
     "another norm goes with a scale: scaling=sqrt_dk scaling.qk_norm=rmsnorm (and "
     "scaling.qk_norm_gain=false for one without a gain)"),
    (dict(qk_norm="l2"), "scaling.qk_norm='l2' is not valid: choose none, layernorm, rmsnorm"),
    (dict(qk_norm_gain="no"), "scaling.qk_norm_gain='no' is not valid: use true or false"),
    (dict(norm="rmsnorm"), "scaling.norm='rmsnorm' is not valid: choose one of layernorm, "
     "rmsnorm (the qk_norm scale's norm)"),
])
def test_combinations_that_cannot_mean_what_they_say_are_refused(scaling, message):
    """scaling=qk_norm is one fixed recipe (its studies' arm): a second norm on top of it, no
    gain, or scaling.norm under another scale (where it would be ignored) are refused."""
    with pytest.raises(ConfigError) as err:
        ScalingConfig(**scaling)
    assert message in str(err.value)


def test_a_norm_on_a_head_of_width_1_is_refused_whatever_the_scale():
    """Over one coordinate a norm leaves 0 (LayerNorm) or a sign (RMSNorm)."""
    with pytest.raises(ConfigError, match="model.d_head=1 is too narrow for scaling.name=dk "
                       "with scaling.qk_norm=layernorm, defined for d_head >= 2"):
        GPTConfig(vocab_size=1, n_head=4, d_model=4, scaling=ScalingConfig("dk", qk_norm=
                                                                            "layernorm"))
    assert GPTConfig(vocab_size=1, n_head=4, d_model=4, scaling=ScalingConfig("dk")).d_head == 1


# ---------------------------------------------------------------- the norm and RoPE

def test_rmsnorm_without_a_gain_commutes_with_rope_and_with_a_gain_does_not():
    """A turn keeps each pair's length, so q's RMS over D is unchanged: normalising before or
    after RoPE gives the same q for a gain-free RMSNorm (and the same logits). A gain weighs the
    coordinates of a pair unequally, so the two orders differ; so does LayerNorm's centring."""
    D, T = 8, 6
    q = torch.randn(1, 1, T, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    cos, sin = (a.double() for a in Rotary(D, 10000.0).angles(T, q.device))
    plain = nn.RMSNorm(D, eps=1e-5, elementwise_affine=False).double()
    assert torch.allclose(rotate(plain(q), cos, sin), plain(rotate(q, cos, sin)), atol=1e-12)
    gained = nn.RMSNorm(D, eps=1e-5).double()
    with torch.no_grad():
        gained.weight.copy_(torch.linspace(0.5, 2.0, D))
    assert (rotate(gained(q), cos, sin) - gained(rotate(q, cos, sin))).abs().max() > 0.1
    centred = nn.LayerNorm(D, elementwise_affine=False).double()
    assert (rotate(centred(q), cos, sin) - centred(rotate(q, cos, sin))).abs().max() > 0.1


def test_the_module_normalises_before_rope():
    """split_heads: the projections, the norm (with its gains), then RoPE's turn, by hand."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=8, n_head=2, pos="rope",
                                       scaling=ScalingConfig(qk_norm="rmsnorm")))
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1))
    q = mha.q_proj(x).view(1, 5, 2, 4)  # (B, T, H, D)
    q = (q / (q.square().mean(-1, keepdim=True) + 1e-5).sqrt() * mha.q_norm.weight)
    cos, sin = mha.rope.angles(5, x.device)
    assert torch.allclose(mha.split_heads(x)[0], rotate(q.transpose(1, 2), cos, sin), atol=1e-6)


# ---------------------------------------------------------------- the cap a head can reach

def aligned(mha: MultiHeadAttention, coordinate: int) -> torch.Tensor:
    """An input whose q and k are both along one coordinate of every head: W_q = W_k with all
    of each head's rows zero but that coordinate's, which reads x's first component."""
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj):
            proj.weight.zero_()
            proj.bias.zero_()
            proj.weight[coordinate::mha.d_head, 0] = 1.0
    return torch.tensor([[[3.0] + [0.0] * (mha.d_model - 1)] * 2])  # (1, 2, C)


def test_the_cap_of_a_gain_free_rmsnorm_is_s_times_d_head_and_is_reached():
    """RMSNorm leaves q and k of length sqrt(D) (up to eps), so |q.k| <= D and the cap is s D:
    here 1/0.12 is the divisor and D = 4, so s D = 0.48. q and k along one coordinate reach it:
    each normalised to sqrt(4) = 2 there, q.k = 4, logit 0.12 * 4."""
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=8, n_head=2, attn_impl="explicit",
                                       scaling=ScalingConfig("constant", divisor=1 / 0.12,
                                                             qk_norm="rmsnorm",
                                                             qk_norm_gain=False)))
    x = aligned(mha, 1)
    cap = logit_cap(mha)
    assert cap.tolist() == pytest.approx([0.48, 0.48], rel=1e-6)
    max_logit = explain(mha, x).stats["max_logit"]
    assert max_logit.tolist() == pytest.approx([0.48, 0.48], rel=1e-5)   # 9 / (9 + 1e-5)
    assert (max_logit <= cap).all()


def test_the_cap_with_gains_is_s_d_head_times_the_largest_product_of_the_gains():
    """g_q = (1, 1, 3, 1), g_k = (1, 2, 1, 1): the products are (1, 2, 3, 1), so with s = 1/2
    and D = 4 the cap is 0.5 * 4 * 3 = 6; q and k along coordinate 2 reach it (q = 2 * 3,
    k = 2 * 1 there: q.k = 12, logit 6); along coordinate 1 they reach 0.5 * 4 * 2 = 4."""
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=8, n_head=2, attn_impl="explicit",
                                       scaling=ScalingConfig("constant", divisor=2.0,
                                                             qk_norm="rmsnorm")))
    with torch.no_grad():
        mha.q_norm.weight.copy_(torch.tensor([1.0, 1.0, 3.0, 1.0]))
        mha.k_norm.weight.copy_(torch.tensor([1.0, 2.0, 1.0, 1.0]))
    assert logit_cap(mha).tolist() == pytest.approx([6.0, 6.0])
    assert explain(mha, aligned(mha, 2)).stats["max_logit"].tolist() == pytest.approx(
        [6.0, 6.0], rel=1e-5)
    assert explain(mha, aligned(mha, 1)).stats["max_logit"].tolist() == pytest.approx(
        [4.0, 4.0], rel=1e-5)


def test_the_cap_of_learned_is_per_head_and_the_qk_norm_scale_has_one():
    """learned: s_h D per head; scaling=qk_norm: 1/sqrt(D) * D * max|g_q g_k| = sqrt(D) at unit
    gains (5.657 at D = 32, the bound docs/scaling.md gives)."""
    learned = make_mha("learned", d_model=8, n_head=2, d_head=4, qk_norm="layernorm",
                       qk_norm_gain=False)
    assert torch.allclose(logit_cap(learned), learned.log_scale.exp() * 4)
    qk = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=64, n_head=2,
                                      scaling=ScalingConfig("qk_norm")))
    assert logit_cap(qk).tolist() == pytest.approx([math.sqrt(32)] * 2)


# ---------------------------------------------------------------- sqrt_dmodel

def test_sqrt_dmodel_is_sqrt_dk_times_one_over_sqrt_n_head():
    """1/sqrt(d_model) = 1/sqrt(H D): sqrt_dk's scale over sqrt(H), 1/2 at 4 heads, and the
    logits by the same factor; with d_head set apart from d_model it is still d_model's."""
    for H in (1, 2, 4, 8):
        dmodel, dk = (MultiHeadAttention(GPTConfig(vocab_size=1, d_model=64, n_head=H,
                                                   scaling=ScalingConfig(name))).scale()
                      for name in ("sqrt_dmodel", "sqrt_dk"))
        assert dmodel == pytest.approx(dk / math.sqrt(H), rel=1e-12) and dmodel == 1 / 8
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    bug, right = (explain(make_mha(name, d_model=16, n_head=4, d_head=4, seed=1), x)
                  for name in ("sqrt_dmodel", "sqrt_dk"))
    assert bug.stats["max_logit"].tolist() == pytest.approx(
        (right.stats["max_logit"] / 2).tolist(), rel=1e-6)
    wide = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=2, d_head=8,
                                        scaling=ScalingConfig("sqrt_dmodel")))
    assert wide.scale() == 1 / math.sqrt(12)
