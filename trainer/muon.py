"""optim=muon: Muon (Jordan et al. 2024) for the matrices inside the blocks, AdamW for the rest,
stepped as one optimizer (docs/training.md, "Optimiser"; docs/scaling.md, section 10).

Muon updates a matrix by its momentum made semi-orthogonal (a few Newton-Schulz iterations), so
every singular value of the update is about the same. It is an optimizer for 2-D hidden
weights: the embeddings (the tied read-out among them), biases, norm gains, learned scales and
sink logits stay on AdamW, as nanochat, modded-nanogpt and Moonlight keep them.
optim.muon_params picks Muon's parameters by name; by default they are muP's hidden matrices,
every 2-D parameter inside the blocks: W_q, W_k, W_v, the attention output, MLP in and out.
W_q, W_k and W_v are three matrices (model/attention.py), so each is orthogonalised alone, as
nanochat's c_q, c_k, c_v are: W_q's and W_k's updates do not depend on W_v's gradient, which the
reparameterisation of docs/scaling.md, section 10 needs (tests/trainer/test_muon.py holds it,
and shows that one fused q, k, v matrix would break it).

The Newton-Schulz iterations run in the run's precision: under bf16 and fp16 in bfloat16, by
torch.optim.Muon itself; under fp32 in float32, by Float32Muon, PyTorch's step with float32 for
its bfloat16 and the same-shape matrices stacked. On a CPU without bfloat16 units bfloat16
products are several times slower than float32's (docs/benchmarks.md, "Muon against AdamW").
"""

from fnmatch import fnmatchcase

import torch
from torch import Tensor
from torch.optim._muon import _adjust_lr

from model.errors import ConfigError, invalid
from model.gpt import GPT
from model.mup import hidden_matrices
from trainer.schema import OptimConfig


def muon_parameters(model: GPT, optim_cfg: OptimConfig) -> list[torch.nn.Parameter]:
    """The parameters optim.muon_params routes to Muon (null: muP's hidden matrices). Refused:
    a pattern that names no parameter, a parameter that is not a matrix, and param=mup with
    optim.adjust_lr_fn=match_rms_adamw."""
    if model.config.param.name == "mup" and optim_cfg.adjust_lr_fn == "match_rms_adamw":
        raise ConfigError(
            "optim.adjust_lr_fn=match_rms_adamw cannot work with param=mup: it multiplies each "
            "Muon update by 0.2 sqrt(max(rows, cols)), which grows with d_model, so the "
            "update's spectral norm grows as sqrt(m) and an LR tuned at param.base_width does "
            "not carry over to other widths (muP's spectral condition, Yang, Simon & Bernstein "
            "2023). Use optim.adjust_lr_fn=original, whose sqrt(max(1, rows/cols)) depends only "
            "on each matrix's aspect ratio, or param=sp.")
    patterns = optim_cfg.muon_params
    if patterns is None:
        return hidden_matrices(model)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    unmatched = [pat for pat in patterns if not any(fnmatchcase(n, pat) for n, _ in named)]
    if unmatched:
        raise invalid("optim.muon_params", patterns, f"{unmatched} name no parameter of this "
                      "model. Its parameters are named as model.named_parameters() gives them, "
                      "e.g. blocks.0.attn.q_proj.weight, blocks.0.mlp.fc.weight, wte.weight; "
                      "fix the pattern (* matches any text, dots included), or use null for "
                      "every 2-D parameter inside the blocks.")
    chosen = [(n, p) for n, p in named if any(fnmatchcase(n, pat) for pat in patterns)]
    vectors = [f"{n} {tuple(p.shape)}" for n, p in chosen if p.dim() != 2]
    if vectors:
        listed = ", ".join(vectors[:2]) + (f" and {len(vectors) - 2} more" if vectors[2:] else "")
        raise invalid("optim.muon_params", patterns, f"it routes {listed} to Muon, "
                      "which updates 2-D matrices only (it orthogonalises each update, and a "
                      "vector has no matrix to orthogonalise). Narrow the patterns to weight "
                      "matrices, e.g. [blocks.*.attn.*_proj.weight,blocks.*.mlp.*.weight], and "
                      "leave biases, gains and scales to AdamW.")
    return [p for _, p in chosen]


