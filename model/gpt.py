"""A decoder-only transformer (GPT-2 shape, as nanoGPT's) on model.attention's attention: token
and position embeddings, pre-LayerNorm blocks (attention, a 4x GELU MLP), a final LayerNorm and
an LM head tied to the token embeddings; GPT-2's initialisation (param=mup: model/mup.py).
Dimension letters: B batch, T time, C model width (d_model), V vocabulary."""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.attention import MultiHeadAttention
from model.config import IGNORE_INDEX, GPTConfig

INIT_STD = 0.02  # GPT-2's initial std of every weight matrix


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Dropout off inside the block; the training mode is restored after, even on error."""
    was_training = model.training
    try:
        yield model.eval()
    finally:
        model.train(was_training)


class MLP(nn.Module):
    """The position-wise feed-forward network: C -> 4C -> GELU -> C."""

    def __init__(self, d_model: int, bias: bool):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.proj = nn.Linear(4 * d_model, d_model, bias=bias)  # a residual output projection

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x)); dropout on each branch."""

    def __init__(self, config: GPTConfig, attention: type[MultiHeadAttention]):
        super().__init__()
        C = config.d_model
        self.ln_1 = nn.LayerNorm(C, bias=config.bias)
        self.attn = attention(config)
        self.ln_2 = nn.LayerNorm(C, bias=config.bias)
        self.mlp = MLP(C, config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, valid_mask: Optional[Tensor] = None) -> Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), causal=True, valid_mask=valid_mask))
        return x + self.drop(self.mlp(self.ln_2(x)))  # (B, T, C)


class GPT(nn.Module):
    """The language model; its blocks build `attention`: MultiHeadAttention or a speed route."""

    def __init__(self, config: GPTConfig, attention: type[MultiHeadAttention] = MultiHeadAttention):
        super().__init__()
        self.config = config
        C = config.d_model
        self.wte = nn.Embedding(config.vocab_size, C)  # token embeddings
        self.wpe = nn.Embedding(config.block_size, C) if config.pos == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(C, bias=config.bias)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied (Press & Wolf 2017)
        for module in self.modules():  # GPT-2: weights N(0, 0.02), biases 0
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # GPT-2: scale residual output projections by 1/sqrt(2 * n_layer), one per branch
        residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)
        if config.qk_init_std is not None:  # W_q and W_k: GPT-2's draws rescaled to this std,
            with torch.no_grad():  # so the random stream (and every other weight) stays sp's
                for block in self.blocks:
                    for proj in (block.attn.q_proj, block.attn.k_proj):
                        proj.weight.mul_(config.qk_init_std / INIT_STD)
        if config.param.name == "mup" or config.param.zero_query:
            from model import mup  # loaded only for param=mup (or a zero query)
            mup.init_width(self)
        # muP's read-out (mup's MuSharedReadout: the tied weight, its input times output_mult / m)
        self.readout_mult = config.param.output_mult / config.width_mult

    @property
    def attention_name(self) -> str:   # for the run's start line
        return type(self.blocks[0].attn).__name__

    def trunk(self, idx: Tensor, valid_mask: Optional[Tensor] = None) -> Tensor:
        """Embeddings and blocks: idx (B, T) -> x (B, T, C), before the final LayerNorm."""
        T = idx.size(1)
        if T > self.config.block_size and self.wpe is not None:   # rope and nope have no table
            raise ValueError(f"sequence length {T} exceeds model.block_size="
                             f"{self.config.block_size}; crop the input or raise block_size.")
        # positions from the mask: a left-padded row gets the positions it would have unpadded,
        # so batched greedy generation equals unbatched generation token for token
        pos = (torch.arange(T, device=idx.device) if valid_mask is None  # (T,)
               else (valid_mask.long().cumsum(dim=1) - 1).clamp(min=0))  # (B, T)
        x = self.drop(self.wte(idx) if self.wpe is None else self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x, valid_mask)
        return x

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None,
                valid_mask: Optional[Tensor] = None,
                reduction: str = "mean") -> tuple[Tensor, Optional[Tensor]]:
        """idx (B, T) long -> (logits (B, T, V) float, cross-entropy or None). targets (B, T),
        IGNORE_INDEX where there is nothing to predict."""
        x = self.ln_f(self.trunk(idx, valid_mask))  # (B, T, C)
        if self.readout_mult != 1.0:  # param: output_mult / m, once, on the read-out's input
            x = x * self.readout_mult
        logits = self.lm_head(x)  # (B, T, C) @ (C, V) -> (B, T, V)
        loss = None
        if targets is not None:  # (B*T, V) against (B*T,)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                   ignore_index=IGNORE_INDEX, reduction=reduction)
        return logits.float(), loss

    def num_params(self) -> int:
        """Number of parameters (the tied token embedding counted once)."""
        return sum(p.numel() for p in self.parameters())
