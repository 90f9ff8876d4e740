"""scripts/bench_qkv.py compares like with like: its fused q/k/v layer, given the three matrices
stacked, computes what MultiHeadAttention computes."""

import torch

from model.attention import MultiHeadAttention
from model.config import GPTConfig
from scripts.bench_qkv import FusedQKV


def test_the_fused_layer_equals_the_split_one_given_the_same_weights():
    config = GPTConfig(vocab_size=11, n_head=2, d_model=8, block_size=5, bias=True)
    torch.manual_seed(0)
    split, fused = MultiHeadAttention(config), FusedQKV(config)
    projections = (split.q_proj, split.k_proj, split.v_proj)
    with torch.no_grad():
        fused.qkv.weight.copy_(torch.cat([p.weight for p in projections]))
        fused.qkv.bias.copy_(torch.cat([p.bias for p in projections]))
        fused.proj.load_state_dict(split.proj.state_dict())
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(fused(x), split(x), atol=1e-6)
    assert not hasattr(fused, "q_proj") and fused.qkv.weight.shape == (24, 8)
