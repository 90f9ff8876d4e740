"""Tests for model/attention.py and model/cpu_autocast.py: the sdpa path and the CPU autocast
route agree with the explicit path, the scales and worked examples are those of
docs/scaling.md, the masks hold, fully masked rows follow the policy, and the statistics are
right."""

import dataclasses
import math
from decimal import Decimal

import pytest
import torch
import torch.nn as nn
from conftest import ROOT
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from model import attention
from model.attention import MultiHeadAttention, attention_weights
from model.config import SCALES, SCALINGS, SDPA_NORMALISERS, GPTConfig, ScalingConfig
from model.cpu_autocast import CPUAutocastAttention
from model.diagnostics import explain, qk_grad_norms
from model.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

ATOL = 1e-5  # explicit vs sdpa in float32
MASK_KINDS = ("none", "causal", "padding", "causal+padding", "fully_masked")


def attention_layer(d_model: int, n_head: int, d_head: int, scaling: ScalingConfig,
                    cls=MultiHeadAttention, **model):
    """One attention layer of these sizes (the model's config, which it reads, with a dummy
    vocabulary); `model`: other GPTConfig fields (dropout, bias, attn_impl)."""
    return cls(GPTConfig(vocab_size=1, d_model=d_model, n_head=n_head, d_head=d_head,
                         scaling=scaling, **model))


SMALL = {"d_model": 12, "n_head": 3, "d_head": 4, "attn_impl": "explicit"}
GPT_FIELDS = {f.name for f in dataclasses.fields(GPTConfig)}


def make_mha(name="sqrt_dk", seed=0, cls=MultiHeadAttention, **fields):
    """A module with random weights; learned temperatures, qk-norm gains and sink logits are
    randomised too, so a path that ignored them would be caught. `fields`: GPTConfig's (d_model,
    n_head, d_head, attn_impl, dropout) over SMALL's, the others ScalingConfig's (softcap, norm,
    normaliser)."""
    torch.manual_seed(seed)
    model = {**SMALL, **{k: v for k, v in fields.items() if k in GPT_FIELDS}}
    scaling = ScalingConfig(name, **{k: v for k, v in fields.items() if k not in GPT_FIELDS})
    mha = cls(GPTConfig(vocab_size=1, scaling=scaling, **model))
    with torch.no_grad():
        if name == "learned":
            mha.log_scale.uniform_(-2.0, 0.5)
        if mha.q_norm is not None and mha.q_norm.weight is not None:   # a norm with a gain
            mha.q_norm.weight.uniform_(0.5, 2.0)
            mha.k_norm.weight.uniform_(0.5, 2.0)
        if mha.scaling.normaliser == "sink":
            mha.sink.uniform_(-2.0, 2.0)
    return mha


def mask_kwargs(kind, B, T, gen):
    """Forward keyword arguments for one mask kind, drawn with generator `gen`."""
    if kind == "none":
        return {"causal": False}
    if kind == "causal":
        return {"causal": True}
    lengths = torch.randint(1, T + 1, (B,), generator=gen)  # at least one real token a row
    ar = torch.arange(T)
    if kind == "padding":  # right padding, no causal mask
        return {"causal": False, "valid_mask": ar[None, :] < lengths[:, None]}
    if kind == "causal+padding":  # left padding: pad queries have no allowed key at all
        return {"causal": True, "valid_mask": ar[None, :] >= (T - lengths)[:, None]}
    # fully_masked: a whole batch row of padding, plus random attn_mask rows that are all False
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0] = False
    attn_mask = torch.rand(B, 1, T, T, generator=gen) < 0.7
    attn_mask[:, :, torch.rand(T, generator=gen) < 0.4, :] = False
    return {"causal": False, "valid_mask": valid, "attn_mask": attn_mask}


def run_both(mha, x, kwargs):
    """Output and gradient of the explicit and the sdpa path on the same module: the input's,
    and under normaliser=sink the sink logits' after it (flattened together)."""
    outs = []
    for impl in ("explicit", "sdpa"):
        mha.attn_impl = impl
        mha.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        y = mha(xi, **kwargs)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        sink = [mha.sink.grad] if hasattr(mha, "sink") else []
        outs.append((y.detach(), torch.cat([xi.grad.flatten(), *sink])))
    return outs


# ---------------------------------------------------------------- config validation

@pytest.mark.parametrize("kwargs, message", [
    ({"name": "sqrtdk"}, "scaling.name='sqrtdk' is not valid: choose one of sqrt_dk, none"),
    ({"divisor": 0.0}, "scaling.divisor=0.0 is not valid: use a positive finite number"),
    ({"norm": "l2"}, "scaling.norm='l2' is not valid: choose one of layernorm, rmsnorm"),
    ({"softcap": -1.0}, "scaling.softcap=-1.0 is not valid: use null (no soft-cap) or a positive"),
    ({"attn_mult": 0}, "scaling.attn_mult=0 is not valid: use null (set by param)"),
    ({"length": "log"}, "scaling.length='log' is not valid: choose one of fixed, log_n"),
    ({"length_base": 1}, "scaling.length_base=1 is not valid: use null (model.block_size)"),
])
def test_scaling_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError) as err:
        ScalingConfig(**kwargs)
    assert message in str(err.value)


def test_attention_rejects_bad_impl_and_sdpa_with_softcap():
    with pytest.raises(ConfigError, match="model.attn_impl='fast' is not valid: choose one of"):
        attention_layer(8, 2, 4, ScalingConfig(), attn_impl="fast")
    with pytest.raises(ConfigError, match="SDPA has no soft-cap"):
        attention_layer(8, 2, 4, ScalingConfig(softcap=50.0), attn_impl="sdpa")