def with_muon(adamw: torch.optim.AdamW, params: list[torch.nn.Parameter], model: GPT,
              optim_cfg: OptimConfig, precision: str) -> "MuonAdamW":
    """`adamw` (the other parameters' groups, built by trainer.build.make_optimizer) and Muon
    for `params`: at optim.muon_lr and muon_weight_decay, at every width under param=mup too
    (Muon's update has the spectral size muP asks for, docs/scaling.md, section 9), W_q and W_k
    at x optim.qk_lr_mult and / it; Newton-Schulz in float32 when `precision` is fp32."""
    groups = [{"params": params, "lr": optim_cfg.muon_lr,
               "weight_decay": optim_cfg.muon_weight_decay}]
    if optim_cfg.qk_lr_mult != 1.0:
        from trainer.qk_lr_mult import qk_groups
        groups = qk_groups(groups, model, optim_cfg.muon_lr, optim_cfg.qk_lr_mult)
    muon_class = Float32Muon if precision == "fp32" else torch.optim.Muon
    muon = muon_class([g for g in groups if g["params"]], lr=optim_cfg.muon_lr,
                      weight_decay=optim_cfg.muon_weight_decay, momentum=optim_cfg.momentum,
                      nesterov=optim_cfg.nesterov, ns_steps=optim_cfg.ns_steps,
                      adjust_lr_fn=optim_cfg.adjust_lr_fn)
    return MuonAdamW(adamw, muon)


class MuonAdamW(torch.optim.Optimizer):
    """AdamW and Muon stepped as one optimizer. param_groups lists both's groups, the same
    dicts (AdamW's first: the first group's LR is optim.lr's, the one train records log), so
    the LR schedule, the gradient scaler and zero_grad reach every parameter through it;
    state_dict holds each optimizer's own."""

    def __init__(self, adamw: torch.optim.AdamW, muon: torch.optim.Muon):
        self.adamw, self.muon = adamw, muon
        super().__init__([*adamw.param_groups, *muon.param_groups], {})

    @property
    def name(self) -> str:   # for the run's start line
        return f"{type(self.muon).__name__} + AdamW"

    @torch.no_grad()
    def step(self, closure=None) -> None:
        self.adamw.step()
        self.muon.step()

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.adamw.load_state_dict(state_dict["adamw"])
        self.muon.load_state_dict(state_dict["muon"])
        # loading gives each optimizer new group dicts: the schedule must set their LRs
        self.param_groups = [*self.adamw.param_groups, *self.muon.param_groups]


class Float32Muon(torch.optim.Muon):
    """torch.optim.Muon with its Newton-Schulz iterations in float32 (`ns_dtype`, bfloat16 in
    PyTorch's), run on each stack of same-shape matrices at once (as nanochat stacks them):
    PyTorch's step (torch/optim/_muon.py, _single_tensor_muon) otherwise line for line. Its
    state is PyTorch's (a momentum buffer per matrix), so a checkpoint is either's; with
    bfloat16 for ns_dtype its weights are torch.optim.Muon's bit for bit (on the CPU)."""

    ns_dtype = torch.float32

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"].lerp_(p.grad, 1 - momentum)   # mu B + (1 - mu) g
                updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
            for stack in self.stacks([p.shape for p in params]):
                orthogonal = newton_schulz(torch.stack([updates[i] for i in stack]),
                                           group["ns_coefficients"], group["ns_steps"],
                                           group["eps"], self.ns_dtype)   # (N, R, C)
                for i, update in zip(stack, orthogonal):
                    p = params[i]
                    p.mul_(1 - lr * group["weight_decay"])   # decoupled weight decay
                    p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))

    @staticmethod
    def stacks(shapes: list[torch.Size]) -> list[list[int]]:
        """The matrices orthogonalised together: the indices of each shape, in order."""
        found: dict[torch.Size, list[int]] = {}
        for i, shape in enumerate(shapes):
            found.setdefault(shape, []).append(i)
        return list(found.values())


def newton_schulz(G: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> Tensor:
    """G (N, R, C): each of N matrices made about semi-orthogonal in `dtype`, by
    X <- a X + (b A + c A^2) X, A = X X^T, from X = G / |G|_F (every singular value at most 1).
    PyTorch's _zeropower_via_newtonschulz, for one matrix in bfloat16, batched."""
    a, b, c = coefficients
    wide = G.size(-2) <= G.size(-1)
    X = G.to(dtype) if wide else G.to(dtype).mT   # (N, r, n), r <= n: A is the smaller Gram
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT                                   # (N, r, n) @ (N, n, r) -> (N, r, r)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)    # b A + c A @ A
        X = torch.baddbmm(X, B, X, beta=a)             # a X + B @ X: (N, r, r) @ (N, r, n)
    return X if wide else X.mT
