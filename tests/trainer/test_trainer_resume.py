"""Resuming in process: bit-exact continuation (dropout, padding), run.json's segments,
finished runs, a torn metrics line. The printed resume commands of a plain run, a sweep and a
preset, run as printed, are tested in tests/e2e/test_train_cli.py."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_run, derive, records

import train
from data.batching import Batcher, BatchShape
from model.errors import UserError
from trainer.job import Interrupted
from trainer.resume import check_sampler

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")


def stopped_after_step_3(cfg, run_dir: Path, monkeypatch) -> Interrupted:
    """Train run_dir with the config `cfg`, SIGTERM to this process after step 3 (mid-run,
    between checkpoints: ckpt_every=4): the Interrupted that train.train raised."""
    steps = {"n": 0}
    real_step = train.train_step

    def step_then_signal(*args, **kw):
        out = real_step(*args, **kw)
        steps["n"] += 1
        if steps["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(train, "train_step", step_then_signal)
    with pytest.raises(Interrupted) as stop:
        train.train(cfg, run_dir)
    monkeypatch.setattr(train, "train_step", real_step)
    return stop.value


def interrupted_then_resumed(cfg, run_dir: Path, monkeypatch,
                             before_resume=lambda run_dir: None) -> Path:
    """run_dir, trained with the config `cfg`, stopped by SIGTERM after step 3 and resumed."""
    stopped_after_step_3(cfg, run_dir, monkeypatch)
    before_resume(run_dir)
    train.train(derive(cfg, ["trainer.resume=auto"]), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def interrupted(tiny_cfg, tmp_path_factory):
    """tiny_run's config, stopped after step 3 and resumed, once for the tests that read it:
    (its folder, the Interrupted, the files it held when stopped, the resumed run's summary)."""
    run_dir = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        stop = stopped_after_step_3(derive(tiny_cfg, []), run_dir, monkeypatch)
    when_stopped = {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}
    summary = train.train(derive(tiny_cfg, ["trainer.resume=auto"]), run_dir)
    return run_dir, stop, when_stopped, summary


def test_resume_reproduces_the_uninterrupted_run(tiny_run, interrupted):
    """8 steps straight == 3 steps, SIGTERM, resume for 5: loss for loss, exactly."""
    straight = tiny_run[0]
    resumed, stop, when_stopped, summary = interrupted
    assert stop.step == 3 and stop.checkpoint == resumed / "checkpoints" / "last.pt"
    assert "checkpoints/last.pt" in when_stopped and "summary.json" not in when_stopped
    assert summary["steps"] == 8
    for kind in ("train", "eval"):
        a, b = records(straight, kind), records(resumed, kind)
        key = "loss" if kind == "train" else "val_loss"
        assert [r["step"] for r in b] == [r["step"] for r in a]
        assert [r[key] for r in b] == [r[key] for r in a]   # bit for bit


@pytest.mark.parametrize("extra", [
    ["model.dropout=0.2"],                                          # dropout RNG restored
    ["data.packing=pad", "data.document=line", "trainer.grad_accum=2"],
    ["optim.qk_clip=0.05", "trainer.z_loss=1e-3"],                 # clip counts checkpointed
    # modded-nanogpt's scale after a gain-free RMSNorm, a gate, RoPE and a learned sink
    ["scaling.name=constant", "scaling.divisor=8.333", "scaling.qk_norm=rmsnorm",
     "scaling.qk_norm_gain=false", "model.attn_gate=headwise", "model.pos=rope",
     "scaling.normaliser=sink"],
    ["scaling.name=sqrt_dmodel", "model.attn_gate=elementwise", "model.pos=nope",
     "scaling.length=ssmax", "scaling.normaliser=sigmoid"]])
def test_resume_is_bit_exact(tiny_cfg, tmp_path, monkeypatch, extra):
    straight, extra = tmp_path / "straight", [*extra, "trainer.diagnostics=true"]
    train.train(derive(tiny_cfg, extra), straight)
    resumed = interrupted_then_resumed(derive(tiny_cfg, extra), tmp_path / "resumed",
                                       monkeypatch)
    for kind, keys in (("train", ("loss", "grad_norm")),
                       ("eval", ("val_loss", "train_loss", "attn_entropy", "attn_max_logit"))):
        a, b = records(straight, kind), records(resumed, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) > 2
        for key in keys:
            assert [r[key] for r in a] == [r[key] for r in b], key
    for key in ("qk_clip_count", "logit_cap"):
        heads = [r["attn_heads"].get(key) for r in records(straight, "eval")]
        assert heads == [r["attn_heads"].get(key) for r in records(resumed, "eval")], key
    assert ("logit_cap" in records(straight, "eval")[-1]["attn_heads"]) == any(
        key.startswith("scaling.qk_norm=") for key in extra)   # recorded where a norm is on
    for r in records(straight, "eval"):   # a head's largest logit never passes its cap
        for caps, maxima in zip(r["attn_heads"].get("logit_cap", []),
                                r["attn_heads"]["max_logit"]):
            assert all(m <= c * (1 + 1e-6) for m, c in zip(maxima, caps))
    assert (straight / "samples.txt").read_text() == (resumed / "samples.txt").read_text()


def test_run_json_keeps_every_segment(interrupted):
    resumed = interrupted[0]
    run = json.loads((resumed / "run.json").read_text())
    first, second = run["segments"]
    assert (first["start_step"], first["end_step"], first["ended"]) == (0, 3, "interrupted")
    assert (second["start_step"], second["end_step"], second["ended"]) == (3, 8, "finished")
    assert first["resumed_from"] is None
    assert second["resumed_from"] == str(resumed / "checkpoints" / "last.pt")
    for segment in (first, second):
        assert {"git_commit", "command", "started_at", "ended_at"} <= set(segment)
        assert segment["started_at"] <= segment["ended_at"]
    assert first["ended_at"] <= second["started_at"]
    assert run["resumed_from"] is None   # the top level describes how the run began


def test_resuming_a_finished_run_changes_nothing(tiny_cfg, tiny_run, tmp_path,
                                                 capsys):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert train.train(derive(tiny_cfg, ["trainer.resume=auto"]), run_dir) is None
    assert "Nothing to do" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_run_stopped_while_finishing_is_finished_on_resume(tiny_cfg, tiny_run, tmp_path,
                                                            capsys):
    """Killed after its last.pt at trainer.max_steps but before summary.json (during the
    whole-split evaluation or the samples): resuming it does what was left, with the same
    numbers as the uninterrupted run, instead of calling it finished without a summary."""
    run_dir = copy_run(tiny_run[0], tmp_path / "run")
    (run_dir / "summary.json").unlink()
    (run_dir / "samples.txt").unlink()
    summary = train.train(derive(tiny_cfg, ["trainer.resume=auto"]), run_dir)
    assert "Nothing to do" not in capsys.readouterr().out
    want = tiny_run[1]
    assert summary is not None and summary["steps"] == want["steps"] == 8
    same = ("final_val_loss", "final_val_loss_full", "best_val_loss", "best_step",
            "init_val_loss", "final_val_bpb_full", "full_eval_targets", "diverged")
    assert {k: summary[k] for k in same} == {k: want[k] for k in same}
    assert summary["tokens_per_sec"] is None   # this segment trained no step
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert (run_dir / "samples.txt").read_text() == (tiny_run[0] / "samples.txt").read_text()
    segments = json.loads((run_dir / "run.json").read_text())["segments"]
    assert [(s["start_step"], s["end_step"], s["ended"]) for s in segments] == [
        (0, 8, "finished"), (8, 8, "finished")]
    assert [r["step"] for r in records(run_dir, "eval")] == [0, 4, 8]   # no step evaluated twice


def test_a_torn_last_metrics_line_is_dropped(tiny_cfg, tiny_run, tmp_path,
                                             monkeypatch):
    def tear(run_dir):   # as kill -9 in the middle of a write would
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write('{"kind": "train", "step": 4, "lo')

    straight = tiny_run[0]
    resumed = interrupted_then_resumed(derive(tiny_cfg, []), tmp_path / "resumed", monkeypatch,
                                       tear)
    assert [r["loss"] for r in records(resumed, "train")] == [
        r["loss"] for r in records(straight, "train")]


def test_a_bad_line_before_the_last_is_reported(tiny_cfg, tiny_run, tmp_path):
    run_dir = copy_run(tiny_run[0], tmp_path / "run")   # at step 8
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match="line 2 is not JSON"):
        train.train(derive(tiny_cfg, ["trainer.max_steps=12", "trainer.resume=auto"]), run_dir)


def test_a_sampler_state_of_other_settings_is_refused():
    """The batches of the uninterrupted run replay only with the saved sampler settings."""
    tokens = np.arange(100, dtype=np.uint16)
    saved = {**Batcher(tokens, BatchShape(4, 8), seed=3).state_dict(), "step": 7}
    check_sampler(saved, Batcher(tokens, BatchShape(4, 8), seed=3).state_dict(), Path("x.pt"))
    for other, key in ((Batcher(tokens, BatchShape(4, 8), seed=9), "seed"),
                       (Batcher(tokens[:50], BatchShape(4, 8), seed=3), "n_tokens")):
        with pytest.raises(UserError, match=rf"differs from this run's in \['{key}'\]"):
            check_sampler(saved, other.state_dict(), Path("x.pt"))
