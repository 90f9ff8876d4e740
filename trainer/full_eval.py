"""Whole-split evaluation: the loss of a model on every token of a split, once.

The periodic evaluation scores a few fixed random windows (cheap, noisy); at the end of a run
this module scores the split itself, cut into consecutive windows of `block_size` inputs: window
i reads tokens[i*T : i*T + T] and predicts tokens[i*T + 1 : i*T + T + 1], so every token but the
first is a target exactly once, with 1 to T tokens of context. The result is a mean per target
token, not per window, so it compares exactly between runs with different batch sizes. A split
of more than `max_tokens` targets is scored on windows spread evenly over it (`numpy.linspace`),
the same for every run with the same split, block size and cap. Under several processes each
rank scores every world-th window and the sums are all-reduced.
"""

from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from model.gpt import eval_mode
from trainer.build import all_reduce_sum


@dataclass(frozen=True)
class FullEval:
    loss: float         # mean cross-entropy per scored target token (nats)
    targets: int        # target tokens scored
    split_targets: int  # target tokens in the split (len(split) - 1)


def window_starts(n_tokens: int, block_size: int, max_tokens: int | None) -> np.ndarray:
    """Start offsets of the windows to score: all of them, or an even spread under the cap."""
    n_windows = -(-(n_tokens - 1) // block_size)  # ceil: the last window may be short
    starts = np.arange(n_windows, dtype=np.int64) * block_size
    if max_tokens is not None and (n_tokens - 1) > max_tokens:
        keep = max(1, max_tokens // block_size)
        starts = starts[np.unique(np.linspace(0, n_windows - 1, keep).round().astype(np.int64))]
    return starts


@torch.no_grad()
def full_split_loss(model: torch.nn.Module, tokens, *, block_size: int, batch_size: int,
                    device: torch.device, autocast: AbstractContextManager,
                    max_tokens: int | None = None, rank: int = 0, world: int = 1) -> FullEval:
    """Score `tokens` (a 1-D id array: memmap, shards or ndarray) with `model` in eval mode.

    `model(idx)` must return (logits (B, T, V), _). The model's training mode is restored.
    """
    n = len(tokens)
    if n < 2:
        raise ValueError(f"a split of {n} token(s) has no target to score")
    starts = window_starts(n, block_size, max_tokens)
    mine = starts[rank::world]
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    with eval_mode(model):
        # Full windows go in batches; a short last window (at most one) goes alone.
        full = [s for s in mine if s + block_size + 1 <= n]   # a prefix: starts ascend
        groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
        groups += [[s] for s in mine[len(full):]]
        for group in groups:
            length = min(block_size, n - 1 - group[0])
            rows = np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64)
                             for s in group])  # (B, length + 1)
            batch = torch.from_numpy(rows).to(device)
            idx, targets = batch[:, :-1], batch[:, 1:]  # (B, length) each
            with autocast:
                logits, _ = model(idx)
            loss_sum += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                        reduction="sum").double()
            count += targets.numel()
    all_reduce_sum(loss_sum)
    all_reduce_sum(count)
    scored = int(count.item())
    return FullEval(loss=(loss_sum / count).item() if scored else float("nan"),
                    targets=scored, split_targets=n - 1)
