"""train.py's loop and configs/ on a tiny corpus made here (data source `text`), in process:
the config is built with Hydra's compose API and train.train is the loop under test (train.py's
one import here; the pieces come from trainer/). The command line itself (`python train.py`,
torchrun, scripts/sample.py) is tested in tests/e2e/test_train_cli.py.
"""

import json
import math
import os

import pytest
from conftest import CONFIGS, GOLDEN, copy_run, derive, make_config, records

import train
from data.config import DataConfig
from model.config import SCALINGS, GPTConfig, ScalingConfig
from model.errors import UserError
from model.generate import Sampling
from model.gpt import GPT
from trainer import samples
from trainer.build import make_optimizer, pick_device
from trainer.job import Diverged
from trainer.schema import OptimConfig, TrainerConfig

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")

GROUPS = ("model", "data", "scaling", "optim", "trainer", "experiment")


def test_every_option_of_every_group_composes():
    options = {group: sorted(p.stem for p in (CONFIGS / group).glob("*.yaml")) for group in GROUPS}
    for group, names in options.items():
        if group != "experiment":
            assert names, f"configs/{group}/ has no options"
    assert set(SCALINGS) <= set(options["scaling"])
    # options that cannot stand alone, with the least they need
    needs = {("data", "text"): ["data.train_files=[corpus.txt]"]}
    # the i-th option of every group at once (a preset picks other groups' options itself, so
    # experiment goes alone): each option is composed once
    picks = [[(group, names[i]) for group, names in options.items()
              if group != "experiment" and i < len(names)]
             for i in range(max(len(names) for names in options.values()))]
    picks += [[("experiment", name)] for name in options["experiment"]]
    for pick in picks:
        cfg = make_config([o for group, option in pick
                           for o in (f"{group}={option}", *needs.get((group, option), []))])
        # ... and turns into the validated dataclasses the model and data code receive
        DataConfig(**cfg.data)
        TrainerConfig(**cfg.trainer)
        OptimConfig(**cfg.optim)
        GPTConfig(vocab_size=65, scaling=ScalingConfig(**cfg.scaling), **cfg.model)
        for group, option in pick:   # each scaling file is named by the scaling it selects
            assert group != "scaling" or cfg.scaling.name == option, pick


def test_defaults_are_the_nanogpt_cpu_configuration():
    cfg = make_config([])
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, cfg.model.block_size) == (
        4, 4, 128, 64)
    assert cfg.scaling.name == "sqrt_dk" and cfg.trainer.batch_size == 12
    small = make_config(["model=small"]).model
    assert (small.n_layer, small.n_head, small.d_model, small.block_size) == (6, 6, 384, 256)


@pytest.mark.parametrize("bad", ["model.n_head=abc", "model.n_heads=2", "trainer.max_step=3",
                                 "scaling=bogus", "optim.betas=0.9"])
def test_bad_overrides_fail_when_composing(bad):
    with pytest.raises(Exception) as err:
        make_config([bad])
    assert bad.split("=")[0].split(".")[-1] in str(err.value) or "bogus" in str(err.value)


@pytest.mark.parametrize("switch", ["trainer.diagnostics=2", "trainer.compile=1",
                                    "data.verify=yes", "model.bias=no", "param.zero_query=0"])
def test_a_switch_is_true_or_false_and_nothing_else(tiny_cfg, tmp_path, switch):
    """Hydra hands a bool setting over as given (OmegaConf would read 2, 1 or yes as true and
    no as false): anything but true or false is refused, naming the key, before anything is
    written."""
    key, value = switch.split("=")
    with pytest.raises(UserError, match=rf"^{key}=('?){value}\1 is not valid: use .*true or "
                                        r"false\b"):
        train.train(derive(tiny_cfg, [switch]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, value, says", [
    ("tokens", -1, "must be an integer >= 0"), ("temperature", math.nan, "must be >= 0 and finite"),
    ("temperature", -0.5, "must be >= 0 and finite"), ("top_k", 0, "must be null or a positive"),
    ("temperature", 1e-40, r"is below 1e-06, where a sample .* or a temperature of at least "
     r"1e-06, e.g. 0.8.$")])
def test_trainer_samples_and_sampling_refuse_alike(field, value, says):
    """One rule for trainer.sample_* and model/generate.py's Sampling (scripts/sample.py's
    options), each naming its own key."""
    trainer_key = {"tokens": "sample_tokens", "temperature": "sample_temperature",
                   "top_k": "sample_top_k"}[field]
    sampling_key = {"tokens": "max_new_tokens"}.get(field, field)
    with pytest.raises(UserError, match=f"^trainer.{trainer_key}={value!r} {says}"):
        TrainerConfig(**{trainer_key: value})
    with pytest.raises(UserError, match=f"^{sampling_key}={value!r} {says}"):
        Sampling(**{"max_new_tokens": 2, sampling_key: value})


