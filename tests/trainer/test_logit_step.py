"""scripts/logit_step.py, in process: its scores are the attention's own, its saturated share
leaves out the one-key first row, and on a fresh recall model one Adam step moves `none`'s
scaled scores sqrt(d_head) times as far as `sqrt_dk`'s (the same seed, so the same init and
nearly the same raw step: Adam's first update is close to lr * sign(gradient))."""

import csv
import math

import pytest
import torch

from model.attention import MultiHeadAttention
from model.config import GPTConfig, ScalingConfig
from model.diagnostics import explain
from scripts.logit_step import FIELDS, measure, read_csv, saturated_share, scaled_scores, summary

RECALL = ["data=recall", "model=recall", "trainer.max_steps=10", "trainer.device=cpu",
          "trainer.precision=fp32", "trainer.threads=1", "trainer.eval_iters=1"]


@pytest.mark.parametrize("scaling", ["none", "sqrt_dk", "dk"])
def test_scaled_scores_give_the_weights_of_the_explicit_path(scaling):
    torch.manual_seed(0)
    attn = MultiHeadAttention(GPTConfig(vocab_size=8, block_size=5, n_layer=1, n_head=2,
                                        d_model=32, scaling=ScalingConfig(name=scaling)))
    x = torch.randn(2, 5, 32)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    weights = scaled_scores(attn, x).masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, explain(attn, x).weights, rtol=1e-5, atol=1e-6)


def test_saturated_share_counts_rows_with_two_or_more_keys_only():
    scores = torch.zeros(1, 1, 3, 3)
    scores[0, 0, 1] = torch.tensor([10.0, 0.0, 0.0])   # 0.99995 on key 0: saturated
    scores[0, 0, 2] = torch.tensor([10.0, 10.0, 0.0])  # 0.5 on two keys: not
    # row 0 sees one key (weight 1) and is left out: 1 of the 2 rows that remain
    assert saturated_share(scores) == 0.5


def test_one_fresh_step_moves_none_about_sqrt_dhead_times_as_far_as_sqrt_dk(single_thread):
    rows = {scaling: measure(RECALL, scaling, seed=1, at=[0]) for scaling in ("none", "sqrt_dk")}
    d_head = 32   # model=recall: d_model 64, 2 heads
    for none, sqrt_dk in zip(rows["none"], rows["sqrt_dk"]):
        assert (none["step"], none["layer"]) == (sqrt_dk["step"], sqrt_dk["layer"])
        ratio = none["mean_abs_change"] / sqrt_dk["mean_abs_change"]
        assert ratio == pytest.approx(math.sqrt(d_head), rel=0.1)
        # the same init: block 0 sees the same input, so its scaled scores differ by exactly
        # sqrt(d_head); block 1's input already went through block 0's different attention
        size = none["mean_abs_logit"] / sqrt_dk["mean_abs_logit"]
        assert size == pytest.approx(math.sqrt(d_head), rel=1e-5 if none["layer"] == 0 else 1e-2)
    assert [r["layer"] for r in rows["none"]] == [0, 1]


def test_summary_averages_layers_then_seeds_and_tests_the_log_ratio_by_seed(tmp_path):
    rows = []
    for seed, factor in ((1, 8.0), (2, 10.0), (3, 12.0)):
        for layer, base in ((0, 0.01), (1, 0.03)):   # sqrt_dk's layer mean 0.02 in every seed
            rows.append({"scaling": "sqrt_dk", "seed": seed, "step": 100, "layer": layer,
                         "mean_abs_logit": 1.0, "mean_abs_change": base,
                         "saturated_rows": 0.1 * layer})
            rows.append({"scaling": "none", "seed": seed, "step": 100, "layer": layer,
                         "mean_abs_logit": 50.0, "mean_abs_change": base * factor,
                         "saturated_rows": 0.5 + 0.2 * layer})
    path = tmp_path / "logit_step.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    lines = summary(read_csv(path), "sqrt_dk")
    assert lines[0] == ("step 100, sqrt_dk: |s q.k| 1 ± 0 (n=3), one step moves it 0.02 ± 0 "
                        "(n=3), saturated rows 0.05 ± 0 (n=3)")
    assert lines[1] == ("step 100, none: |s q.k| 50 ± 0 (n=3), one step moves it 0.2 ± 0.099 "
                        "(n=3), saturated rows 0.6 ± 0 (n=3)")
    # ratios 8, 10, 12: mean 10, half-width t(0.975, 2) * 2 / sqrt(3) = 4.97; log ratios
    # ln 8, ln 10, ln 12 against 0: t = 19.5 on 2 degrees of freedom, p = 0.00261
    assert lines[2].startswith("step 100: none's step over sqrt_dk's, per seed: 10 ± 5 (n=3) "
                               "(paired t of the log changes p 0.00261")
    assert lines[2].endswith("Holm p 0.00261 over 1)")
