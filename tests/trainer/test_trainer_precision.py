"""The float16 path with its gradient scaler for a few steps on CPU; the attention route each
precision builds. torch.compile (a minute of compiling on a CPU) is tested in
tests/e2e/test_train_cli.py."""

import math

import pytest
import torch
from conftest import derive, records

import train
from trainer import checkpoint_read
from trainer.build import build

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")


def cpu_fp16_supported() -> str:
    """Why the CPU float16 path cannot run here ('' if it can)."""
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        torch.amp.GradScaler("cpu")
    except (RuntimeError, TypeError, AssertionError) as err:
        return f"this torch has no CPU float16 autocast or GradScaler ({err})"
    return ""


@pytest.mark.skipif(bool(cpu_fp16_supported()), reason=cpu_fp16_supported() or "supported")
def test_fp16_trains_with_a_gradient_scaler(tiny_cfg, tiny_run, tmp_path):
    fp32 = tiny_run[0]
    run_dir = tmp_path / "fp16"
    summary = train.train(derive(tiny_cfg, ["trainer.precision=fp16"]), run_dir)
    assert summary["steps"] == 8 and not summary["diverged"]
    scaler = checkpoint_read.read(run_dir / "checkpoints" / "last.pt")["scaler"]
    assert scaler["scale"] > 0 and math.isfinite(scaler["scale"])   # the scaler was on
    ours, reference = records(run_dir, "train"), records(fp32, "train")
    for a, b in zip(ours, reference, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=0.02)
    assert ours[-1]["loss"] != reference[-1]["loss"]   # really computed in float16


@pytest.mark.parametrize("precision, attn_impl, attention", [
    ("fp32", "auto", "MultiHeadAttention"),        # no autocast: the teaching module
    ("bf16", "auto", "CPUAutocastAttention"),      # CPU autocast: model/cpu_autocast.py
    ("bf16", "sdpa", "MultiHeadAttention"),        # an explicit attn_impl: no route
])
def test_cpu_autocast_route_only_under_cpu_autocast(tiny_cfg, precision, attn_impl,
                                                     attention):
    run = build(derive(tiny_cfg, [f"trainer.precision={precision}",
                                  f"model.attn_impl={attn_impl}"]))
    assert run.compute.device.type == "cpu"
    assert run.state.model.attention_name == attention
    assert all(type(b.attn).__name__ == attention for b in run.state.model.blocks)
