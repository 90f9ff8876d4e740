"""The float16 path with its gradient scaler, and torch.compile, each for a few steps on CPU;
the attention route each precision builds."""

import math
import shutil

import pytest
import torch
from test_train import make_config, records, tiny  # noqa: F401 (tiny is a fixture)

import train
from trainer import checkpoint
from trainer.build import build


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
def test_fp16_trains_with_a_gradient_scaler(tiny, tmp_path):  # noqa: F811
    fp32 = tmp_path / "fp32"
    train.train(make_config(tiny), fp32)
    run_dir = tmp_path / "fp16"
    summary = train.train(make_config([*tiny, "trainer.precision=fp16"]), run_dir)
    assert summary["steps"] == 8 and not summary["diverged"]
    scaler = checkpoint.read(run_dir / "checkpoints" / "last.pt")["scaler"]
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
def test_cpu_autocast_route_only_under_cpu_autocast(tiny, precision, attn_impl,  # noqa: F811
                                                     attention):
    run = build(make_config([*tiny, f"trainer.precision={precision}",
                             f"model.attn_impl={attn_impl}"]))
    assert run.compute.device.type == "cpu"
    assert run.state.model.attention_name == attention
    assert all(type(b.attn).__name__ == attention for b in run.state.model.blocks)


def compile_unsupported() -> str:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "torch.compile on CPU needs a C compiler (none on PATH)"
    return ""


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")   # inside torch's compiler
@pytest.mark.skipif(bool(compile_unsupported()), reason=compile_unsupported() or "supported")
def test_compile_trains_like_eager(tiny, tmp_path):  # noqa: F811
    eager = tmp_path / "eager"
    short = [*tiny, "trainer.max_steps=3", "trainer.eval_every=3", "trainer.ckpt_every=3"]
    train.train(make_config(short), eager)
    summary = train.train(make_config([*short, "trainer.compile=true"]), tmp_path / "compiled")
    assert summary["steps"] == 3
    for a, b in zip(records(tmp_path / "compiled", "train"), records(eager, "train"),
                    strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    ckpt = checkpoint.read(tmp_path / "compiled" / "checkpoints" / "last.pt")
    assert not any(k.startswith("_orig_mod") for k in ckpt["model"])   # uncompiled weights