def test_masks_must_be_boolean():
    mha = make_mha()
    with pytest.raises(ValueError, match="valid_mask must be a bool tensor"):
        mha(torch.randn(1, 3, 12), valid_mask=torch.ones(1, 3, dtype=torch.long))


# -------------------------------- explicit == sdpa, and the CPU autocast route

@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 3), (2, 7, 3, 5, 11), (3, 13, 2, 8, 16)],
                         ids=["T1", "odd", "even"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("normaliser", SDPA_NORMALISERS)   # sigmoid: explicit only
def test_explicit_equals_sdpa(normaliser, name, kind, shape):
    B, T, H, D, C = shape
    mha = make_mha(name, d_model=C, n_head=H, d_head=max(D, SCALES[name].min_d_head),
                   normaliser=normaliser)
    gen = torch.Generator().manual_seed(B * 100 + T)
    x = torch.randn(B, T, C, generator=gen)
    (y_e, g_e), (y_s, g_s) = run_both(mha, x, mask_kwargs(kind, B, T, gen))
    assert (y_e - y_s).abs().max() <= ATOL
    assert (g_e - g_s).abs().max() <= ATOL


def count_sdpa_calls(monkeypatch):
    """A list that grows by the query dtype at each F.scaled_dot_product_attention call."""
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def counting(q, *args, **kwargs):
        calls.append(q.dtype)
        return real(q, *args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("normaliser", SDPA_NORMALISERS)
def test_cpu_autocast_attention_equals_explicit(normaliser, name, kind, monkeypatch):
    """The speed route of model/cpu_autocast.py: without autocast it is MultiHeadAttention
    (explicit == sdpa to ATOL); under CPU bf16 autocast its one SDPA call computes in float32
    and returns bf16 like the explicit path, with the same values to bf16 precision and finite
    gradients."""
    B, T, H, D, C = 2, 9, 3, 8, 24
    mha = make_mha(name, d_model=C, n_head=H, d_head=D, cls=CPUAutocastAttention,
                   normaliser=normaliser)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(B, T, C, generator=gen)
    kwargs = mask_kwargs(kind, B, T, gen)
    (y_e, g_e), (y_s, g_s) = run_both(mha, x, kwargs)
    assert (y_e - y_s).abs().max() <= ATOL and (g_e - g_s).abs().max() <= ATOL
    calls = count_sdpa_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = run_both(mha, x, kwargs)
    assert calls == [torch.float32]  # the sdpa pass, in float32
    for y, grad in outs:
        assert y.dtype == torch.bfloat16
        assert torch.isfinite(grad).all()
        assert (y.float() - y_e).abs().max() <= 0.05
    (y_e16, _), (y_s16, _) = outs
    assert (y_e16.float() - y_s16.float()).abs().max() <= 0.05


@pytest.mark.parametrize("case", ["causal", "padding", "not_causal", "float16"])
def test_cpu_autocast_attention_calls_float32_sdpa(case, monkeypatch):
    """Causal or not, with a padding mask or under float16 autocast, the route calls SDPA in
    float32 once and returns the autocast dtype; the plain module keeps the autocast dtype."""
    T = 9
    x = torch.randn(1, T, 8, generator=torch.Generator().manual_seed(1))
    kwargs = {"causal": case != "not_causal"}
    if case == "padding":
        kwargs["valid_mask"] = torch.arange(T)[None, :] < 6
    dtype = torch.float16 if case == "float16" else torch.bfloat16
    for cls, sdpa_dtype in ((CPUAutocastAttention, torch.float32), (MultiHeadAttention, dtype)):
        mha = make_mha("sqrt_dk", d_model=8, n_head=2, d_head=4, attn_impl="sdpa", cls=cls)
        y32 = mha(x, **kwargs)
        calls = count_sdpa_calls(monkeypatch)
        with torch.autocast("cpu", dtype=dtype):
            y = mha(x, **kwargs)
        assert calls == [sdpa_dtype]
        assert y.dtype == dtype
        assert (y.float() - y32).abs().max() <= 0.02


@settings(max_examples=100, deadline=None, derandomize=True)
@given(name=st.sampled_from(SCALINGS), kind=st.sampled_from(MASK_KINDS),
       B=st.integers(1, 3), T=st.integers(1, 11), H=st.integers(1, 3), D=st.integers(1, 9),
       C=st.integers(1, 13), seed=st.integers(0, 2**16),
       normaliser=st.sampled_from(SDPA_NORMALISERS))
def test_explicit_equals_sdpa_property(name, kind, B, T, H, D, C, seed, normaliser):
    """Any shape from each scale's narrowest head up, in float64: the paths compute the same
    thing (test_explicit_equals_sdpa holds them within ATOL in float32), so that no draw fails
    on float32 rounding that a norm over a few near-equal coordinates magnifies."""
    assume(D >= SCALES[name].min_d_head)
    mha = make_mha(name, d_model=C, n_head=H, d_head=D, seed=seed,
                   normaliser=normaliser).double()
    gen = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    (y_e, g_e), (y_s, g_s) = run_both(mha, x, mask_kwargs(kind, B, T, gen))
    assert (y_e - y_s).abs().max() <= ATOL
    assert (g_e - g_s).abs().max() <= ATOL


def test_auto_uses_sdpa_unless_explained_or_softcap(monkeypatch):
    calls = []
    real_sdpa = attention.F.scaled_dot_product_attention

    def spy(q, k, v, **options):   # the keywords MultiHeadAttention.sdpa passes
        mask, causal = options["attn_mask"], options["is_causal"]
        assert not (causal and mask is not None), "attn_mask passed with is_causal"
        calls.append((mask is not None, causal, options["scale"]))
        return real_sdpa(q, k, v, **options)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    x = torch.randn(2, 5, 12)
    valid = torch.tensor([[True] * 5, [False, False, True, True, True]])
    mha = make_mha(attn_impl="auto")
    mha(x)
    mha(x, valid_mask=valid)
    assert calls == [(False, True, 0.5), (True, False, 0.5)]  # d_head 4: scale 1/2
    explain(mha, x)
    make_mha(attn_impl="auto", softcap=5.0)(x)
    assert len(calls) == 2
    make_mha("learned", attn_impl="sdpa")(x)
    assert calls[-1] == (False, True, 1.0)  # the per-head factor rides on q


# ---------------------------------------------------------------- reference implementation

@pytest.mark.parametrize("mode", ["causal", "padded", "causal+padded"])
def test_sqrt_dk_equals_torch_multihead_attention(mode):
    B, T, C, H = 3, 6, 16, 4
    mha = make_mha("sqrt_dk", d_model=C, n_head=H, d_head=C // H)
    ref = nn.MultiheadAttention(C, H, batch_first=True)
    projs = mha.q_proj, mha.k_proj, mha.v_proj
    with torch.no_grad():  # in_proj's rows are [W_q; W_k; W_v]
        ref.in_proj_weight.copy_(torch.cat([p.weight for p in projs]))
        ref.in_proj_bias.copy_(torch.cat([p.bias for p in projs]))
        ref.out_proj.weight.copy_(mha.proj.weight)
        ref.out_proj.bias.copy_(mha.proj.bias)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    causal = mode != "padded"
    valid = torch.ones(B, T, dtype=torch.bool)
    if mode != "causal":
        valid[1, 4:] = False  # right padding: every real query keeps a real key
        valid[2, 2:] = False
    ref_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = block
    y_ref, w_ref = ref(x, x, x, attn_mask=ref_mask, key_padding_mask=~valid,  # polarity flip
                       average_attn_weights=False)
    for impl in ("explicit", "sdpa"):
        mha.attn_impl = impl
        y = mha(x, causal=causal, valid_mask=valid)
        real = valid[:, :, None].expand_as(y)
        assert (y - y_ref)[real].abs().max() <= ATOL
    info = explain(mha, x, causal=causal, valid_mask=valid)
    assert (info.weights - w_ref)[valid[:, None, :, None].expand_as(w_ref)].abs().max() <= ATOL


# ---------------------------------------------------------------- the scale of each variant

# Each variant's s at initialisation, written by hand from its source (D head width, c the
# ScalingConfig, C the model width): the one test table a new scale adds a row to
BY_HAND = {"sqrt_dk": lambda D, c, C: D ** -0.5, "none": lambda D, c, C: 1.0,
           "dk": lambda D, c, C: 1 / D, "constant": lambda D, c, C: 1 / c.divisor,
           "learned": lambda D, c, C: D ** -0.5, "qk_norm": lambda D, c, C: D ** -0.5,
           "uniform": lambda D, c, C: 0.0, "sqrt_dmodel": lambda D, c, C: C ** -0.5}
D_HEAD = 16  # distinguishes every variant: 1/4, 1, 1/16, 1/8 ... (and 1/sqrt(32) at C = 32)


def test_every_scale_has_a_row_by_hand_and_a_config_file():
    assert set(BY_HAND) == set(SCALINGS)
    assert all((ROOT / "configs" / "scaling" / f"{name}.yaml").is_file() for name in SCALINGS)


@pytest.mark.parametrize("name", SCALINGS)
def test_each_scale_is_built_from_its_min_d_head_and_refused_below(name):
    """Each row of SCALES names the narrowest head it is defined for; GPTConfig refuses a
    narrower one, with the row's limit in the message."""
    narrowest = SCALES[name].min_d_head
    assert attention_layer(4, 1, narrowest, ScalingConfig(name)).d_head == narrowest
    if narrowest > 1:
        with pytest.raises(ConfigError, match=rf"model.d_head={narrowest - 1} is too narrow for "
                           rf"scaling.name={name} with scaling.qk_norm=none, defined for d_head "
                           rf">= {narrowest} "):
            attention_layer(4, 1, narrowest - 1, ScalingConfig(name))


def test_qk_norm_on_a_head_of_width_1_is_refused():
    """LayerNorm over one coordinate leaves 0 (RMSNorm a sign): every row of qk_norm's attention
    at d_head 1 would be uniform, silently."""
    assert torch.nn.LayerNorm(1, bias=False)(torch.randn(5, 1)).abs().max() == 0
    with pytest.raises(ConfigError, match="model.d_head=1 is too narrow for scaling.name=qk_norm"):
        attention_layer(4, 4, 1, ScalingConfig("qk_norm", norm="layernorm"))


@pytest.mark.parametrize("name", SCALINGS)
def test_scale_at_initialisation(name):
    mha = attention_layer(32, 2, D_HEAD, ScalingConfig(name))
    s = mha.scale()
    s = s.detach().flatten().tolist() if isinstance(s, torch.Tensor) else [s]
    assert s == pytest.approx([BY_HAND[name](D_HEAD, ScalingConfig(name), 32)] * len(s), rel=1e-6)
    assert attention_layer(32, 2, D_HEAD, ScalingConfig("constant", divisor=5.0)).scale() == 0.2


@pytest.mark.parametrize("name", SCALINGS)
def test_logits_are_qk_times_the_variant_factor(name):
    """Recompute q.k from the projection weights by hand and check softmax(q.k * factor)."""
    B, T, C, H = 2, 5, 32, 2
    mha = make_mha(name, d_model=C, n_head=H, d_head=D_HEAD, seed=3)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        q = (x @ mha.q_proj.weight.T + mha.q_proj.bias).view(B, T, H, D_HEAD).transpose(1, 2)
        k = (x @ mha.k_proj.weight.T + mha.k_proj.bias).view(B, T, H, D_HEAD).transpose(1, 2)
        factor = torch.full((H, 1, 1), BY_HAND[name](D_HEAD, mha.scaling, C))
        if name == "learned":
            factor = mha.log_scale.exp().view(H, 1, 1)
        if name == "qk_norm":  # LayerNorm over D (no bias) with the learnable gain
            q = nn.functional.layer_norm(q, (D_HEAD,), mha.q_norm.weight, eps=1e-5)
            k = nn.functional.layer_norm(k, (D_HEAD,), mha.k_norm.weight, eps=1e-5)
        logits = (q @ k.transpose(-2, -1)) * factor  # (B, H, T, T)
        info = explain(mha, x, causal=False)
    assert (info.weights - logits.softmax(-1)).abs().max() <= ATOL
    assert info.stats["max_logit"] == pytest.approx(logits.abs().amax(dim=(0, 2, 3)), rel=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_qk_norm_sdpa_equals_the_projections_by_hand(bias):
    """qk_norm by the sdpa path: the output and the q, k and v weight gradients equal those of
    the three projections, normed per head and given to SDPA by hand, with or without bias."""
    B, T, C, H = 2, 7, 24, 3
    torch.manual_seed(0)
    mha = attention_layer(C, H, 8, ScalingConfig("qk_norm"), bias=bias, attn_impl="sdpa")
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    y = mha(x)
    y.square().sum().backward()
    projs = mha.q_proj, mha.k_proj, mha.v_proj
    q, k, v = (p(x).view(B, T, H, 8) for p in projs)  # x W_q, x W_k, x W_v: (B, T, H, D)
    q, k = mha.q_norm(q), mha.k_norm(k)
    o = nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                   is_causal=True)
    ref = mha.proj(o.transpose(1, 2).reshape(B, T, H * 8))
    grads = [p.weight.grad.clone() for p in projs]
    mha.zero_grad()
    ref.square().sum().backward()
    assert (y - ref).abs().max() <= ATOL
    for grad, p in zip(grads, projs):
        assert (grad - p.weight.grad).abs().max() <= ATOL


def test_qk_norm_rmsnorm_and_learned_gradients():
    mha = make_mha("qk_norm", norm="rmsnorm")
    assert isinstance(mha.q_norm, nn.RMSNorm)
    mha = make_mha("learned", attn_impl="sdpa")
    mha(torch.randn(2, 5, 12)).square().sum().backward()
    assert mha.log_scale.grad is not None and (mha.log_scale.grad != 0).all()


def test_softcap_bounds_logits():
    mha = make_mha("none", softcap=2.0)
    x = 10.0 * torch.randn(2, 7, 12, generator=torch.Generator().manual_seed(0))
    info = explain(mha, x)
    uncapped = explain(make_mha("none"), x).stats["max_logit"]
    assert (uncapped > 4.0).all()  # the cap matters here
    assert (info.stats["max_logit"] <= 2.0).all()
    expected = 2.0 * torch.tanh(uncapped / 2.0)
    assert info.stats["max_logit"] == pytest.approx(expected, rel=1e-5)


def qk_by_hand(mha, x):
    """q and k (B, H, T, D) from the projection weights, normalised by hand for the qk_norm
    scale and scaling.qk_norm (with the gains, or without under qk_norm_gain=false)."""
    B, T, _ = x.shape
    H, D = mha.n_head, mha.d_head
    q, k = ((x @ p.weight.T + p.bias).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            for p in (mha.q_proj, mha.k_proj))
    norm = mha.scaling.norm if mha.scaling.name == "qk_norm" else mha.scaling.qk_norm
    if norm != "none":
        gains = (mha.q_norm.weight, mha.k_norm.weight) if mha.scaling.qk_norm_gain else (1, 1)
        if norm == "rmsnorm":  # t / sqrt(mean over D of t^2 + eps) * gain
            q, k = (t / (t.square().mean(-1, keepdim=True) + 1e-5).sqrt() * g
                    for t, g in zip((q, k), gains))
        else:  # (t - mean) / sqrt(var + eps) * gain, no bias
            q, k = ((t - t.mean(-1, keepdim=True))
                    / (t.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * g
                    for t, g in zip((q, k), gains))
    return q, k


def factor_by_hand(mha):
    """The score scale of the variant as BY_HAND gives it: (H|1, 1, 1)."""
    if mha.scaling.name == "learned":
        return mha.log_scale.exp().view(-1, 1, 1)
    factor = BY_HAND[mha.scaling.name](mha.d_head, mha.scaling, mha.d_model)
    return torch.full((1, 1, 1), factor, dtype=torch.float64)


def logits_by_hand(mha, x):
    """Raw scores q.k and logits (B, H, T, T): the scale, then the soft-cap."""
    q, k = qk_by_hand(mha, x)
    raw = q @ k.transpose(-2, -1)
    logits = raw * factor_by_hand(mha)
    c = mha.scaling.softcap
    return raw, logits if c is None else c * torch.tanh(logits / c)


def causal_padded_input(B=3, T=7, C=12, amplitude=3.0, seed=0):
    """x (B, T, C) with batch row 1 left-padded (3 pads) and row 2 right-padded (2 pads)."""
    x = amplitude * torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, :3] = False
    valid[2, T - 2:] = False
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & valid[:, None, None, :]  # (B, 1, T, T)
    return x.double(), valid, allowed


def test_softcap_weights_cap_after_the_scale_and_before_the_mask():
    """With s = 1/4 != 1, a causal mask and padding, the weights of the real query rows are
    softmax(c tanh(q.k s / c) + M): capping q.k before the scale, or the masked logits after
    the mask, gives other numbers."""
    mha = make_mha("sqrt_dk", d_model=12, n_head=2, d_head=16, softcap=2.0, attn_impl="auto")
    mha.double()
    x, valid, allowed = causal_padded_input(amplitude=4.0)
    raw, logits = logits_by_hand(mha, x)
    assert (raw / 4).abs().max() > 4 * 2.0  # the scaled logits reach well past the cap
    expected = logits.masked_fill(~allowed, float("-inf")).softmax(-1)  # (B, H, T, T)
    info = explain(mha, x, valid_mask=valid)
    got, want = (w.transpose(0, 1)[:, valid] for w in (info.weights, expected))  # (H, rows, T)
    assert (got - want).abs().max() <= 1e-12


def test_softcap_keeps_causality_and_padding():
    """Future and padded tokens never change real outputs with a soft-cap either (a cap applied
    after the mask would turn -inf into -c and let them in)."""
    mha = make_mha("sqrt_dk", softcap=1.0, attn_impl="auto")
    gen = torch.Generator().manual_seed(0)
    x = 5.0 * torch.randn(2, 9, 12, generator=gen)
    y = mha(x)
    x2 = x.clone()
    x2[:, 5:] = 5.0 * torch.randn(2, 4, 12, generator=gen)
    assert torch.equal(mha(x2)[:, :5], y[:, :5])
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, :3] = False
    valid[1, 6:] = False
    for causal in (False, True):
        y = mha(x, causal=causal, valid_mask=valid)
        x3 = torch.where(valid[..., None], x, 100 * torch.randn(2, 9, 12, generator=gen))
        assert torch.equal(mha(x3, causal=causal, valid_mask=valid)[valid], y[valid])


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_qk_norm_rmsnorm_by_hand(impl):
    """scaling.norm=rmsnorm: q / sqrt(mean(q^2) + 1e-5) * gain (and k alike), no centring, then
    s = 1/sqrt(d_head); the output y = proj(softmax(logits + M) v) by hand."""
    B, T, C, H, D = 2, 6, 12, 3, 4
    mha = make_mha("qk_norm", d_model=C, n_head=H, d_head=D, attn_impl=impl, norm="rmsnorm")
    mha.double()
    x = 3.0 + torch.randn(B, T, C, generator=torch.Generator().manual_seed(2)).double()
    _, logits = logits_by_hand(mha, x)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)  # (B, H, T, T)
    v = (x @ mha.v_proj.weight.T + mha.v_proj.bias).view(B, T, H, D)
    y = (weights @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, H * D)
    y = y @ mha.proj.weight.T + mha.proj.bias
    assert (mha(x) - y).abs().max() <= 1e-10
    if impl == "explicit":
        info = explain(mha, x)
        assert (info.weights - weights).abs().max() <= 1e-12


# -------------------------------------------------- worked examples (docs/scaling.md)

def stated_tol(s: str) -> float:
    """Half a unit of the last digit written: '0.10' -> 0.005, '6e-06' -> 5e-07."""
    return 0.5 * 10.0 ** Decimal(s).as_tuple().exponent


def worked_weights(scores, name, d_head, divisor=8.0):
    """Softmax weights of one query over keys with q.k = scores, through MultiHeadAttention.

    d_model = 2, one head of width d_head: W_q puts x[0] on the first q coordinate, W_k puts
    x[1] on the first k coordinate, so token j = (1, s_j) gives q_0 . k_j = s_j.
    """
    mha = attention_layer(2, 1, d_head, ScalingConfig(name, divisor=divisor))
    with torch.no_grad():
        for p in (mha.q_proj, mha.k_proj, mha.v_proj):
            p.weight.zero_()
            p.bias.zero_()
        mha.q_proj.weight[0, 0] = 1.0
        mha.k_proj.weight[0, 1] = 1.0
    x = torch.tensor([[[1.0, s] for s in scores]], dtype=torch.float64)
    info = explain(mha.double(), x, causal=False)
    return info.weights[0, 0, 0]


@pytest.mark.parametrize("scores, name, d_head, stated", [
    ((3, 1, -1), "none", 3, ("0.867", "0.117", "0.016")),
    ((3, 1, -1), "sqrt_dk", 3, ("0.707", "0.223", "0.070")),
    ((12, 8, 4, 0, -4), "none", 64, ("0.98", "0.018", "0.0003", "6e-06", "1e-07")),
    ((12, 8, 4, 0, -4), "constant", 16, ("0.43", "0.26", "0.16", "0.10", "0.06")),
    ((12, 8, 4, 0, -4), "sqrt_dk", 64, ("0.43", "0.26", "0.16", "0.10", "0.06")),
    ((8, 0, -8, 4), "none", 64, ("0.98", "0.0003", "1e-07", "0.018")),
    ((8, 0, -8, 4), "sqrt_dk", 64, ("0.47", "0.17", "0.06", "0.29")),
    ((8, 0, -8, 4), "dk", 64, ("0.28", "0.25", "0.22", "0.26")),
])
def test_science_worked_weights(scores, name, d_head, stated):
    w = worked_weights(scores, name, d_head)
    for got, s in zip(w.tolist(), stated, strict=True):
        assert abs(got - float(s)) <= stated_tol(s) + 1e-12, (got, s)


def test_science_example_vectors_give_scores_3_1_minus_1():
    """q = (1,1,1); k = (1,1,1), (1,0,0), (-1,0,0): identity projections, query row 0."""
    mha = attention_layer(3, 1, 3, ScalingConfig("none"))
    with torch.no_grad():
        for p in (mha.q_proj, mha.k_proj, mha.v_proj):  # q = k = v = x
            p.weight.copy_(torch.eye(3))
            p.bias.zero_()
    x = torch.tensor([[[1.0, 1, 1], [1, 0, 0], [-1, 0, 0]]])
    info = explain(mha, x, causal=False)
    assert info.weights[0, 0, 0].tolist() == pytest.approx([0.86681, 0.11731, 0.01588], abs=1e-5)


def softmax_jacobian(logits):
    """d weights / d logits through the module's own softmax (attention_weights)."""
    return torch.autograd.functional.jacobian(attention_weights, logits)


def test_science_jacobian_row_8_0_minus8_4():
    scores = torch.tensor([8.0, 0.0, -8.0, 4.0], dtype=torch.float64)
    unscaled = softmax_jacobian(scores).abs().max().item()
    scaled = softmax_jacobian(scores / 8).abs().max().item()
    assert abs(unscaled - 0.018) <= stated_tol("0.018")
    assert abs(scaled - 0.2493) <= stated_tol("0.2493")
    assert round(scaled / unscaled) == 14  # "roughly 14x larger"


def test_science_jacobian_row_12_8_4_0_minus4():
    scores = torch.tensor([12.0, 8.0, 4.0, 0.0, -4.0], dtype=torch.float64)
    j1, j8 = softmax_jacobian(scores), softmax_jacobian(scores / 8)
    p1, p8 = scores.softmax(-1), (scores / 8).softmax(-1)
    assert torch.allclose(j1, torch.diag(p1) - torch.outer(p1, p1))  # J = diag(p) - p p^T
    assert torch.allclose(j8, torch.diag(p8) - torch.outer(p8, p8))
    assert abs(j1[0, 0].item() - 0.02) <= stated_tol("0.02")
    # 0.43 x 0.57 = 0.25 from rounded factors; the exact entry is 0.2449
    assert j8[0, 0].item() == pytest.approx(0.2449, abs=5e-5)
    assert abs(j8[0, 0].item() - 0.25) <= 0.006
    assert abs(j1[0, 2].item() - -0.0003) <= stated_tol("0.0003")
    assert abs(j8[0, 2].item() - -0.068) <= stated_tol("0.068")


# ---------------------------------------------------------------- masks

@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("name", ["sqrt_dk", "qk_norm"])
def test_causality_future_tokens_never_change_the_past(impl, name):
    mha = make_mha(name, attn_impl=impl)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 12, generator=gen)
    y = mha(x)
    for t in (0, 4, 8):
        x2 = x.clone()
        x2[:, t:] = torch.randn(2, 9 - t, 12, generator=gen)
        y2 = mha(x2)
        assert torch.equal(y[:, :t], y2[:, :t])
        assert not torch.allclose(y[:, t:], y2[:, t:])


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_tokens_never_change_real_outputs(impl, causal):
    mha = make_mha("learned", attn_impl=impl)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 12, generator=gen)
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[0, :3] = False  # left padding
    valid[1, 5:] = False  # right padding
    attn_mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    attn_mask[..., :4, 4:] = attn_mask[..., 4:, :4] = False  # two documents
    for extra in ({}, {"attn_mask": attn_mask}):
        y = mha(x, causal=causal, valid_mask=valid, **extra)
        x2 = torch.where(valid[..., None], x, 100 * torch.randn(3, 8, 12, generator=gen))
        y2 = mha(x2, causal=causal, valid_mask=valid, **extra)
        assert torch.equal(y[valid], y2[valid])


