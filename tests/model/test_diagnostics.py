"""model/diagnostics.py's mass and activation statistics on hand-built tensors with known answers:
where attention's mass goes (the first token, Gu et al.'s sink rate, the sink's own weight) and
the residual stream's size (Sun et al.'s top-3 and median |h|, kurtosis)."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from data.batching import Batch
from model.config import SDPA_NORMALISERS, GPTConfig, ScalingConfig
from model.diagnostics import (
    SINK_EPSILON,
    SINK_WINDOW,
    activation_stats,
    attention_stats,
    layer_stats,
    mass_stats,
    read_weights,
    residual_stats,
)
from model.gpt import GPT
from trainer.diagnose import attention_record

pytestmark = pytest.mark.usefixtures("single_thread")


def harmonic(n: int) -> float:
    return sum(1.0 / i for i in range(1, n + 1))


def causal_weights(T: int, first) -> torch.Tensor:
    """(T, T): row i puts first(i) on key 0 and 1 - first(i) evenly on keys 1..i (row 0 has no
    other key, so its row sums to first(0); the rest of 1 is outside the keys: a sink)."""
    w = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        w[i, 0] = first(i)
        if i > 0:
            w[i, 1:i + 1] = (1.0 - first(i)) / i
    return w


HALF = causal_weights(16, lambda i: 0.5)   # 0.5 on key 0 in every row
UNIFORM = causal_weights(16, lambda i: 1.0 / (i + 1))   # 1/(i+1) on every key


def test_sink_rate_and_first_mass_by_hand():
    """Head 0 puts 0.5 on key 0 in every row, head 1 attends uniformly: head 0 is a sink head
    (0.5 > 0.3), head 1 not (H_16 / 16 = 0.211), so the sink rate is 0.5."""
    weights = torch.stack([HALF, UNIFORM])[None].float()   # (1, 2, 16, 16)
    rows = torch.ones(1, 2, 16, 1, dtype=torch.bool)
    stats = mass_stats(weights, rows, "softmax1")
    assert stats["first_mass"].tolist() == pytest.approx([0.5, harmonic(16) / 16], rel=1e-6)
    assert stats["sink_score"].tolist() == pytest.approx([0.5, harmonic(16) / 16], rel=1e-6)
    assert stats["sink_rate"].tolist() == [1.0, 0.0]
    assert stats["sink_rate"].mean().item() == 0.5
    # the +1 of softmax1 holds row 0's other 0.5 in head 0; head 1's rows sum to 1
    assert stats["sink_weight"].tolist() == pytest.approx([0.5 / 16, 0.0], abs=1e-7)


@pytest.mark.parametrize("normaliser", SDPA_NORMALISERS)
def test_rows_without_a_real_query_or_key_count_nowhere(normaliser):
    """Sequence 1 is right-padded after 5 tokens: its padded rows put everything on key 0 and
    must not count; under the window its uniform head sees 5 rows, H_5 / 5 = 0.457 > 0.3, so
    it is a sink head on that sequence only. Sequence 2 is all padding: zero weights by the
    empty-row policy (1 - sum = 1 outside), in no mean. Per normaliser, the sink's weight: the
    rest of 1 (softmax1, sink), 0 (softmax). (Sigmoid reads shares of each row: below.)"""
    weights = torch.stack([HALF, UNIFORM])[None].repeat(3, 1, 1, 1).float()   # (3, 2, 16, 16)
    weights[1, :, 5:] = 0.0
    weights[1, :, 5:, 0] = 1.0
    weights[2] = 0.0
    rows = torch.ones(3, 2, 16, 1, dtype=torch.bool)
    rows[1, :, 5:] = rows[2] = False
    stats = mass_stats(weights, rows, normaliser)
    assert stats["first_mass"].tolist() == pytest.approx(
        [0.5, (harmonic(16) + harmonic(5)) / 21], rel=1e-6)
    assert stats["sink_score"].tolist() == pytest.approx(
        [0.5, (harmonic(16) / 16 + harmonic(5) / 5) / 2], rel=1e-6)
    assert stats["sink_rate"].tolist() == [1.0, 0.5]
    expected = [0.0, 0.0] if normaliser == "softmax" else [1 / 21, 0.0]   # the extra logit's
    assert stats["sink_weight"].tolist() == pytest.approx(expected, abs=1e-7)


# sigmoid rows of 16 causal keys: head 0 gives every key 0.5, head 1 gives key 0 0.9 and every
# other key 0.1; a padded sequence after them
HALVES = torch.ones(16, 16, dtype=torch.float64).tril() * 0.5
TENTHS = torch.ones(16, 16, dtype=torch.float64).tril() * 0.1
TENTHS[:, 0] = 0.9
SIGMOID_ROWS = torch.stack([torch.stack([HALVES, TENTHS]), torch.zeros(2, 16, 16)]).float()


def test_sigmoid_first_mass_and_sink_read_shares_of_each_row():
    """Head 0's rows are uniform: key 0's share of row i is 1/(i + 1), as under softmax, so its
    first mass and sink score are H_16 / 16 = 0.211 < 0.3, no sink head (as weights, 0.5 in
    every row, it was one). Head 1's share of key 0 in row i is 0.9 / (0.9 + 0.1 i) = 9 / (9 +
    i): mean 0.595 over the 16 rows, a sink head. Sequence 2 has no real row; no sink weight,
    as the rows need not sum to 1."""
    rows = torch.ones(2, 2, 16, 1, dtype=torch.bool)
    rows[1] = False
    stats = mass_stats(SIGMOID_ROWS, rows, "sigmoid")
    shares = [harmonic(16) / 16, sum(9 / (9 + i) for i in range(16)) / 16]
    assert shares[0] < SINK_EPSILON < shares[1]
    assert stats["first_mass"].tolist() == pytest.approx(shares, rel=1e-6)
    assert stats["sink_score"].tolist() == pytest.approx(shares, rel=1e-6)
    assert stats["sink_rate"].tolist() == [0.0, 1.0]
    assert "sink_weight" not in stats


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_sigmoid_entropy_reads_shares_of_each_row():
    """The same rows: head 0's row i is uniform over its i + 1 keys, entropy ln(i + 1) and
    entropy / ln(i + 1) = 1 (as weights, 0.5 ln 2 (i + 1) / ln(i + 1): 2.0 at i = 15); head 1's
    shares are (9, 1, ..., 1) / (9 + i). Row 0 has one key, share 1: saturated, as under
    softmax."""
    B, H, T = SIGMOID_ROWS.shape[:3]
    q = k = torch.zeros(B, H, T, 4)
    causal = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
    valid = torch.tensor([[True] * T, [False] * T])   # sequence 2: padding
    stats = attention_stats(q, k, torch.zeros(B, H, T, T), read_weights(SIGMOID_ROWS, "sigmoid"),
                            (causal, torch.ones(1, 1, T, 1, dtype=torch.bool)), valid)
    tenths = [entropy([9 / (9 + i)] + [1 / (9 + i)] * i) for i in range(T)]
    assert stats["entropy"].tolist() == pytest.approx(
        [sum(math.log(i + 1) for i in range(T)) / T, sum(tenths) / T], rel=1e-5)
    assert stats["entropy_norm"].tolist() == pytest.approx(
        [1.0, sum(h / math.log(i + 1) for i, h in enumerate(tenths) if i) / (T - 1)], rel=1e-5)
    assert stats["entropy_norm"].max() <= 1.0
    assert stats["saturated"].tolist() == pytest.approx([1 / T, 1 / T])


def test_the_sink_score_reads_the_first_64_rows():
    """T = 80. Head 0 uniform: first mass H_80 / 80, score H_64 / 64. Head 1 puts its weight
    on key 0 only in row 0 and past row 64: first mass 17 / 80, score 1 / 64, not a sink.
    Head 2 puts 0.4 on key 0 in the first 64 rows only: first mass 0.32, a sink."""
    T = 80
    heads = [causal_weights(T, lambda i: 1.0 / (i + 1)),
             causal_weights(T, lambda i: 1.0 if i == 0 or i >= SINK_WINDOW else 0.0),
             causal_weights(T, lambda i: 0.4 if i < SINK_WINDOW else 0.0)]
    stats = mass_stats(torch.stack(heads)[None].float(), torch.ones(1, 3, T, 1, dtype=bool),
                       "softmax")
    assert stats["first_mass"].tolist() == pytest.approx(
        [harmonic(T) / T, 17 / T, 0.4 * 64 / T], rel=1e-6)
    assert stats["sink_score"].tolist() == pytest.approx(
        [harmonic(64) / 64, 1 / 64, 0.4], rel=1e-6)
    assert stats["sink_rate"].tolist() == [0.0, 0.0, 1.0]


def gu_compute_attention_sink(attention_scores: np.ndarray, epsilon: float) -> torch.Tensor:
    """compute_attention_sink of sail-sg/Attention-Sink's eval_sink_open_source.py, as written
    there but for the file it loads the scores from."""
    num_samples, num_layers, num_heads, num_tokens1, num_tokens2 = attention_scores.shape
    assert num_tokens1 == num_tokens2
    attention_scores = torch.from_numpy(attention_scores)
    ratios = torch.arange(num_tokens1, 0, -1)[None, None, None, :].expand(
        num_samples, num_layers, num_heads, num_tokens1, num_tokens2).to(attention_scores)
    importance_scores = (attention_scores / ratios).sum(dim=-2)
    metric1 = (importance_scores > epsilon).to(torch.float).mean(dim=(0, 1, 2))
    return metric1 * 100


def test_sink_rate_is_gu_et_al_s_on_the_first_64_tokens():
    """Random causal softmax weights of 5 sequences, 3 layers, 4 heads and 96 tokens, key 0's
    logit raised by a per-head amount so that some heads are sink heads on some sequences:
    the mean over layers and heads of sink_rate is their code's metric for token 0 (in %) on
    the weights cut to the first 64 tokens, and each head's sink_score is their score of key 0
    averaged over the sequences."""
    S, L, H, T = 5, 3, 4, 96
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(S, L, H, T, T, generator=gen, dtype=torch.float64)
    logits[..., 0] += torch.linspace(0.0, 6.0, L * H, dtype=torch.float64).view(L, H, 1)
    logits = logits + torch.randn(S, 1, 1, 1, 1, generator=gen, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    weights = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    rows = torch.ones(S, H, T, 1, dtype=torch.bool)
    stats = [mass_stats(weights[:, layer], rows, "softmax") for layer in range(L)]
    rate = torch.stack([s["sink_rate"] for s in stats]).mean().item()
    window = weights[..., :SINK_WINDOW, :SINK_WINDOW].numpy()
    assert 0.0 < rate < 1.0   # some heads are, some are not
    assert rate * 100 == pytest.approx(gu_compute_attention_sink(window, SINK_EPSILON)[0].item())
    scores = window[..., 0].sum(axis=-1) / SINK_WINDOW   # (S, L, H) their score of key 0
    for layer in range(L):
        assert stats[layer]["sink_score"].tolist() == pytest.approx(
            scores[:, layer].mean(axis=0).tolist(), rel=1e-5)


def test_activation_stats_by_hand():
    """Sequence 0 holds one massive entry, -100, among 1..11; sequence 1 holds (0.5, -0.5,
    0.25) in its one real token and 1000 in its padding; sequence 2 is all padding. Per
    sequence: top-3 |h| (100, 11, 10) and (0.5, 0.5, 0.25), lower median 6 and 0.5; their means
    over the two sequences with a real token. Kurtosis: scipy's excess kurtosis of the 15 real
    entries."""
    h = torch.tensor([[[1., -2., 3.], [-4., 5., -6.], [7., -8., 9.], [-10., 11., -100.]],
                      [[.5, -.5, .25], [1e3, 1e3, 1e3], [1e3, 1e3, 1e3], [1e3, 1e3, 1e3]],
                      [[1e4, 1e4, 1e4]] * 4])
    valid = torch.tensor([[True] * 4, [True, False, False, False], [False] * 4])
    stats = activation_stats(h, valid)
    assert [stats[k].item() for k in ("top1", "top2", "top3", "median")] == pytest.approx(
        [(100 + 0.5) / 2, (11 + 0.5) / 2, (10 + 0.25) / 2, (6 + 0.5) / 2])
    real = h[valid].flatten().numpy().astype(np.float64)
    expected = scipy.stats.kurtosis(real, fisher=True, bias=True)
    assert expected > 5   # the massive entry makes the tails heavy
    assert stats["kurtosis"].item() == pytest.approx(expected, rel=1e-5)
    assert all(v.dtype == torch.float32 and v.dim() == 0 for v in stats.values())
    # without a mask every token counts, and a Gaussian's excess kurtosis is near 0
    gauss = activation_stats(torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(0)),
                             None)
    assert abs(gauss["kurtosis"].item()) < 0.1


def uniform_gpt(T: int, n_layer: int = 2) -> GPT:
    """scaling=uniform: every logit is 0, so row i puts 1/(i+1) on each of its keys."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=T, n_layer=n_layer, n_head=2, d_model=8,
                         scaling=ScalingConfig("uniform")))


