"""Tests for trainer/long_eval.py (trainer.eval_lengths): the buckets, the per-length loss and
the sliding-window reference against forwards by hand, the refusals before training, the lookup
evaluation's weight on the right key, and a run's records, lines and summary."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import derive, records

import train
from data.config import DataConfig
from data.recall import lookup_set
from model.config import GPTConfig, ScalingConfig
from model.diagnostics import explain
from model.errors import ConfigError
from model.gpt import GPT, eval_mode
from trainer import long_eval

pytestmark = pytest.mark.usefixtures("single_thread")
T0 = 8
KV = DataConfig(source="recall", name="recall", document="sequence", task="kv", num_keys=4,
                num_values=3, seq_len=9, min_pairs=2, val_sequences=7)


def small_model(pos="nope", length="fixed", vocab=13, n_layer=2, block_size=T0):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_head=2,
                         d_model=16, pos=pos, scaling=ScalingConfig(length=length))).eval()


def test_buckets_are_t0_then_doubling_up_to_the_length():
    assert long_eval.buckets(1024, 64) == [(1, 64), (65, 128), (129, 256), (257, 512),
                                           (513, 1024)]
    assert long_eval.buckets(100, 64) == [(1, 64), (65, 100)]
    assert long_eval.buckets(32, 64) == [(1, 32)]


def ce(model, idx: list[int], target: int) -> float:
    """The loss of `target` after the tokens idx, by one plain forward."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([idx]))
    return F.cross_entropy(logits[0, -1:], torch.tensor([target])).item()


@pytest.mark.parametrize("pos, length", [("nope", "fixed"), ("rope", "log_n")])
def test_lengths_and_the_sliding_reference_equal_forwards_by_hand(pos, length):
    model = small_model(pos, length)
    tokens = np.random.default_rng(0).integers(0, 13, size=200).astype(np.uint16)
    with torch.no_grad():
        got = long_eval.text_lengths(model, tokens, [4, 24], torch.autocast("cpu",
                                                                             enabled=False), 48)
    # windows of the longest (24): an even spread of 48 // 24 = 2 full windows
    starts = [s for s in long_eval.window_starts(200, 24, 48) if s + 25 <= 200]
    by_pos, ref_pos = np.zeros(24), np.zeros(24)
    for s in starts:
        w = tokens[s:s + 25].astype(int).tolist()
        for o in range(24):
            by_pos[o] += ce(model, w[:o + 1], w[o + 1])
            ref_pos[o] += ce(model, w[max(0, o - T0 + 1):o + 1], w[o + 1])   # last T0 only
    n = len(starts)
    long = got[1]
    assert long["targets"] == 24 * n
    assert long["loss"] == pytest.approx(by_pos.sum() / (24 * n), abs=1e-5)
    assert long["sliding_loss"] == pytest.approx(ref_pos.sum() / (24 * n), abs=1e-5)
    assert list(long["buckets"]) == ["1-8", "9-16", "17-24"]
    assert long["buckets"]["17-24"]["loss"] == pytest.approx(by_pos[16:].sum() / (8 * n),
                                                             abs=1e-5)
    assert long["buckets"]["17-24"]["sliding_loss"] == pytest.approx(
        ref_pos[16:].sum() / (8 * n), abs=1e-5)
    assert long["buckets"]["1-8"]["loss"] == long["buckets"]["1-8"]["sliding_loss"]
    assert long["loss"] != pytest.approx(long["sliding_loss"], abs=1e-6)   # context matters
    # length 4: the same tokens cut into pieces of 4, each seeing only its piece
    short = got[0]
    assert short["targets"] == 24 * n and short["loss"] == short["sliding_loss"]
    by_hand = sum(ce(model, w[p - o:p + 1], w[p + 1])
                  for s in starts for w in [tokens[s:s + 25].astype(int).tolist()]
                  for p in range(24) for o in [p % 4])
    assert short["loss"] == pytest.approx(by_hand / (24 * n), abs=1e-5)


@pytest.mark.parametrize("lengths", [[4], [8], [4, 8]])
def test_lengths_within_block_size_are_their_own_reference(lengths):
    model = small_model("learned")
    tokens = np.random.default_rng(1).integers(0, 13, size=100).astype(np.uint16)
    with torch.no_grad():
        got = long_eval.text_lengths(model, tokens, lengths, torch.autocast("cpu",
                                                                            enabled=False), 64)
    for length, record in zip(lengths, got):
        assert record["loss"] == record["sliding_loss"] and record["targets"] > 0
        assert list(record["buckets"]) == [f"1-{length}"]


def test_fused_attention_restores_each_layers_path():
    model = small_model()
    for block in model.blocks:
        block.attn.attn_impl = "explicit"
    with long_eval.fused_attention(model):
        assert {b.attn.attn_impl for b in model.blocks} == {"sdpa"}
    assert {b.attn.attn_impl for b in model.blocks} == {"explicit"}


