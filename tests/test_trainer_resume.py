"""Resuming: bit-exact continuation (dropout, padding), run.json's segments, finished runs,
a torn metrics line, and the printed resume commands of a plain run, a sweep and a preset."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train import ROOT, make_config, records, run_cli, tiny  # noqa: F401 (fixture)

import train
from model.errors import UserError
from trainer.launch import Interrupted


def interrupted_then_resumed(tiny, tmp_path, monkeypatch, extra,  # noqa: F811
                             before_resume=lambda run_dir: None):
    """(straight run dir, run dir stopped by SIGTERM after step 3 and resumed)."""
    train.train(make_config([*tiny, *extra]), tmp_path / "straight")
    steps = {"n": 0}
    real_step = train.train_step

    def step_then_signal(*args, **kw):
        out = real_step(*args, **kw)
        steps["n"] += 1
        if steps["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(train, "train_step", step_then_signal)
    with pytest.raises(Interrupted):
        train.train(make_config([*tiny, *extra]), tmp_path / "resumed")
    monkeypatch.setattr(train, "train_step", real_step)
    before_resume(tmp_path / "resumed")
    train.train(make_config([*tiny, *extra, "trainer.resume=auto"]), tmp_path / "resumed")
    return tmp_path / "straight", tmp_path / "resumed"


@pytest.mark.parametrize("extra", [
    ["model.dropout=0.2"],                                          # dropout RNG restored
    ["data.packing=pad", "data.document=line", "trainer.grad_accum=2"]])
def test_resume_is_bit_exact(tiny, tmp_path, monkeypatch, extra):  # noqa: F811
    straight, resumed = interrupted_then_resumed(tiny, tmp_path, monkeypatch, extra)
    for kind, keys in (("train", ("loss", "grad_norm")),
                       ("eval", ("val_loss", "train_loss", "attn_entropy", "attn_max_logit"))):
        a, b = records(straight, kind), records(resumed, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) > 2
        for key in keys:
            assert [r[key] for r in a] == [r[key] for r in b], key
    assert (straight / "samples.txt").read_text() == (resumed / "samples.txt").read_text()


def test_run_json_keeps_every_segment(tiny, tmp_path, monkeypatch):  # noqa: F811
    _, resumed = interrupted_then_resumed(tiny, tmp_path, monkeypatch, [])
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


def test_resuming_a_finished_run_changes_nothing(tiny, tmp_path, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    train.train(make_config(tiny), run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert train.train(make_config([*tiny, "trainer.resume=auto"]), run_dir) is None
    assert "Nothing to do" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_torn_last_metrics_line_is_dropped(tiny, tmp_path, monkeypatch):  # noqa: F811
    def tear(run_dir):   # as kill -9 in the middle of a write would
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write('{"kind": "train", "step": 4, "lo')

    straight, resumed = interrupted_then_resumed(tiny, tmp_path, monkeypatch, [], tear)
    assert [r["loss"] for r in records(resumed, "train")] == [
        r["loss"] for r in records(straight, "train")]


def test_a_bad_line_before_the_last_is_reported(tiny, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    train.train(make_config([*tiny, "trainer.max_steps=4"]), run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match="line 2 is not JSON"):
        train.train(make_config([*tiny, "trainer.max_steps=8", "trainer.resume=auto"]), run_dir)


# ---------------------------------------------------------------- interrupting real sweeps

def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def stop_once_training(proc: subprocess.Popen, folder: Path,
                       allowed=(128 + signal.SIGTERM,)) -> str:
    """SIGTERM as soon as some run under `folder` has logged a training step; its stderr."""
    def training() -> bool:
        try:
            return any(records(m.parent, "train") for m in folder.rglob("metrics.jsonl"))
        except ValueError:   # a line read while it was being written
            return False

    deadline = time.time() + 120
    while time.time() < deadline and not training():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in allowed, stderr
    return stderr


def shell(command: str) -> subprocess.CompletedProcess:
    """`command` pasted into a shell at the repository root, `python` being this Python."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def printed(stderr: str, what: str) -> str:
    return stderr.split(f"Resume {what}")[1].split("with:\n")[1].splitlines()[0].strip()


def job_folders(sweep: Path) -> list[Path]:
    return sorted(p.parent.parent for p in sweep.rglob(".hydra/overrides.yaml"))


