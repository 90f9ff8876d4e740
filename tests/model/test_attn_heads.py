"""trainer/diagnose.py's attention record: `attn_heads` keeps every head of every layer, and
the per-layer means are those of the heads."""

import math

import pytest
import torch

from data.batching import Batch
from model.config import GPTConfig, ScalingConfig
from model.gpt import GPT
from trainer.diagnose import attention_record

pytestmark = pytest.mark.usefixtures("single_thread")

T, H, D = 6, 3, 4
KEYS = ("entropy", "entropy_norm", "max_logit", "saturated", "raw_var", "raw_max_logit",
        "q_norm", "k_norm", "first_mass", "sink_score", "sink_rate", "sink_weight")


def hand_made_model(scaling="learned"):
    """Two layers of three heads; the q rows of head 0 in layer 0 and of head 2 in layer 1 are
    zero, so those two heads attend uniformly with q.k = 0 (their statistics by hand below),
    and the others have large random q so that they do not."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=T, n_layer=2, n_head=H, d_model=12,
                          d_head=D, scaling=ScalingConfig(scaling)))
    with torch.no_grad():
        for layer, head in ((0, 0), (1, 2)):
            attn = model.blocks[layer].attn
            attn.q_proj.weight.normal_(0.0, 2.0)
            attn.q_proj.weight[head * D:(head + 1) * D].zero_()  # q rows of this head
            attn.q_proj.bias[head * D:(head + 1) * D].zero_()
            if scaling == "learned":
                attn.log_scale.copy_(torch.tensor([-1.0, 0.0, 0.5]) + layer)
    return model


def test_attn_heads_per_layer_per_head_by_hand():
    model = hand_made_model()
    idx = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    record = attention_record(model, Batch(idx, idx, None), torch.device("cpu"))
    heads = record["attn_heads"]
    assert set(heads) == set(KEYS) | {"scale"}
    for key in KEYS:
        assert [len(layer) for layer in heads[key]] == [H, H], key
    uniform = sum(math.log(t) for t in range(1, T + 1)) / T  # causal rows see 1..T keys
    for layer, head in ((0, 0), (1, 2)):
        assert heads["entropy"][layer][head] == pytest.approx(uniform, rel=1e-6)
        assert heads["saturated"][layer][head] == pytest.approx(1 / T)  # the one-key row
        assert heads["entropy_norm"][layer][head] == pytest.approx(1.0, rel=1e-6)
        assert heads["q_norm"][layer][head] == 0.0   # its q rows are zero
        assert heads["max_logit"][layer][head] == 0.0
        assert heads["raw_var"][layer][head] == 0.0
        assert heads["raw_max_logit"][layer][head] == 0.0
        others = [h for h in range(H) if h != head]
        assert all(heads["entropy"][layer][h] < uniform - 0.05 for h in others)
        assert all(heads["raw_max_logit"][layer][h] > 1.0 for h in others)
        assert all(heads["entropy_norm"][layer][h] < 0.95 for h in others)
        assert all(heads["q_norm"][layer][h] > 1.0 for h in others)
    assert heads["scale"] == [pytest.approx([math.exp(v) for v in (-1.0, 0.0, 0.5)]),
                              pytest.approx([math.exp(v) for v in (0.0, 1.0, 1.5)])]
    # the per-layer means are those of the heads
    for layer in range(2):
        assert record["attn_entropy"][layer] == pytest.approx(
            sum(heads["entropy"][layer]) / H, rel=1e-6)
        assert record["attn_max_logit"][layer] == max(heads["max_logit"][layer])
        assert record["attn_raw_max_logit"][layer] == max(heads["raw_max_logit"][layer])


def test_scale_only_for_learned():
    model = hand_made_model("sqrt_dk")
    idx = torch.zeros(1, T, dtype=torch.long)
    assert set(attention_record(model, Batch(idx, idx, None), torch.device("cpu"))["attn_heads"]) \
        == set(KEYS)