def test_a_learned_model_past_block_size_is_refused_with_the_fix():
    learned = GPTConfig(vocab_size=5, block_size=64)
    with pytest.raises(ConfigError, match=r"model.pos=learned .* \(model.pos=rope or nope\)"):
        long_eval.check_lengths(learned, DataConfig(), [64, 1024])
    long_eval.check_lengths(learned, DataConfig(), [32, 64])   # within block_size: fine
    long_eval.check_lengths(GPTConfig(vocab_size=5, pos="nope"), DataConfig(), [1024])
    with pytest.raises(ConfigError, match="pairs for kv"):
        long_eval.check_lengths(learned, DataConfig(), [0])
    copy = DataConfig(source="recall", name="recall", document="sequence")
    with pytest.raises(ConfigError, match="data.task=copy"):
        long_eval.check_lengths(learned, copy, [64])
    with pytest.raises(ConfigError, match="sequences of 65 tokens"):   # 64 pairs + the query
        long_eval.check_lengths(learned, KV, [64])


def test_a_length_past_the_target_cap_or_the_split_is_refused_and_none_scores_more():
    """A window of the longest length scores each of its tokens: a length past the cap (or
    past the validation split) is refused; under it, no length scores more than the cap."""
    nope = GPTConfig(vocab_size=5, pos="nope")
    with pytest.raises(ConfigError, match="32,768 targets, more than the 16,384"):
        long_eval.check_lengths(nope, DataConfig(), [64, 32_768])
    with pytest.raises(ConfigError, match="more than the 40 .* within 40"):
        long_eval.check_lengths(nope, DataConfig(), [48], long_eval.target_cap(40))
    long_eval.check_lengths(nope, DataConfig(), [16_384])
    long_eval.check_lengths(nope, KV, [64, 32_768])   # kv: pairs, each length its own rows
    with pytest.raises(ConfigError,
                       match=r"has 200 tokens.*\(201\)\. Keep every length within 199"):
        long_eval.check_lengths(nope, DataConfig(), [200], val_tokens=200)
    long_eval.check_lengths(nope, DataConfig(), [199], val_tokens=200)
    model = small_model()
    tokens = np.random.default_rng(2).integers(0, 13, size=200).astype(np.uint16)
    for lengths, cap in (([24], 30), ([4, 24], 48), ([16], 199), ([199], 199)):
        with torch.no_grad():
            got = long_eval.text_lengths(model, tokens, lengths, torch.autocast(
                "cpu", enabled=False), cap)
        assert all(0 < r["targets"] <= cap for r in got), (lengths, cap)


def test_lookup_weight_on_the_right_key_is_the_explicit_paths_last_row():
    vocab = 4 * 3 + 4 + 3 + 1
    model = small_model(vocab=vocab, n_layer=2, block_size=9)
    with eval_mode(model), long_eval.fused_attention(model), torch.no_grad():
        got = long_eval.lookup(model, KV, 6, torch.autocast("cpu", enabled=False))
    inputs, targets, right = (torch.from_numpy(a) for a in lookup_set(KV, 6))
    with torch.no_grad():
        logits, _ = model(inputs)
        x = model.drop(model.wte(inputs))
        weight = []
        for block in model.blocks:
            w = explain(block.attn, block.ln_1(x)).weights[:, :, -1]  # (B, H, T): the query row
            weight.append(w[torch.arange(7), :, right].mean(0))
            x = block(x)
    answer = targets[:, -1]
    assert got["sequences"] == 7
    assert got["accuracy"] == (logits[:, -1].argmax(-1) == answer).float().mean().item()
    assert got["loss"] == pytest.approx(F.cross_entropy(logits[:, -1], answer).item(),
                                        abs=1e-5)
    assert np.allclose(got["right_key_weight_heads"], torch.stack(weight).tolist(), atol=1e-6)
    assert got["right_key_weight"] == max(map(max, got["right_key_weight_heads"]))


def test_a_run_with_eval_lengths_logs_prints_and_summarises_each_length(tiny_cfg, tmp_path,
                                                                       capsys):
    cfg = derive(tiny_cfg, ["model.pos=nope", "scaling.length=log_n", "trainer.max_steps=2",
                            "trainer.eval_lengths=[16,48]", "trainer.sample_prompts=[]"])
    summary = train.train(cfg, tmp_path / "run")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("length ")] == [
        "length 16", "length 48"]
    logged = records(tmp_path / "run", "length_eval")
    assert [r["length"] for r in logged] == [16, 48] and all(r["step"] == 2 for r in logged)
    written = json.loads((tmp_path / "run" / "summary.json").read_text())["length_eval"]
    assert written == summary["length_eval"]
    assert list(written["48"]["buckets"]) == ["1-16", "17-32", "33-48"]
    assert written["48"]["targets"] == written["16"]["targets"] > 0


def test_a_learned_run_past_block_size_stops_before_training(tiny_cfg, tmp_path):
    cfg = derive(tiny_cfg, ["trainer.eval_lengths=[16,64]"])
    with pytest.raises(ConfigError, match="model.block_size=16"):
        train.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("lengths, more", [
    ([16, 4096], []),                                   # the split has ~2,300 tokens
    ([48], ["trainer.full_eval_tokens=32"])])           # the target cap is 32
def test_a_length_the_split_or_the_cap_cannot_hold_stops_before_training(tiny_cfg, tmp_path,
                                                                        lengths, more):
    cfg = derive(tiny_cfg, ["model.pos=nope", f"trainer.eval_lengths={lengths}", *more])
    with pytest.raises(ConfigError, match=re.escape(f"trainer.eval_lengths={lengths}: ")):
        train.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()   # nothing written


def test_the_default_run_has_no_length_evaluation(tiny_run):
    run_dir, summary = tiny_run
    assert "length_eval" not in summary and records(run_dir, "length_eval") == []
