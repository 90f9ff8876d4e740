"""A decoder-only transformer (GPT-2 shape) built on model.attention.MultiHeadAttention.

Token embeddings plus learned absolute position embeddings, pre-LayerNorm blocks (attention
and a 4x GELU MLP), a final LayerNorm and an LM head tied to the token embeddings; GPT-2
initialisation (Radford et al. 2019; as in nanoGPT).

Padding: `valid_mask` (B, T) bool, True = real token. Positions come from the mask,
pos = cumsum(valid_mask) - 1 (clamped at 0), so a left-padded row gets the positions it would
have unpadded, and batched greedy generation equals unbatched generation token for token.

Dimension letters: B batch, T time, C model width (d_model), V vocabulary size.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.attention import MultiHeadAttention, ScalingConfig, check_attn_impl, is_positive_number
from model.errors import ConfigError, check_dropout, check_positive_int

IGNORE_INDEX = -100  # targets equal to this are ignored by the loss (F.cross_entropy's default)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Dropout off inside the block; the module's training mode is restored after, even on error."""
    was_training = model.training
    model.eval()
    try:
        yield model
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

    def __init__(self, config: "GPTConfig", attention: type[MultiHeadAttention]):
        super().__init__()
        C = config.d_model
        self.ln_1 = nn.LayerNorm(C, bias=config.bias)
        self.attn = attention(
            C, config.n_head, config.head_dim, config.scaling, dropout=config.dropout,
            bias=config.bias, attn_impl=config.attn_impl)
        self.ln_2 = nn.LayerNorm(C, bias=config.bias)
        self.mlp = MLP(C, config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, valid_mask: Optional[Tensor] = None) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        x = x + self.drop(self.attn(self.ln_1(x), causal=True, valid_mask=valid_mask))
        return x + self.drop(self.mlp(self.ln_2(x)))


@dataclass(frozen=True)
class GPTConfig:
    """Model shape and options; field names are the `model.<field>` Hydra keys."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_head: Optional[int] = None  # None -> d_model // n_head (must divide)
    dropout: float = 0.0
    bias: bool = True
    attn_impl: str = "auto"  # auto | explicit | sdpa
    # Initial std of the q and k projection weights (not v, not the output projection); null
    # keeps GPT-2's 0.02. With unit-variance LayerNorm output each q, k component has variance
    # d_model * std^2 at step 0, so std = 1/sqrt(d_model) gives unit-variance q and k, the
    # assumption behind s = 1/sqrt(d_head) (docs/scaling.md); 0.02 gives d_model * 0.0004.
    qk_init_std: Optional[float] = None
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            check_positive_int(f"model.{name}", getattr(self, name))
        if self.d_head is not None:
            check_positive_int("model.d_head", self.d_head)
        elif self.d_model % self.n_head != 0:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}; "
                "set model.d_head explicitly or change model.n_head (or model.d_model)."
            )
        check_dropout("model.dropout", self.dropout)
        if not isinstance(self.scaling, ScalingConfig):
            raise ConfigError(f"model.scaling must be a ScalingConfig, got "
                              f"{type(self.scaling).__name__}; build it with "
                              "ScalingConfig(**cfg) before GPTConfig.")
        check_attn_impl(self.attn_impl, self.scaling)
        if self.qk_init_std is not None and not is_positive_number(self.qk_init_std):
            raise ConfigError(f"model.qk_init_std={self.qk_init_std!r} must be null (GPT-2's "
                              "0.02, the default) or a positive finite number, e.g. "
                              "1/sqrt(model.d_model) for unit-variance q and k at initialisation.")

    @property
    def head_dim(self) -> int:
        """The resolved per-head width d_head."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_head


def positions(valid_mask: Optional[Tensor], T: int, device: torch.device) -> Tensor:
    """Position of each token: (T,) 0..T-1, or with a mask cumsum(valid) - 1 clamped at 0."""
    if valid_mask is None:
        return torch.arange(T, device=device)  # (T,)
    return (valid_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)