def test_a_failing_sample_loses_no_summary(tiny_cfg, tmp_path, monkeypatch):
    """The end-of-run samples come after summary.json and run.json's end: a sample that fails
    (a bug, memory) leaves the finished run's record whole, and the error is raised."""
    def fail(*args, **kwargs):
        raise RuntimeError("the sample failed")

    monkeypatch.setattr(samples, "generate", fail)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="the sample failed"):
        train.train(derive(tiny_cfg, ["trainer.max_steps=2"]), run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    segment = json.loads((run_dir / "run.json").read_text())["segments"][-1]
    assert (segment["end_step"], segment["ended"]) == (2, "finished")
    assert not (run_dir / "samples.txt").exists()


@pytest.mark.parametrize("scaling", SCALINGS)
def test_each_scaling_variant_trains(tiny_cfg, tmp_path, scaling):
    run_dir = tmp_path / "run"
    # scaling=<name> composes to scaling.name=<name> (test_every_option_of_every_group_composes)
    summary = train.train(derive(tiny_cfg, [f"scaling.name={scaling}", "trainer.max_steps=4"]),
                          run_dir)
    assert summary["steps"] == 4 and not summary["diverged"]
    assert math.isfinite(summary["best_val_loss"])
    assert summary["best_val_loss"] < summary["init_val_loss"]   # 4 steps already help


def test_z_loss_and_qk_clip_are_recorded(tiny_cfg, tiny_run, tmp_path):
    """trainer.z_loss logs its term beside the unchanged cross-entropy; optim.qk_clip with a
    threshold below the tiny model's logits clips, and each eval record counts the clips per
    head (non-decreasing); the plain run has neither."""
    run_dir = tmp_path / "run"
    train.train(derive(tiny_cfg, ["optim.qk_clip=0.05", "trainer.z_loss=1e-3",
                                  "trainer.diagnostics=true"]), run_dir)
    trains = records(run_dir, "train")
    assert all(r["z_term"] > 0 for r in trains) and len(trains) == 8
    counts = [r["attn_heads"]["qk_clip_count"] for r in records(run_dir, "eval")]
    assert counts[0] == [[0, 0], [0, 0]] and sum(map(sum, counts[-1])) > 0
    assert all(a <= b for x, y in zip(counts, counts[1:]) for la, lb in zip(x, y)
               for a, b in zip(la, lb))
    plain = records(tiny_run[0], "train")
    assert "z_term" not in plain[0] and plain[0]["loss"] == trains[0]["loss"]   # step 1: same
    assert plain[-1]["loss"] != trains[-1]["loss"]


def test_diagnostics_are_recorded_and_change_nothing(tiny_cfg, tiny_run, tmp_path):
    """trainer.diagnostics=true adds the q/k gradient norms to train records and the attention
    statistics to eval records; every loss, and the samples, stay bit for bit the plain run's."""
    run_dir = tmp_path / "run"
    summary = train.train(derive(tiny_cfg, ["trainer.diagnostics=true"]), run_dir)
    trains, evals = records(run_dir, "train"), records(run_dir, "eval")
    assert set(trains[0]) >= {"q_grad_norm", "k_grad_norm", "q_grad_norm_layers",
                              "k_grad_norm_layers"}
    assert len(trains[0]["q_grad_norm_layers"]) == 2 and trains[0]["q_grad_norm"] > 0
    for key in ("attn_entropy", "attn_max_logit", "attn_saturated", "attn_raw_var",
                "attn_raw_max_logit"):
        assert len(evals[-1][key]) == 2
    assert [len(layer) for layer in evals[-1]["attn_heads"]["entropy"]] == [2, 2]
    assert "qk_clip_count" not in evals[0]["attn_heads"]
    # at initialisation q, k components have variance d_model * 0.02^2 (GPT-2's init on
    # unit-variance LayerNorm output), so Var(q.k) / d_head is that squared
    expected_raw_var = (32 * 0.02**2) ** 2
    assert 0.5 < evals[0]["attn_raw_var"][0] / expected_raw_var < 2
    # at initialisation attention is nearly uniform: entropy close to the mean of log(t+1)
    uniform = sum(math.log(t + 1) for t in range(16)) / 16
    assert abs(evals[0]["attn_entropy"][0] - uniform) < 0.1
    plain_dir, plain = tiny_run
    assert [r["loss"] for r in trains] == [r["loss"] for r in records(plain_dir, "train")]
    assert [r["val_loss"] for r in evals] == [r["val_loss"] for r in records(plain_dir, "eval")]
    assert summary["final_val_loss_full"] == plain["final_val_loss_full"]
    assert (run_dir / "samples.txt").read_text() == (plain_dir / "samples.txt").read_text()


def test_run_directory_contents(tiny_run):
    run_dir, summary = tiny_run
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
    assert set(trains[0]) == {"kind", "step", "loss", "lr", "tokens_per_sec", "grad_norm"}
    assert set(evals[0]) == {"kind", "step", "train_loss", "val_loss", "val_bpb", "lr",
                             "tokens_per_sec"}   # no diagnostics unless trainer.diagnostics
    assert evals[-1]["val_bpb"] == pytest.approx(
        evals[-1]["val_loss"] / math.log(2), rel=0.01)   # one byte per character here
    # warm-up to optim.lr at step 2, then cosine down to min_lr at max_steps
    lrs = [r["lr"] for r in trains]
    assert lrs[:2] == pytest.approx([5e-4, 1e-3]) and lrs[-1] == pytest.approx(1e-4)
    assert summary["best_val_loss"] == min(r["val_loss"] for r in evals)
    assert (run_dir / "samples.txt").read_text().startswith("--- prompt 'the king' ---\nthe king")


def test_weight_decay_on_matrices_only(tiny_cfg):
    cfg = derive(tiny_cfg, ["scaling.name=qk_norm"])   # scaling=qk_norm
    model = GPT(GPTConfig(vocab_size=30, scaling=ScalingConfig(**cfg.scaling), **cfg.model))
    optimizer = make_optimizer(model, OptimConfig(), pick_device("cpu"))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert no_decay["params"] and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_resume_from_a_checkpoint_path_into_a_new_run(tiny_cfg, tiny_run,
                                                      tmp_path):
    before = (tiny_run[0] / "checkpoints" / "last.pt").read_bytes()
    more = ["trainer.max_steps=10", f"trainer.resume={tiny_run[0]}/checkpoints/last.pt"]
    summary = train.train(derive(tiny_cfg, more), tmp_path / "b")
    assert summary["steps"] == 10
    assert [r["step"] for r in records(tmp_path / "b", "train")] == [9, 10]
    assert (tiny_run[0] / "checkpoints" / "last.pt").read_bytes() == before   # only read


def test_a_new_run_in_a_folder_holding_a_run_is_refused_and_writes_nothing(
        tiny_cfg, tiny_run, tmp_path):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="already holds a run .*trainer.resume=auto"):
        train.train(derive(tiny_cfg, ["trainer.max_steps=2"]), run_dir)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    # trainer.resume=auto without a checkpoint starts afresh, not after the leftover records
    (run_dir / "checkpoints" / "last.pt").unlink()
    train.train(derive(tiny_cfg, ["trainer.resume=auto"]), run_dir)
    assert [r["step"] for r in records(run_dir, "eval")] == [0, 4, 8]