def test_document_mask_separates_documents():
    mha = make_mha()
    x = torch.randn(1, 8, 12, generator=torch.Generator().manual_seed(0))
    docs = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    attn_mask = (docs[:, None] == docs[None, :])[None, None]  # (1, 1, T, T)
    y = mha(x, attn_mask=attn_mask)
    assert torch.allclose(y[:, 3:], mha(x[:, 3:]), atol=ATOL)  # document 2 alone


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_fp16_prescaled_q_does_not_overflow(impl):
    """q = k = 40, d = 64: q @ k^T = 102400 = inf in fp16; (q/8) @ k^T = 12800."""
    mha = attention_layer(64, 1, 64, ScalingConfig("sqrt_dk"), attn_impl=impl).half()
    with torch.no_grad():
        for p in (mha.q_proj, mha.k_proj, mha.v_proj):  # q = k = v = x
            p.weight.copy_(torch.eye(64))
            p.bias.zero_()
    x = torch.full((1, 3, 64), 40.0, dtype=torch.float16)
    q = x[0]
    assert torch.isinf(q @ q.T * 0.125).all()  # the unsafe order overflows
    assert ((q * 0.125) @ q.T == 12800).all()
    y = mha(x)
    assert y.isfinite().all()
    if impl == "explicit":
        info = explain(mha, x, causal=False)
        assert torch.allclose(info.weights.float(), torch.full((1, 1, 3, 3), 1 / 3), atol=1e-3)
        assert info.stats["max_logit"].item() == 12800


