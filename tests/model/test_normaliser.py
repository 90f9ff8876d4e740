"""Tests for scaling.normaliser (model/config.py's NORMALISERS, model/attention.py): each
normaliser's weights against its formula written by hand, the worked example of docs/scaling.md,
section 12, rows with no key on every path, the sink logit outside the scale and the length
factor, and which path attn_impl picks. tests/model/test_attention.py holds the explicit and the
SDPA path equal for every normaliser SDPA computes, under every scale and mask."""

import math
from decimal import Decimal

import pytest
import test_attention
import test_diagnostics
import torch
from conftest import ROOT, add_rows, make_config

from model import attention
from model.attention import MultiHeadAttention, build_mask
from model.config import (
    NORMALISERS,
    SCALINGS,
    SDPA_NORMALISERS,
    GPTConfig,
    ScalingConfig,
)
from model.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

SINK = 0.75  # the sink logit b the tests give `sink` (softmax1's is 0)


def softmax_with_by_hand(z: list[float], b: float) -> list[float]:
    return [math.exp(x) / (math.exp(b) + sum(math.exp(y) for y in z)) for x in z]


# Each normaliser's weights for one row of logits z (the keys the row may attend, n = len(z)) and
# the sink logit b, written by hand from its source: the one test table a new normaliser adds a
# row to
BY_HAND = {
    "softmax": lambda z, b: [math.exp(x) / sum(math.exp(y) for y in z) for x in z],
    "softmax1": lambda z, b: softmax_with_by_hand(z, 0.0),   # e^z_j / (1 + sum_k e^z_k)
    "sink": softmax_with_by_hand,                            # e^z_j / (e^b + sum_k e^z_k)
    "sigmoid": lambda z, b: [1 / (1 + math.exp(-(x - math.log(len(z))))) for x in z],
}


def test_every_normaliser_has_a_row_by_hand_and_a_config_file():
    assert set(BY_HAND) == set(NORMALISERS)
    for name in NORMALISERS:
        assert (ROOT / "configs" / "normaliser" / f"{name}.yaml").is_file()
        for override in (f"normaliser={name}", f"scaling.normaliser={name}"):
            composed = make_config([override, "scaling=none"]).scaling
            assert (composed.name, composed.normaliser) == ("none", name), override
    assert make_config([]).scaling.normaliser == "softmax"


def layer(normaliser: str, scaling: str = "none", impl: str = "explicit", C: int = 12,
          H: int = 3, seed: int = 0, **scaling_fields) -> MultiHeadAttention:
    """Random weights; under `sink` each head's b is SINK + its index, so heads differ."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=1, d_model=C, n_head=H, attn_impl=impl, scaling=ScalingConfig(
        scaling, normaliser=normaliser, **scaling_fields))
    mha = MultiHeadAttention(config)
    if normaliser == "sink":
        with torch.no_grad():
            mha.sink.copy_(SINK + torch.arange(H))
    return mha


def explicit(mha, x, **masks):
    """(y, weights, logits) of MultiHeadAttention.explicit, the interface diagnostics read."""
    q, k, v = mha.split_heads(x)
    mask = build_mask(x, masks.get("causal", True), masks.get("valid_mask"), None)
    q = q if mha.length is None else mha.length(q, mask, masks.get("causal", True))
    return mha.explicit(q, k, v, mask)


@pytest.mark.parametrize("name", NORMALISERS)
def test_weights_are_the_formula_by_hand_under_causal_and_padding_masks(name):
    """Every row of every head, in float64: the row's allowed keys (n = their count, i + 1
    under the causal mask, fewer past left padding) weighed by BY_HAND from the module's own
    logits; every other key 0; a row with no key all 0."""
    mha = layer(name).double()
    B, T = 2, 5
    x = 2.0 * torch.randn(B, T, 12, generator=torch.Generator().manual_seed(1)).double()
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, :2] = False  # left padding: rows 0-1 of batch 1 have no key
    _, weights, logits = explicit(mha, x, causal=True, valid_mask=valid)
    for b_, h, i in ((b_, h, i) for b_ in range(B) for h in range(3) for i in range(T)):
        keys = [j for j in range(i + 1) if valid[b_, j]]
        want = [0.0] * T
        for j, w in zip(keys, BY_HAND[name]([logits[b_, h, i, j].item() for j in keys],
                                            SINK + h) if keys else []):
            want[j] = w
        assert weights[b_, h, i].tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)


def stated_tol(s: str) -> float:
    """Half a unit of the last digit written: '0.831' -> 0.0005."""
    return 0.5 * 10.0 ** Decimal(s).as_tuple().exponent


@pytest.mark.parametrize("name, stated", [
    ("softmax", ("0.867", "0.117", "0.016")),
    ("softmax1", ("0.831", "0.112", "0.015")),
    ("sink", ("0.794", "0.107", "0.015")),
    ("sigmoid", ("0.870", "0.475", "0.109")),
])
def test_worked_weights_of_the_logits_3_1_minus_1(name, stated):
    """docs/scaling.md, section 12: one query whose logits are (3, 1, -1) (q = k = identity
    projections, scaling=none; the sink at b = SINK = 0.75)."""
    mha = layer(name, C=3, H=1)
    with torch.no_grad():
        for p in (mha.q_proj, mha.k_proj, mha.v_proj):
            p.weight.copy_(torch.eye(3))
            p.bias.zero_()
    x = torch.tensor([[[1.0, 1, 1], [1, 0, 0], [-1, 0, 0]]], dtype=torch.float64)
    _, weights, logits = explicit(mha.double(), x, causal=False)
    assert logits[0, 0, 0].tolist() == [3.0, 1.0, -1.0]
    for got, s in zip(weights[0, 0, 0].tolist(), stated, strict=True):
        assert abs(got - float(s)) <= stated_tol(s), (got, s)


# every normaliser on every path that computes it: sigmoid has no SDPA path (auto: explicit)
PATHS = [(name, impl) for name in NORMALISERS for impl in ("explicit", "sdpa", "auto")
         if impl != "sdpa" or name in SDPA_NORMALISERS]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name, impl", PATHS)
def test_rows_with_no_key_output_zero_with_finite_gradients(name, impl, dtype):
    """Mask's policy under every normaliser and path: a query row with no key it may attend
    outputs 0 (then the projection's bias) with zero weights on the keys (for softmax1 and sink
    all its mass on the extra logit, whose value is 0) and finite gradients everywhere, the
    sink logits' too."""
    mha = layer(name, "qk_norm", impl).to(dtype)   # a norm over padded rows too
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(0)).to(dtype)
    x.requires_grad_(True)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[0, :2] = False  # left padding: under the causal mask rows 0-1 have no key
    valid[1] = False  # a row of nothing but padding
    y = mha(x, causal=True, valid_mask=valid)
    y.float().square().sum().backward()
    assert torch.equal(y[0, :2], mha.proj.bias.expand(2, 12))
    assert torch.equal(y[1], mha.proj.bias.expand(6, 12))
    assert y.isfinite().all() and x.grad.isfinite().all() and x.grad[0, 2:].abs().sum() > 0
    assert all(p.grad.isfinite().all() for p in mha.parameters())
    if name == "sink":
        assert mha.sink.grad.abs().sum() > 0  # the real rows still train it
    weights = explicit(mha, x.detach(), causal=True, valid_mask=valid)[1]
    assert not weights[0, :, :2].any() and not weights[1].any()


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("scaling, length", [("uniform", "fixed"), ("none", "log_n"),
                                             ("learned", "ssmax")])
