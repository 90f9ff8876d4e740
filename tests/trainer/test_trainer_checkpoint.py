"""trainer/checkpoint.py and checkpoint_read.py: what a checkpoint holds, how it is read;
trainer/resume.py: the random streams it restores, when a resume is refused. The command lines'
exit codes on a bad checkpoint are tested in tests/e2e/test_train_cli.py."""

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, copy_run, derive

import train
from model.config import GPTConfig
from model.errors import UserError
from model.gpt import GPT
from trainer import checkpoint, checkpoint_read
from trainer.resume import set_rng_state

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")

PLAIN = (dict, list, tuple, str, int, float, bool, type(None), torch.Tensor)


def walk(obj, where="checkpoint"):
    """Every leaf of a checkpoint with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, (str, int)), f"{where}: key {k!r}"
            yield from walk(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk(v, f"{where}[{i}]")
    else:
        yield where, obj


def test_checkpoints_hold_only_tensors_and_plain_containers(tiny_run):
    run_dir = tiny_run[0]
    for name in ("last", "best"):
        path = run_dir / "checkpoints" / f"{name}.pt"
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert ckpt["format"] == checkpoint.FORMAT and ckpt["version"] == checkpoint.VERSION
        for where, leaf in walk(ckpt):
            assert isinstance(leaf, PLAIN), f"{where} is a {type(leaf).__name__}"
    last = checkpoint_read.read(run_dir / "checkpoints" / "last.pt")
    assert last["step"] == 8 and len(last["rng"]) == 1 and "cuda" not in last["rng"][0]


def test_rng_state_round_trip_restores_every_stream():
    state = checkpoint.rng_state(torch.device("cpu"))
    first = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1),
             np.random.randn())
    set_rng_state(state, torch.device("cpu"))
    again = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1),
             np.random.randn())
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    assert first[3:] == again[3:]


def test_each_process_keeps_only_its_own_cuda_stream(monkeypatch):
    """checkpoint.rng_state and resume.set_rng_state touch the CUDA generator of the process's
    device only (a node with fewer GPUs can resume); torch.cuda is faked: this runs on a CPU."""
    streams = {i: torch.tensor([i], dtype=torch.uint8) for i in range(4)}
    calls = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: streams[device.index])
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda state, device: calls.append((state.item(), device.index)))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("all devices"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: pytest.fail("all devices"))
    state = checkpoint.rng_state(torch.device("cuda:2"))
    assert torch.equal(state["cuda"], streams[2])
    set_rng_state(state, torch.device("cuda:1"))
    assert calls == [(2, 1)]


def older_version(path: Path) -> None:
    """A checkpoint as an older attnscale wrote it: numpy RNG states, no format entry."""
    torch.save({"model": {"w": torch.ones(2)}, "step": 4,
                "rng": [{"numpy": np.random.get_state()}]}, path)


UNREADABLE = {
    "garbage": lambda p: p.write_text("this is not a checkpoint\n"),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "another program's": lambda p: torch.save({"state_dict": {"w": torch.ones(2)}}, p),
    "an older version's": older_version,
    "a future version's": lambda p: torch.save({"format": checkpoint.FORMAT, "version": 99}, p),
}


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("kind", UNREADABLE)
def test_unreadable_checkpoint_is_one_paragraph_and_touches_nothing(
        tiny_cfg, tiny_run, tmp_path, kind):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    UNREADABLE[kind](run_dir / "checkpoints" / "last.pt")
    before = snapshot(run_dir)
    with pytest.raises(UserError) as err:
        train.train(derive(tiny_cfg, ["trainer.max_steps=12", "trainer.resume=auto"]), run_dir)
    message = str(err.value)
    assert str(run_dir / "checkpoints" / "last.pt") in message and "trainer.resume" in message
    assert "\n" not in message.strip() and len(message) < 700
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("kind", ["garbage", "an older version's"])
def test_sample_script_speaks_of_sampling(tiny_run, tmp_path, capsys, kind):
    sys.path.insert(0, str(ROOT / "scripts"))
    import sample
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    UNREADABLE[kind](run_dir / "checkpoints" / "best.pt")
    assert sample.main([str(run_dir), "--max_new_tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "Cannot sample from" in err and str(run_dir / "checkpoints" / "best.pt") in err
    assert "trainer.resume" not in err and "Traceback" not in err


def fused_qkv(weights: dict) -> dict:
    """A model state dict as version 1 held it: each layer's W_q, W_k, W_v (weights, biases)
    stacked, in that order, into one `attn.qkv` entry."""
    out = {}
    for name, tensor in weights.items():
        prefix, dot, kind = name.rpartition(".q_proj.")
        if dot:
            out[f"{prefix}.qkv.{kind}"] = torch.cat(
                [weights[f"{prefix}.{proj}.{kind}"] for proj in ("q_proj", "k_proj", "v_proj")])
        elif ".k_proj." not in name and ".v_proj." not in name:
            out[name] = tensor
    return out


def test_a_version_1_checkpoint_is_read_split_and_refused_for_resuming(tiny_cfg, tiny_run,
                                                                       tmp_path):
    """Version 1 (one fused qkv weight a layer, q rows, then k, then v): `read` splits it
    back into W_q, W_k, W_v bit for bit, weights and biases; sample.py loads it; resuming from
    it is refused, naming version 1, with the run folder untouched."""
    torch.manual_seed(0)
    biased = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=3, n_head=2, d_model=8))
    with torch.no_grad():
        for p in biased.parameters():   # GPT-2's biases are zero: make every row tell
            p.uniform_(-1.0, 1.0)
    originals = {"biased": biased.state_dict()}
    fused = fused_qkv(originals["biased"])
    assert sorted(n for n in fused if ".qkv." in n) == [
        f"blocks.{i}.attn.qkv.{kind}" for i in (0, 1, 2) for kind in ("bias", "weight")]
    assert fused["blocks.2.attn.qkv.weight"].shape == (3 * 8, 8)
    torch.save({"format": checkpoint.FORMAT, "version": 1, "model": fused}, tmp_path / "v1.pt")
    sys.path.insert(0, str(ROOT / "scripts"))
    import sample
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    for name in ("last", "best"):   # tiny: 2 layers without biases
        path = run_dir / "checkpoints" / f"{name}.pt"
        ckpt = torch.load(path, weights_only=True)
        originals[name] = ckpt["model"]
        fused = fused_qkv(ckpt["model"])
        assert sorted(n for n in fused if ".qkv." in n) == [
            "blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight"]
        torch.save({**ckpt, "version": 1, "model": fused}, path)
    for name, path in (("biased", tmp_path / "v1.pt"),
                       ("last", run_dir / "checkpoints" / "last.pt"),
                       ("best", run_dir / "checkpoints" / "best.pt")):
        read = checkpoint_read.read(path)
        assert read["version"] == 1 and set(read["model"]) == set(originals[name]), name
        for key, tensor in originals[name].items():
            assert torch.equal(read["model"][key], tensor), (name, key)
    model, _ = sample.load_model(run_dir, "best", torch.device("cpu"))
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, originals["best"][key]), key
    before = snapshot(run_dir)
    with pytest.raises(UserError) as err:
        train.train(derive(tiny_cfg, ["trainer.max_steps=12", "trainer.resume=auto"]), run_dir)
    message = str(err.value)
    assert str(run_dir / "checkpoints" / "last.pt") in message
    assert "version 1" in message and "trainer.resume" in message
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("change, key", [
    ("optim.lr=2e-3", "optim.lr"), ("optim.betas=[0.8,0.9]", "optim.betas"),
    ("optim.weight_decay=0.0", "optim.weight_decay"), ("optim.min_lr=0.0", "optim.min_lr"),
    ("trainer.batch_size=8", "trainer.batch_size"), ("trainer.seed=5", "trainer.seed"),
    ("data.packing=pad", "data.packing"), ("trainer.grad_accum=2", "trainer.grad_accum"),
    ("model.dropout=0.1", "model.dropout")])
def test_resume_with_changed_settings_is_refused_naming_them(
        tiny_cfg, tiny_run, tmp_path, change, key):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    before = snapshot(run_dir)
    with pytest.raises(UserError) as err:
        train.train(derive(tiny_cfg, ["trainer.max_steps=12", "trainer.resume=auto", change]),
                    run_dir)
    named = str(err.value).split("(")[1].split(")")[0]
    assert named.startswith(f"{key}: checkpoint") and named.count(": checkpoint") == 1
    assert snapshot(run_dir) == before


def test_a_checkpoint_from_before_a_key_existed_resumes_at_its_default(tiny_cfg, tiny_run,
                                                                     tmp_path):
    """A checkpoint written before optim.qk_clip, trainer.z_loss, scaling.attn_mult, the
    param group, scaling.qk_norm, scaling.qk_norm_gain, model.attn_gate and scaling.normaliser
    existed (its config lacks them) resumes when they are at their defaults, which change
    nothing, and is refused, naming the key and the default it resumes as, when one is set; its
    model_config rebuilds the model it saved."""
    run_dir = copy_run(tiny_run[0], tmp_path / "run")   # at step 8
    last = run_dir / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=False)
    for group, key in (("optim", "qk_clip"), ("trainer", "z_loss"), ("scaling", "attn_mult"),
                       ("scaling", "qk_norm"), ("scaling", "qk_norm_gain"),
                       ("model", "attn_gate"), ("scaling", "normaliser")):
        del ckpt["config"][group][key]
    del ckpt["config"]["param"]
    del ckpt["model_config"]["attn_gate"]
    for key in ("qk_norm", "qk_norm_gain", "normaliser"):
        del ckpt["model_config"]["scaling"][key]
    GPT(checkpoint_read.model_config(ckpt["model_config"])).load_state_dict(ckpt["model"])
    torch.save(ckpt, last)
    predates = "the checkpoint predates the key and resumes as"
    for change, named in (("optim.qk_clip=1.0", f"optim.qk_clip: {predates} None, now 1.0"),
                          ("model.attn_gate=headwise", f"model.attn_gate: {predates} 'none', "
                           "now 'headwise'"),
                          ("scaling.normaliser=sink", f"scaling.normaliser: {predates} "
                           "'softmax', now 'sink'")):
        with pytest.raises(UserError) as err:
            train.train(derive(tiny_cfg, ["trainer.resume=auto", "trainer.max_steps=12",
                                          change]), run_dir)
        assert f"the settings differ from the checkpoint's ({named})." in str(err.value)
    summary = train.train(derive(tiny_cfg, ["trainer.resume=auto", "trainer.max_steps=12"]),
                          run_dir)
    assert summary["steps"] == 12


def test_settings_on_the_allow_list_may_change_on_resume(tiny_cfg, tiny_run,
                                                         tmp_path):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")   # at step 8
    summary = train.train(derive(tiny_cfg, [
        "trainer.resume=auto", "trainer.max_steps=12", "trainer.eval_every=3",
        "trainer.log_every=2", "trainer.ckpt_every=3", "trainer.threads=1",
        "trainer.precision=bf16", "trainer.device=cpu", "trainer.sample_tokens=4",
        "model.attn_impl=explicit", "trainer.diagnostics=true"]), run_dir)
    assert summary["steps"] == 12
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "eval"]
    assert ["attn_entropy" in r for r in evals] == [False] * 3 + [True] * 2   # 0, 4, 8 | 9, 12
