"""The arithmetic of docs/scaling.md, asserted to the digits the doc states."""

import functools
import math

import pytest
import torch

from scripts import scaling_stats as ss

ROW3 = (3.0, 1.0, -1.0)
ROW5 = (12.0, 8.0, 4.0, 0.0, -4.0)
ROW4 = (8.0, 0.0, -8.0, 4.0)


def rounded(xs, digits):
    return tuple(round(x, digits) for x in xs)


# The Monte Carlo measurements (seconds each, seeded, so the same numbers every call) are computed
# once for the tests below and for main(), which prints them again in its report.
measured_init_score_std = functools.cache(ss.measured_init_score_std)
aligned_score_mean = functools.cache(ss.aligned_score_mean)


@pytest.fixture(scope="module")
def var_rows():
    return ss.variance_table()  # 20,000 trials per size, d_k 4..1024, as docs/scaling.md


def test_variance_of_dot_product_is_within_5_percent_of_d_k(var_rows):
    assert [r["d_k"] for r in var_rows] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for r in var_rows:
        assert r["rel_err"] < 0.05, r
        assert math.isclose(r["std"], math.sqrt(r["var"]))
        # scaled std is back at 1 whatever the width (within the same 5% on the variance)
        assert abs(r["std_scaled"] - 1.0) < 0.025, r


def test_variance_is_seeded_and_scales_with_sigma_to_the_fourth():
    assert ss.dot_variance(64, 2000, seed=3) == ss.dot_variance(64, 2000, seed=3)
    assert ss.dot_variance(64, 2000, seed=3) != ss.dot_variance(64, 2000, seed=4)
    # Var(q.k) = d_k * sigma^4: with sigma = 2 the right divisor would be 4 * sqrt(d_k)
    assert abs(ss.dot_variance(64, 20_000, sigma=2.0) / (64 * 16) - 1) < 0.05


def test_example_vectors_give_scores_3_1_minus1():
    assert ss.example_scores() == [3.0, 1.0, -1.0]


def test_worked_softmax_rows():
    assert rounded(ss.softmax_weights(ROW3, 1.0), 3) == (0.867, 0.117, 0.016)
    assert rounded(ss.softmax_weights(ROW3, math.sqrt(3)), 3) == (0.707, 0.223, 0.070)
    unscaled = ss.softmax_weights(ROW5, 1.0)
    assert round(unscaled[0], 2) == 0.98 and round(unscaled[1], 3) == 0.018
    assert round(unscaled[2], 4) == 0.0003
    assert f"{unscaled[3]:.0e}" == "6e-06" and f"{unscaled[4]:.0e}" == "1e-07"
    assert rounded(ss.softmax_weights(ROW5, 8.0), 2) == (0.43, 0.26, 0.16, 0.10, 0.06)


def test_divisor_choices_for_the_d_k_64_row():
    unscaled = ss.softmax_weights(ROW4, 1.0)
    assert round(unscaled[0], 2) == 0.98 and round(unscaled[3], 3) == 0.018
    assert round(unscaled[1], 4) == 0.0003 and f"{unscaled[2]:.0e}" == "1e-07"
    assert rounded(ss.softmax_weights(ROW4, 8.0), 2) == (0.47, 0.17, 0.06, 0.29)
    by_dk = ss.softmax_weights(ROW4, 64.0)
    assert rounded(by_dk, 2) == (0.28, 0.25, 0.22, 0.26)
    assert max(by_dk) - min(by_dk) < 0.07  # nearly flat


def test_jacobian_maxima_and_entries():
    j1, j8 = ss.jacobian_max(ROW4, 1.0), ss.jacobian_max(ROW4, 8.0)
    assert round(j1, 3) == 0.018
    assert round(j8, 4) == 0.2493
    assert round(j8 / j1) == 14
    # J is diag(p) - p p^T: rows sum to zero (softmax is shift invariant)
    jac = ss.softmax_jacobian(ROW5, 8.0)
    assert jac.sum(dim=1).abs().max() < 1e-12
    assert round(ss.jacobian_entry(ROW5, 1.0, 0, 0), 4) == 0.0180
    # 0.43 x 0.57 = 0.25 from the rounded weights; exactly it is 0.2449
    assert round(ss.jacobian_entry(ROW5, 8.0, 0, 0), 3) == 0.245
    assert round(ss.jacobian_entry(ROW5, 1.0, 0, 2), 4) == -0.0003
    assert round(ss.jacobian_entry(ROW5, 8.0, 0, 2), 3) == -0.068


def test_fixed_divisor_8_is_right_only_at_64():
    rows = {g["d_k"]: g for g in ss.gap_table()}
    assert rows[256]["gap_fixed"] == 2.0 and round(rows[256]["ratio_fixed"], 2) == 7.39
    assert rows[16]["gap_fixed"] == 0.5 and round(rows[16]["ratio_fixed"], 2) == 1.65
    assert rows[64]["gap_fixed"] == 1.0
    for g in rows.values():
        assert g["gap_sqrt"] == 1.0 and round(g["ratio_sqrt"], 2) == 2.72


def test_jacobian_of_the_three_score_row():
    unscaled = ss.softmax_jacobian(ROW3, 1.0)
    assert rounded(unscaled[0].tolist(), 4) == (0.1154, -0.1017, -0.0138)
    assert rounded(unscaled.diagonal().tolist(), 4) == (0.1154, 0.1035, 0.0156)
    scaled = ss.softmax_jacobian(ROW3, math.sqrt(3))
    assert rounded(scaled[0].tolist(), 4) == (0.2072, -0.1575, -0.0496)
    assert round(ss.jacobian_max(ROW3, math.sqrt(3)) / ss.jacobian_max(ROW3, 1.0), 2) == 1.79


