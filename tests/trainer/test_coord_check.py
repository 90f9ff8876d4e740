"""scripts/coord_check.py, in process: the coordinate check tells muP from SP. It trains the
models of two arms at d_model 128 and 1024 (n_head 4: d_head 32 and 256) for 3 AdamW steps at
lr 1e-2 and compares the mean |coordinate| at the widest width with the narrowest: mup with
`dk` over 4 seeds (one seed's block-1 logits move 0.3-1.0x; the mean of 4 is steady), sp with
`sqrt_dk` over one (it grows some 60x, whatever the seed)."""

import pytest
import torch

from scripts.coord_check import Setup, coord_check, growth, quantities

MUP_DK, SP_SQRT_DK = ("mup", "dk"), ("sp", "sqrt_dk")
WATCHED = ("attn_logits.0", "attn_logits.1", "logits")


@pytest.fixture(scope="module")
def rows():
    """The check's rows, on one thread (conftest.single_thread's reason; a module fixture is
    built before a function's fixtures, so it sets the count itself)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return (coord_check((128, 1024), Setup(steps=3, seeds=4), arms=(MUP_DK,))
                + coord_check((128, 1024), Setup(steps=3, seeds=1), arms=(SP_SQRT_DK,)))
    finally:
        torch.set_num_threads(previous)


def test_mup_with_dk_keeps_the_logits_within_2x_over_8x_the_width_and_sp_does_not(rows):
    """After 3 steps, across 8x the width: under mup with s = alpha/d_head each block's
    attention logits and the output logits change by less than 2x either way; under sp with
    1/sqrt(d_head) every one of them grows by more than 2x. (Measured: mup, dk 1.24, 0.75,
    0.83; sp, sqrt_dk 91, 144, 4.1. At d_model 64, d_head 16, block 1's |q|, |k| and their
    alignment under mup are each 17-25% above their values at 512, and the logits, their
    product, 1.7x: the check starts at the base width; docs/scaling.md, section 9.)"""
    for name in WATCHED:
        assert 0.5 < growth(rows, MUP_DK, name, 3) < 2.0, name
        assert growth(rows, SP_SQRT_DK, name, 3) > 2.0, name


def test_every_quantity_is_recorded_at_every_step_width_and_seed(rows):
    names = quantities(2)
    assert names[0] == "embedding" and names[-1] == "logits" and len(names) == 8
    keys = {(r["arm"], r["width"], r["seed"], r["step"], r["quantity"]) for r in rows}
    assert len(keys) == len(rows) == (4 + 1) * 2 * 4 * len(names)   # seeds, widths, steps
    zero_query = [r["value"] for r in rows if r["arm"] == "mup, dk" and r["step"] == 0
                  and r["quantity"].startswith("attn_logits")]
    assert zero_query == [0.0] * 16   # W_q starts at zero under mup: every logit 0 at step 0
