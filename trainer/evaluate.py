"""Evaluation: the losses on fixed batches, the attention diagnostics, and the samples.

Losses are weighted by real target tokens (as in trainer/step.py) and summed over processes.
The attention diagnostics come from `GPT.attention_stats`, which runs in eval mode and draws no
random numbers, so evaluating never changes what training does next.
"""

import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Optional

import torch

from data.recall import RecallData, validation_batches
from model.gpt import GPT, IGNORE_INDEX, eval_mode
from trainer import checkpoint
from trainer.build import Run, all_reduce_sum
from trainer.full_eval import full_split_loss
from trainer.step import to_device


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """A loss in nats per token as bits per byte of text: comparable across tokenizers."""
    return loss / math.log(2) / bytes_per_token


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, batches, autocast: AbstractContextManager,
                  device: torch.device) -> float:
    """Mean loss over every real target of the fixed batches of all processes, in eval mode."""
    total = torch.zeros(2, device=device)   # (sum of token losses, number of real targets)
    with eval_mode(model):
        for batch in batches:
            idx, targets, valid = to_device(batch, device)
            with autocast:
                loss_sum = model(idx, targets, valid, reduction="sum")[1].float()
            total += torch.stack([loss_sum, (targets != IGNORE_INDEX).sum().float()])
    loss_sum, count = all_reduce_sum(total).tolist()
    return loss_sum / count