# ---------------------------------------------------------------- dropout, stats, grads

@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_attention_dropout_in_both_paths(impl):
    mha = make_mha(attn_impl=impl, dropout=0.5)
    x = torch.randn(2, 7, 12, generator=torch.Generator().manual_seed(0))
    mha.eval()
    y_eval = mha(x)
    torch.manual_seed(1)
    mha.train()
    y_train = mha(x)
    assert not torch.allclose(y_train, y_eval)
    mha.dropout = 0.0
    assert torch.allclose(mha(x), y_eval, atol=ATOL)  # train == eval without dropout


def test_returned_weights_are_before_dropout():
    mha = make_mha(dropout=0.5).train()
    info = explain(mha, torch.randn(2, 5, 12))
    assert torch.allclose(info.weights.sum(-1), torch.ones(2, 3, 5))


def test_stats_on_uniform_causal_attention():
    """Zero q projection: logits 0, each row uniform over its t + 1 allowed keys."""
    T = 5
    mha = make_mha()
    with torch.no_grad():
        mha.q_proj.weight.zero_()
        mha.q_proj.bias.zero_()
    valid = torch.tensor([[True] * T, [False, False, True, True, True]])
    info = explain(mha, torch.randn(2, T, 12), valid_mask=valid)
    # real rows: batch 0 has t + 1 keys at t = 0..4, batch 1 (left-padded) 1..3 keys
    entropies = [math.log(n) for n in (1, 2, 3, 4, 5, 1, 2, 3)]
    assert info.stats["entropy"] == pytest.approx([sum(entropies) / 8] * 3, rel=1e-6)
    assert info.stats["saturated"] == pytest.approx([2 / 8] * 3)  # the single-key rows
    assert info.stats["max_logit"].tolist() == [0.0, 0.0, 0.0]
    # entropy / ln(keys) over the 6 rows with 2 keys or more: 1 for uniform attention
    assert info.stats["entropy_norm"] == pytest.approx([1.0] * 3, rel=1e-6)


