"""The training step and the evaluation loss weigh every real target token equally (padded
batches, and data=recall's unmasked batches whose targets are only the answers)."""

import copy
import math
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from data.batching import Batch
from model.config import IGNORE_INDEX, GPTConfig
from model.gpt import GPT
from trainer.build import Compute, TrainState, make_optimizer, step_hooks
from trainer.evaluate import estimate
from trainer.schema import OptimConfig, TrainerConfig
from trainer.step import train_step

VOCAB, T = 20, 8


def model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=1, n_head=2, d_model=16))


def batches() -> list[Batch]:
    """A full micro-batch of 2 x 8 real targets, then one with a single real target."""
    g = torch.Generator().manual_seed(1)
    full_idx = torch.randint(0, VOCAB, (2, T), generator=g)
    full = Batch(full_idx, torch.randint(0, VOCAB, (2, T), generator=g),
                 torch.ones(2, T, dtype=torch.bool))
    valid = torch.zeros(2, T, dtype=torch.bool)
    valid[0, :2] = True                                   # 2 real tokens, 1 real target
    targets = torch.full((2, T), IGNORE_INDEX)
    targets[0, 0] = 3
    sparse = Batch(torch.randint(0, VOCAB, (2, T), generator=g), targets, valid)
    return [full, sparse]


def recall_batches() -> list[Batch]:
    """As data=recall makes them: no valid mask, IGNORE_INDEX but at 3 and 1 answers."""
    g = torch.Generator().manual_seed(2)
    out = []
    for answers in ([(0, 5), (1, 6), (1, 7)], [(0, 7)]):
        targets = torch.full((2, T), IGNORE_INDEX)
        for row, col in answers:
            targets[row, col] = int(torch.randint(0, VOCAB, (), generator=g))
        out.append(Batch(torch.randint(0, VOCAB, (2, T), generator=g), targets, None))
    return out


def token_mean(m: GPT, bs: list[Batch]) -> torch.Tensor:
    """Sum of the token losses over the number of real targets, written out."""
    total, count = 0.0, 0
    for b in bs:
        logits, _ = m(b.idx, valid_mask=b.valid_mask)
        total = total + F.cross_entropy(logits.flatten(0, 1), b.targets.flatten(),
                                        ignore_index=IGNORE_INDEX, reduction="sum")
        count += int((b.targets != IGNORE_INDEX).sum())
    return total / count


class ListBatcher:
    def __init__(self, bs):
        self.bs = list(bs)

    def next(self) -> Batch:
        return self.bs.pop(0)


def test_evaluation_loss_is_the_mean_over_real_targets():
    m = model().eval()
    bs = batches()
    expected = token_mean(m, bs).item()
    per_batch = sum(m(b.idx, b.targets, b.valid_mask)[1].item() for b in bs) / len(bs)
    assert abs(per_batch - expected) > 0.02        # the two weightings really differ here
    assert estimate(m, bs, nullcontext(), torch.device("cpu"))[0] == pytest.approx(
        expected, rel=1e-6)


@pytest.mark.parametrize("make", [batches, recall_batches])
def test_train_step_loss_and_gradient_weigh_tokens_not_micro_batches(make):
    m = model()
    reference = copy.deepcopy(m)
    expected = token_mean(reference, make())
    expected.backward()
    expected_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in reference.parameters()
                                  if p.grad is not None))
    device = torch.device("cpu")
    optim = OptimConfig(warmup_steps=0, grad_clip=0.0)
    optimizer = make_optimizer(m, optim, device)
    state = TrainState(
        model=m, wrapped=m, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False), batcher=ListBatcher(make()))
    compute = Compute(rank=0, world=1, device=device, precision="fp32", autocast=nullcontext())
    loss, grad_norm, _ = train_step(state, compute, optim, TrainerConfig(grad_accum=2))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert grad_norm.item() == pytest.approx(expected_norm, rel=1e-5)


def plain_state(m: GPT, optim: OptimConfig, bs: list[Batch], lr_factor: float = 1.0,
                z_loss: float = 0.0):
    optimizer = make_optimizer(m, optim, torch.device("cpu"))
    return TrainState(
        model=m, wrapped=m, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor),
        scaler=torch.amp.GradScaler("cpu", enabled=False), batcher=ListBatcher(bs),
        hooks=step_hooks(m, optim.qk_clip, TrainerConfig(z_loss=z_loss)))


CPU = Compute(rank=0, world=1, device=torch.device("cpu"), precision="fp32",
              autocast=nullcontext())


def test_z_loss_adds_its_term_to_the_gradient_and_not_to_the_logged_loss():
    """trainer.z_loss = 0.05: the step's gradient is that of CE + 0.05 * mean (log Z)^2 over
    the real targets, log Z = log sum_v exp(logit_v) written out; the returned loss stays the
    cross-entropy, and the z term is reported beside it."""
    z = 0.05
    m = model()
    reference = copy.deepcopy(m)
    bs = batches()
    count = sum(int((b.targets != IGNORE_INDEX).sum()) for b in bs)
    log_z_sq = 0.0
    for b in bs:
        logits, _ = reference(b.idx, valid_mask=b.valid_mask)
        log_z = logits.exp().sum(-1).log()   # (B, T)
        log_z_sq = log_z_sq + log_z[b.targets != IGNORE_INDEX].square().sum()
    ce = token_mean(reference, bs)
    (ce + z * log_z_sq / count).backward()
    expected_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in reference.parameters()
                                  if p.grad is not None))
    optim = OptimConfig(warmup_steps=0, grad_clip=0.0)
    state = plain_state(m, optim, bs, z_loss=z)
    loss, grad_norm, record = train_step(state, CPU, optim, TrainerConfig(grad_accum=2, z_loss=z),
                                         check=True)
    assert loss.item() == pytest.approx(ce.item(), rel=1e-6)
    z_term = record["z_term"]
    assert z_term == pytest.approx(z * log_z_sq.item() / count, rel=1e-5)
    assert z_term > 0.01 * loss.item()   # large enough to change the gradient
    assert grad_norm.item() == pytest.approx(expected_norm, rel=1e-5)
    assert state.hooks.loss_term.total.item() == 0.0   # cleared for the next step
    # without the option the gradient is the cross-entropy's alone, and no z term is reported
    _, plain_norm, record = train_step(plain_state(model(), optim, batches()), CPU, optim,
                                       TrainerConfig(grad_accum=2), check=True)
    assert record == {}
    assert abs(plain_norm.item() - expected_norm) > 1e-3
