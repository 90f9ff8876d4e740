"""muP's width rules (Yang et al. 2022, Tensor Programs V; docs/scaling.md, section 9), for
param=mup (GPT.__init__ and trainer.build.make_optimizer) and param.zero_query=true. With m =
d_model / param.base_width, the hidden matrices start at GPT-2's std / sqrt(m) and train at AdamW's
lr / m with weight decay * m; the query projection may start at zero. The read-out multiplier,
output_mult / m, is one line of GPT.forward.
"""

import math

import torch
import torch.nn as nn


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """muP's "hidden" matrices of a GPT: every 2-D parameter inside its blocks (q, k, v,
    attention output, MLP in and out, model.attn_gate's W_g, and whatever matrix a block gains
    next), derived, not listed. Outside the blocks are the embeddings (the tied read-out among
    them), whose vocabulary or position side does not grow with d_model; inside, norm gains,
    biases and per-head scales are vectors. What the LR / m rule needs is a fan-in that grows
    with d_model: Adam's rule for hidden and output weights alike (Yang et al. 2022, Table 3)."""
    return [p for block in model.blocks for p in block.parameters() if p.dim() == 2]


@torch.no_grad()
def init_width(model: nn.Module) -> None:
    """param's initialisation on top of GPT-2's: the hidden matrices' std divided by sqrt(m),
    so each one's output keeps its size as the fan-in grows (sp's draws, scaled, so the random
    stream is sp's); with param.zero_query each layer's W_q at zero, so that
    every logit is 0 and attention uniform at step 0, as Yang et al. 2022 recommend."""
    config = model.config
    if config.width_mult != 1.0:
        for weight in hidden_matrices(model):
            weight.mul_(1.0 / math.sqrt(config.width_mult))
    if config.param.zero_query:
        for block in model.blocks:
            block.attn.q_proj.weight.zero_()


def param_groups(params: list[nn.Parameter], model: nn.Module, lr: float,
                 weight_decay: float) -> list[dict]:
    """muP's AdamW groups (mup's MuAdam): the embeddings (the tied read-out among them) and the
    vectors at lr, the hidden matrices at lr / m with weight decay * m. AdamW shrinks a weight
    by its LR times its decay a step, so theirs stays SP's at the base width. The first group
    has optim.lr, the LR the train records log."""
    m, hidden = model.config.width_mult, {id(w) for w in hidden_matrices(model)}
    return [{"params": [p for p in params if p.dim() >= 2 and id(p) not in hidden],
             "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            {"params": [p for p in params if id(p) in hidden], "lr": lr / m,
             "weight_decay": weight_decay * m}]
