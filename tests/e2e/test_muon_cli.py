"""optim=muon as a command line: a bad Muon value exits 2 in one paragraph and writes nothing;
kill -9 in the middle of a run, then trainer.resume=auto, gives the uninterrupted run's losses
bit for bit; torchrun's two processes train the one process's run. The processes are started
as tests/e2e/test_train_cli.py starts them (its `start`, TORCHRUN and ENV); what a subprocess
would only train is trained in process (train.train)."""

import signal
import subprocess
import time

import pytest
from conftest import ROOT, make_config, records, run_scripts, tiny_overrides
from test_train_cli import ENV, TORCHRUN, start

import train

pytestmark = pytest.mark.slow

BAD = [("optim.ns_steps=0", "error: optim.ns_steps=0 is not valid: use a whole number of "
        "Newton-Schulz iterations"),
       ("optim.adjust_lr_fn=rms", "error: optim.adjust_lr_fn='rms' is not valid: choose "
        "original | match_rms_adamw"),
       ("optim.muon_params=[blocks.*]", "error: optim.muon_params=['blocks.*'] is not valid: it "
        "routes blocks.0.ln_1.weight (32,), blocks.0.ln_2.weight (32,) and 2 more to Muon"),
       ("param=mup optim.adjust_lr_fn=match_rms_adamw", "error: optim.adjust_lr_fn="
        "match_rms_adamw cannot work with param=mup")]


def test_a_bad_muon_value_exits_2_in_one_paragraph_and_writes_nothing(tmp_path):
    tiny = tiny_overrides(tmp_path)
    runs = [("train.py", [*tiny, "optim=muon", *bad.split(), f"hydra.run.dir={tmp_path}/bad{i}"],
             []) for i, (bad, _) in enumerate(BAD)]
    for i, ((_, says), out) in enumerate(zip(BAD, run_scripts(runs))):
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(says), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
        assert not (tmp_path / f"bad{i}").exists()


def logged_past(run_dir, step: int) -> bool:
    """Whether the run in run_dir has logged a training step past `step`."""
    try:
        return any(r["step"] > step for r in records(run_dir, "train"))
    except (FileNotFoundError, ValueError):   # not started, or a line read half-written
        return False


def test_kill_9_then_resume_gives_the_uninterrupted_losses_bit_for_bit(tmp_path):
    """MuonClip and the z-loss on: killed (no checkpoint written at the kill) some steps past
    the step-20 checkpoint; the resumed run replays from there, Muon's momentum, AdamW's
    moments, the clip counts and the sampler restored, and logs the straight run's losses."""
    args = [*tiny_overrides(tmp_path), "optim=muon", "optim.qk_clip=0.05", "trainer.z_loss=1e-3",
            "trainer.max_steps=400", "trainer.eval_every=100", "trainer.ckpt_every=20"]
    run_dir = tmp_path / "killed"
    proc = start([*args, f"hydra.run.dir={run_dir}"])
    deadline = time.time() + 120
    while time.time() < deadline and not logged_past(run_dir, 25) and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(r["step"] for r in records(run_dir, "train"))
    assert 25 < killed_at < 400
    train.train(make_config([*args, "trainer.resume=auto"]), run_dir)
    train.train(make_config(args), tmp_path / "straight")
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        a, b = records(tmp_path / "straight", kind), records(run_dir, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b]
        assert [r[key] for r in a] == [r[key] for r in b], kind   # bit for bit


def test_two_process_torchrun_trains_the_one_process_run(tmp_path):
    """DDP averages the gradients before the step, so each process's Muon orthogonalises the
    same matrices: the losses of one process, to float32's rounding of the all-reduce."""
    args = [*tiny_overrides(tmp_path), "optim=muon", "trainer.max_steps=6",
            "trainer.eval_every=3", "trainer.grad_accum=2"]
    train.train(make_config(args), tmp_path / "one")
    double = subprocess.run([*TORCHRUN, *args, f"hydra.run.dir={tmp_path}/two"], cwd=ROOT,
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert double.returncode == 0, double.stderr
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        one, two = records(tmp_path / "one", kind), records(tmp_path / "two", kind)
        assert [r["step"] for r in one] == [r["step"] for r in two]
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
