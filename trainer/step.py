"""One optimizer step: fetch the micro-batches, forward, backward, clip, AdamW, schedule.

The loss of a step is the sum of the token losses of all its micro-batches and processes over
their count of real targets: a padded micro-batch with few real tokens weighs as few tokens,
and the step does not depend on how the global batch is split over processes.
"""

import math
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from data.batching import Batch
from model.config import IGNORE_INDEX
from trainer.build import Compute, TrainState, all_reduce_sum


def to_device(batch: Batch, device: torch.device):
    """(idx, targets, valid_mask) on the device. On CUDA the copies go from pinned memory with
    non_blocking=True: a copy from pageable memory would synchronise with the GPU every step."""
    cuda = device.type == "cuda"
    return tuple(t if t is None else (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)
                 for t in (batch.idx, batch.targets, batch.valid_mask))


def count_targets(batches) -> torch.Tensor:
    """Real targets (not IGNORE_INDEX) in `batches` of all processes: the divisor of a
    token-weighted loss. Counted, not taken from the shape: padding and data=recall (whose
    batches have no valid mask, only answers as targets) leave targets out."""
    local = sum((targets != IGNORE_INDEX).sum() for _, targets, _ in batches)
    return all_reduce_sum(local.float())


def train_step(state: TrainState, compute: Compute, grad_accum: int, grad_clip: float,
               want_qk: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One optimizer step over `grad_accum` micro-batches of `state.batcher`. Returns device
    tensors (this process's share of the step's loss, summed over processes it is the loss; the
    gradient norm before clipping at `grad_clip`, 0 = off) and, if want_qk, the q/k projection
    gradient norms (mean over layers and per layer; a host sync)."""
    batches = [to_device(state.batcher.next(), compute.device) for _ in range(grad_accum)]
    n_targets = count_targets(batches)
    # DDP averages gradients over processes: scaling by the world size undoes that average.
    scale = compute.world / n_targets
    loss_sum = torch.zeros((), device=compute.device)
    wrapped = state.wrapped
    for micro, (idx, targets, valid) in enumerate(batches):
        # DDP all-reduces gradients on the last micro-step only.
        last = micro == len(batches) - 1
        with wrapped.no_sync() if isinstance(wrapped, DDP) and not last else nullcontext():
            with compute.autocast:
                _, loss = wrapped(idx, targets, valid, reduction="sum")
            state.scaler.scale(loss * scale).backward()
        loss_sum += loss.detach().float()
    state.scaler.unscale_(state.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), grad_clip or math.inf)
    qk = {}
    if want_qk:
        q, k = zip(*(block.attn.qk_grad_norms() for block in state.model.blocks))
        qk = {"q_grad_norm": sum(q) / len(q), "k_grad_norm": sum(k) / len(k),
              "q_grad_norm_layers": list(q), "k_grad_norm_layers": list(k)}
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm, qk
