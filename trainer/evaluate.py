"""Evaluation: the losses on fixed batches, the attention diagnostics, and the samples.

Losses are weighted by real target tokens (as in trainer/step.py) and summed over processes.
The attention diagnostics come from `GPT.attention_stats`, which runs in eval mode and draws no
random numbers, so evaluating never changes what training does next.
"""

import math
from pathlib import Path
from typing import Optional

import torch

from model.gpt import IGNORE_INDEX, eval_mode
from trainer import checkpoint
from trainer.build import Run
from trainer.full_eval import full_split_loss
from trainer.step import all_reduce_sum, to_device


@torch.no_grad()
def estimate_loss(model, batches, ctx, device) -> float:
    """Mean loss over every real target of the fixed batches of all processes, in eval mode."""
    total = torch.zeros(2, device=device)   # (sum of token losses, number of real targets)
    with eval_mode(model):
        for batch in batches:
            idx, targets, valid = to_device(batch, device)
            with ctx:
                loss_sum = model(idx, targets, valid, reduction="sum")[1].float()
            total += torch.stack([loss_sum, (targets != IGNORE_INDEX).sum().float()])
    loss_sum, count = all_reduce_sum(total).tolist()
    return loss_sum / count


def attention_record(r: Run) -> dict:
    """Per-layer attention diagnostics on the first fixed validation batch: mean entropy over
    heads, max |logit| over heads, mean fraction of saturated rows over heads, and for the raw
    scores q.k before the scale: mean Var(q.k) / d_head over heads and max |q.k| over heads."""
    idx, _, valid = to_device(r.val_batches[0], r.device)
    stats = r.raw.attention_stats(idx, valid)
    return {"attn_entropy": [s["entropy"].mean().item() for s in stats],
            "attn_max_logit": [s["max_logit"].max().item() for s in stats],
            "attn_saturated": [s["saturated"].mean().item() for s in stats],
            "attn_raw_var": [s["raw_var"].mean().item() for s in stats],
            "attn_raw_max_logit": [s["raw_max_logit"].max().item() for s in stats]}


def evaluate(r: Run, step: int, lr: float,
             tokens_per_sec: Optional[float]) -> tuple[dict, bool]:
    """The eval record of `step` (diagnostics on rank 0 only) and whether val_loss is the best
    so far; updates r.state (best, final and initial validation loss)."""
    val_loss = estimate_loss(r.model, r.val_batches, r.ctx, r.device)
    record = {"kind": "eval", "step": step,
              "train_loss": estimate_loss(r.model, r.train_batches, r.ctx, r.device),
              "val_loss": val_loss,
              "val_bpb": val_loss / math.log(2) / r.data.meta["bytes_per_token"]["val"],
              "lr": lr, "tokens_per_sec": tokens_per_sec}
    r.state["final_val_loss"] = val_loss
    if step == 0:
        r.state["init_val_loss"] = val_loss
    improved = math.isfinite(val_loss) and val_loss < r.state["best_val_loss"]
    if improved:
        r.state["best_val_loss"], r.state["best_step"] = val_loss, step
    if r.rank == 0:
        record.update(attention_record(r))
    return record, improved


def evaluate_full(r: Run) -> dict:
    """The final model on the whole validation split (trainer/full_eval.py), capped at
    trainer.full_eval_tokens targets: summary.json's *_full fields."""
    full = full_split_loss(r.raw, r.data.val, block_size=r.model_cfg.block_size,
                           batch_size=max(1, r.tc.batch_size // r.world), device=r.device,
                           autocast=r.ctx, max_tokens=r.tc.full_eval_tokens, rank=r.rank,
                           world=r.world)
    return {"final_val_loss_full": full.loss,
            "final_val_bpb_full": full.loss / math.log(2) / r.data.meta["bytes_per_token"]["val"],
            "full_eval_targets": full.targets, "full_eval_split_targets": full.split_targets}


def describe_full(full: dict) -> str:
    """One line for the terminal: the whole-split numbers and how much of the split they cover."""
    scored, total = full["full_eval_targets"], full["full_eval_split_targets"]
    cover = ("every token" if scored == total else
             f"{scored:,} of {total:,} tokens, an even fixed subset (trainer.full_eval_tokens)")
    return (f"whole validation split: loss {full['final_val_loss_full']:.4f} "
            f"({full['final_val_bpb_full']:.3f} bits/byte), {cover}")


def describe(record: dict) -> str:
    """One line for the terminal."""
    speed = record["tokens_per_sec"]
    return (f"step {record['step']}: train {record['train_loss']:.4f}, val "
            f"{record['val_loss']:.4f} ({record['val_bpb']:.3f} bits/byte), lr "
            f"{record['lr']:.2e}" + (f", {speed:,.0f} tokens/s" if speed else ""))


def write_samples(r: Run, run_dir: Path, best: Path) -> None:
    """samples.txt: one continuation per trainer.sample_prompts, from the weights of `best`
    (best.pt; the current weights if no evaluation improved on the first)."""
    if best.exists():
        r.raw.load_state_dict(checkpoint.read(best)["model"])
    gen = torch.Generator(device=r.device).manual_seed(r.tc.seed)
    r.raw.eval()
    outs = r.raw.generate(r.prompts, r.tc.sample_tokens, temperature=r.tc.sample_temperature,
                          top_k=r.tc.sample_top_k, pad_id=r.data.pad_id, generator=gen)
    text = "".join(f"--- prompt {p!r} ---\n{p}{r.data.decode(o)}\n\n"
                   for p, o in zip(r.tc.sample_prompts, outs))
    (run_dir / "samples.txt").write_text(text)
