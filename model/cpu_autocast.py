"""A speed route for CPU autocast: MultiHeadAttention with its SDPA step run in float32.

torch's CPU SDPA kernels are slow in bf16, the backward most of all: the default step under bf16
autocast on an AVX512-BF16 CPU runs 1.43x faster with attention in float32 (docs/benchmarks.md).
model/attention.py never imports this subclass; trainer/build.py builds it for
model.attn_impl=auto under CPU autocast; tests/test_attention.py holds it equal to the explicit
path."""

from typing import Optional

import torch
from torch import Tensor

from model.attention import Mask, MultiHeadAttention


class CPUAutocastAttention(MultiHeadAttention):
    """MultiHeadAttention; under CPU autocast its SDPA call computes in float32."""

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, mask: Optional[Mask]) -> Tensor:
        """y (B, H, T, D) by float32 SDPA, returned in the autocast dtype as other ops return."""
        if not (q.device.type == "cpu" and torch.is_autocast_enabled("cpu")):
            return super().sdpa(q, k, v, causal, mask)
        with torch.autocast("cpu", enabled=False):
            y = super().sdpa(q.float(), k.float(), v.float(), causal, mask)
        return y.to(torch.get_autocast_dtype("cpu"))
