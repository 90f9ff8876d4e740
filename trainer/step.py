"""One optimizer step: fetch the micro-batches, forward, backward, clip, AdamW (optim=muon: Muon
and AdamW), schedule. The loss is the sum of the token losses of all micro-batches and processes
over their count of real targets: it depends neither on padding nor on how processes split it."""

import math
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import clip_grad_norm_

from data.batching import Sampler
from model.config import IGNORE_INDEX
from trainer.build import Compute, TrainState, all_reduce_sum
from trainer.schema import OptimConfig, TrainerConfig


def next_batches(batcher: Sampler, n: int, device: torch.device) -> list[tuple]:
    return [batcher.next().to(device) for _ in range(n)]


def count_targets(batches) -> torch.Tensor:
    """Real targets (not IGNORE_INDEX) in all processes' `batches`: the loss's divisor."""
    local = sum((targets != IGNORE_INDEX).sum() for _, targets, _ in batches)
    return all_reduce_sum(local.float())


def accumulating(wrapped: torch.nn.Module, last: bool) -> AbstractContextManager:
    """DDP all-reduces gradients on the step's last micro-batch only."""
    return wrapped.no_sync() if isinstance(wrapped, DDP) and not last else nullcontext()


def train_step(state: TrainState, compute: Compute, optim_cfg: OptimConfig,
               train_cfg: TrainerConfig, check: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """This process's loss share, the gradient norm before clipping, a check step's records."""
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
    record = {k: v for hook in hooks.records for k, v in hook(n_targets).items()} if check else {}
    state.scaler.step(state.optimizer)
    state.scaler.update()
    for hook in hooks.after_step:
        hook()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm, record

