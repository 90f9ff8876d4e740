"""QK-Clip (trainer/qk_clip.py, optim.qk_clip) against a hand computation: the max logit comes
from the step's own forward, a clipped head's W_q and W_k rows shrink by sqrt(tau / max) so
its largest logit on the same input becomes tau, other heads and v are untouched; the option
is refused where it cannot work."""

import math
from contextlib import nullcontext

import pytest
import torch

from data.batching import Batch
from model.config import GPTConfig, ScalingConfig
from model.errors import ConfigError
from model.gpt import GPT
from trainer import qk_clip
from trainer.build import Compute, TrainState, make_optimizer, step_hooks
from trainer.schema import OptimConfig, TrainerConfig
from trainer.step import train_step

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, T, H, D, TAU = 13, 8, 2, 8, 5.0


class OneBatch:
    def __init__(self, batch):
        self.batch = batch

    def next(self) -> Batch:
        return self.batch


def hot_model(scaling: str = "sqrt_dk") -> GPT:
    """Head 0's q and k rows scaled up 50x each so that its logits exceed TAU; head 1 keeps
    GPT-2's small initial ones."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=1, n_head=H, d_model=16,
                          d_head=D, scaling=ScalingConfig(scaling)))
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight[:D].mul_(50.0)  # head 0's q rows
        model.blocks[0].attn.k_proj.weight[:D].mul_(50.0)  # head 0's k rows
    return model


def batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, T), generator=g)
    return Batch(idx, torch.randint(0, VOCAB, (2, T), generator=g), None)


def max_logits_by_hand(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Per head, max over causal entries of s q.k of the attention's input, written out."""
    attn, seen = model.blocks[0].attn, []
    hook = attn.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    with torch.no_grad():
        model(idx)
    hook.remove()
    with torch.no_grad():
        q, k, _ = attn.split_heads(seen[0])  # (B, H, T, D)
    logits = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3))


def step(model: GPT, tau: float = TAU) -> None:
    """Arm `model` for QK-Clip at tau as a run does (trainer.build.step_hooks), then one
    train_step at learning rate 0: the weights change by the clip alone."""
    optim = OptimConfig(lr=1e-3, warmup_steps=0, qk_clip=tau)
    optimizer = make_optimizer(model, optim, torch.device("cpu"))
    state = TrainState(model, model, optimizer,
                       torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.0),
                       torch.amp.GradScaler("cpu", enabled=False), OneBatch(batch()),
                       step_hooks(model, optim.qk_clip, TrainerConfig()))
    compute = Compute(0, 1, torch.device("cpu"), "fp32", nullcontext())
    train_step(state, compute, optim, TrainerConfig())


def test_a_clipped_head_ends_at_tau_and_the_others_are_untouched():
    model = hot_model()
    attn = model.blocks[0].attn
    projs = attn.q_proj, attn.k_proj, attn.v_proj
    before = [p.weight.detach().clone() for p in projs]  # W_q, W_k, W_v: (HD, C) each
    bias = [p.bias.detach().clone() for p in projs]
    expected = max_logits_by_hand(model, batch().idx)
    assert expected[0] > 4 * TAU and expected[1] < TAU   # one head over, one under
    step(model)
    factor = math.sqrt(TAU / expected[0].item())
    (w_q, w_k, w_v), (b_q, b_k, _) = ([getattr(p, n).detach() for p in projs]
                                      for n in ("weight", "bias"))
    assert torch.allclose(w_q[:D], before[0][:D] * factor, rtol=1e-5)    # head 0's q rows
    assert torch.allclose(w_k[:D], before[1][:D] * factor, rtol=1e-5)    # head 0's k rows
    assert torch.equal(w_q[D:], before[0][D:])                            # head 1's q rows
    assert torch.equal(w_k[D:], before[1][D:])                            # head 1's k rows
    assert torch.equal(w_v, before[2])                                    # v untouched
    assert torch.allclose(b_q[:D], bias[0][:D] * factor, rtol=1e-5)
    assert torch.allclose(b_k[:D], bias[1][:D] * factor, rtol=1e-5)
    assert torch.isinf(attn.max_logit).all()   # reset for the next step
    after = max_logits_by_hand(model, batch().idx)
    assert after[0].item() == pytest.approx(TAU, rel=1e-4)
    assert after[1].item() == pytest.approx(expected[1].item(), rel=1e-6)
    assert [block.attn.qk_clip_count.tolist() for block in model.blocks] == [[1, 0]]


