"""trainer/loggers.py: logger=tensorboard and logger=wandb mirror metrics.jsonl, summary.json and
the resolved config, read back from the files each writes after a real run of train.py (under
torchrun, rank 0's alone); a missing package is named with its pip command before anything
runs."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_train import (  # noqa: F401 (tiny is a fixture)
    CONFIGS,
    ROOT,
    make_config,
    records,
    run_cli,
    tiny,
)

from model.errors import ConfigError
from trainer import loggers
from trainer.loggers import LoggerConfig, hyperparameters, require, tags


def expected(run_dir: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value of every scalar of metrics.jsonl and summary.json."""
    want = {}
    for record in records(run_dir, "train") + records(run_dir, "eval"):
        want.update({(tag, record["step"]): v for tag, v in tags(record).items()})
    summary = json.loads((run_dir / "summary.json").read_text())
    want.update({(tag, summary["steps"]): v for tag, v in tags(summary, "summary").items()
                 if math.isfinite(v)})
    return want


def tensorboard_scalars(run_dir: Path):
    """The run's event files read back, and (tag, step) -> value of every scalar in them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return events, {(tag, e.step): e.value for tag in events.Tags()["scalars"]
                    for e in events.Scalars(tag)}


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
    assert names == sorted(loggers.LOGGERS)
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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_train_py_without_the_package_exits_2_before_writing(name, tmp_path):
    """The package is hidden from the import system, as if it were not installed."""
    run_dir = tmp_path / "run"
    code = (f"import runpy, sys; sys.modules[{name!r}] = None; "
            f"sys.argv = ['train.py', 'logger={name}', 'hydra.run.dir={run_dir}']; "
            "runpy.run_path('train.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: logger={name} needs the {name} package, which is not installed in this Python "
        f"({loggers.PACKAGES[name]} is not part of requirements.txt). Install it with `pip "
        f"install -r requirements-loggers.txt` (both loggers) or `pip install "
        f"{loggers.PACKAGES[name]}`, or train without it: logger=none."]
    assert not run_dir.exists()   # nothing prepared or written: not even Hydra's .hydra/


@pytest.mark.slow
def test_tensorboard_mirrors_every_record_summary_and_config(tiny, tmp_path):  # noqa: F811
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir = tmp_path / "run"
    result = run_cli([*tiny, "logger=tensorboard", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr
    events, got = tensorboard_scalars(run_dir)
    want = expected(run_dir)
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


def wandb_records(log: Path) -> list[dict]:
    """The records of an offline run's .wandb transaction log, as `wandb leet inspect --json`
    (wandb's own reader) prints them."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wandb_home(monkeypatch, tmp_path: Path) -> None:
    """wandb's files outside the run folder go under tmp_path."""
    for kind in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        monkeypatch.setenv(f"WANDB_{kind}_DIR", str(tmp_path / "wandb_home"))


@pytest.mark.slow
def test_wandb_offline_run_mirrors_every_record_summary_and_config(tiny, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """A one-job sweep: the run is named by its folder and grouped by the sweep folder."""
    sweep = tmp_path / "sweep"
    wandb_home(monkeypatch, tmp_path)
    result = run_cli(["-m", *tiny, "logger=wandb", "logger.project=scales", "trainer.seed=5",
                      f"hydra.sweep.dir={sweep}"])
    assert result.returncode == 0, result.stderr
    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir()]   # named by every override
    assert run_dir.name.endswith("trainer.seed=5")
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    log = wandb_records(log)
    (run,) = [r["run"] for r in log if r["type"] == "run"]
    assert (run["project"], run["display_name"], run["run_group"]) == (
        "scales", run_dir.name, str(sweep))
    assert len(list(run_dir.glob(f"wandb/offline-run-*-{run['run_id']}"))) == 1
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    assert config == json.loads((run_dir / "run.json").read_text())["config"]
    got = {}
    for r in log:
        if r["type"] == "history":
            step = r["history"]["step"]["num"]
            got.update({(k, int(step)): v for k, v in r["history"]["item"].items()
                        if not k.startswith("_")})
    assert got == expected(run_dir)   # the same float64 values, every one
    summary = {}
    for r in log:
        if r["type"] == "summary":
            summary.update(r["summary"]["update"])
    written = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss_full"] == written["final_val_loss_full"]
    assert summary["best_step"] == written["best_step"]
    assert [r["exit"]["exit_code"] for r in log if r["type"] == "exit"] == [0]


@pytest.mark.slow
def test_tensorboard_after_resumes_matches_metrics_jsonl(tiny, tmp_path):  # noqa: F811
    """A resume drops the records past its checkpoint from metrics.jsonl and redoes those
    steps (with other tokens/s): the event files must show the redone values only."""
    run_dir = tmp_path / "run"
    args = [*tiny, "logger=tensorboard", f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    assert run_cli([*args, "trainer.max_steps=4"]).returncode == 0
    at_4 = (run_dir / "checkpoints" / "last.pt").read_bytes()
    assert run_cli(args).returncode == 0                       # steps 5-8
    (run_dir / "checkpoints" / "last.pt").write_bytes(at_4)   # back to step 4: redo 5-8
    result = run_cli(args)
    assert result.returncode == 0, result.stderr
    events, got = tensorboard_scalars(run_dir)
    for tag in events.Tags()["scalars"]:   # one value per step: nothing of a dropped segment
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), tag
    # the first segment ended at its max_steps=4 and wrote its summary there; it stays
    assert got.pop(("summary/steps", 4)) == 4.0
    got = {(tag, step): v for (tag, step), v in got.items()
           if not (tag.startswith("summary/") and step == 4)}
    want = expected(run_dir)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == np.float32(value), key
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3


@pytest.mark.slow
def test_a_resumed_wandb_run_keeps_its_id(tiny, tmp_path, monkeypatch):  # noqa: F811
    """Each segment writes its own offline folder, under the id of the first: `wandb sync`
    uploads them in order into one run. Together they hold every record once."""
    wandb_home(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    args = [*tiny, "logger=wandb", f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    assert run_cli([*args, "trainer.max_steps=4"]).returncode == 0
    result = run_cli(args)
    assert result.returncode == 0, result.stderr
    folders = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(folders) == 2 and len({f.name.rsplit("-", 1)[1] for f in folders}) == 1
    got, steps = {}, []
    for folder in folders:
        (log,) = folder.glob("run-*.wandb")
        history = [r["history"] for r in wandb_records(log) if r["type"] == "history"]
        steps.append([int(h["step"]["num"]) for h in history])
        for h in history:
            got.update({(k, int(h["step"]["num"])): v for k, v in h["item"].items()
                        if not k.startswith("_")})
    assert steps == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    want = expected(run_dir)
    assert {k: v for k, v in got.items() if not (k[0].startswith("summary/") and k[1] == 4)} \
        == want


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_under_torchrun_rank_0_alone_logs(name, tiny, tmp_path, monkeypatch):  # noqa: F811
    """Two processes (gloo) train one run: one writer, whose values are metrics.jsonl's."""
    wandb_home(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "train.py", *tiny, f"logger={name}", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    want = expected(run_dir)
    if name == "tensorboard":
        assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
        _, got = tensorboard_scalars(run_dir)
        assert set(got) == set(want)
        for key, value in want.items():   # event files store float32
            assert got[key] == np.float32(value), key
    else:
        (log,) = run_dir.glob("wandb/*run-*/run-*.wandb")   # one offline run
        assert len(list(run_dir.glob("wandb/*run-*"))) == 1
        got = {(k, int(r["history"]["step"]["num"])): v for r in wandb_records(log)
               if r["type"] == "history" for k, v in r["history"]["item"].items()
               if not k.startswith("_")}
        assert got == want