@pytest.mark.parametrize("T, sink", [(80, 0.0), (8, 1.0)])
def test_uniform_attention_in_a_gpt_has_a_known_first_token_mass(T, sink):
    """The first-token mass of uniform attention is H_T / T in every layer and head; its sink
    score over the first min(T, 64) rows is H_64 / 64 = 0.074 at T = 80 (no sink), H_8 / 8 =
    0.340 at T = 8 (a sink by Gu et al.'s epsilon); a right-padded row with 5 real tokens
    gives its rows 1/(i+1) over its real keys."""
    idx = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    record = attention_record(uniform_gpt(T), Batch(idx, idx, None), torch.device("cpu"))
    window = min(T, SINK_WINDOW)
    assert record["attn_first_mass"] == pytest.approx([harmonic(T) / T] * 2, rel=1e-6)
    assert record["attn_sink_rate"] == [sink, sink]
    assert record["attn_sink_weight"] == [0.0, 0.0]
    for layer in record["attn_heads"]["sink_score"]:
        assert layer == pytest.approx([harmonic(window) / window] * 2, rel=1e-6)
    valid = torch.ones(2, T, dtype=torch.bool)
    valid[1, 5:] = False
    padded = layer_stats(uniform_gpt(T), idx, valid)
    for layer in padded:
        assert layer["first_mass"].tolist() == pytest.approx(
            [(harmonic(T) + harmonic(5)) / (T + 5)] * 2, rel=1e-6)