def test_stats_match_returned_weights_with_padding():
    mha = make_mha("none")
    x = 4 * torch.randn(3, 7, 12, generator=torch.Generator().manual_seed(0))
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[1, :4] = False
    with torch.no_grad():
        info = explain(mha, x, valid_mask=valid)
    w = info.weights.permute(1, 0, 2, 3)[:, valid]  # (H, real rows, T)
    entropy = -(w * w.clamp_min(1e-30).log()).sum(-1).mean(-1)
    assert info.stats["entropy"] == pytest.approx(entropy, rel=1e-5)
    assert info.stats["saturated"] == pytest.approx((w.amax(-1) > 0.99).float().mean(-1))
    assert (info.stats["saturated"] > 0).any()
    assert {k: v.shape for k, v in info.stats.items()} == {
        "entropy": (3,), "entropy_norm": (3,), "max_logit": (3,), "saturated": (3,),
        "raw_var": (3,), "raw_max_logit": (3,), "q_norm": (3,), "k_norm": (3,)}


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_attention_dropout_drops_weights(impl):
    """Training with dropout p: each weight is kept as w / (1 - p) or set to 0. With one head
    of width T, x_t = e_t, V orthogonal and an identity output projection, y @ V^T is exactly
    the dropped weight matrix; dropout on the output (before or after the projection) is not of
    this form. (V is orthogonal rather than the identity, for which dropout on W V and on W
    would coincide.)"""
    B, T, p = 4, 6, 0.5
    mha = make_mha(d_model=T, n_head=1, d_head=T, attn_impl=impl, dropout=p).double()
    gen = torch.Generator().manual_seed(0)
    rotation = torch.linalg.qr(torch.randn(T, T, generator=gen, dtype=torch.float64))[0]
    with torch.no_grad():
        mha.v_proj.weight.copy_(rotation)  # v_j = rotation[:, j]: V = rotation^T
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
            proj.bias.zero_()
        mha.proj.weight.copy_(torch.eye(T))
        mha.proj.bias.zero_()
    x = torch.eye(T, dtype=torch.float64).expand(B, T, T)
    info = explain(mha.eval(), x)
    w = info.weights[:, 0]  # (B, T, T), no dropout in evaluation
    torch.manual_seed(3)
    dropped = mha.train()(x) @ rotation  # (B, T, T) = dropped weights
    kept = (dropped - w / (1 - p)).abs() <= 1e-12
    zero = dropped.abs() <= 1e-12
    assert (kept | zero).all()
    allowed = w > 0
    assert (kept & allowed).any() and (zero & allowed).any()  # some of each