def test_the_sink_logit_is_not_multiplied_by_the_scale_or_the_length_factor(
        scaling, length, impl):
    """W_q = 0: every logit q.k is 0 whatever the scale s and the factor g(n), so a row of n
    keys gives each e^0 / (e^b + n) (s = 0 under `uniform`; g(n) = ln n / ln T0 != 1 at n != T0
    under log_n; ssmax learns its own). Were b multiplied by s or g(n), the weights would be
    1 / (e^(b s g) + n) instead; read from y with v = one-hot keys, on the SDPA path too."""
    T = 6
    mha = layer("sink", scaling, impl, C=T, H=1, length=length, length_base=3).double()
    with torch.no_grad():
        mha.q_proj.weight.zero_()
        mha.q_proj.bias.zero_()
        mha.v_proj.weight.copy_(torch.eye(T))  # v_j = x_j = e_j: y's row i is weights row i
        mha.v_proj.bias.zero_()
        mha.proj.weight.copy_(torch.eye(T))
        mha.proj.bias.zero_()
    x = torch.eye(T, dtype=torch.float64)[None]  # (1, T, T)
    y = mha(x, causal=True)[0]  # (T, T): the weights over the keys
    n = torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    want = torch.ones(T, T, dtype=torch.float64).tril() / (math.exp(SINK) + n)
    assert (y - want).abs().max() <= 1e-12


def test_sink_starts_as_softmax1_and_is_a_parameter_per_head():
    """b starts at 0 (softmax1's fixed logit); `sink` is a (H,) parameter of the sink module
    only, which trains."""
    sink, one = layer("sink", seed=3), layer("softmax1", seed=3)
    with torch.no_grad():
        sink.sink.zero_()
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(2))
    assert torch.equal(sink(x), one(x))
    assert dict(sink.named_parameters())["sink"].shape == (3,)
    assert "sink" not in dict(one.named_parameters())
    assert not torch.equal(layer("sink", seed=3)(x), one(x))


def test_softmax1_and_sink_rows_leave_their_share_to_the_extra_logit():
    """The returned weights are over the real keys: 1 - their sum is the extra logit's share,
    e^b / (e^b + sum_k e^z_k), so near 1 when every logit is far below b."""
    mha = layer("sink", "none").double()
    x = torch.randn(1, 4, 12, generator=torch.Generator().manual_seed(0)).double()
    _, weights, logits = explicit(mha, x, causal=True)
    b = (SINK + torch.arange(3, dtype=torch.float64)).view(3, 1)
    keys = logits.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -math.inf)
    share = b.exp() / (b.exp() + keys.exp().sum(-1)[0])  # (H, T)
    assert (1 - weights.sum(-1)[0] - share).abs().max() <= 1e-12


