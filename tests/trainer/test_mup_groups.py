"""param=mup where the run is built (trainer/build.py make_optimizer, the `param` group): its
AdamW groups per parameter name, its equality with sp at the base width, and a run."""

import json
import math

import pytest
import torch
from conftest import derive, make_config

import train
from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.gpt import GPT
from trainer.build import make_optimizer, pick_device
from trainer.schema import OptimConfig

pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.usefixtures("no_fsync")]

VOCAB = 17
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.1)


def model(param: ParamConfig, d_model: int, scaling: str = "sqrt_dk", bias: bool = True) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=8, n_layer=2, n_head=2, d_model=d_model,
                         bias=bias, scaling=ScalingConfig(name=scaling), param=param))


def train_steps(net: GPT, steps: int) -> list[torch.Tensor]:
    """The logits before each of `steps` AdamW steps (make_optimizer's groups) on one batch."""
    optimizer = make_optimizer(net, OPTIM, pick_device("cpu"))
    tokens = torch.randint(VOCAB, (4, 9), generator=torch.Generator().manual_seed(1))
    seen = []
    for _ in range(steps):
        logits, loss = net(tokens[:, :-1], tokens[:, 1:])
        seen.append(logits.detach())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return seen


def test_mup_at_the_base_width_without_zero_query_is_sp_exactly():
    """m = 1, scaling=sqrt_dk, param.zero_query=false: the same logits at step 0 and the same
    weights, bit for bit, after each of 3 steps (mup's three groups hold sp's LR and decay)."""
    sp = model(ParamConfig(name="sp"), 32)
    mup = model(ParamConfig(name="mup", base_width=32, zero_query=False), 32)
    for before_sp, before_mup in zip(train_steps(sp, 3), train_steps(mup, 3)):
        assert torch.equal(before_sp, before_mup)
    for (name, p_sp), (_, p_mup) in zip(sp.named_parameters(), mup.named_parameters()):
        assert torch.equal(p_sp, p_mup), name
    assert len(make_optimizer(mup, OPTIM, pick_device("cpu")).param_groups) == 3


HIDDEN = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.proj.weight",
          "mlp.fc.weight", "mlp.proj.weight")


@pytest.mark.parametrize("scaling", ["qk_norm", "learned"])
def test_mup_groups_carry_lr_over_m_for_hidden_matrices_only(scaling):
    """m = 4: by parameter name, the hidden matrices at lr / 4 with decay 0.1 * 4 (AdamW's
    per-step shrink lr * decay unchanged), the embeddings (the tied read-out) at lr with decay
    0.1, the vectors (LayerNorm gains, biases, qk_norm gains, learned's log-scale) at lr without
    decay; every parameter in one group; a schedule keeps the ratio."""
    net = model(ParamConfig(name="mup", base_width=16), 64, scaling)
    optimizer = make_optimizer(net, OPTIM, pick_device("cpu"))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert len(group_of) == sum(len(g["params"]) for g in optimizer.param_groups)
    names = dict(net.named_parameters())
    assert {"wte.weight", "wpe.weight"} <= set(names) and "lm_head.weight" not in names  # tied
    vectors = [n for n in names if names[n].dim() == 1]
    assert any(("q_norm" in n or "log_scale" in n) for n in vectors)
    assert any(n.endswith(".bias") for n in vectors)
    for name, p in names.items():
        group = group_of[id(p)]
        if name.startswith("blocks.") and name.endswith(HIDDEN):
            want = (1e-2 / 4, 0.1 * 4)
        elif name in ("wte.weight", "wpe.weight"):
            want = (1e-2, 0.1)
        else:
            assert p.dim() == 1, name
            want = (1e-2, 0.0)
        assert (group["lr"], group["weight_decay"]) == pytest.approx(want), name
    assert optimizer.param_groups[0]["lr"] == 1e-2   # the LR train.py logs
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5)   # as build() schedules
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([5e-3, 5e-3, 5e-3 / 4])


def test_param_group_composes_and_a_mup_run_trains(tiny_cfg, tmp_path):
    """`param=mup` composes to ParamConfig's defaults but the name; a tiny run under mup at
    m = 2 with `dk` trains and records param and the filled-in attn_mult in run.json."""
    composed = make_config(["param=mup"]).param
    assert dict(composed) == {"name": "mup", "base_width": 128, "output_mult": 1.0,
                              "zero_query": None}
    assert dict(make_config([]).param)["name"] == "sp"
    cfg = derive(tiny_cfg, ["param.name=mup", "param.base_width=16", "scaling.name=dk",
                            "trainer.max_steps=4"])   # tiny's d_model 32, 2 heads of 16
    summary = train.train(cfg, tmp_path / "run")
    assert summary["steps"] == 4 and not summary["diverged"]
    assert summary["best_val_loss"] < summary["init_val_loss"]
    model_config = json.loads((tmp_path / "run" / "run.json").read_text())["model_config"]
    assert model_config["param"] == {"name": "mup", "base_width": 16, "output_mult": 1.0,
                                     "zero_query": True}
    assert model_config["scaling"]["attn_mult"] == pytest.approx(math.sqrt(16 / 2))