def files_of(run_dir: Path) -> dict:
    """What train.py wrote into a job folder (Hydra rewrites .hydra/ before train.py runs)."""
    return {p: p.read_bytes() for p in run_dir.rglob("*")
            if p.is_file() and ".hydra" not in p.parts}


def check_sweep_resumes(tiny, sweep: Path, args: list[str]):  # noqa: F811
    stderr = stop_once_training(start(args), sweep)
    (stopped,) = job_folders(sweep)
    assert "=" in stopped.name and not (stopped / "summary.json").exists()
    steps = STEPS

    job = shell(printed(stderr, "this run"))
    assert job.returncode == 0, job.stderr
    assert [r["step"] for r in records(stopped, "train")] == list(range(1, steps + 1))
    assert json.loads((stopped / "summary.json").read_text())["steps"] == steps
    finished = files_of(stopped)

    rest = shell(printed(stderr, "the whole sweep"))
    assert rest.returncode == 0, rest.stderr
    assert "Nothing to do" in rest.stdout
    assert files_of(stopped) == finished
    folders = job_folders(sweep)
    assert len(folders) == 2
    for folder in folders:
        assert json.loads((folder / "summary.json").read_text())["steps"] == steps
        assert [r["step"] for r in records(folder, "train")] == list(range(1, steps + 1))


# Long enough (a few seconds a job) that the signal lands while the first job trains.
STEPS = 400
SHORT = [f"trainer.max_steps={STEPS}", "trainer.eval_every=200", "trainer.ckpt_every=200",
         "trainer.log_every=1"]


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_job_by_job_and_whole(tiny, tmp_path):  # noqa: F811
    sweep = tmp_path / "sweep"
    check_sweep_resumes(tiny, sweep, ["-m", *tiny, *SHORT, "scaling=sqrt_dk,none",
                                      f"hydra.sweep.dir={sweep}"])


@pytest.mark.slow
def test_an_interrupted_preset_resumes_job_by_job_and_whole(tiny, tmp_path):  # noqa: F811
    """A preset sets hydra.mode: MULTIRUN in its file; shrunk to two jobs here."""
    sweep = tmp_path / "preset"
    check_sweep_resumes(tiny, sweep, [
        "experiment=scaling_ablation", *tiny, *SHORT, "model.n_layer=1",
        "scaling=sqrt_dk,none", "trainer.seed=1", "optim.lr=1e-3",
        f"hydra.sweep.dir={sweep}"])


@pytest.mark.slow
def test_a_plain_run_prints_a_resume_command_that_works(tiny, tmp_path):  # noqa: F811
    run_dir = tmp_path / "plain"
    stderr = stop_once_training(start([*tiny, *SHORT, f"hydra.run.dir={run_dir}"]), run_dir)
    assert "the whole sweep" not in stderr
    command = printed(stderr, "this run")
    assert shlex.split(command)[:2] == ["python", "train.py"]
    assert shell(command).returncode == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS


@pytest.mark.slow
def test_an_interrupted_two_process_run_resumes_bit_exact(tiny, tmp_path):  # noqa: F811
    """torchrun forwards SIGTERM to both processes; each saves and restores its own random
    streams (dropout), and the printed torchrun command continues the run."""
    args = [*tiny, "trainer.max_steps=200", "trainer.eval_every=100", "trainer.ckpt_every=100",
            "trainer.log_every=1", "model.dropout=0.2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "train.py"]
    straight = subprocess.run([*torchrun, *args, f"hydra.run.dir={tmp_path}/straight"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr
    run_dir = tmp_path / "stopped"
    proc = subprocess.Popen([*torchrun, *args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = stop_once_training(proc, run_dir, allowed=(1, 128 + signal.SIGTERM))
    command = printed(stderr, "this run")
    assert shlex.split(command)[:4] == ["torchrun", "--standalone", "--nproc_per_node=2",
                                        "train.py"]
    # the printed command, with this environment's torchrun
    resumed = shell(command.replace("torchrun", f"{sys.executable} -m torch.distributed.run", 1))
    assert resumed.returncode == 0, resumed.stderr
    a, b = records(tmp_path / "straight", "train"), records(run_dir, "train")
    assert [r["step"] for r in b] == list(range(1, 201))
    first, second = json.loads((run_dir / "run.json").read_text())["segments"]
    assert first["ended"] == "interrupted" and 0 < first["end_step"] == second["start_step"] < 200
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-6)