def test_max_logit_counts_real_query_rows_only():
    """Under packing=pad, padded query rows attend real keys; their logits must not set
    max_logit (entropy and saturated leave them out too)."""
    mha = make_mha("none")
    x, valid, allowed = causal_padded_input()
    x = x.float()
    x[~valid] *= 50.0  # padded queries get the largest logits
    info = explain(mha, x, valid_mask=valid)
    with torch.no_grad():
        _, logits = logits_by_hand(mha, x)
    real = allowed & valid[:, None, :, None]  # (B, 1, T, T)
    by_head = logits.abs().transpose(0, 1)  # (H, B, T, T)
    expected = by_head[:, real[:, 0]].amax(-1)
    with_pads = by_head[:, allowed.expand_as(logits).transpose(0, 1)[0]].amax(-1)
    assert (with_pads > 2 * expected).all()  # a padded row would set it
    assert info.stats["max_logit"] == pytest.approx(expected, rel=1e-5)


def stats_by_hand(mha, x, valid, allowed):
    """Every statistic per head, from the raw scores and logits computed by hand."""
    with torch.no_grad():
        raw, logits = logits_by_hand(mha, x)
        q, k = qk_by_hand(mha, x)  # (B, H, T, D)
    weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)  # (B, H, T, T)
    rows = valid & allowed[:, 0].any(-1)  # (B, T) real query rows
    entries = allowed[:, 0] & rows[..., None]  # (B, T, T)
    n_keys = entries.sum(-1)  # (B, T)
    wide = rows & (n_keys >= 2)  # rows whose entropy can be normalised
    out = {key: [] for key in ("entropy", "entropy_norm", "max_logit", "saturated", "raw_var",
                               "raw_max_logit", "q_norm", "k_norm")}
    for h in range(mha.n_head):
        w = weights[:, h][rows]  # (real rows, T)
        r, lg = raw[:, h][entries], logits[:, h][entries]  # (entries,)
        out["entropy"].append(-(w * w.clamp_min(1e-300).log()).sum(-1).mean())
        ww = weights[:, h][wide]  # (wide rows, T)
        out["entropy_norm"].append((-(ww * ww.clamp_min(1e-300).log()).sum(-1)
                                    / n_keys[wide].double().log()).mean())
        out["q_norm"].append(q[:, h][rows].norm(dim=-1).mean())
        out["k_norm"].append(k[:, h][valid].norm(dim=-1).mean())
        out["saturated"].append((w.amax(-1) > 0.99).double().mean())
        out["max_logit"].append(lg.abs().max())
        out["raw_var"].append(((r - r.mean()) ** 2).mean() / mha.d_head)
        out["raw_max_logit"].append(r.abs().max())
    return {key: torch.stack(v).tolist() for key, v in out.items()}