def accuracy_counts(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[correct, answered] over the real targets: logits (B, T, V), targets (B, T)."""
    answered = targets != IGNORE_INDEX
    correct = (logits.argmax(-1) == targets) & answered
    return torch.stack([correct.sum(), answered.sum()]).float()


@torch.no_grad()
def estimate_accuracy(model: torch.nn.Module, batches, autocast: AbstractContextManager,
                      device: torch.device) -> float:
    """Share of the real targets of the batches of all processes whose most likely token (the
    argmax of the logits) is the target: for recall, the share of answered queries right."""
    total = torch.zeros(2, device=device)   # (correct, answered)
    with eval_mode(model):
        for batch in batches:
            idx, targets, valid = to_device(batch, device)
            with autocast:
                logits = model(idx, valid_mask=valid)[0]
            total += accuracy_counts(logits, targets)
    correct, answered = all_reduce_sum(total).tolist()
    return correct / answered


def val_bpb(run: Run, loss: float) -> Optional[float]:
    """Bits per byte of a validation loss; None for a generated task, which has no bytes."""
    per_token = run.data.meta.get("bytes_per_token")
    return bits_per_byte(loss, per_token["val"]) if per_token else None


def attention_record(model: GPT, batch, device: torch.device) -> dict:
    """Per-layer attention diagnostics on `batch`: mean entropy over heads, max |logit| over
    heads, mean fraction of saturated rows over heads, and for the raw scores q.k before the
    scale: mean Var(q.k) / d_head over heads and max |q.k| over heads. `attn_heads` keeps every
    head, so that one saturating head is not averaged away: {statistic: [[per head] per layer]},
    plus `scale`, the learned g_h = exp(log_scale[h]), for scaling=learned."""
    idx, _, valid = to_device(batch, device)
    stats = model.attention_stats(idx, valid)
    heads = {key: [s[key].tolist() for s in stats] for key in stats[0]}
    if model.config.scaling.name == "learned":
        heads["scale"] = [block.attn.log_scale.detach().exp().tolist() for block in model.blocks]
    return {"attn_entropy": [s["entropy"].mean().item() for s in stats],
            "attn_max_logit": [s["max_logit"].max().item() for s in stats],
            "attn_saturated": [s["saturated"].mean().item() for s in stats],
            "attn_raw_var": [s["raw_var"].mean().item() for s in stats],
            "attn_raw_max_logit": [s["raw_max_logit"].max().item() for s in stats],
            "attn_heads": heads}


def evaluate(run: Run, step: int, lr: float,
             tokens_per_sec: Optional[float]) -> tuple[dict, bool]:
    """The eval record of `step` (diagnostics on rank 0 only) and whether val_loss is the best
    so far; updates the run's progress (best, final and initial validation loss)."""
    model, compute, progress = run.state.model, run.compute, run.state.progress
    val_loss, train_loss = (estimate_loss(model, run.eval_batches[split], compute.autocast,
                                          compute.device) for split in ("val", "train"))
    record = {"kind": "eval", "step": step, "train_loss": train_loss, "val_loss": val_loss,
              "val_bpb": val_bpb(run, val_loss), "lr": lr, "tokens_per_sec": tokens_per_sec}
    if isinstance(run.data, RecallData):
        record["val_accuracy"] = estimate_accuracy(model, run.eval_batches["val"],
                                                   compute.autocast, compute.device)
    progress.final_val_loss = val_loss
    if step == 0:
        progress.init_val_loss = val_loss
    improved = math.isfinite(val_loss) and val_loss < progress.best_val_loss
    if improved:
        progress.best_val_loss, progress.best_step = val_loss, step
    if compute.rank == 0:
        record.update(attention_record(model, run.eval_batches["val"][0], compute.device))
    return record, improved


def evaluate_full(run: Run) -> dict:
    """The final model on the whole validation split (trainer/full_eval.py), capped at
    trainer.full_eval_tokens targets: summary.json's *_full fields."""
    compute, train_cfg = run.compute, run.config.train_cfg
    if isinstance(run.data, RecallData):
        return evaluate_recall_full(run)
    full = full_split_loss(run.state.model, run.data.val,
                           block_size=run.config.model_cfg.block_size,
                           batch_size=max(1, train_cfg.batch_size // compute.world),
                           device=compute.device, autocast=compute.autocast,
                           max_tokens=train_cfg.full_eval_tokens, rank=compute.rank,
                           world=compute.world)
    return {"final_val_loss_full": full.loss,
            "final_val_bpb_full": val_bpb(run, full.loss),
            "full_eval_targets": full.targets, "full_eval_split_targets": full.split_targets}


def evaluate_recall_full(run: Run) -> dict:
    """The final model on the whole recall validation set: the loss over its targets (the
    answers) and the share of them predicted right."""
    compute, data_cfg = run.compute, run.config.data_cfg
    batches = validation_batches(data_cfg, batch_size=run.config.train_cfg.batch_size,
                                 rank=compute.rank, world_size=compute.world)
    loss = estimate_loss(run.state.model, batches, compute.autocast, compute.device)
    accuracy = estimate_accuracy(run.state.model, batches, compute.autocast, compute.device)
    answers = int(all_reduce_sum(torch.tensor(
        float(sum((b.targets != IGNORE_INDEX).sum().item() for b in batches)),
        device=compute.device)).item())
    return {"final_val_loss_full": loss, "final_val_bpb_full": None,
            "full_eval_targets": answers, "full_eval_split_targets": answers,
            "final_val_accuracy": accuracy}


def describe_full(full: dict) -> str:
    """One line for the terminal: the whole-split numbers and how much of the split they cover."""
    scored, total = full["full_eval_targets"], full["full_eval_split_targets"]
    cover = ("every token" if scored == total else
             f"{scored:,} of {total:,} tokens, an even fixed subset (trainer.full_eval_tokens)")
    if "final_val_accuracy" in full:
        return (f"whole validation set: loss {full['final_val_loss_full']:.4f}, accuracy "
                f"{full['final_val_accuracy']:.4f} over {total:,} answers")
    return (f"whole validation split: loss {full['final_val_loss_full']:.4f} "
            f"({full['final_val_bpb_full']:.3f} bits/byte), {cover}")


def describe(record: dict) -> str:
    """One line for the terminal."""
    speed = record["tokens_per_sec"]
    val = (f"accuracy {record['val_accuracy']:.4f}" if "val_accuracy" in record
           else f"{record['val_bpb']:.3f} bits/byte")
    return (f"step {record['step']}: train {record['train_loss']:.4f}, val "
            f"{record['val_loss']:.4f} ({val}), lr "
            f"{record['lr']:.2e}" + (f", {speed:,.0f} tokens/s" if speed else ""))


def write_samples(run: Run, run_dir: Path, best: Path) -> None:
    """samples.txt: one continuation per trainer.sample_prompts, from the weights of `best`
    (best.pt; the current weights if no evaluation improved on the first)."""
    model, train_cfg = run.state.model, run.config.train_cfg
    if best.exists():
        model.load_state_dict(checkpoint.read(best)["model"])
    gen = torch.Generator(device=run.compute.device).manual_seed(train_cfg.seed)
    with eval_mode(model):
        outs = model.generate(run.prompts, train_cfg.sample_tokens,
                              temperature=train_cfg.sample_temperature,
                              top_k=train_cfg.sample_top_k, pad_id=run.data.pad_id,
                              generator=gen)
    text = "".join(f"--- prompt {p!r} ---\n{p}{run.data.decode(o)}\n\n"
                   for p, o in zip(train_cfg.sample_prompts, outs))
    (run_dir / "samples.txt").write_text(text)
