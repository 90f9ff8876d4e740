"""train.py as a command line, and what only a process shows: exit codes and printed lines on
bad command lines and checkpoints, SIGTERM stopping a run, a sweep and a preset and the printed
resume commands run as printed, torchrun's two processes (the same numbers as one, rank 0 alone
logging, a stop and resume bit for bit), logger=wandb's offline runs, a missing logger package,
scripts/sample.py, and torch.compile (a minute of compiling: kept out of tests/trainer).

Each test is as small as its subject allows: the tiny corpus and model, few steps. A run of a
few hundred steps is one that a signal must land in (the poll below signals at the first logged
step). What a subprocess would only train is trained in process (train.train)."""

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    CONFIGS,
    ROOT,
    derive,
    logger_expected,
    make_config,
    records,
    register_schema,
    run_scripts,
    tensorboard_scalars,
    tiny_overrides,
)
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

import train
from trainer import checkpoint_read, loggers

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "train.py"]
# A run a signal lands in: the first training record appears within a second, the run lasts a
# few seconds more.
STEPS = 200
SHORT = [f"trainer.max_steps={STEPS}", "trainer.eval_every=100", "trainer.ckpt_every=100",
         "trainer.log_every=1"]


def start(args: list[str], launcher=(sys.executable, "train.py")) -> subprocess.Popen:
    return subprocess.Popen([*launcher, *args], cwd=ROOT, text=True, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop_once_training(proc: subprocess.Popen, folder: Path,
                       allowed=(128 + signal.SIGTERM,)) -> tuple[str, str]:
    """SIGTERM as soon as some run under `folder` has logged a training step; (its stdout,
    its stderr)."""
    def training() -> bool:
        try:
            return any(records(m.parent, "train") for m in folder.rglob("metrics.jsonl"))
        except ValueError:   # a line read while it was being written
            return False

    deadline = time.time() + 120
    while time.time() < deadline and not training() and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode in allowed, stderr
    return stdout, stderr


def shell(command: str) -> subprocess.CompletedProcess:
    """`command` pasted into a shell at the repository root, `python` being this Python."""
    env = {**ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def printed(stderr: str, what: str) -> str:
    return stderr.split(f"Resume {what}")[1].split("with:\n")[1].splitlines()[0].strip()


# ---------------------------------------------------------------- bad command lines

BAD = [("scaling=bogus", "config group `scaling` needs one of its options"),
       ("model.n_head=abc", "n_head"), ("model.n_heads=2", "n_heads"),
       ("model.n_head=3", "model."),
       ("trainer.diagnostics=2", "error: trainer.diagnostics=2 is not valid: use true or false"),
       ("+model.normaliser=sink", "error: +model.normaliser=sink: `model` has no key "
        "`normaliser` (`+` adds a key that the run cannot use); use normaliser=sink or "
        "scaling.normaliser=sink."),
       ("normaliser=[sink,sigmoid]", "sweep with -m: python train.py -m normaliser=sink,sigmoid."),
       ("model.pos=nope trainer.eval_lengths=[4096]", "error: trainer.eval_lengths=[4096]: the "
        "validation split has 2,")]
LOGGERS = ("tensorboard", "wandb")


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> tuple[Path, dict]:
    """The command lines that end before training, and scripts/sample.py's on a run trained
    here, run in one process (conftest.run_scripts): (their folder, the result of each by
    name)."""
    folder = tmp_path_factory.mktemp("refused")
    tiny = tiny_overrides(folder)
    garbage = folder / "garbage.pt"
    garbage.write_text("not a checkpoint")
    train.train(make_config(tiny), folder / "trained")
    runs = {bad: ("train.py", [*tiny, *bad.split(), f"hydra.run.dir={folder}/bad{i}"], [])
            for i, (bad, _) in enumerate(BAD)}
    kept = shutil.copytree(folder / "trained", folder / "kept")   # a run's folder, as the CLI
    (kept / ".hydra").mkdir()                                     # leaves it
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (kept / ".hydra" / name).write_text(f"# the {name} of the run as it started\n")
    shutil.copytree(kept, folder / "kept_before")
    runs["refused resume"] = ("train.py", [*tiny, "optim.lr=0.002", "trainer.resume=auto",
                                           f"hydra.run.dir={kept}"], [])
    runs["group"] = ("train.py", ["hydra/launcher=", f"hydra.run.dir={folder}/group"], [])
    runs["garbage"] = ("train.py", [*tiny, f"trainer.resume={garbage}",
                                    f"hydra.run.dir={folder}/new"], [])
    runs["sample garbage"] = ("scripts/sample.py", [str(folder)], [])
    runs["sample"] = ("scripts/sample.py", [str(folder / "trained"), "--prompt", "the",
                                            "--prompt", "a pale moon", "--max_new_tokens", "12"],
                      [])
    for option, value, _ in BAD_SAMPLING:
        runs[f"{option} {value}"] = ("scripts/sample.py", [str(folder / "trained"), option,
                                                          value], [])
    for name in LOGGERS:   # the package hidden from the import system
        runs[name] = ("train.py", [f"logger={name}", f"hydra.run.dir={folder}/{name}"], [name])
    return folder, dict(zip(runs, run_scripts(list(runs.values()))))


@pytest.mark.parametrize("bad, says", BAD)
def test_bad_command_line_exits_readably_and_writes_nothing(refused, bad, says):
    folder, results = refused
    out = results[bad]
    assert out.returncode != 0
    assert says in out.stderr and "Traceback" not in out.stderr
    assert not (folder / f"bad{[b for b, _ in BAD].index(bad)}").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="reads GNU OpenMP's report (libgomp)")
@pytest.mark.parametrize("given, spins", [(None, "0"), ("ACTIVE", "30000000000")])
def test_train_py_loads_openmp_with_threads_that_sleep_while_waiting(given, spins):
    """train.py sets OMP_WAIT_POLICY=PASSIVE before torch loads OpenMP, which reads it once:
    OpenMP's own report (OMP_DISPLAY_ENV) has its threads spin 0 times before they sleep (left
    unset: 300000), and a caller's policy is kept. The command line is refused after the load."""
    env = {k: v for k, v in ENV.items() if k != "OMP_WAIT_POLICY"}
    env.update({"OMP_DISPLAY_ENV": "VERBOSE", **({"OMP_WAIT_POLICY": given} if given else {})})
    proc = subprocess.run([sys.executable, "train.py", "+foo=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"GOMP_SPINCOUNT = '{spins}'" in proc.stderr, proc.stderr


def checksums(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def test_a_refused_resume_changes_nothing_in_the_run_folder(refused):
    """The settings differ from the checkpoint's: refused in one paragraph, and every file of
    the folder keeps its bytes, .hydra/ included (Hydra writes nothing there before the run's
    checks pass)."""
    folder, results = refused
    result = results["refused resume"]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"error: Cannot resume from {folder / 'kept'}/checkpoints/last.pt: the settings differ "
        "from the checkpoint's (optim.lr: checkpoint 0.001, now 0.002). Resume with")
    assert len(result.stderr.strip().splitlines()) == 1
    assert checksums(folder / "kept") == checksums(folder / "kept_before")


def test_train_py_exits_2_with_one_paragraph(refused):
    """A bad config-group value: the command line's exit code and its one line (every group:
    tests/trainer/test_group_overrides.py, through train.main in process)."""
    folder, results = refused
    result = results["group"]
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: hydra/launcher=: the config group `hydra/launcher` needs ")
    assert not (folder / "group").exists() and result.stdout == ""


def test_command_line_garbage_checkpoint_exits_2_without_traceback(refused):
    folder, results = refused
    out, garbage = results["garbage"], folder / "garbage.pt"
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(garbage) in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (folder / "new").exists()
    sampled = results["sample garbage"]   # a folder without checkpoints
    assert sampled.returncode == 2 and "Cannot sample from" in sampled.stderr
    assert "Traceback" not in sampled.stderr


@pytest.mark.parametrize("name", LOGGERS)
def test_train_py_without_the_package_exits_2_before_writing(refused, name):
    """The package is hidden from the import system, as if it were not installed."""
    folder, results = refused
    result = results[name]
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: logger={name} needs the {name} package, which is not installed in this Python "
        f"({loggers.PACKAGES[name]} is not part of requirements.txt). Install it with `pip "
        f"install -r requirements-loggers.txt` (both loggers) or `pip install "
        f"{loggers.PACKAGES[name]}`, or train without it: logger=none."]
    assert not (folder / name).exists()   # nothing prepared or written: not even .hydra/


# scripts/sample.py's bad options: (option, value, its one error line)
ABSENT = next(d for d in ("cuda", "mps") if not (torch.cuda.is_available() if d == "cuda" else
                                                 torch.backends.mps.is_available()))
BAD_SAMPLING = [
    ("--temperature", "nan", "error: temperature=nan must be >= 0 and finite: 0 means greedy, "
     "e.g. 0.8 samples."),
    ("--temperature", "1e-40", "error: temperature=1e-40 is below 1e-06, where a sample follows "
     "the rounding of the logits or overflows them: use 0 (greedy) or a temperature of at least "
     "1e-06, e.g. 0.8."),
    ("--max_new_tokens", "-1", "error: max_new_tokens=-1 must be an integer >= 0, the number of "
     "tokens to generate."),
    ("--device", ABSENT, f"error: --device={ABSENT} is not available on this machine; use "
     "--device=auto or cpu.")]


@pytest.mark.parametrize("option, value, says", BAD_SAMPLING)
def test_sample_script_refuses_a_bad_option_in_one_line(refused, option, value, says):
    folder, results = refused
    result = results[f"{option} {value}"]
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [says]   # no traceback


def test_sample_script_command_line(refused):
    sampled = refused[1]["sample"]
    assert sampled.returncode == 0, sampled.stderr
    assert "the" in sampled.stdout and "a pale moon" in sampled.stdout


# ---------------------------------------------------------------- a run stopped and resumed

def test_a_stopped_run_prints_a_resume_command_that_works(tiny, tmp_path):
    """SIGTERM: exit 128 + 15 with last.pt and the printed command, which continues the run to
    its end; the finished run prints its summary line and its folder."""
    run_dir = tmp_path / "term"
    _, stderr = stop_once_training(start([*tiny, *SHORT, f"hydra.run.dir={run_dir}"]), run_dir)
    assert "trainer.resume=auto" in stderr and (run_dir / "checkpoints" / "last.pt").is_file()
    assert "the whole sweep" not in stderr
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()
    stopped_at = records(run_dir, "train")[-1]["step"]
    assert stopped_at < STEPS and not (run_dir / "summary.json").exists()
    command = printed(stderr, "this run")
    assert shlex.split(command)[:2] == ["python", "train.py"]
    resumed = shell(command)
    assert resumed.returncode == 0, resumed.stderr
    assert "best val loss" in resumed.stdout and f"run dir: {run_dir}" in resumed.stdout
    assert [r["step"] for r in records(run_dir, "train")] == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS


def job_folders(sweep: Path) -> list[Path]:
    return sorted(p.parent.parent for p in sweep.rglob(".hydra/overrides.yaml"))


def files_of(run_dir: Path) -> dict:
    """What train.py wrote into a job folder (Hydra rewrites .hydra/ before train.py runs)."""
    return {p: p.read_bytes() for p in run_dir.rglob("*")
            if p.is_file() and ".hydra" not in p.parts}


def check_sweep(folders: list[Path]) -> None:
    assert len(folders) == 2
    for folder in folders:
        assert json.loads((folder / "summary.json").read_text())["steps"] == STEPS
        assert [r["step"] for r in records(folder, "train")] == list(range(1, STEPS + 1))


def test_an_interrupted_sweep_resumes_whole(tiny, tmp_path):
    """-m, two jobs stopped in the first: the printed whole-sweep command continues the
    stopped job from its checkpoint and runs the other. One folder per job, named by its
    overrides (paths and output settings left out)."""
    sweep = tmp_path / "sweep"
    _, stderr = stop_once_training(start(["-m", *tiny, *SHORT, "scaling=sqrt_dk,none",
                                          f"hydra.sweep.dir={sweep}"]), sweep)
    (stopped,) = job_folders(sweep)
    assert "=" in stopped.name and not (stopped / "summary.json").exists()
    rest = shell(printed(stderr, "the whole sweep"))
    assert rest.returncode == 0, rest.stderr
    first, second = json.loads((stopped / "run.json").read_text())["segments"]
    assert (first["ended"], second["ended"]) == ("interrupted", "finished")
    assert first["end_step"] == second["start_step"]
    folders = job_folders(sweep)
    check_sweep(folders)
    for run, scaling in zip(folders, ("none", "sqrt_dk")):
        assert f"scaling={scaling}," in run.name and f"trainer.max_steps={STEPS}" in run.name
        assert "train_files" not in run.name and "sample_prompts" not in run.name
        assert (run / ".hydra" / "overrides.yaml").is_file()


def test_an_interrupted_preset_resumes_job_by_job_and_whole(tiny, tmp_path):
    """A preset sets hydra.mode: MULTIRUN in its file (shrunk to two jobs here): the printed
    command of the stopped job resumes it alone (hydra.mode=RUN), then the whole sweep's
    leaves that finished job as it is and runs the other."""
    sweep = tmp_path / "preset"
    _, stderr = stop_once_training(start([
        "experiment=scaling_ablation", *tiny, *SHORT, "model.n_layer=1",
        "scaling=sqrt_dk,none", "trainer.seed=1", "optim.lr=1e-3",
        f"hydra.sweep.dir={sweep}"]), sweep)
    (stopped,) = job_folders(sweep)
    assert "=" in stopped.name and not (stopped / "summary.json").exists()

    job = shell(printed(stderr, "this run"))
    assert job.returncode == 0, job.stderr
    assert [r["step"] for r in records(stopped, "train")] == list(range(1, STEPS + 1))
    assert json.loads((stopped / "summary.json").read_text())["steps"] == STEPS
    finished = files_of(stopped)

    rest = shell(printed(stderr, "the whole sweep"))
    assert rest.returncode == 0, rest.stderr
    assert "Nothing to do" in rest.stdout
    assert files_of(stopped) == finished
    check_sweep(job_folders(sweep))


# ---------------------------------------------------------------- torchrun: two processes

def wandb_records(log: Path) -> list[dict]:
    """The records of an offline run's .wandb transaction log, as `wandb leet inspect --json`
    (wandb's own reader) prints them."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wandb_history(log: Path) -> dict:
    """(tag, step) -> value of every scalar an offline W&B run logged."""
    return {(k, int(r["history"]["step"]["num"])): v for r in wandb_records(log)
            if r["type"] == "history" for k, v in r["history"]["item"].items()
            if not k.startswith("_")}


@pytest.fixture
def wandb_home(monkeypatch, tmp_path):
    """wandb's files outside the run folder go under tmp_path (this process and its
    children)."""
    for kind in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        monkeypatch.setenv(f"WANDB_{kind}_DIR", str(tmp_path / "wandb_home"))


@pytest.mark.parametrize("packing, logger", [("concat", "tensorboard"), ("pad", "wandb")])
def test_two_process_torchrun_matches_one_process_and_rank_0_alone_logs(
        tiny, tmp_path, wandb_home, packing, logger):
    """torchrun's two processes (gloo) train the run one process trains: the same losses, one
    writer of the run folder and of the logger's files, whose values are metrics.jsonl's.
    grad_accum=2: DDP skips the gradient all-reduce on the first micro-step (no_sync). pad with
    one document per line: the processes' micro-batches hold different numbers of real
    targets, so only a token-weighted loss matches the one-process run."""
    args = [*tiny, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.grad_accum=2",
            f"data.packing={packing}", "data.document=line"]
    train.train(make_config(args), tmp_path / "one")   # the reference, in this process
    run_dir = tmp_path / "two"
    double = subprocess.run([*TORCHRUN, *args, f"logger={logger}", f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True, timeout=300)
    assert double.returncode == 0, double.stderr
    assert not (ROOT / ".hydra").exists()   # the second process made no run directory
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        one, two = records(tmp_path / "one", kind), records(run_dir, kind)
        assert [r["step"] for r in one] == [r["step"] for r in two]
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    want = logger_expected(run_dir)
    if logger == "tensorboard":
        assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
        _, got = tensorboard_scalars(run_dir)
        assert set(got) == set(want)
        for key, value in want.items():   # event files store float32
            assert got[key] == np.float32(value), key
    else:
        (log,) = run_dir.glob("wandb/*run-*/run-*.wandb")   # one offline run
        assert len(list(run_dir.glob("wandb/*run-*"))) == 1
        assert wandb_history(log) == want


def test_an_interrupted_two_process_run_resumes_bit_exact(tiny, tmp_path):
    """torchrun forwards SIGTERM to both processes; each saves and restores its own random
    streams (dropout), and the printed torchrun command continues the run."""
    args = [*tiny, *SHORT, "model.dropout=0.2"]
    straight = subprocess.run([*TORCHRUN, *args, f"hydra.run.dir={tmp_path}/straight"],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr
    run_dir = tmp_path / "stopped"
    proc = start([*args, f"hydra.run.dir={run_dir}"], launcher=TORCHRUN)
    _, stderr = stop_once_training(proc, run_dir, allowed=(1, 128 + signal.SIGTERM))
    command = printed(stderr, "this run")
    assert shlex.split(command)[:4] == ["torchrun", "--standalone", "--nproc_per_node=2",
                                        "train.py"]
    # the printed command, with this environment's torchrun
    resumed = shell(command.replace("torchrun", f"{sys.executable} -m torch.distributed.run", 1))
    assert resumed.returncode == 0, resumed.stderr
    a, b = records(tmp_path / "straight", "train"), records(run_dir, "train")
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    first, second = json.loads((run_dir / "run.json").read_text())["segments"]
    assert first["ended"] == "interrupted"
    assert 0 < first["end_step"] == second["start_step"] < STEPS
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-6)


# ---------------------------------------------------------------- logger=wandb

@pytest.fixture
def in_sweep(tmp_path):
    """HydraConfig as in a job of a sweep (-m) in tmp_path/sweep, cleared afterwards: the
    folder wandb_run reads."""
    sweep = tmp_path / "sweep"
    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        hydra = compose("config", overrides=[f"hydra.sweep.dir={sweep}"],
                        return_hydra_config=True)
    with open_dict(hydra):
        hydra.hydra.mode = "MULTIRUN"
    HydraConfig.instance().set_config(hydra)
    yield sweep
    HydraConfig.instance().cfg = None


def test_wandb_offline_run_mirrors_every_record_summary_and_config(tiny_cfg, in_sweep,
                                                                   wandb_home):
    """A job of a sweep (HydraConfig as in one; trained in process): the run is named by its
    folder and grouped by the sweep folder. (The folder's name, Hydra's: the sweep tests.)"""
    sweep = in_sweep
    run_dir = sweep / "trainer.seed=5"
    train.train(derive(tiny_cfg, ["logger.name=wandb", "logger.project=scales",  # logger=wandb
                                  "trainer.seed=5"]), run_dir)
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
    assert got == logger_expected(run_dir)   # the same float64 values, every one
    summary = {}
    for r in log:
        if r["type"] == "summary":
            summary.update(r["summary"]["update"])
    written = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss_full"] == written["final_val_loss_full"]
    assert summary["best_step"] == written["best_step"]
    assert [r["exit"]["exit_code"] for r in log if r["type"] == "exit"] == [0]


def test_a_resumed_wandb_run_keeps_its_id(tiny_cfg, tmp_path, wandb_home):
    """Each segment writes its own offline folder, under the id of the first: `wandb sync`
    uploads them in order into one run. Together they hold every record once. Trained in
    process (wandb's own service process and reader are what make this slow)."""
    run_dir = tmp_path / "run"
    cfg = derive(tiny_cfg, ["logger.name=wandb", "trainer.resume=auto"])   # logger=wandb
    train.train(derive(cfg, ["trainer.max_steps=4"]), run_dir)
    train.train(cfg, run_dir)
    folders = sorted(run_dir.glob("wandb/offline-run-*"))
    # offline-run-<time>-<id>, and -1 after it for a segment started in the same second
    ids = {re.fullmatch(r"offline-run-\d{8}_\d{6}-(\w+)(-\d+)?", f.name)[1] for f in folders}
    assert len(folders) == 2 and len(ids) == 1
    got, steps = {}, []
    for folder in folders:
        (log,) = folder.glob("run-*.wandb")
        history = [r["history"] for r in wandb_records(log) if r["type"] == "history"]
        steps.append([int(h["step"]["num"]) for h in history])
        for h in history:
            got.update({(k, int(h["step"]["num"])): v for k, v in h["item"].items()
                        if not k.startswith("_")})
    assert steps == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    want = logger_expected(run_dir)
    assert {k: v for k, v in got.items() if not (k[0].startswith("summary/") and k[1] == 4)} \
        == want


# ---------------------------------------------------------------- torch.compile

def compile_unsupported() -> str:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "torch.compile on CPU needs a C compiler (none on PATH)"
    return ""


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")   # inside torch's compiler
@pytest.mark.skipif(bool(compile_unsupported()), reason=compile_unsupported() or "supported")
def test_compile_trains_like_eager(tiny_cfg, tmp_path):
    """In process; one layer and three steps: the compiled forward and backward are the
    compile's cost, the same for any length of run."""
    eager = tmp_path / "eager"
    short = derive(tiny_cfg, ["model.n_layer=1", "trainer.max_steps=3", "trainer.eval_every=3",
                              "trainer.ckpt_every=3"])
    train.train(short, eager)
    summary = train.train(derive(short, ["trainer.compile=true"]), tmp_path / "compiled")
    assert summary["steps"] == 3
    for a, b in zip(records(tmp_path / "compiled", "train"), records(eager, "train"),
                    strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    ckpt = checkpoint_read.read(tmp_path / "compiled" / "checkpoints" / "last.pt")
    assert not any(k.startswith("_orig_mod") for k in ckpt["model"])   # uncompiled weights


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")
@pytest.mark.skipif(bool(compile_unsupported()), reason=compile_unsupported() or "supported")
@pytest.mark.parametrize("normaliser, impl", [("sink", "sdpa"), ("sigmoid", "explicit")])
def test_compile_keeps_each_normalisers_loss_and_gradients(normaliser, impl):
    """The normalisers' own paths compiled: sink's zero key with its float mask column and
    learned logit on SDPA, sigmoid's per-row bias on the explicit path (a one-layer model, one
    forward and backward each)."""
    from model.config import GPTConfig, ScalingConfig
    from model.gpt import GPT
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, d_model=32,
                          d_head=16, attn_impl=impl,
                          scaling=ScalingConfig(normaliser=normaliser)))
    x = torch.randint(0, 50, (2, 16))
    losses, grads = [], []
    for forward in (model, torch.compile(model)):
        model.zero_grad()
        loss = forward(x, x)[1]
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in model.parameters()])
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)
    for eager, compiled in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-4)
    if normaliser == "sink":
        assert model.blocks[0].attn.sink.grad.abs().sum() > 0   # the logit learns when compiled