@pytest.mark.parametrize("name, softcap, impl", [
    (n, None, impl) for n in SCALINGS for impl in ("auto", "explicit", "sdpa")
] + [("dk", 0.5, "auto"), ("dk", 0.5, "explicit")])
def test_stats_by_hand_whatever_attn_impl(name, softcap, impl):
    """Every statistic, whatever attn_impl the module was built with, equals the hand
    computation from q, k and the mask; raw_var and raw_max_logit are those of q.k before the
    scale and the soft-cap, after qk_norm."""
    mha = make_mha(name, d_model=12, n_head=3, d_head=4, attn_impl=impl, softcap=softcap)
    x, valid, allowed = causal_padded_input(amplitude=4.0)
    x = x.float()
    info = explain(mha, x, valid_mask=valid)
    expected = stats_by_hand(mha.double(), x.double(), valid, allowed)
    assert 0 < min(expected["saturated"]) and max(expected["saturated"]) < 1
    assert set(info.stats) == set(expected)
    for key, value in info.stats.items():
        assert value.dtype == torch.float32 and value.shape == (3,)
        assert value.tolist() == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


def test_raw_stats_do_not_depend_on_the_scale():
    """The same weights under none, sqrt_dk and dk: raw_var and raw_max_logit are equal,
    max_logit is raw_max_logit times the scale."""
    x, valid, _ = causal_padded_input()
    stats = {}
    for name in ("none", "sqrt_dk", "dk"):
        info = explain(make_mha(name, d_head=4), x.float(), valid_mask=valid)
        stats[name] = info.stats
    for name, s in (("sqrt_dk", 0.5), ("dk", 0.25)):
        for key in ("raw_var", "raw_max_logit"):
            assert torch.allclose(stats[name][key], stats["none"][key], rtol=1e-6)
        assert torch.allclose(stats[name]["max_logit"], s * stats[name]["raw_max_logit"],
                              rtol=1e-6)


