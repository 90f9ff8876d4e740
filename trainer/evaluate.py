"""Evaluation: losses on fixed batches and the whole-split score.
Losses are means over the real targets of all processes; evaluating runs in eval mode and draws
no random numbers, so it never changes what training does."""

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from data.batching import BatchShape
from model.config import IGNORE_INDEX
from model.gpt import eval_mode
from trainer.build import Run, all_reduce_sum


def accuracy_counts(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[correct, answered]: logits (B, T, V), targets (B, T)."""
    answered = targets != IGNORE_INDEX
    correct = (logits.argmax(-1) == targets) & answered
    return torch.stack([correct.sum(), answered.sum()]).float()


@torch.no_grad()
def estimate(model: torch.nn.Module, batches, autocast: AbstractContextManager,
             device: torch.device) -> tuple[float, float, int]:
    """(mean loss, accuracy, count) over the real targets of all processes, in eval mode."""
    total = torch.zeros(3, device=device)   # (sum of token losses, correct, real targets)
    with eval_mode(model):
        for batch in batches:
            idx, targets, valid = batch.to(device)
            with autocast:
                logits, loss_sum = model(idx, targets, valid, reduction="sum")
            total += torch.cat([loss_sum.float()[None], accuracy_counts(logits, targets)])
    loss_sum, correct, count = all_reduce_sum(total).tolist()
    return loss_sum / count, correct / count, int(count)


def evaluate(run: Run, step: int, lr: float, tokens_per_sec: Optional[float]) -> dict:
    """The eval record of `step`: fixed-batch losses; trainer.diagnostics: on rank 0 attention's."""
    model, compute = run.state.model, run.compute
    (val_loss, accuracy, _), (train_loss, _, _) = (
        estimate(model, run.eval_batches[split], compute.autocast, compute.device)
        for split in ("val", "train"))
    record = {"kind": "eval", "step": step, "train_loss": train_loss, "val_loss": val_loss,
              "val_bpb": run.data.val_bpb(val_loss), "lr": lr, "tokens_per_sec": tokens_per_sec}
    record.update(run.data.accuracy("val_accuracy", accuracy))
    if compute.rank == 0 and run.config.train_cfg.diagnostics:
        from trainer.diagnose import attention_record
        record.update(attention_record(model, run.eval_batches["val"][0], compute.device))
    return record


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
def full_split_loss(model: torch.nn.Module, tokens, shape: BatchShape,
                    autocast: AbstractContextManager, max_tokens: int | None = None) -> FullEval:
    """Score every token of a split (a 1-D id array) once: window i reads tokens[i*T : i*T + T]
    (T = shape.block_size) and predicts the next T, so each target has 1 to T tokens of context.
    A split of more than `max_tokens` targets is scored on evenly spread windows. Rank r scores
    every world-th window, shape.batch_size // world at a time."""
    block_size, batch_size = shape.block_size, shape.batch_size // shape.world
    device = next(model.parameters()).device
    n = len(tokens)
    if n < 2:
        raise ValueError(f"a split of {n} token(s) has no target to score")
    mine = window_starts(n, block_size, max_tokens)[shape.rank::shape.world]
    total = torch.zeros(2, dtype=torch.float64, device=device)   # (sum of losses, targets)
    with eval_mode(model):
        # Full windows go in batches; a short last window (at most one) goes alone.
        full = [s for s in mine if s + block_size + 1 <= n]   # a prefix: starts ascend
        groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
        for group in groups + [[s] for s in mine[len(full):]]:
            length = min(block_size, n - 1 - group[0])
            rows = np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64)
                             for s in group])  # (B, length + 1)
            batch = torch.from_numpy(rows).to(device)
            idx, targets = batch[:, :-1], batch[:, 1:]  # (B, length) each
            with autocast:
                _, loss_sum = model(idx, targets, reduction="sum")
            total[0] += loss_sum.double()
            total[1] += targets.numel()
    loss_sum, count = all_reduce_sum(total).tolist()
    return FullEval(loss_sum / count if count else math.nan, int(count), n - 1)


def evaluate_full(run: Run) -> dict:
    """summary.json's *_full fields: the final weights on the whole validation split (at most
    trainer.full_eval_tokens targets), or on the data's answer set with its accuracy."""
    compute, train_cfg = run.compute, run.config.train_cfg
    shape = BatchShape(train_cfg.batch_size, run.config.model_cfg.block_size, compute.rank,
                       compute.world)
    answers = run.data.whole_validation(shape)
    if answers is not None:
        loss, accuracy, n_answers = estimate(run.state.model, answers, compute.autocast,
                                             compute.device)
        return {"final_val_loss_full": loss, "final_val_bpb_full": None,
                "full_eval_targets": n_answers, "full_eval_split_targets": n_answers,
                "final_val_accuracy": accuracy}
    full = full_split_loss(run.state.model, run.data.val, shape, compute.autocast,
                           train_cfg.full_eval_tokens)
    return {"final_val_loss_full": full.loss, "final_val_bpb_full": run.data.val_bpb(full.loss),
            "full_eval_targets": full.targets, "full_eval_split_targets": full.split_targets}


def describe(record: dict) -> str:
    """One terminal line for an eval record, or for the whole-split numbers (evaluate_full)."""
    if "full_eval_targets" in record:
        scored, total = record["full_eval_targets"], record["full_eval_split_targets"]
        if "final_val_accuracy" in record:
            return (f"whole validation set: loss {record['final_val_loss_full']:.4f}, accuracy "
                    f"{record['final_val_accuracy']:.4f} over {total:,} answers")
        return (f"whole validation split: loss {record['final_val_loss_full']:.4f} "
                f"({record['final_val_bpb_full']:.3f} bits/byte), " + (
                    "every token" if scored == total else f"{scored:,} of {total:,} tokens, an "
                    "even fixed subset (trainer.full_eval_tokens)"))
    speed = record["tokens_per_sec"]
    val = (f"accuracy {record['val_accuracy']:.4f}" if "val_accuracy" in record
           else f"{record['val_bpb']:.3f} bits/byte")
    return (f"step {record['step']}: train {record['train_loss']:.4f}, val "
            f"{record['val_loss']:.4f} ({val}), lr "
            f"{record['lr']:.2e}" + (f", {speed:,.0f} tokens/s" if speed else ""))

