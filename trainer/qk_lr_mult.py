"""W_q's and W_k's own learning rate (optim.qk_lr_mult), for a multiplier other than 1. Under Adam,
scaling=sqrt_dk equals scaling=none with W_q, W_k at d_head^(-1/4) x the init and this multiplier at
d_head^(-1/4) (docs/scaling.md, "The scale under Adam").
"""

from model.gpt import GPT


def qk_groups(groups: list[dict], model: GPT, lr: float, mult: float) -> list[dict]:
    """Each group split in two: its W_q and W_k parameters at the group's LR x mult and weight
    decay / mult (so lr x decay, the shrink a step, is unchanged), the rest as they were. Under
    param=mup the group's LR is muP's lr / m, so W_q and W_k train at lr / m x mult."""
    qk = {id(p) for block in model.blocks
          for p in (*block.attn.q_proj.parameters(), *block.attn.k_proj.parameters())}
    split = []
    for group in groups:
        rest = [p for p in group["params"] if id(p) not in qk]
        mine = [p for p in group["params"] if id(p) in qk]
        split.append({**group, "params": rest})
        if mine:
            split.append({**group, "params": mine, "lr": group.get("lr", lr) * mult,
                          "weight_decay": group["weight_decay"] / mult})
    return split
