"""trainer/evaluate.py's full_split_loss: every token of a split scored once, a per-token mean,
a fixed cap; and summary.json's whole-split fields from a real run."""

import json
import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.batching import BatchShape
from data.config import DataConfig
from data.prepare import prepare
from model.config import GPTConfig
from model.gpt import GPT
from trainer import checkpoint_read
from trainer.evaluate import full_split_loss, window_starts

BLOCK = 8
CPU = torch.device("cpu")


@pytest.fixture
def model(single_thread) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=BLOCK, n_layer=1, n_head=2, d_model=16,
                         dropout=0.3))


def split(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 11, size=n).astype(np.uint16)


def by_hand(model: GPT, tokens: np.ndarray) -> tuple[float, int]:
    """Each target t scored alone, with the context of the window it sits in."""
    model.eval()
    losses = []
    with torch.no_grad():
        for t in range(1, len(tokens)):
            start = (t - 1) // BLOCK * BLOCK
            idx = torch.tensor(tokens[start:t], dtype=torch.long)[None]  # (1, t - start)
            logits, _ = model(idx)
            losses.append(F.cross_entropy(logits[0, -1:], torch.tensor([int(tokens[t])])).item())
    return sum(losses) / len(losses), len(losses)


def score(model, tokens, batch_size=3, rank=0, world=1, max_tokens=None):
    """full_split_loss with `batch_size` windows per process at a time."""
    return full_split_loss(model, tokens, BatchShape(batch_size * world, BLOCK, rank, world),
                           nullcontext(), max_tokens)


def test_every_target_once_with_its_window_context(model):
    tokens = split(8 * 5 + 4)   # five full windows and a short one of 3 targets
    expected, n_targets = by_hand(model, tokens)
    result = score(model, tokens)
    assert result.targets == n_targets == len(tokens) - 1 == result.split_targets
    assert result.loss == pytest.approx(expected, abs=1e-5)


def test_a_mean_per_token_not_per_window(model):
    tokens = split(8 * 2 + 2)   # windows of 8, 8 and 1 targets
    model.eval()
    window_means = []
    with torch.no_grad():
        for s in (0, 8, 16):
            rows = torch.tensor(tokens[s:s + 9], dtype=torch.long)
            logits, _ = model(rows[None, :-1])
            window_means.append(F.cross_entropy(logits[0], rows[1:]).item())
    per_window = sum(window_means) / 3
    result = score(model, tokens)
    assert result.loss == pytest.approx(by_hand(model, tokens)[0], abs=1e-5)
    assert abs(result.loss - per_window) > 1e-3


def test_batch_size_does_not_change_the_number(model):
    tokens = split(100, seed=1)
    losses = {b: score(model, tokens, batch_size=b).loss for b in (1, 4, 64)}
    assert losses[4] == pytest.approx(losses[1], abs=1e-6)
    assert losses[64] == pytest.approx(losses[1], abs=1e-6)


def test_mode_restored_and_no_random_numbers_drawn(model):
    model.train()
    state = torch.get_rng_state()
    a = score(model, split(50)).loss
    assert model.training
    assert torch.equal(torch.get_rng_state(), state)
    assert score(model, split(50)).loss == a   # dropout (p=0.3) was off both times


def test_cap_scores_an_even_deterministic_subset(model):
    n = 8 * 100 + 1
    starts = window_starts(n, BLOCK, max_tokens=8 * 10)
    assert len(starts) == 10 and starts[0] == 0 and starts[-1] == 8 * 99
    assert np.all(np.diff(starts) >= 8 * 10)   # spread over the whole split, not its head
    assert np.array_equal(starts, window_starts(n, BLOCK, max_tokens=8 * 10))
    result = score(model, split(n), max_tokens=8 * 10)
    assert result.targets == 80 and result.split_targets == 800
    assert len(window_starts(n, BLOCK, max_tokens=None)) == 100


def test_a_split_without_targets_is_refused(model):
    with pytest.raises(ValueError, match="no target"):
        score(model, split(1))


def test_loss_is_finite_and_near_uniform_for_an_untrained_model(model):
    # An untrained model predicts close to uniformly over the 11 ids.
    result = score(model, split(200, seed=3))
    assert math.isfinite(result.loss) and abs(result.loss - math.log(11)) < 0.5


def test_a_run_records_the_whole_split_score_of_its_final_weights(tiny_cfg,
                                                                   tiny_run):
    """summary.json's *_full fields are full_split_loss of the final weights (checkpoints/
    last.pt), over every token of the validation split."""
    cfg, (run_dir, summary) = tiny_cfg, tiny_run
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["final_val_loss_full"] == summary["final_val_loss_full"]
    ckpt = checkpoint_read.read(run_dir / "checkpoints" / "last.pt")
    model = GPT(checkpoint_read.model_config(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    val = prepare(DataConfig(**cfg.data)).val
    expected = full_split_loss(model, val, BatchShape(5, 16), nullcontext())
    assert summary["full_eval_targets"] == summary["full_eval_split_targets"] == len(val) - 1
    assert summary["final_val_loss_full"] == pytest.approx(expected.loss, abs=1e-5)
    bpb = expected.loss / math.log(2) / json.loads(
        (run_dir / "run.json").read_text())["data"]["bytes_per_token"]["val"]
    assert summary["final_val_bpb_full"] == pytest.approx(bpb, abs=1e-5)