def test_qk_grad_norms():
    mha = make_mha()
    assert mha.q_proj.weight.grad is None and qk_grad_norms(mha) == (0.0, 0.0)
    mha(torch.randn(2, 6, 12)).square().sum().backward()
    q, k = qk_grad_norms(mha)
    for norm, p in ((q, mha.q_proj), (k, mha.k_proj)):  # weight and bias together
        grad = torch.cat([p.weight.grad.flatten(), p.bias.grad])
        assert norm == pytest.approx(grad.norm().item())
    assert q > 0 and k > 0
    # T = 1: softmax over one key is constant, so q and k get no gradient while v does
    mha.zero_grad()
    mha(torch.randn(2, 1, 12)).square().sum().backward()
    assert qk_grad_norms(mha) == (0.0, 0.0)
    assert mha.v_proj.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- the uniform control

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_uniform_is_the_masked_mean_of_v_and_q_k_get_no_gradient(kind, impl, dtype):
    """scaling=uniform: each real query row outputs the plain mean of v over its allowed keys
    (written out as sum_j allowed_ij v_j / sum_j allowed_ij), a row with no allowed key
    outputs 0, and the loss does not depend on q or k: their projection rows get zero
    gradient while v's do not."""
    B, T, H, D, C = 3, 6, 2, 4, 8
    mha = make_mha("uniform", d_model=C, n_head=H, d_head=D, attn_impl=impl).to(dtype)
    gen = torch.Generator().manual_seed(5)
    x = (3.0 * torch.randn(B, T, C, generator=gen)).to(dtype)
    kwargs = mask_kwargs(kind, B, T, gen)
    y = mha(x, **kwargs)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)  # (B, 1, T, T) by hand
    if kwargs["causal"]:
        allowed &= torch.ones(T, T, dtype=torch.bool).tril()
    if "valid_mask" in kwargs:
        allowed &= kwargs["valid_mask"][:, None, None, :]
    if "attn_mask" in kwargs:
        allowed &= kwargs["attn_mask"]
    with torch.no_grad():
        v = (x @ mha.v_proj.weight.T + mha.v_proj.bias)  # (B, T, HD)
        v = v.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        a = allowed.to(dtype)
        mean = (a @ v) / a.sum(-1, keepdim=True).clamp(min=1)  # (B, H, T, D); 0 on empty rows
        expected = mha.proj(mean.transpose(1, 2).reshape(B, T, H * D))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert (y - expected).abs().max() <= tol
    y.square().sum().backward()
    for p in (mha.q_proj, mha.k_proj):
        assert torch.count_nonzero(p.weight.grad) == 0
        assert torch.count_nonzero(p.bias.grad) == 0
    assert mha.v_proj.weight.grad.abs().max() > 0
