"""Tests for scaling.length (model/length.py and its seam in model/attention.py): log_n is exactly
1 at n = T0, log_n_eval exactly 1 in training and at n <= T0, ssmax changes the weights on the
same keys when more keys are visible, n counts every mask, explicit equals SDPA, fully masked
rows give zeros with finite gradients, and the statistics see the factored logits."""

import math

import pytest
import torch
from test_attention import MASK_KINDS, mask_kwargs, run_both

from model.attention import MultiHeadAttention, build_mask
from model.config import LENGTHS, GPTConfig, ScalingConfig
from model.diagnostics import explain
from model.errors import ConfigError
from model.length import LengthFactor, keys_per_row

pytestmark = pytest.mark.usefixtures("single_thread")


def length_layer(length, base=4, seed=0, impl="explicit", name="sqrt_dk", **model):
    torch.manual_seed(seed)
    return MultiHeadAttention(GPTConfig(
        vocab_size=1, d_model=12, n_head=3, block_size=base, attn_impl=impl,
        scaling=ScalingConfig(name, length=length), **model))


def test_log_n_is_exactly_one_at_t0_and_ln_n_over_ln_t0_elsewhere():
    factor = LengthFactor("log_n", 64, 2)
    n = torch.tensor([[1.0], [8.0], [64.0], [1024.0]])
    g = factor.factor(n)
    assert g[2].item() == 1.0   # exactly
    assert g[:, 0].tolist() == pytest.approx([0.0, 0.5, 1.0, math.log(1024) / math.log(64)],
                                             abs=1e-6)


def test_log_n_eval_is_one_in_training_and_at_n_up_to_t0():
    factor = LengthFactor("log_n_eval", 16, 2)
    q = torch.randn(1, 2, 40, 4)
    assert torch.equal(factor.train()(q, None, True), q)   # training: q itself
    factor.eval()
    g = factor.factor(torch.arange(1, 41).float()[:, None])
    assert torch.equal(g[:16], torch.ones(16, 1))   # n <= T0: exactly 1
    assert g[31, 0].item() == pytest.approx(math.log(32) / math.log(16), abs=1e-6)
    out = factor(q, None, True)
    assert torch.equal(out[..., :16, :], q[..., :16, :])
    assert not torch.allclose(out[..., 16:, :], q[..., 16:, :])


def test_ssmax_starts_at_one_over_ln_t0_and_learns_per_head():
    mha = length_layer("ssmax", base=16)
    s = mha.length.ssmax_scale
    assert s.shape == (3,) and s.requires_grad
    assert (s * math.log(16)).tolist() == pytest.approx([1.0] * 3, abs=1e-6)
    mha(torch.randn(2, 20, 12)).sum().backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


@pytest.mark.parametrize("length", ["log_n", "ssmax"])
def test_more_visible_keys_change_the_weights_on_the_same_keys(length):
    """The same query and the same first 3 keys: with 3 keys visible, then with 12 (the rest
    masked out or not), the weights that the first 3 keys get relative to each other differ
    under log_n and ssmax (a larger factor sharpens them), and not under fixed."""
    ratios = {}
    for name in ("fixed", length):
        mha = length_layer(name, base=4)
        x = torch.randn(1, 12, 12, generator=torch.Generator().manual_seed(3))
        few = torch.zeros(1, 1, 12, 12, dtype=torch.bool)
        few[..., :3] = True
        many = torch.ones(1, 1, 12, 12, dtype=torch.bool)
        w_few = explain(mha, x, causal=False, attn_mask=few).weights[0, :, -1, :3]
        w_many = explain(mha, x, causal=False, attn_mask=many).weights[0, :, -1, :3]
        ratios[name] = (w_few / w_few.sum(-1, keepdim=True),
                        w_many / w_many.sum(-1, keepdim=True))
    assert torch.allclose(*ratios["fixed"], atol=1e-6)
    assert not torch.allclose(*ratios[length], atol=1e-3)


def test_ssmax_factor_is_s_times_ln_n():
    factor = LengthFactor("ssmax", 8, 2)
    with torch.no_grad():
        factor.ssmax_scale.copy_(torch.tensor([0.5, 2.0]))
    g = factor.factor(torch.tensor([[1.0], [10.0]]))   # (2, 1) -> (H, 2, 1)
    assert g.shape == (2, 2, 1)
    assert g[:, 1, 0].tolist() == pytest.approx([0.5 * math.log(10), 2.0 * math.log(10)])
    assert g[:, 0, 0].tolist() == [0.0, 0.0]