def test_the_max_is_the_step_forwards_own_and_evaluation_does_not_touch_it():
    model = hot_model()
    qk_clip.setup(model, 1e9)   # never clips: the running max stays readable
    attn = model.blocks[0].attn
    expected = max_logits_by_hand(model, batch().idx)
    model.train()
    model(batch().idx)
    assert torch.allclose(attn.max_logit, expected, rtol=1e-5)
    model.eval()
    model(batch().idx * 0)   # an evaluation forward: not part of the step
    assert torch.allclose(attn.max_logit, expected, rtol=1e-5)


def test_a_step_without_the_option_leaves_the_weights_to_adamw():
    model = hot_model()
    attn = model.blocks[0].attn
    before = [p.weight.detach().clone() for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    optim = OptimConfig(lr=1e-3, warmup_steps=0)
    optimizer = make_optimizer(model, optim, torch.device("cpu"))
    state = TrainState(model, model, optimizer,
                       torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.0),
                       torch.amp.GradScaler("cpu", enabled=False), OneBatch(batch()))
    train_step(state, Compute(0, 1, torch.device("cpu"), "fp32", nullcontext()), optim,
               TrainerConfig())
    for p, w in zip((attn.q_proj, attn.k_proj, attn.v_proj), before):
        assert torch.equal(p.weight.detach(), w)
    assert not hasattr(attn, "max_logit")


@pytest.mark.parametrize("scaling, why", [("qk_norm", "a norm on q and k per head undoes"),
                                          ("uniform", "no logits")])
def test_refused_where_it_cannot_bound_the_logits(scaling, why):
    with pytest.raises(ConfigError, match=why):
        qk_clip.setup(hot_model(scaling), TAU)


def test_refused_with_a_norm_on_q_and_k_under_any_scale():
    """scaling.qk_norm normalises q and k per head: rows of W_q and W_k scaled by a factor
    leave the normalised q and k, so the logits, as they were."""
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=1, n_head=H, d_model=16,
                          d_head=D, scaling=ScalingConfig("constant", qk_norm="rmsnorm")))
    with pytest.raises(ConfigError, match="cannot work with scaling=constant "
                       "scaling.qk_norm=rmsnorm: a norm on q and k per head undoes"):
        qk_clip.setup(model, TAU)


@pytest.mark.parametrize("model_keys, why", [({"pos": "rope"}, "model.pos=rope"),
                                             ({"scaling": ScalingConfig(length="log_n")},
                                              "scaling.length=log_n")])
def test_refused_where_the_logits_change_after_its_hooks(model_keys, why):
    """RoPE and a length factor change q after W_q: the hooks' max is not softmax's."""
    model = GPT(GPTConfig(**{"vocab_size": VOCAB, "block_size": T, "n_layer": 1, "n_head": H,
                             "d_model": 16, "d_head": D, **model_keys}))
    with pytest.raises(ConfigError, match=why):
        qk_clip.setup(model, TAU)


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf])
def test_threshold_must_be_positive(value):
    with pytest.raises(ConfigError, match="optim.qk_clip"):
        OptimConfig(qk_clip=value)


@pytest.mark.parametrize("value", [-1e-4, math.nan])
def test_z_loss_must_be_non_negative(value):
    with pytest.raises(ConfigError, match="trainer.z_loss"):
        TrainerConfig(z_loss=value)
