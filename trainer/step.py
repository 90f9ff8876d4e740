"""One optimizer step: fetch the micro-batches, forward, backward, clip, AdamW, schedule.

The loss of a step is the mean over every real target token of all its micro-batches and all
processes: the sum of the token losses over the count of real targets, both summed across
processes. A padded micro-batch with few real tokens therefore weighs as few tokens, and the
step does not depend on how the global batch is split over processes.
"""

import math
from contextlib import nullcontext
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model.gpt import IGNORE_INDEX
from trainer.build import Run


def to_device(batch, device: torch.device):
    """(idx, targets, valid_mask) on the device. On CUDA the copies go from pinned memory with
    non_blocking=True: a copy from pageable memory would synchronise with the GPU every step."""
    def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None:
            return None
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)
    return move(batch.idx), move(batch.targets), move(batch.valid_mask)


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


def count_targets(batches, device: torch.device) -> torch.Tensor:
    """Real targets in `batches` of all processes: the divisor of a token-weighted loss."""
    if all(valid is None for _, _, valid in batches):   # concat: every target is real
        return torch.tensor(float(world_size() * sum(t.numel() for _, t, _ in batches)),
                            device=device)
    local = sum((targets != IGNORE_INDEX).sum() for _, targets, _ in batches)
    return all_reduce_sum(local.float())


def qk_grad_record(r: Run) -> dict:
    """Gradient norms of the query and key projections, mean over layers and per layer."""
    q, k = zip(*(block.attn.qk_grad_norms() for block in r.raw.blocks))
    return {"q_grad_norm": sum(q) / len(q), "k_grad_norm": sum(k) / len(k),
            "q_grad_norm_layers": list(q), "k_grad_norm_layers": list(k)}


def train_step(r: Run, want_qk: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One optimizer step over trainer.grad_accum micro-batches of `r.batcher`.

    Returns device tensors (this process's share of the step's loss, whose sum over processes
    is the loss; the gradient norm before clipping) and, if want_qk, the q/k projection
    gradient norms (floats: a host sync). scripts/bench.py times this function.
    """
    batches = [to_device(r.batcher.next(), r.device) for _ in range(r.tc.grad_accum)]
    n_targets = count_targets(batches, r.device)
    # DDP averages gradients over processes: scaling by the world size undoes that average.
    scale = world_size() / n_targets
    loss_sum = torch.zeros((), device=r.device)
    for micro, (idx, targets, valid) in enumerate(batches):
        # DDP all-reduces gradients on the last micro-step only.
        last = micro == len(batches) - 1
        with r.ddp.no_sync() if isinstance(r.ddp, DDP) and not last else nullcontext():
            with r.ctx:
                _, loss = r.ddp(idx, targets, valid, reduction="sum")
            r.scaler.scale(loss * scale).backward()
        loss_sum += loss.detach().float()
    r.scaler.unscale_(r.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(r.raw.parameters(),
                                               r.optim.grad_clip or math.inf)
    qk = qk_grad_record(r) if want_qk else {}
    r.scaler.step(r.optimizer)
    r.scaler.update()
    r.scheduler.step()
    r.optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm, qk
