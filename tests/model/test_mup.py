"""param=mup in the model (model/config.py ParamConfig, model/gpt.py): the width multiplier,
the default attention multiplier of `dk`, the initialisation and the read-out multiplier, each
against the same model under param=sp."""

import math

import pytest
import torch

from model import mup as mup_rules
from model.config import GPTConfig, ParamConfig, ScalingConfig
from model.errors import ConfigError
from model.gpt import GPT

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 17
BASE = 32   # param.base_width of these tests: small models, m = d_model / 32


def config(param: str, d_model: int, scaling: str = "sqrt_dk", **param_keys) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, block_size=8, n_layer=2, n_head=2, d_model=d_model,
                     scaling=ScalingConfig(name=scaling),
                     param=ParamConfig(name=param, base_width=BASE, **param_keys))


def model(param: str, d_model: int, scaling: str = "sqrt_dk", **param_keys) -> GPT:
    torch.manual_seed(0)
    return GPT(config(param, d_model, scaling, **param_keys)).eval()


@pytest.mark.parametrize("keys, message", [
    ({"name": "ntk"}, "param.name='ntk' is not valid: choose one of sp, mup"),
    ({"base_width": 0}, "param.base_width=0 must be a positive integer"),
    ({"output_mult": 0.0}, "param.output_mult=0.0 is not valid: use a positive finite number"),
    ({"zero_query": "yes"}, "param.zero_query='yes' is not valid: use null"),
    ({"zero_query": 1}, "param.zero_query=1 is not valid: use null"),
])
def test_bad_param_values_name_the_key(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParamConfig(**keys)


def test_gpt_config_takes_a_param_config_only():
    with pytest.raises(ConfigError, match=r"model.param must be a ParamConfig, got dict"):
        GPTConfig(vocab_size=VOCAB, param={"name": "mup"})


def test_defaults_sp_at_the_default_width_and_zero_query_only_under_mup():
    assert ParamConfig().base_width == GPTConfig(vocab_size=VOCAB).d_model == 128
    assert ParamConfig().zero_query is False and ParamConfig(name="mup").zero_query is True
    assert ParamConfig(name="mup", zero_query=False).zero_query is False
    assert config("sp", 128).width_mult == 1.0   # sp ignores base_width
    assert config("mup", 128).width_mult == 4.0 and config("mup", 16).width_mult == 0.5


def test_dk_attn_mult_is_1_under_sp_and_1_over_sqrt_d_head_at_the_base_width_under_mup():
    """s = attn_mult / d_head: 1/d_head under sp at any width; under mup 1/sqrt(d_head) at the
    base width (d_head 16 here) and sqrt(16) / d_head at 4x the width (d_head 64)."""
    def scale(cfg):
        return GPT(cfg).blocks[0].attn.scale()
    assert config("sp", 128, "dk").scaling.attn_mult == 1.0
    assert scale(config("sp", 128, "dk")) == 1 / 64
    assert scale(config("mup", BASE, "dk")) == pytest.approx(1 / math.sqrt(16))
    assert scale(config("mup", 4 * BASE, "dk")) == pytest.approx(4 / 64)
    explicit = GPTConfig(vocab_size=VOCAB, d_model=128, n_head=2, param=ParamConfig(name="mup"),
                         scaling=ScalingConfig(name="dk", attn_mult=8.0))
    assert scale(explicit) == 8 / 64   # mup's own 8 / d_head
    assert config("mup", 128, "sqrt_dk").scaling.attn_mult is None   # only dk's is filled in


def test_mup_divides_hidden_init_by_sqrt_m_zeroes_q_and_leaves_embeddings_and_vectors():
    """At m = 4 every hidden matrix is sp's draw / 2, the query rows are zero, and everything
    else (embeddings, the tied read-out, norm gains) is sp's exactly."""
    sp, mup = model("sp", 4 * BASE), model("mup", 4 * BASE)
    hidden = {name for name, p in mup.named_parameters()
              if any(p is w for w in mup_rules.hidden_matrices(mup))}
    assert len(hidden) == 6 * 2   # W_q, W_k, W_v, attn out, MLP in and out, per layer
    for (name, p_sp), (_, p_mup) in zip(sp.named_parameters(), mup.named_parameters()):
        if name.endswith("attn.q_proj.weight"):
            assert name in hidden and torch.all(p_mup == 0)   # the query projection
        elif name in hidden:   # W_k and W_v among them
            assert torch.equal(p_mup, p_sp * 0.5), name
        else:
            assert torch.equal(p_mup, p_sp), name
    assert mup.wte.weight is mup.lm_head.weight


def test_hidden_matrices_are_derived_so_a_new_matrix_in_a_block_is_one():
    """Every 2-D parameter inside the blocks, none listed: a matrix a student adds to a block
    (here a second MLP matrix) takes muP's lr / m and weight decay * m with no list edited;
    the embeddings (the tied read-out among them) and every vector stay at lr."""
    mup = model("mup", 4 * BASE, "learned")
    mup.blocks[1].mlp.extra = torch.nn.Linear(4 * BASE, 4 * BASE)
    hidden = {id(p) for p in mup_rules.hidden_matrices(mup)}
    assert id(mup.blocks[1].mlp.extra.weight) in hidden
    assert id(mup.blocks[1].mlp.extra.bias) not in hidden   # a vector
    assert len(hidden) == 6 * 2 + 1
    embeddings, vectors, matrices = mup_rules.param_groups(list(mup.parameters()), mup, 1e-3,
                                                           0.1)
    assert {id(p) for p in matrices["params"]} == hidden
    assert matrices["lr"] == 1e-3 / 4 and matrices["weight_decay"] == pytest.approx(0.4)
    assert {id(p) for p in embeddings["params"]} == {id(mup.wte.weight), id(mup.wpe.weight)}
    assert all(p.dim() == 1 for p in vectors["params"])


def test_the_read_out_multiplier_is_applied_once():
    """output_mult / m multiplies the logits once: the mup model's logits are 0.5 times those
    of an sp model with its weights (output_mult 2, m = 4), not 0.25 or 1 times."""
    mup = model("mup", 4 * BASE, output_mult=2.0)
    sp = model("sp", 4 * BASE)
    sp.load_state_dict(mup.state_dict())
    idx = torch.randint(VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    assert mup.readout_mult == 0.5 and sp.readout_mult == 1.0
    torch.testing.assert_close(mup(idx)[0], 0.5 * sp(idx)[0])