def test_n_counts_causal_padding_and_document_masks():
    q = torch.zeros(2, 1, 5, 4)
    assert keys_per_row(q, None, True)[:, 0].tolist() == [1, 2, 3, 4, 5]
    assert keys_per_row(q, None, False)[:, 0].tolist() == [5] * 5
    mha = length_layer("log_n")
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    mask = build_mask(torch.zeros(2, 5, 12), True, valid, None)
    n = keys_per_row(q, mask.allowed, True)   # (2, 1, 5, 1)
    assert n[0, 0, :, 0].tolist() == [1, 1, 1, 2, 3]   # pads: no key, counted as 1
    assert n[1, 0, :, 0].tolist() == [1, 2, 3, 4, 5]
    assert mha.length is not None


def test_factored_q_gives_logits_g_times_s_times_qk():
    mha = length_layer("log_n", base=4)
    x = torch.randn(1, 9, 12)
    q, k, _ = mha.split_heads(x)
    explained = explain(mha, x)
    n = torch.arange(1, 10).float()[:, None]
    by_hand = (n.log() / math.log(4)) * (q / 2.0) @ k.transpose(-2, -1)  # s=1/2
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    weights = by_hand.masked_fill(~causal, float("-inf")).softmax(-1)
    assert torch.allclose(explained.weights, weights, atol=1e-5)
    # the statistics see the factored logits: max |logit| over the allowed entries
    expected = by_hand.masked_fill(~causal, 0).abs().amax(dim=(0, 2, 3))
    assert torch.allclose(explained.stats["max_logit"], expected, atol=1e-5)
    plain = length_layer("fixed", base=4)
    assert not torch.allclose(explain(plain, x).stats["max_logit"], expected, atol=1e-3)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("pos", ["nope", "rope"])
def test_explicit_equals_sdpa_for_each_length(length, kind, pos):
    mha = length_layer(length, base=3, pos=pos).eval()   # eval: log_n_eval acts
    if length == "ssmax":
        with torch.no_grad():
            mha.length.ssmax_scale.uniform_(0.3, 2.0)
    x = torch.randn(2, 7, 12, generator=torch.Generator().manual_seed(4))
    kwargs = mask_kwargs(kind, 2, 7, torch.Generator().manual_seed(5))
    (ye, ge), (ys, gs) = run_both(mha, x, kwargs)
    assert torch.allclose(ye, ys, atol=1e-5) and torch.allclose(ge, gs, atol=1e-5)


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("length", ["log_n", "log_n_eval", "ssmax"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(length, impl):
    mha = length_layer(length, base=3, impl=impl).eval()
    x = torch.randn(2, 6, 12, requires_grad=True)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[0, :3] = False   # left padding: three queries with no key at all
    y = mha(x, valid_mask=valid)
    y.sum().backward()
    assert torch.equal(y[0, :3], torch.zeros(3, 12) + mha.proj.bias)   # zeros before proj
    assert torch.isfinite(x.grad).all()
    params = [p.grad for p in mha.parameters() if p.grad is not None]
    assert params and all(torch.isfinite(g).all() for g in params)


def test_length_factor_keeps_the_dtype():
    factor = LengthFactor("log_n", 8, 2)
    q = torch.randn(1, 2, 5, 4, dtype=torch.bfloat16)
    assert factor(q, None, True).dtype == torch.bfloat16


@pytest.mark.parametrize("fields, message", [
    ({"length": "log"}, "scaling.length='log'"),
    ({"length": "log_n", "length_base": 1}, "integer >= 2"),
    ({"length": "log_n", "length_base": 2.5}, "integer >= 2"),
])
def test_bad_length_settings_name_the_key_and_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        ScalingConfig(**fields)


def test_length_base_defaults_to_block_size_only_when_a_factor_is_on():
    assert GPTConfig(vocab_size=1, block_size=32).scaling.length_base is None
    cfg = GPTConfig(vocab_size=1, block_size=32, scaling=ScalingConfig(length="log_n"))
    assert cfg.scaling.length_base == 32
    cfg = GPTConfig(vocab_size=1, scaling=ScalingConfig(length="ssmax", length_base=128))
    assert cfg.scaling.length_base == 128
