"""trainer.diagnostics=true: the attention statistics and the residual stream's size at each
evaluation (eval records) and W_q's and W_k's gradient norms at each check step (train
records); docs/training.md, "Evaluation".
Neither changes what training does: the statistics are taken in eval mode and draw no random
numbers, the norms read the clipped gradients before AdamW steps."""

from dataclasses import asdict, dataclass

import torch

from data.batching import Batch
from model.diagnostics import layer_stats, qk_grad_norms, residual_stats
from model.gpt import GPT

# attn_<key>, per layer, of the per-head statistics: their mean over heads, or the max of
# the maxima; sink_rate's mean is the share of heads, so its mean over layers (the report's
# column) is the model's sink rate as Gu et al. 2024 count it (model/diagnostics.py)
OVER_HEADS = {"entropy": torch.mean, "max_logit": torch.amax, "saturated": torch.mean,
              "raw_var": torch.mean, "raw_max_logit": torch.amax, "first_mass": torch.mean,
              "sink_rate": torch.mean, "sink_weight": torch.mean}


def attention_record(model: GPT, batch: Batch, device: torch.device) -> dict:
    """The attention diagnostics of `batch` per layer; `attn_heads` keeps every head, so that a
    saturating one is not averaged away; and the size of the residual stream per layer."""
    idx, _, valid = batch.to(device)
    stats = layer_stats(model, idx, valid)
    heads = {key: [s[key].tolist() for s in stats] for key in stats[0]}
    if model.config.scaling.name == "learned":
        heads["scale"] = [block.attn.log_scale.detach().exp().tolist() for block in model.blocks]
    if hasattr(model.blocks[0].attn, "qk_clip_count"):   # optim.qk_clip: clips so far per head
        heads["qk_clip_count"] = [block.attn.qk_clip_count.tolist() for block in model.blocks]
    layers = {f"attn_{key}": [reduce(s[key]).item() for s in stats]
              for key, reduce in OVER_HEADS.items() if key in stats[0]}
    hidden = residual_stats(model, idx, valid)
    return {**layers, "attn_heads": heads,
            **{f"hidden_{key}": [s[key].item() for s in hidden] for key in hidden[0]}}


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