def test_resume_with_another_model_shape_names_the_fields(tiny_cfg, tiny_run,
                                                          tmp_path):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    bigger = ["trainer.max_steps=12", "trainer.resume=auto", "model.n_layer=3",
              "model.d_model=48"]
    with pytest.raises(UserError) as err:
        train.train(derive(tiny_cfg, bigger), run_dir)
    assert "model.n_layer" in str(err.value) and "model.d_model" in str(err.value)
    assert "model.n_head" not in str(err.value)


def test_non_finite_loss_stops_with_diverged(tiny_cfg, tmp_path, monkeypatch):
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
    summary = train.train(derive(tiny_cfg, []), tmp_path / "stop")
    assert summary["diverged"] is True and summary["steps"] == 6
    on_disk = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert on_disk["diverged"] is True
    assert all(math.isfinite(r["loss"]) for r in records(tmp_path / "stop", "train"))
    assert (tmp_path / "stop" / "checkpoints" / "last.pt").is_file()   # step 4, the last good
    calls["n"] = 0
    with pytest.raises(Diverged):
        train.train(derive(tiny_cfg, ["trainer.on_nan=raise"]), tmp_path / "raise")


def test_golden_loss_curve(tiny_cfg, tmp_path):
    """The first 20 losses of a tiny deterministic float32 run, against tests/golden/.

    Regenerate (after an intended change to the model, data or loop) with
    ATTNSCALE_UPDATE_GOLDEN=1 python -m pytest tests/trainer/test_train.py -k golden
    """
    cfg = derive(tiny_cfg, ["trainer.max_steps=20", "trainer.eval_every=20",
                           "trainer.ckpt_every=20"])
    train.train(cfg, tmp_path / "run")
    losses = [r["loss"] for r in records(tmp_path / "run", "train")]
    assert len(losses) == 20
    if os.environ.get("ATTNSCALE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({"steps": list(range(1, 21)), "loss": losses}, indent=1))
    golden = json.loads(GOLDEN.read_text())["loss"]
    assert losses == pytest.approx(golden, abs=1e-4)
    assert losses[-1] < losses[0] - 0.2
