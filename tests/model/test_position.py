"""Tests for model.pos (model/rope.py, the seams in model/attention.py and model/gpt.py): RoPE's
scores depend on the offset between query and key only, RoPE turns pairs as the formula says,
explicit equals SDPA for every position choice and mask, nope has no position input, and
learned is today's model."""

import math

import pytest
import torch
from test_attention import MASK_KINDS, mask_kwargs, run_both

from model.attention import MultiHeadAttention
from model.config import GPTConfig, ScalingConfig
from model.errors import ConfigError
from model.gpt import GPT
from model.rope import Rotary, rotate

pytestmark = pytest.mark.usefixtures("single_thread")


def rope_layer(seed=0, d_model=12, n_head=3, d_head=4, base=10000.0, **model):
    torch.manual_seed(seed)
    return MultiHeadAttention(GPTConfig(vocab_size=1, d_model=d_model, n_head=n_head,
                                        d_head=d_head, pos="rope", rope_base=base,
                                        attn_impl="explicit", **model))


def test_rope_turns_each_pair_by_position_times_theta():
    """Pair i of position t = (x_i, x_{i+D/2}) turned by t * base^(-2i/D), by hand."""
    D, T, base = 6, 5, 100.0
    x = torch.randn(1, 1, T, D, dtype=torch.float64)
    cos, sin = Rotary(D, base).angles(T, x.device)
    got = rotate(x, cos.double(), sin.double())
    for t in range(T):
        for i in range(D // 2):
            a, b, angle = x[0, 0, t, i], x[0, 0, t, i + D // 2], t * base ** (-2 * i / D)
            assert got[0, 0, t, i].item() == pytest.approx(
                (a * math.cos(angle) - b * math.sin(angle)).item(), abs=1e-6)
            assert got[0, 0, t, i + D // 2].item() == pytest.approx(
                (b * math.cos(angle) + a * math.sin(angle)).item(), abs=1e-6)


def test_rope_scores_depend_only_on_the_offset():
    """The same q at position t and k at position u score as at t + s and u + s: shifting both
    by s leaves every score (and the norms) unchanged."""
    D, H, shift = 8, 2, 7
    rot = Rotary(D, 10000.0)
    q, k = torch.randn(1, H, 1, D), torch.randn(1, H, 1, D)
    T = 20
    seq_q = q.expand(1, H, T, D).clone()
    seq_k = k.expand(1, H, T, D).clone()
    rq, rk = rot(seq_q, seq_k)   # q and k at every position 0..T-1
    scores = rq @ rk.transpose(-2, -1)   # (1, H, T, T): score of q at t with k at u
    for t, u in ((3, 1), (5, 5), (2, 9)):
        assert torch.allclose(scores[..., t, u], scores[..., t + shift, u + shift], atol=1e-5)
    assert torch.allclose(rq.norm(dim=-1), seq_q.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(scores[..., 3, 1], scores[..., 3, 2], atol=1e-3)  # offsets differ


def test_rope_attention_output_is_shift_invariant_on_the_same_tokens():
    """A causal RoPE layer sees the same scores whether the sequence is read from position 0 or
    after a block of earlier tokens it cannot attend (document mask): offsets only."""
    mha = rope_layer()
    x = torch.randn(1, 6, 12)
    pad = torch.randn(1, 4, 12)
    both = torch.cat([pad, x], dim=1)  # (1, 10, C): x at positions 4..9
    docs = torch.zeros(1, 1, 10, 10, dtype=torch.bool)
    docs[..., :4, :4], docs[..., 4:, 4:] = True, True  # two documents
    with torch.no_grad():
        alone = mha(x)
        shifted = mha(both, attn_mask=docs)[:, 4:]
    assert torch.allclose(alone, shifted, atol=1e-5)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("pos", ["learned", "rope", "nope"])
def test_explicit_equals_sdpa_for_each_position_choice(pos, kind):
    torch.manual_seed(1)
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3, pos=pos))
    x = torch.randn(2, 7, 12)
    kwargs = mask_kwargs(kind, 2, 7, torch.Generator().manual_seed(2))
    (ye, ge), (ys, gs) = run_both(mha, x, kwargs)
    assert torch.allclose(ye, ys, atol=1e-5) and torch.allclose(ge, gs, atol=1e-5)


def test_rope_changes_the_output_and_learned_adds_nothing_to_attention():
    torch.manual_seed(0)
    plain = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3))
    roped = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3, pos="rope"))
    roped.load_state_dict(plain.state_dict())   # RoPE holds no weights
    x = torch.randn(1, 5, 12)
    assert plain.rope is None and plain.length is None
    assert not torch.allclose(plain(x), roped(x), atol=1e-4)


def test_nope_and_rope_have_no_position_table_and_read_past_block_size():
    for pos in ("rope", "nope"):
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, d_model=16, n_head=2,
                              pos=pos))
        assert model.wpe is None and "wpe.weight" not in model.state_dict()
        logits, _ = model(torch.randint(0, 11, (2, 20)))   # 20 > block_size
        assert logits.shape == (2, 20, 11) and torch.isfinite(logits).all()
    learned = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, d_model=16, n_head=2))
    with pytest.raises(ValueError, match="exceeds model.block_size=8"):
        learned(torch.randint(0, 11, (1, 9)))


def test_nope_output_of_a_token_ignores_absolute_position_without_context():
    """With no position input, a causal model's first output depends on its token only."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, d_model=16, n_head=2,
                          pos="nope")).eval()
    a = model(torch.tensor([[3, 4, 5]]))[0]
    b = model(torch.tensor([[3, 7]]))[0]
    assert torch.allclose(a[0, 0], b[0, 0], atol=1e-6)   # same first token, same output


@pytest.mark.parametrize("fields, message", [
    ({"pos": "alibi"}, "model.pos='alibi'"),
    ({"pos": "rope", "rope_base": 0.0}, "positive rope_base"),
    ({"pos": "rope", "d_model": 15, "n_head": 3}, "even d_head"),
])
def test_bad_position_settings_name_the_key_and_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(vocab_size=1, **{"d_model": 12, "n_head": 3, **fields})


def test_scaling_default_is_fixed_and_builds_no_length_module():
    mha = MultiHeadAttention(GPTConfig(vocab_size=1, d_model=12, n_head=3,
                                       scaling=ScalingConfig()))
    assert mha.length is None and mha.rope is None
