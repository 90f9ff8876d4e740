"""The z-loss (PaLM, Chowdhery et al. 2022; Wortsman et al. 2023): trainer.z_loss sets its weight w.
The step minimises cross-entropy + w * mean (log Z)^2 over the real targets, Z = sum_v exp(logit_v)
the softmax's normaliser: it keeps log Z near 0, so that the output logits cannot drift upwards
together. The logged loss stays the cross-entropy; a check step logs the z term beside it (train
record "z_term").
"""

import torch
import torch.distributed as dist

from model.config import IGNORE_INDEX


def z_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The sum over real targets of (log Z)^2. logits (B, T, V), targets (B, T)."""
    log_z = torch.logsumexp(logits.float(), dim=-1)  # (B, T)
    return log_z[targets != IGNORE_INDEX].square().sum()


class ZLoss:
    """The loss term (trainer/build.py's LossTerm) at weight w. It keeps the sum of the step's
    terms for `record`; `clear`, a hook after each step, starts the next step's."""

    def __init__(self, weight: float):
        self.weight, self.total = weight, torch.zeros(())

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """w * z_sum: the term added to a micro-batch's summed cross-entropy."""
        z = self.weight * z_sum(logits, targets)
        self.total = self.total + z.detach()
        return z

    def record(self, n_targets: torch.Tensor) -> dict:
        """A check step's hook: the step's z term per real target, summed over processes."""
        z = self.total.to(n_targets.device) / n_targets
        if dist.is_initialized():
            dist.all_reduce(z)
        return {"z_term": z.item()}

    def clear(self) -> None:
        self.total = torch.zeros(())
