"""Sampling from a GPT: continue a batch of prompts token by token, greedy or top-k with a
temperature (scripts/sample.py; trainer.sample_prompts at the end of a run). Dimension letters:
B batch, L prompt length, V vocabulary."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from model.errors import ConfigError, check_sampling
from model.gpt import GPT


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0    # 0: greedy
    top_k: Optional[int] = None   # None: every token
    seed: int = 0               # of the torch.Generator the draws come from

    def __post_init__(self):
        check_sampling(("max_new_tokens", "temperature", "top_k"), self.max_new_tokens,
                       self.temperature, self.top_k)


@torch.no_grad()
def generate(model: GPT, prompts: list[list[int]], sampling: Sampling,
             pad_id: int = 0) -> list[list[int]]:
    """The sampling.max_new_tokens tokens that continue each prompt (left-padded with pad_id and
    masked; cropped on the left to block_size). Call model.eval() first."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("generate() needs a prompt, and every prompt needs at least one "
                          "token (start an empty one with end-of-text).")
    device, L = model.wte.weight.device, max(len(p) for p in prompts)
    idx = torch.tensor([[pad_id] * (L - len(p)) + p for p in prompts], device=device)  # (B, L)
    valid = torch.tensor([[False] * (L - len(p)) + [True] * len(p) for p in prompts],
                         device=device)  # (B, L)
    padded, T = any(len(p) != L for p in prompts), model.config.block_size
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    for _ in range(sampling.max_new_tokens):
        logits, _ = model(idx[:, -T:], valid_mask=valid[:, -T:] if padded else None)
        next_id = pick(logits[:, -1, :], sampling, generator)  # (B, 1)
        idx = torch.cat([idx, next_id], dim=1)
        valid = torch.cat([valid, torch.ones_like(next_id, dtype=torch.bool)], dim=1)
    return idx[:, L:].tolist()


def pick(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> Tensor:
    """Next token from the last logits (B, V): argmax, or a top-k temperature sample."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = logits / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(logits, min(sampling.top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1,
                             generator=generator)  # (B, V) -> (B, 1)
