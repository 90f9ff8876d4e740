"""One optimizer step: fetch the micro-batches, forward, backward, clip, AdamW, schedule; with
trainer.z_loss a z term on the loss, with optim.qk_clip QK-Clip after AdamW (trainer/qk_clip.py).

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
from trainer.schema import OptimConfig, TrainerConfig


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


def z_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The z-loss's sum over real targets of (log Z)^2, Z = sum_v exp(logit_v) the softmax's
    normaliser (PaLM, Chowdhery et al. 2022; Wortsman et al. 2023): it keeps log Z near 0, so
    that the output logits cannot drift upwards together. logits (B, T, V), targets (B, T)."""
    log_z = torch.logsumexp(logits.float(), dim=-1)  # (B, T)
    return log_z[targets != IGNORE_INDEX].square().sum()


def train_step(state: TrainState, compute: Compute, optim_cfg: OptimConfig,
               train_cfg: TrainerConfig, want_qk: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One optimizer step over train_cfg.grad_accum micro-batches of `state.batcher`. Returns
    device tensors (this process's share of the step's cross-entropy, summed over processes it
    is the loss; the gradient norm before clipping at optim_cfg.grad_clip, 0 = off) and, if
    want_qk, the q/k projection gradient norms (mean over layers and per layer) and with
    trainer.z_loss the z term added to the loss (host syncs)."""
    batches = [to_device(state.batcher.next(), compute.device)
               for _ in range(train_cfg.grad_accum)]
    n_targets = count_targets(batches)
    # DDP averages gradients over processes: scaling by the world size undoes that average.
    scale = compute.world / n_targets
    loss_sum = torch.zeros((), device=compute.device)
    z_total = torch.zeros((), device=compute.device)
    wrapped = state.wrapped
    for micro, (idx, targets, valid) in enumerate(batches):
        # DDP all-reduces gradients on the last micro-step only.
        last = micro == len(batches) - 1
        with wrapped.no_sync() if isinstance(wrapped, DDP) and not last else nullcontext():
            with compute.autocast:
                logits, loss = wrapped(idx, targets, valid, reduction="sum")
            objective = loss
            if train_cfg.z_loss:   # loss + z_loss * mean (log Z)^2; the logged loss stays CE
                z = train_cfg.z_loss * z_sum(logits, targets)
                objective, z_total = loss + z, z_total + z.detach()
            state.scaler.scale(objective * scale).backward()
        loss_sum += loss.detach().float()
    state.scaler.unscale_(state.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(),
                                               optim_cfg.grad_clip or math.inf)
    extra = {}
    if want_qk:
        q, k = zip(*(block.attn.qk_grad_norms() for block in state.model.blocks))
        extra = {"q_grad_norm": sum(q) / len(q), "k_grad_norm": sum(k) / len(k),
                 "q_grad_norm_layers": list(q), "k_grad_norm_layers": list(k)}
        if train_cfg.z_loss:
            extra["z_term"] = all_reduce_sum(z_total / n_targets).item()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    if optim_cfg.qk_clip is not None:   # the option loads only when a config sets it
        from trainer import qk_clip
        qk_clip.clip(state.model, optim_cfg.qk_clip)
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm, extra
