"""One optimizer step: fetch the micro-batches, forward, backward, clip, AdamW, schedule.

The loss of a step is the sum of the token losses of all its micro-batches and processes over
their count of real targets: a padded micro-batch with few real tokens weighs as few tokens,
and the step does not depend on how the global batch is split over processes.

Options attach as state.hooks (trainer/build.py's StepHooks): trainer.z_loss a term on the loss,
optim.qk_clip a hook after AdamW. A check step also returns its gradient `Diagnostics`.
"""

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import clip_grad_norm_

from data.batching import Batch, Sampler
from model.config import IGNORE_INDEX
from trainer.build import Compute, LossTerm, TrainState, all_reduce_sum
from trainer.schema import OptimConfig, TrainerConfig


@dataclass(frozen=True)
class Diagnostics:
    """A check step's gradient diagnostics, read after clipping: each layer's W_q and W_k
    gradient norms, and under trainer.z_loss the z term's share of the step's loss."""

    q_grad_norms: list[float]
    k_grad_norms: list[float]
    z_term: Optional[float] = None

    def record(self) -> dict:
        """The fields of the step's train record (metrics.jsonl)."""
        q, k = self.q_grad_norms, self.k_grad_norms
        fields = {"q_grad_norm": sum(q) / len(q), "k_grad_norm": sum(k) / len(k),
                  "q_grad_norm_layers": q, "k_grad_norm_layers": k}
        return fields if self.z_term is None else {**fields, "z_term": self.z_term}


class StepResult(NamedTuple):
    loss: torch.Tensor          # this process's share of the step's loss: summed, the loss
    grad_norm: torch.Tensor     # before clipping at optim.grad_clip
    diagnostics: Optional[Diagnostics]   # at a check step (train_step's diagnose)


def to_device(batch: Batch, device: torch.device):
    """(idx, targets, valid_mask) on the device. On CUDA the copies go from pinned memory with
    non_blocking=True: a copy from pageable memory would synchronise with the GPU every step."""
    cuda = device.type == "cuda"
    return tuple(t if t is None else (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)
                 for t in (batch.idx, batch.targets, batch.valid_mask))


def next_batches(batcher: Sampler, n: int, device: torch.device) -> list[tuple]:
    """The step's `n` micro-batches, on the device."""
    return [to_device(batcher.next(), device) for _ in range(n)]


def count_targets(batches) -> torch.Tensor:
    """Real targets (not IGNORE_INDEX) in `batches` of all processes: the divisor of a
    token-weighted loss. Counted, not taken from the shape: padding and data=recall (whose
    batches have no valid mask, only answers as targets) leave targets out."""
    local = sum((targets != IGNORE_INDEX).sum() for _, targets, _ in batches)
    return all_reduce_sum(local.float())


def accumulating(wrapped: torch.nn.Module, last: bool) -> AbstractContextManager:
    """DDP all-reduces gradients on the step's last micro-batch only."""
    return wrapped.no_sync() if isinstance(wrapped, DDP) and not last else nullcontext()


def train_step(state: TrainState, compute: Compute, optim_cfg: OptimConfig,
               train_cfg: TrainerConfig, diagnose: bool = False) -> StepResult:
    """One optimizer step over train_cfg.grad_accum micro-batches of state.batcher; device
    tensors, and with `diagnose` the Diagnostics (host syncs)."""
    batches = next_batches(state.batcher, train_cfg.grad_accum, compute.device)
    n_targets = count_targets(batches)
    scale = compute.world / n_targets   # DDP averages gradients over processes: undone here
    loss_sum, hooks = torch.zeros((), device=compute.device), state.hooks
    for micro, (idx, targets, valid) in enumerate(batches):
        with accumulating(state.wrapped, last=micro == len(batches) - 1):
            with compute.autocast:
                logits, loss = state.wrapped(idx, targets, valid, reduction="sum")
            objective = loss if hooks.loss_term is None else loss + hooks.loss_term(logits, targets)
            state.scaler.scale(objective * scale).backward()
        loss_sum += loss.detach().float()
    state.scaler.unscale_(state.optimizer)
    grad_norm = clip_grad_norm_(state.model.parameters(), optim_cfg.grad_clip or math.inf)
    diagnostics = diagnose_step(state.model, hooks.loss_term, n_targets) if diagnose else None
    state.scaler.step(state.optimizer)
    state.scaler.update()
    for hook in hooks.after_step:
        hook()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum / n_targets, grad_norm, diagnostics)


def diagnose_step(model: torch.nn.Module, loss_term: Optional[LossTerm],
                  n_targets: torch.Tensor) -> Diagnostics:
    """The Diagnostics of a step whose gradients are clipped and not yet applied."""
    q, k = zip(*(block.attn.qk_grad_norms() for block in model.blocks))
    z_term = None if loss_term is None else all_reduce_sum(loss_term.step_sum() / n_targets)
    return Diagnostics(list(q), list(k), None if z_term is None else z_term.item())