def test_residual_stats_are_each_blocks_output():
    """Layer l's activation statistics are those of block l's output on the real tokens, and
    the eval record keeps them per layer as hidden_*."""
    T = 12
    model = GPT(GPTConfig(vocab_size=11, block_size=T, n_layer=3, n_head=2, d_model=16))
    idx = torch.randint(0, 11, (3, T), generator=torch.Generator().manual_seed(2))
    valid = torch.ones(3, T, dtype=torch.bool)
    valid[2, 7:] = False
    stats = residual_stats(model, idx, valid)
    with torch.no_grad():
        x = model.wte(idx) + model.wpe((valid.long().cumsum(1) - 1).clamp(min=0))
        for block, layer in zip(model.blocks, stats, strict=True):
            x = block(x, valid)
            expected = activation_stats(x, valid)
            assert {k: v.item() for k, v in layer.items()} == pytest.approx(
                {k: v.item() for k, v in expected.items()})
    record = attention_record(model, Batch(idx, idx, valid), torch.device("cpu"))
    for key in ("top1", "top2", "top3", "median", "kurtosis"):
        assert record[f"hidden_{key}"] == pytest.approx([s[key].item() for s in stats])
    assert all(a >= b >= c > m for a, b, c, m in zip(*(record[f"hidden_{k}"] for k in
                                                       ("top1", "top2", "top3", "median"))))