def test_softmax_temperature_raises_weight_ratios_to_the_power_c():
    base = ss.weight_ratio(ROW3, 1.0, 0, 1)
    assert math.isclose(base, math.e**2)
    for c in (0.5, 1 / math.sqrt(3), 2.0, 3.0):
        for i, j in ((0, 1), (0, 2), (1, 2)):
            assert math.isclose(ss.weight_ratio(ROW3, c, i, j),
                                ss.weight_ratio(ROW3, 1.0, i, j) ** c, rel_tol=1e-9)
    assert round(ss.weight_ratio(ROW3, 1 / math.sqrt(3), 0, 1), 3) == 3.173
    # a lower temperature (larger c) sharpens: entropy falls as c grows
    entropies = [ss.entropy(ss.softmax_weights(ROW3, 1 / c)) for c in (0.25, 0.5, 1, 2, 4)]
    assert entropies == sorted(entropies, reverse=True)
    assert round(ss.entropy(ss.softmax_weights(ROW3, 1.0)), 3) == 0.441
    # the entropy column of docs/scaling.md's worked-rows table
    table = ((ROW3, math.sqrt(3), 0.766), (ROW5, 1.0, 0.093), (ROW5, 8.0, 1.394),
             (ROW4, 1.0, 0.093), (ROW4, 8.0, 1.193), (ROW4, 64.0, 1.382))
    for scores, divisor, expected in table:
        assert round(ss.entropy(ss.softmax_weights(scores, divisor)), 3) == expected, scores


def test_gpt2_initialisation_makes_step_0_logits_small():
    rows = {(r["d_model"], r["d_head"]): r for r in ss.init_table()}
    assert math.isclose(rows[(128, 32)]["var_q"], 0.0512)
    assert round(rows[(128, 32)]["std_none"], 3) == 0.290
    assert math.isclose(rows[(128, 32)]["std_sqrt_dk"], 0.0512)
    assert round(rows[(256, 256)]["std_none"], 3) == 1.638
    assert round(rows[(768, 64)]["std_none"], 3) == 2.458
    for (c, d), r in rows.items():
        # Var(q.k) = d_head var(q_i) var(k_i), measured with GPT-2-style weights
        assert abs(measured_init_score_std(c, d) / r["std_none"] - 1) < 0.03, (c, d)
        assert r["std_dk"] < r["std_sqrt_dk"] < 1


def test_dividing_by_sqrt_d_model_flattens_by_sqrt_n_head():
    assert ss.d_model_divisor_std(4) == 0.5 and round(math.exp(0.5), 2) == 1.65
    assert round(ss.d_model_divisor_std(12), 3) == 0.289
    assert round(math.exp(ss.d_model_divisor_std(12)), 2) == 1.33
    # the same thing measured: unit-variance q.k at d_head 64 over sqrt(12 * 64)
    assert abs(math.sqrt(ss.dot_variance(64)) / math.sqrt(12 * 64) - 0.289) < 0.005


def test_aligned_q_and_k_grow_like_d_k_which_mup_divides_away():
    for d_k in (16, 64, 256, 1024):
        mean = aligned_score_mean(d_k, 0.5)
        assert abs(mean / d_k - 0.5) < 0.01, d_k  # / d_k: constant
    assert round(aligned_score_mean(1024, 0.5) / math.sqrt(1024), 1) == 16.0  # / sqrt grows
    assert ss.mup_divisor(64) == 8.0 and ss.mup_divisor(256) == 32.0


def test_masked_rows_fp16_qk_norm_and_softcap():
    assert all(math.isnan(w) for w in ss.fully_masked_row(float("-inf")))
    assert ss.fully_masked_row(torch.finfo(torch.float32).min) == [0.25] * 4
    assert ss.sdpa_fully_masked_row() == [0.0] * 4
    assert round(ss.uniform_causal_entropy(64), 3) == 3.206
    assert ss.uniform_causal_entropy(1) == 0.0
    unscaled, prescaled = ss.fp16_scores(40.0, 64)
    assert math.isinf(unscaled) and prescaled == 12800.0
    bound = ss.qk_norm_logit_bound(32)
    assert round(bound, 3) == 5.657
    measured = ss.measured_qk_norm_max_logit(32)
    assert measured <= bound + 1e-4 and measured > bound - 1e-3  # reached at k = q
    assert round(ss.softcap(10.0), 2) == 9.87 and round(ss.softcap(100.0), 2) == 48.20
    assert abs(ss.softcap(1e4)) <= 50.0


def test_main_prints_the_table_and_writes_figures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ss, "measured_init_score_std", measured_init_score_std)
    monkeypatch.setattr(ss, "aligned_score_mean", aligned_score_mean)
    out = tmp_path / "figs"
    assert ss.main(["--out", str(out), "--trials", "500"]) == 0
    text = capsys.readouterr().out
    assert "| 1024 |" in text
    assert "(0.867, 0.117, 0.016)" in text and "(0.707, 0.223, 0.070)" in text
    assert "13.9x larger" in text
    assert "with respect to the raw q.k, 0.031 vs 0.018: 1.73x" in text
    assert "| 256 | 2.00 | 7.39 | 1.00 | 2.72 |" in text
    assert "| 128 | 32 | 0.0512 | 0.290 |" in text
    assert "(q @ k^T) / 8 = inf, (q / 8) @ k^T = 12800" in text
    for name in ("variance_vs_dk.png", "worked_weights.png", "gap_ratio_vs_width.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
