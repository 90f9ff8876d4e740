"""What the teaching layout costs: the default model's training step with W_q, W_k, W_v as three
matrices (model/attention.py) against the same model with one fused q/k/v matrix, the cases
interleaved in one process (scripts/common.py's interleave).

    python scripts/bench_qkv.py                    # 2 threads, 20 rounds of 10 steps
    python scripts/bench_qkv.py --threads 1 --rounds 30

Prints each case's median step and their ratio. The step is forward, backward, clipping and
AdamW on one fixed batch of the default shape (12 x 64 tokens).
"""

import argparse
import statistics

import torch
import torch.nn as nn

from model.attention import MultiHeadAttention
from model.config import GPTConfig
from model.gpt import GPT
from scripts.common import interleave
from trainer.build import make_optimizer
from trainer.schema import OptimConfig


class FusedQKV(MultiHeadAttention):
    """MultiHeadAttention with q, k and v from one (3HD, C) matrix: rows q, then k, then v."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv = nn.Linear(config.d_model, 3 * self.n_head * self.d_head, bias=config.bias)

    def split_heads(self, x: torch.Tensor):
        B, T, _ = x.shape
        H, D = self.n_head, self.d_head
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).split(H * D, dim=2))
        return q, k, v


def stepper(model: GPT, idx: torch.Tensor, targets: torch.Tensor):
    """One training step of `model` on the fixed batch, as a function."""
    optimizer = make_optimizer(model, OptimConfig(), torch.device("cpu"))

    def step() -> None:
        _, loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = GPTConfig(vocab_size=87, bias=False)   # python train.py's model
    models = {}
    for name, attention in (("split", MultiHeadAttention), ("fused", FusedQKV)):
        torch.manual_seed(0)
        models[name] = GPT(config, attention)
    g = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, 87, (12, 64), generator=g) for _ in range(2))
    cases = {name: stepper(m, idx, targets) for name, m in models.items()}
    for case in cases.values():   # warm-up, untimed
        for _ in range(5):
            case()
    times = interleave(cases, args.rounds, args.per_round, torch.device("cpu"))
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    print(f"threads {args.threads}: split {ms['split']:.2f} ms, fused {ms['fused']:.2f} ms, "
          f"split / fused {ms['split'] / ms['fused']:.3f}")


if __name__ == "__main__":
    main()