@pytest.mark.parametrize("normaliser, b", [("softmax1", (0.0, 0.0)), ("sink", (2.0, -1.0)),
                                           ("sigmoid", None)])
def test_the_sink_weight_of_a_hand_set_sink_logit(normaliser, b):
    """scaling=uniform makes every logit 0, so with the extra logit b of softmax1 (0) or sink
    (set by hand to 2 and -1 in the two heads) row i puts e^b / (e^b + i + 1) outside its i + 1
    keys and 1 / (e^b + i + 1) on key 0. Sigmoid: sigmoid(0 - ln(i + 1)) = 1 / (i + 2) on each
    key, so key 0's share of row i is 1 / (i + 1), uniform attention's (first mass H_T / T,
    entropy_norm 1), and no sink weight, as its rows need not sum to 1."""
    T = 10
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=T, n_layer=2, n_head=2, d_model=8,
                          scaling=ScalingConfig("uniform", normaliser=normaliser)))
    if normaliser == "sink":
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sink.copy_(torch.tensor(b))
    idx = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    record = attention_record(model, Batch(idx, idx, None), torch.device("cpu"))
    heads = record["attn_heads"]
    if b is None:
        assert "sink_weight" not in heads and "attn_sink_weight" not in record
        for layer in range(2):
            assert heads["first_mass"][layer] == pytest.approx([harmonic(T) / T] * 2)
            assert heads["entropy_norm"][layer] == pytest.approx([1.0] * 2, rel=1e-6)
        return
    e = [np.exp(v) for v in b]
    outside = [sum(eb / (eb + i + 1) for i in range(T)) / T for eb in e]
    first = [sum(1 / (eb + i + 1) for i in range(T)) / T for eb in e]
    for layer in range(2):
        assert heads["sink_weight"][layer] == pytest.approx(outside, rel=1e-5)
        assert heads["first_mass"][layer] == pytest.approx(first, rel=1e-5)
    assert record["attn_sink_weight"] == pytest.approx([sum(outside) / 2] * 2, rel=1e-5)
