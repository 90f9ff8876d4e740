"""trainer/loggers.py: logger=tensorboard mirrors metrics.jsonl, summary.json and the resolved
config, read back from the event files of a run trained in process (over three segments too); a
missing package is named with its pip command. logger=wandb's runs, train.py's exit code without
the package, and rank 0 alone logging under torchrun are in tests/e2e/test_train_cli.py."""

import json
import sys
import types

import numpy as np
import pytest
from conftest import CONFIGS, derive, logger_expected, make_config, tensorboard_scalars

import train
from model.errors import ConfigError
from trainer import loggers
from trainer.loggers import hyperparameters, require, tags
from trainer.schema import LOGGERS, LoggerConfig

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")


def test_tags_flatten_layers_heads_and_dicts():
    record = {"kind": "eval", "step": 8, "val_loss": 2.5, "tokens_per_sec": None, "flag": True,
              "note": "text", "attn_entropy": [1.0, 2.0],
              "attn_heads": {"entropy": [[0.1, 0.2], [0.3, 0.4]], "max_logit": [[5, 6], [7, 8]]},
              "q_grad_norm_layers": [0.5]}
    assert tags(record) == {
        "eval/val_loss": 2.5, "eval/flag": 1.0, "attn/entropy/layer0": 1.0,
        "attn/entropy/layer1": 2.0, "attn/entropy/layer0/head0": 0.1,
        "attn/entropy/layer0/head1": 0.2, "attn/entropy/layer1/head0": 0.3,
        "attn/entropy/layer1/head1": 0.4, "attn/max_logit/layer0/head0": 5.0,
        "attn/max_logit/layer0/head1": 6.0, "attn/max_logit/layer1/head0": 7.0,
        "attn/max_logit/layer1/head1": 8.0, "eval/q_grad_norm_layers/layer0": 0.5}
    assert tags({"steps": 8, "best_step": None}, "summary") == {"summary/steps": 8.0}


def test_hyperparameters_are_flat_scalars():
    config = {"model": {"n_layer": 2, "bias": False}, "trainer": {"resume": None,
                                                                 "sample_prompts": ["a", "b"]}}
    assert hyperparameters(config) == {"model.n_layer": 2, "model.bias": False,
                                       "trainer.resume": "None",
                                       "trainer.sample_prompts": "['a', 'b']"}


def test_each_logger_option_composes_to_its_config():
    names = sorted(p.stem for p in (CONFIGS / "logger").glob("*.yaml"))
    assert names == sorted(LOGGERS)
    assert LoggerConfig(**make_config([]).logger) == LoggerConfig()   # none, offline
    for name in names:
        cfg = LoggerConfig(**make_config([f"logger={name}"]).logger)
        assert (cfg.name, cfg.mode, cfg.project) == (name, "offline", "attnscale")
    cfg = make_config(["logger=wandb", "logger.mode=online", "logger.project=p"]).logger
    assert LoggerConfig(**cfg) == LoggerConfig(name="wandb", project="p", mode="online")


@pytest.mark.parametrize("key, value", [("name", "mlflow"), ("mode", "cloud"), ("project", " ")])
def test_bad_logger_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=f"logger.{key}="):
        LoggerConfig(**{key: value})


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_package_names_the_pip_command(name, monkeypatch):
    require(LoggerConfig(name=name))   # installed here (requirements-dev.txt)
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda module: None)
    require(LoggerConfig(name="none"))
    with pytest.raises(ConfigError) as err:
        require(LoggerConfig(name=name))
    assert "pip install -r requirements-loggers.txt" in str(err.value)
    assert f"pip install {loggers.PACKAGES[name]}" in str(err.value)


def test_a_resumed_wandb_run_reads_its_id_past_a_same_second_suffix(tmp_path, monkeypatch):
    """wandb names a segment's folder offline-run-<time>-<id>, and adds -<n> when a folder of
    that second exists (a segment that started in the second the one before did): the id the
    next segment resumes is the run's, not <n>. wandb itself is faked: its init's arguments."""
    for name in ("offline-run-20260101_000000-abcd1234",
                 "offline-run-20260101_000000-abcd1234-1"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
    seen = {}
    fake = types.SimpleNamespace(init=lambda **kw: seen.update(kw), Error=Exception)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    loggers.wandb_run(LoggerConfig(name="wandb"), tmp_path, {"a": 1})
    assert (seen["id"], seen["resume"], seen["dir"]) == ("abcd1234", "allow", str(tmp_path))


def test_tensorboard_mirrors_every_record_summary_and_config(tiny_cfg, tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir = tmp_path / "run"
    train.train(derive(tiny_cfg, ["logger.name=tensorboard", "trainer.diagnostics=true"]),
                run_dir)
    events, got = tensorboard_scalars(run_dir)
    want = logger_expected(run_dir)
    assert set(got) == set(want)   # every record, layer and summary field; nothing else
    assert {("attn/entropy/layer1", 8), ("train/loss", 3), ("summary/final_val_loss_full", 8),
            ("eval/val_bpb", 0)} <= set(got)
    for key, value in want.items():   # event files store float32
        assert got[key] == np.float32(value), key
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    config = json.loads((run_dir / "run.json").read_text())["config"]
    assert {k: v.ListFields()[0][1] for k, v in start.hparams.items()} == {
        k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
        for k, v in hyperparameters(config).items()}
    assert config["logger"]["name"] == "tensorboard"


def test_tensorboard_after_resumes_matches_metrics_jsonl(tiny_cfg, tmp_path):
    """A resume drops the records past its checkpoint from metrics.jsonl and redoes those
    steps (with other tokens/s): the event files must show the redone values only."""
    run_dir = tmp_path / "run"
    cfg = derive(tiny_cfg, ["logger.name=tensorboard", "trainer.resume=auto"])
    train.train(derive(cfg, ["trainer.max_steps=4"]), run_dir)
    at_4 = (run_dir / "checkpoints" / "last.pt").read_bytes()
    train.train(cfg, run_dir)                                 # steps 5-8
    (run_dir / "checkpoints" / "last.pt").write_bytes(at_4)   # back to step 4: redo 5-8
    train.train(cfg, run_dir)
    events, got = tensorboard_scalars(run_dir)
    for tag in events.Tags()["scalars"]:   # one value per step: nothing of a dropped segment
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), tag
    # the first segment ended at its max_steps=4 and wrote its summary there; it stays
    assert got.pop(("summary/steps", 4)) == 4.0
    got = {(tag, step): v for (tag, step), v in got.items()
           if not (tag.startswith("summary/") and step == 4)}
    want = logger_expected(run_dir)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == np.float32(value), key
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3