def test_sdpa_with_sigmoid_is_refused_and_bad_names_are_named():
    with pytest.raises(ConfigError, match=r"model.attn_impl='sdpa' cannot compute "
                       r"scaling.normaliser=sigmoid: .*set model.attn_impl=explicit \(or auto\)"):
        layer("sigmoid", impl="sdpa")
    with pytest.raises(ConfigError, match=r"scaling.normaliser='softmax_1' is not valid: choose "
                       rf"one of {', '.join(NORMALISERS)} \("):
        ScalingConfig(normaliser="softmax_1")


@pytest.mark.parametrize("name", NORMALISERS)
def test_auto_takes_sdpa_where_it_computes_the_normaliser(name, monkeypatch):
    """attn_impl=auto: one SDPA call for each of SDPA_NORMALISERS, over the T keys for softmax
    and with the zero key first and its float mask column for the others (softmax1, sink);
    none for the rest (sigmoid), whose explicit path it takes."""
    calls, real = [], attention.F.scaled_dot_product_attention

    def spy(q, k, v, **options):
        calls.append((k.shape[-2], None if options["attn_mask"] is None
                      else options["attn_mask"].dtype))
        return real(q, k, v, **options)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(0))
    mha = layer(name, "sqrt_dk", "auto")
    y = mha(x)
    expected = ([] if name not in SDPA_NORMALISERS else [(5, None)] if name == "softmax"
                else [(6, torch.float32)])
    assert calls == expected
    mha.attn_impl = "explicit"
    assert (mha(x) - y).abs().max() <= 1e-6


# ---------------------------------------------------------------------------------------------
# a normaliser added as docs/scaling.md, "Adding a normaliser", says
# ---------------------------------------------------------------------------------------------

def softmax_with_its_max(z, b):
    """softmax_with written out as the guide says: the row's max subtracted, detached, from
    every logit and from b."""
    m = z.amax(-1, keepdim=True).detach()  # (B, H, T, 1), over the keys the row may attend
    e = (z - m).exp()
    return e / ((b - m).exp() + e.sum(-1, keepdim=True))


# name: (its row of NORMALISERS, its row of BY_HAND, whether it joins SDPA_NORMALISERS), one
# normaliser of each kind
ADDED = {
    "sigmoid_plain": (lambda z, b: z.sigmoid(),   # sigmoid without -ln n: the explicit path
                      lambda z, b: [1 / (1 + math.exp(-x)) for x in z], False),
    "softmax1_by_hand": (softmax_with_its_max, lambda z, b: softmax_with_by_hand(z, 0.0), True),
}


@pytest.mark.parametrize("name", ADDED)
def test_a_normaliser_added_as_the_guide_says_needs_no_other_test_edited(name, monkeypatch):
    """Steps 1 and 3 of the guide, for this test only (conftest.add_rows, BY_HAND): every test
    here over the normalisers and, for one SDPA computes, test_attention.py's explicit path
    against SDPA under every scale and mask and test_diagnostics.py's weight outside the keys
    run on it unchanged. (Step 2, its config file, is what
    test_every_normaliser_has_a_row_by_hand_and_a_config_file asks for.)"""
    weigh, by_hand, sdpa = ADDED[name]
    add_rows(monkeypatch, normalisers={name: weigh}, sdpa=(name,) if sdpa else ())
    monkeypatch.setitem(BY_HAND, name, by_hand)
    test_weights_are_the_formula_by_hand_under_causal_and_padding_masks(name)
    for impl in ("explicit", "auto", "sdpa")[:3 if sdpa else 2]:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            test_rows_with_no_key_output_zero_with_finite_gradients(name, impl, dtype)
    test_auto_takes_sdpa_where_it_computes_the_normaliser(name, monkeypatch)
    test_sdpa_with_sigmoid_is_refused_and_bad_names_are_named()
    for scale in SCALINGS if sdpa else ():
        for kind in test_attention.MASK_KINDS:
            test_attention.test_explicit_equals_sdpa(name, scale, kind, (2, 7, 3, 5, 11))
    if sdpa:   # the diagnostics' weight outside the keys, 1 - sum_j w_j
        test_diagnostics.test_rows_without_a_real_query_or_key_count_nowhere(name)


def test_a_masked_key_in_a_sum_fails_the_weights_by_hand(monkeypatch):
    """The guide's rule that masked keys stay out of every sum is what the weights test
    checks: sigmoid with n counted over all T keys, the masked ones too, fails it."""
    add_rows(monkeypatch, normalisers={
        "sigmoid_all_keys": lambda z, b: (z - math.log(z.shape[-1])).sigmoid()})
    monkeypatch.setitem(BY_HAND, "sigmoid_all_keys", BY_HAND["sigmoid"])
    with pytest.raises(AssertionError):
        test_weights_are_the_formula_by_hand_under_causal_and_padding_masks("sigmoid_all_keys")