class GPT(nn.Module):
    """The language model. self.blocks[i].attn is an `attention`: MultiHeadAttention, or a
    subclass with a hardware speed route that the caller chooses (trainer/build.py)."""

    def __init__(self, config: GPTConfig,
                 attention: type[MultiHeadAttention] = MultiHeadAttention):
        super().__init__()
        self.config = config
        C = config.d_model
        self.wte = nn.Embedding(config.vocab_size, C)  # token embeddings
        self.wpe = nn.Embedding(config.block_size, C)  # learned absolute positions
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(C, bias=config.bias)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied (Press & Wolf 2017)
        self.apply(self._init_weights)
        # GPT-2: scale residual output projections by 1/sqrt(2 * n_layer), one per branch
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)
        if config.qk_init_std is not None:  # q and k rows [0, 2HD) of each fused qkv weight
            for block in self.blocks:
                HD = config.n_head * config.head_dim
                nn.init.normal_(block.attn.qkv.weight[:2 * HD], mean=0.0, std=config.qk_init_std)

    @property
    def attention_name(self) -> str:
        """The attention module's class, for the run's start line."""
        return type(self.blocks[0].attn).__name__

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def trunk(self, idx: Tensor, valid_mask: Optional[Tensor] = None,
              stats: Optional[list[dict[str, Tensor]]] = None) -> Tensor:
        """Embeddings and blocks: idx (B, T) -> x (B, T, C), before the final LayerNorm.

        With a list `stats`, appends each layer's attention statistics on that layer's input
        (MultiHeadAttention.explain, an extra explicit pass: a diagnostic, not the training path).
        """
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size="
                             f"{self.config.block_size}; crop the input or raise block_size.")
        pos = positions(valid_mask, T, idx.device)  # (T,) or (B, T)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            if stats is not None:
                stats.append(block.attn.explain(block.ln_1(x), valid_mask=valid_mask).stats)
            x = block(x, valid_mask)
        return x

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None,
                valid_mask: Optional[Tensor] = None,
                reduction: str = "mean") -> tuple[Tensor, Optional[Tensor]]:
        """idx (B, T) long -> (logits (B, T, V) float, cross-entropy or None).

        targets (B, T) long, IGNORE_INDEX where there is nothing to predict (padding).
        valid_mask (B, T) bool, True = real token; None = every token is real.
        reduction "mean" (over real targets) or "sum": the trainer sums token losses over
        micro-batches and processes and divides once by their count of real targets.
        """
        x = self.trunk(idx, valid_mask)
        logits = self.lm_head(self.ln_f(x))  # (B, T, C) @ (C, V) -> (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                   ignore_index=IGNORE_INDEX,
                                   reduction=reduction)  # (B*T, V) vs (B*T,)
        return logits.float(), loss

    @torch.no_grad()
    def attention_stats(self, idx: Tensor, valid_mask: Optional[Tensor] = None
                        ) -> list[dict[str, Tensor]]:
        """Per layer, the five statistics of model/diagnostics.py (entropy, max_logit,
        saturated, raw_var, raw_max_logit), each (H,), from the explicit path.

        Always in eval mode (dropout off), so the numbers describe the model itself and no
        random stream is consumed; the module's training mode is restored afterwards.
        """
        stats = []
        with eval_mode(self):
            self.trunk(idx, valid_mask, stats)
        return stats

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, pad_id: int = 0,
                 generator: Optional[torch.Generator] = None) -> list[list[int]]:
        """Continue each prompt by max_new_tokens tokens; returns only the new tokens.

        Prompts of different lengths are left-padded with pad_id and masked with valid_mask.
        temperature == 0 is greedy decoding. The context is cropped on the left to block_size.
        Call model.eval() first (dropout would make the output random).
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ConfigError("generate() needs at least one prompt and every prompt needs at "
                              "least one token; start empty prompts with a token such as "
                              "end-of-text.")
        if temperature < 0:
            raise ConfigError(f"temperature={temperature} must be >= 0 (0 means greedy).")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"top_k={top_k} must be null or a positive integer.")
        device = self.wte.weight.device
        L = max(len(p) for p in prompts)
        idx = torch.full((len(prompts), L), pad_id, dtype=torch.long, device=device)  # (B, L)
        valid = torch.zeros(len(prompts), L, dtype=torch.bool, device=device)  # (B, L)
        for i, p in enumerate(prompts):
            idx[i, L - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
            valid[i, L - len(p):] = True
        padded = any(len(p) != L for p in prompts)
        for _ in range(max_new_tokens):
            ctx, ctx_valid = idx[:, -self.config.block_size:], valid[:, -self.config.block_size:]
            logits, _ = self(ctx, valid_mask=ctx_valid if padded else None)
            next_id = self._pick(logits[:, -1, :], temperature, top_k, generator)  # (B, 1)
            idx = torch.cat([idx, next_id], dim=1)
            valid = torch.cat([valid, torch.ones_like(next_id, dtype=torch.bool)], dim=1)
        return idx[:, L:].tolist()

    @staticmethod
    def _pick(logits: Tensor, temperature: float, top_k: Optional[int],
              generator: Optional[torch.Generator]) -> Tensor:
        """Next token from the last logits (B, V): argmax, or a top-k temperature sample."""
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=-1)  # (B, V)
        return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)

    def num_params(self) -> int:
        """Number of parameters (the tied token embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        """Training FLOPs per token, PaLM appendix B style: 6 N + 12 L H D T.

        N counts the weights of every matrix multiply (q/k/v/output projections, MLP, and the
        tied LM head; not embeddings lookups, norms or biases); 6 = 2 (multiply-add) x 3
        (forward + backward). 12 L H D T is the attention score and weighted-sum matmuls
        (Q K^T and W V, 2 x 2 forward, x 3 with backward) over a context of T = seq_len
        (default block_size), counted over the full T x T square as PaLM does.
        """
        T = seq_len if seq_len is not None else self.config.block_size
        n_matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        cfg = self.config
        return float(6 * n_matmul + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * T)
