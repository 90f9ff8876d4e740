"""scaling.normaliser in a run: the sink logits train as vectors (no weight decay, under sp and
mup), a sink run's checkpoint rebuilds its model, and a checkpoint written before the key existed
resumes as softmax while a changed normaliser is refused (it is not on the resume allow-list)."""

import json

import pytest
import torch
from conftest import copy_run, derive

import train
from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.errors import UserError
from model.gpt import GPT
from trainer.build import make_optimizer, pick_device
from trainer.checkpoint_read import model_config, read
from trainer.schema import OptimConfig

pytestmark = pytest.mark.usefixtures("no_fsync")


@pytest.mark.parametrize("param", ["sp", "mup"])
def test_sink_logits_are_vectors_at_the_lr_without_weight_decay(param):
    """Every parameter in one group; each layer's (H,) sink at optim.lr without decay, as norm
    gains are (under mup too: a vector is not a hidden matrix)."""
    model = GPT(GPTConfig(vocab_size=30, d_model=32, n_head=2, scaling=ScalingConfig(
        normaliser="sink"), param=ParamConfig(param, base_width=16)))
    optim_cfg = OptimConfig(lr=1e-2)
    optimizer = make_optimizer(model, optim_cfg, pick_device("cpu"))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert len(group_of) == sum(len(g["params"]) for g in optimizer.param_groups)
    assert set(group_of) == {id(p) for p in model.parameters()}
    for block in model.blocks:
        group = group_of[id(block.attn.sink)]
        assert block.attn.sink.shape == (2,)
        assert (group.get("lr", optim_cfg.lr), group["weight_decay"]) == (1e-2, 0.0)


def test_a_sink_run_trains_its_sink_logits_and_its_checkpoint_rebuilds_the_model(
        tiny_cfg, tmp_path):
    run_dir = tmp_path / "run"
    summary = train.train(derive(tiny_cfg, ["scaling.normaliser=sink", "trainer.max_steps=4",
                                            "trainer.sample_prompts=[]"]), run_dir)
    assert summary["steps"] == 4 and not summary["diverged"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["config"]["scaling"]["normaliser"] == "sink"
    ckpt = read(run_dir / "checkpoints" / "last.pt")
    sinks = [v for k, v in ckpt["model"].items() if k.endswith(".attn.sink")]
    assert len(sinks) == 2 and all(v.shape == (2,) and v.abs().min() > 0 for v in sinks)  # moved
    model = GPT(model_config(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])   # strict: the sink is a parameter of the model


def test_a_checkpoint_from_before_the_normaliser_resumes_as_softmax(tiny_cfg, tiny_run,
                                                                   tmp_path):
    """Without the key its model config reads softmax and the run resumes; asking for another
    normaliser, of that checkpoint or of one that names softmax, is refused, naming the key."""
    run_dir = copy_run(tiny_run[0], tmp_path / "run")   # at step 8
    with pytest.raises(UserError, match=r"scaling.normaliser: checkpoint 'softmax', now 'sink'"):
        train.train(derive(tiny_cfg, ["trainer.resume=auto", "trainer.max_steps=12",
                                      "scaling.normaliser=sink"]), run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=False)
    del ckpt["config"]["scaling"]["normaliser"], ckpt["model_config"]["scaling"]["normaliser"]
    torch.save(ckpt, last)
    assert model_config(ckpt["model_config"]).scaling.normaliser == "softmax"
    with pytest.raises(UserError, match=r"scaling.normaliser: the checkpoint predates the key "
                                        r"and resumes as 'softmax', now 'sigmoid'"):
        train.train(derive(tiny_cfg, ["trainer.resume=auto", "trainer.max_steps=12",
                                      "scaling.normaliser=sigmoid"]), run_dir)
    summary = train.train(derive(tiny_cfg, ["trainer.resume=auto", "trainer.max_steps=12"]),
                          run_dir)
    assert summary["steps"] == 12
