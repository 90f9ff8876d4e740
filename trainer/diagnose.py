"""trainer.diagnostics=true: the attention statistics of each evaluation (eval records) and W_q's
and W_k's gradient norms at each check step (train records); docs/training.md, "Evaluation".
Neither changes what training does: the statistics are taken in eval mode and draw no random
numbers, the norms read the clipped gradients before AdamW steps."""

from dataclasses import asdict, dataclass

import torch

from data.batching import Batch
from model.diagnostics import layer_stats, qk_grad_norms
from model.gpt import GPT


def attention_record(model: GPT, batch: Batch, device: torch.device) -> dict:
    """The attention diagnostics of `batch` per layer; `attn_heads` keeps every head, so that a
    saturating one is not averaged away."""
    idx, _, valid = batch.to(device)
    stats = layer_stats(model, idx, valid)
    heads = {key: [s[key].tolist() for s in stats] for key in stats[0]}
    if model.config.scaling.name == "learned":
        heads["scale"] = [block.attn.log_scale.detach().exp().tolist() for block in model.blocks]
    if hasattr(model.blocks[0].attn, "qk_clip_count"):   # optim.qk_clip: clips so far per head
        heads["qk_clip_count"] = [block.attn.qk_clip_count.tolist() for block in model.blocks]
    return {"attn_entropy": [s["entropy"].mean().item() for s in stats],
            "attn_max_logit": [s["max_logit"].max().item() for s in stats],
            "attn_saturated": [s["saturated"].mean().item() for s in stats],
            "attn_raw_var": [s["raw_var"].mean().item() for s in stats],
            "attn_raw_max_logit": [s["raw_max_logit"].max().item() for s in stats],
            "attn_heads": heads}


@dataclass(frozen=True)
class GradNorms:
    """W_q's and W_k's gradient norms after clipping: the mean over layers, and per layer."""

    q_grad_norm: float
    k_grad_norm: float
    q_grad_norm_layers: list[float]
    k_grad_norm_layers: list[float]


def grad_record(model: GPT, n_targets: torch.Tensor) -> dict:
    """A check step's hook (trainer/build.py's StepHooks.records): GradNorms as record fields."""
    q, k = zip(*(qk_grad_norms(block.attn) for block in model.blocks))
    return asdict(GradNorms(sum(q) / len(q), sum(k) / len(k), list(q), list(k)))
