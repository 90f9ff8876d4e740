"""train.py, configs/ and scripts/sample.py on a tiny corpus made here (data source `text`).

In-process tests build the config with Hydra's compose API and call train.train, the loop
under test (train.py's one import here; the pieces come from trainer/); the subprocess tests
run the real command line (`python train.py ...`, torchrun).
"""

import json
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import train
from data.config import DataConfig
from model.attention import SCALINGS, ScalingConfig
from model.errors import UserError
from model.gpt import GPT, GPTConfig
from trainer.build import make_optimizer, pick_device
from trainer.launch import Diverged, Interrupted
from trainer.schema import OptimConfig, TrainerConfig, register_configs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
GROUPS = ("model", "data", "scaling", "optim", "trainer", "experiment")
GOLDEN = ROOT / "tests" / "golden" / "tiny_loss_curve.json"
WORDS = ("the king is dead long live the queen and all her court shall sing of love war and "
         "the sea while fools and wise men walk together under a pale moon").split()


def write_corpus(folder: Path) -> Path:
    """~24 KB of seeded pseudo-English in a train and a val file."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train", 500), ("val", 60)):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(lines))
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


@pytest.fixture
def tiny(tmp_path) -> list[str]:
    """Overrides for a seconds-long deterministic run on the tiny corpus."""
    corpus = write_corpus(tmp_path / "corpus")
    return ["data=text", f"data.train_files=[{corpus}/train.txt]",
            f"data.val_files=[{corpus}/val.txt]", f"data.cache_dir={tmp_path}/cache",
            "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.block_size=16",
            "trainer.batch_size=4", "trainer.max_steps=8", "trainer.eval_every=4",
            "trainer.eval_iters=2", "trainer.log_every=1", "trainer.ckpt_every=4",
            "trainer.precision=fp32", "trainer.device=cpu", "trainer.sample_tokens=8",
            "trainer.threads=1",
            "trainer.sample_prompts=[the king]", "optim.warmup_steps=2"]


def make_config(overrides: list[str]):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        return compose("config", overrides=overrides)


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def run_cli(args: list[str], cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group):
    options = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
    if group != "experiment":
        assert options, f"configs/{group}/ has no options"
    # options that cannot stand alone, with the least they need
    needs = {("data", "text"): ["data.train_files=[corpus.txt]"]}
    for option in options:
        cfg = make_config([f"{group}={option}", *needs.get((group, option), [])])
        # ... and turns into the validated dataclasses the model and data code receive
        DataConfig(**cfg.data)
        TrainerConfig(**cfg.trainer)
        OptimConfig(**cfg.optim)
        GPTConfig(vocab_size=65, scaling=ScalingConfig(**cfg.scaling), **cfg.model)


def test_defaults_are_the_nanogpt_cpu_configuration():
    cfg = make_config([])
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, cfg.model.block_size) == (
        4, 4, 128, 64)
    assert cfg.scaling.name == "sqrt_dk" and cfg.trainer.batch_size == 12
    small = make_config(["model=small"]).model
    assert (small.n_layer, small.n_head, small.d_model, small.block_size) == (6, 6, 384, 256)


def test_scaling_files_match_their_names():
    for name in SCALINGS:
        assert make_config([f"scaling={name}"]).scaling.name == name


@pytest.mark.parametrize("bad", ["model.n_head=abc", "model.n_heads=2", "trainer.max_step=3",
                                 "scaling=bogus", "optim.betas=0.9"])
def test_bad_overrides_fail_when_composing(bad):
    with pytest.raises(Exception) as err:
        make_config([bad])
    assert bad.split("=")[0].split(".")[-1] in str(err.value) or "bogus" in str(err.value)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_each_scaling_variant_trains(tiny, tmp_path, scaling):
    run_dir = tmp_path / "run"
    summary = train.train(make_config([*tiny, f"scaling={scaling}", "trainer.max_steps=4"]),
                          run_dir)
    assert summary["steps"] == 4 and not summary["diverged"]
    assert math.isfinite(summary["best_val_loss"])
    assert summary["best_val_loss"] < summary["init_val_loss"]   # 4 steps already help


def test_run_directory_contents(tiny, tmp_path):
    run_dir = tmp_path / "run"
    summary = train.train(make_config(tiny), run_dir)
    for name in ("run.json", "metrics.jsonl", "summary.json", "tokenizer.json", "samples.txt",
                 "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (run_dir / name).is_file(), name
    assert not list(run_dir.rglob(".*.tmp"))
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["model"]["n_layer"] == 2 and run["versions"]["torch"]
    assert run["device"]["type"] == "cpu" and "git_commit" in run
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary))
    for key in ("final_val_loss", "best_val_loss", "steps", "tokens_per_sec", "n_params",
                "diverged", "wall_s", "final_val_loss_full", "final_val_bpb_full"):
        assert key in summary
    trains, evals = records(run_dir, "train"), records(run_dir, "eval")
    assert [r["step"] for r in trains] == list(range(1, 9))
    assert [r["step"] for r in evals] == [0, 4, 8]
    assert set(trains[0]) >= {"loss", "lr", "tokens_per_sec", "grad_norm", "q_grad_norm",
                              "k_grad_norm", "q_grad_norm_layers", "k_grad_norm_layers"}
    assert len(trains[0]["q_grad_norm_layers"]) == 2 and trains[0]["q_grad_norm"] > 0
    for key in ("attn_entropy", "attn_max_logit", "attn_saturated", "attn_raw_var",
                "attn_raw_max_logit"):
        assert len(evals[-1][key]) == 2
    assert [len(layer) for layer in evals[-1]["attn_heads"]["entropy"]] == [2, 2]
    # at initialisation q, k components have variance d_model * 0.02^2 (GPT-2's init on
    # unit-variance LayerNorm output), so Var(q.k) / d_head is that squared
    expected_raw_var = (32 * 0.02**2) ** 2
    assert 0.5 < evals[0]["attn_raw_var"][0] / expected_raw_var < 2
    # at initialisation attention is nearly uniform: entropy close to the mean of log(t+1)
    uniform = sum(math.log(t + 1) for t in range(16)) / 16
    assert abs(evals[0]["attn_entropy"][0] - uniform) < 0.1
    assert evals[-1]["val_bpb"] == pytest.approx(
        evals[-1]["val_loss"] / math.log(2), rel=0.01)   # one byte per character here
    # warm-up to optim.lr at step 2, then cosine down to min_lr at max_steps
    lrs = [r["lr"] for r in trains]
    assert lrs[:2] == pytest.approx([5e-4, 1e-3]) and lrs[-1] == pytest.approx(1e-4)
    assert summary["best_val_loss"] == min(r["val_loss"] for r in evals)
    assert (run_dir / "samples.txt").read_text().startswith("--- prompt 'the king' ---\nthe king")


def test_weight_decay_on_matrices_only(tiny):
    cfg = make_config([*tiny, "scaling=qk_norm"])
    model = GPT(GPTConfig(vocab_size=30, scaling=ScalingConfig(**cfg.scaling), **cfg.model))
    optimizer = make_optimizer(model, OptimConfig(), pick_device("cpu"))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert no_decay["params"] and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_resume_reproduces_the_uninterrupted_run(tiny, tmp_path, monkeypatch):
    """8 steps straight == 4 steps, SIGTERM, resume for 4: loss for loss, exactly."""
    train.train(make_config(tiny), tmp_path / "straight")
    steps = {"n": 0}
    real_step = train.train_step

    def step_then_signal(*args, **kw):
        out = real_step(*args, **kw)
        steps["n"] += 1
        if steps["n"] == 3:   # mid-run, between checkpoints (ckpt_every=4)
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(train, "train_step", step_then_signal)
    with pytest.raises(Interrupted) as stop:
        train.train(make_config(tiny), tmp_path / "resumed")
    assert stop.value.step == 3 and stop.value.checkpoint.is_file()
    assert not (tmp_path / "resumed" / "summary.json").exists()
    monkeypatch.setattr(train, "train_step", real_step)
    summary = train.train(make_config([*tiny, "trainer.resume=auto"]), tmp_path / "resumed")
    assert summary["steps"] == 8
    for kind in ("train", "eval"):
        straight = records(tmp_path / "straight", kind)
        resumed = records(tmp_path / "resumed", kind)
        key = "loss" if kind == "train" else "val_loss"
        assert [r["step"] for r in resumed] == [r["step"] for r in straight]
        assert [r[key] for r in resumed] == [r[key] for r in straight]   # bit for bit


def test_resume_from_a_checkpoint_path_into_a_new_run(tiny, tmp_path):
    train.train(make_config(tiny), tmp_path / "a")
    more = [*tiny, "trainer.max_steps=10", f"trainer.resume={tmp_path}/a/checkpoints/last.pt"]
    summary = train.train(make_config(more), tmp_path / "b")
    assert summary["steps"] == 10
    assert [r["step"] for r in records(tmp_path / "b", "train")] == [9, 10]


def test_a_new_run_in_a_folder_holding_a_run_is_refused_and_writes_nothing(tiny, tmp_path):
    train.train(make_config([*tiny, "trainer.max_steps=2"]), tmp_path / "run")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="already holds a run .*trainer.resume=auto"):
        train.train(make_config(tiny), tmp_path / "run")
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    # trainer.resume=auto without a checkpoint starts afresh, not after the leftover records
    (tmp_path / "run" / "checkpoints" / "last.pt").unlink()
    train.train(make_config([*tiny, "trainer.resume=auto"]), tmp_path / "run")
    assert [r["step"] for r in records(tmp_path / "run", "eval")] == [0, 4, 8]


def test_resume_with_another_model_shape_names_the_fields(tiny, tmp_path):
    train.train(make_config([*tiny, "trainer.max_steps=2"]), tmp_path / "run")
    bigger = [*tiny, "trainer.resume=auto", "model.n_layer=3", "model.d_model=48"]
    with pytest.raises(UserError) as err:
        train.train(make_config(bigger), tmp_path / "run")
    assert "model.n_layer" in str(err.value) and "model.d_model" in str(err.value)
    assert "model.n_head" not in str(err.value)


def test_non_finite_loss_stops_with_diverged(tiny, tmp_path, monkeypatch):
    real_forward = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, valid_mask=None, reduction="mean"):
        logits, loss = real_forward(self, idx, targets, valid_mask, reduction)
        if self.training:
            calls["n"] += 1
            if calls["n"] >= 6:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    summary = train.train(make_config(tiny), tmp_path / "stop")
    assert summary["diverged"] is True and summary["steps"] == 6
    on_disk = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert on_disk["diverged"] is True
    assert all(math.isfinite(r["loss"]) for r in records(tmp_path / "stop", "train"))
    assert (tmp_path / "stop" / "checkpoints" / "last.pt").is_file()   # step 4, the last good
    calls["n"] = 0
    with pytest.raises(Diverged):
        train.train(make_config([*tiny, "trainer.on_nan=raise"]), tmp_path / "raise")


def test_golden_loss_curve(tiny, tmp_path):
    """The first 20 losses of a tiny deterministic float32 run, against tests/golden/.

    Regenerate (after an intended change to the model, data or loop) with
    ATTNSCALE_UPDATE_GOLDEN=1 python -m pytest tests/test_train.py -k golden
    """
    cfg = make_config([*tiny, "trainer.max_steps=20", "trainer.eval_every=20",
                       "trainer.ckpt_every=20"])
    train.train(cfg, tmp_path / "run")
    losses = [r["loss"] for r in records(tmp_path / "run", "train")]
    assert len(losses) == 20
    if os.environ.get("ATTNSCALE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({"steps": list(range(1, 21)), "loss": losses}, indent=1))
    golden = json.loads(GOLDEN.read_text())["loss"]
    assert losses == pytest.approx(golden, abs=1e-4)
    assert losses[-1] < losses[0] - 0.2


@pytest.mark.slow
def test_command_line_run_and_sample(tiny, tmp_path):
    run_dir = tmp_path / "cli"
    out = run_cli([*tiny, f"hydra.run.dir={run_dir}"])
    assert out.returncode == 0, out.stderr
    assert "best val loss" in out.stdout and f"run dir: {run_dir}" in out.stdout
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()
    sampled = subprocess.run([sys.executable, "scripts/sample.py", str(run_dir), "--prompt",
                              "the", "--prompt", "a pale moon", "--max_new_tokens", "12"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert sampled.returncode == 0, sampled.stderr
    assert "the" in sampled.stdout and "a pale moon" in sampled.stdout


@pytest.mark.slow
@pytest.mark.parametrize("bad, says", [
    ("scaling=bogus", "config group `scaling` needs one of its options"),
    ("model.n_head=abc", "n_head"),
    ("model.n_heads=2", "n_heads"), ("model.n_head=3", "model.")])
def test_bad_command_line_exits_readably_and_writes_nothing(tiny, tmp_path, bad, says):
    run_dir = tmp_path / "bad"
    out = run_cli([*tiny, bad, f"hydra.run.dir={run_dir}"])
    assert out.returncode != 0
    assert says in out.stderr and "Traceback" not in out.stderr
    assert not run_dir.exists()


@pytest.mark.slow
def test_sigterm_leaves_a_checkpoint_that_resumes(tiny, tmp_path):
    run_dir = tmp_path / "term"
    args = [*tiny, "trainer.max_steps=400", "trainer.eval_every=100", "trainer.ckpt_every=100",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and not (
            (run_dir / "metrics.jsonl").exists() and records(run_dir, "train")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "trainer.resume=auto" in stderr and (run_dir / "checkpoints" / "last.pt").is_file()
    stopped_at = records(run_dir, "train")[-1]["step"]
    assert stopped_at < 400 and not (run_dir / "summary.json").exists()
    command = shlex.split(stderr.split("Resume this run with:")[1])
    assert command[:2] == ["python", "train.py"]
    resumed = run_cli(command[2:])
    assert resumed.returncode == 0, resumed.stderr
    steps = [r["step"] for r in records(run_dir, "train")]
    assert steps == list(range(1, 401))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 400


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_two_process_torchrun_matches_one_process(tiny, tmp_path, packing):
    # grad_accum=2: DDP skips the gradient all-reduce on the first micro-step (no_sync).
    # pad with one document per line: the processes' micro-batches hold different numbers of
    # real targets, so only a token-weighted loss matches the one-process run.
    args = [*tiny, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.grad_accum=2",
            f"data.packing={packing}", "data.document=line"]
    single = run_cli([*args, f"hydra.run.dir={tmp_path}/one"])
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    double = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "train.py", *args, f"hydra.run.dir={tmp_path}/two"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert double.returncode == 0, double.stderr
    assert not (ROOT / ".hydra").exists()   # the second process made no run directory
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        one, two = records(tmp_path / "one", kind), records(tmp_path / "two", kind)
        assert [r["step"] for r in one] == [r["step"] for r in two]
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_sweep_writes_one_folder_per_run_named_by_its_overrides(tiny, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", *tiny, "trainer.max_steps=2", "scaling=sqrt_dk,none",
                   f"hydra.sweep.dir={sweep}"])
    assert out.returncode == 0, out.stderr
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 2
    for run, scaling in zip(runs, ("none", "sqrt_dk")):
        assert f"scaling={scaling}," in run.name and "trainer.max_steps=2" in run.name
        assert "train_files" not in run.name and "sample_prompts" not in run.name
        assert (run / ".hydra" / "overrides.yaml").is_file()
        assert json.loads((run / "summary.json").read_text())["steps"] == 2
