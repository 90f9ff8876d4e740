"""Sweeps under Hydra's launchers: hydra/launcher=joblib (parallel on this machine) and
submitit_local (the SLURM plugin's local executor): configs, threads per job, failing and
stopped jobs, resuming a whole sweep, the cache lock, and the time-limit signal's requeue.

The end-to-end tests run the real command line on the tiny corpus (conftest's `tiny`)."""

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from conftest import CONFIGS, ROOT, make_config, records
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

import train
from data.cache import default_cache_root
from data.config import DataConfig
from data.prepare import cache_key, open_source
from trainer import launch
from trainer.build import MAX_AUTO_THREADS, choose_threads
from trainer.job import Job
from trainer.launch import SweepJob
from trainer.schema import register_configs


def hydra_config(overrides: list[str], sweep_dir: Path):
    """The composed config with its `hydra` node, as a sweep job sees it in HydraConfig,
    and the multirun.yaml Hydra's sweeper writes into sweep_dir before launching."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        cfg = compose("config", overrides=[*overrides, f"hydra.sweep.dir={sweep_dir}"],
                      return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
        cfg.hydra.job.num = 0
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, sweep_dir / "multirun.yaml")
    return cfg


@pytest.fixture
def in_sweep(monkeypatch):
    """Set HydraConfig as inside a sweep job; cleared afterwards."""
    def enter(cfg):
        HydraConfig.instance().set_config(cfg)
    yield enter
    HydraConfig.instance().cfg = None


def test_our_joblib_config_takes_precedence_over_the_plugins(tmp_path):
    hydra = hydra_config(["hydra/launcher=joblib"], tmp_path).hydra
    assert hydra.launcher._target_.endswith("JoblibLauncher")
    # the plugin's own default is n_jobs=-1 with pre_dispatch 2*n_jobs and batch_size auto
    assert (hydra.launcher.n_jobs, hydra.launcher.batch_size, hydra.launcher.pre_dispatch) == (
        -1, "1", "n_jobs")
    assert hydra.callbacks.parallel_sweep._target_ == "trainer.launch.ParallelSweep"
    slurm = hydra_config(["hydra/launcher=submitit_slurm"], tmp_path).hydra.launcher
    assert (slurm.signal_delay_s, slurm.max_num_timeout, slurm.gpus_per_node) == (120, 3, 1)


@pytest.mark.parametrize("cores, jobs, expected", [(8, 2, 4), (8, 3, 2), (2, 2, 1), (2, 8, 1),
                                                   (64, 2, MAX_AUTO_THREADS)])
def test_joblib_jobs_share_the_cores(monkeypatch, cores, jobs, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")   # joblib's own setting in its workers: not read
    threads, how = choose_threads("auto", jobs)
    assert threads == expected and threads * jobs <= max(cores, jobs)
    waits = os.environ.get("OMP_WAIT_POLICY", "unset")   # train.py's PASSIVE once it is loaded
    assert how == (f"trainer.threads=auto: {cores} core(s) available / {jobs} sweep job(s) at "
                   f"once (hydra.launcher.n_jobs), at most {MAX_AUTO_THREADS}; "
                   f"OMP_WAIT_POLICY={waits}")
    assert choose_threads("auto", None)[0] == 7   # outside joblib OMP_NUM_THREADS still rules
    assert choose_threads(3, jobs) == (3, "")


@pytest.mark.parametrize("overrides, n_jobs, expected", [
    (["scaling=sqrt_dk,none,dk", "trainer.seed=1,2"], 4, 4),          # 6 jobs, 4 at once
    (["scaling=sqrt_dk,none"], 8, 2),                                 # 2 jobs on 8 workers
    (["experiment=scaling_ablation"], 5, 5),                          # the preset's 18 jobs
    (["experiment=scaling_ablation", "scaling=none,dk", "trainer.seed=1"], 16, 2),
])
def test_jobs_at_once_reads_n_jobs_and_the_sweep_from_hydra(tmp_path, in_sweep, overrides,
                                                            n_jobs, expected):
    cfg = hydra_config(["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}"], tmp_path)
    with open_dict(cfg):
        cfg.hydra.overrides.task = [o for o in overrides if not o.startswith("experiment=")]
        if overrides[0].startswith("experiment="):
            cfg.hydra.sweeper.params = {"trainer.seed": "1,2,3",
                                        "scaling": "sqrt_dk,none,dk,constant,learned,qk_norm"}
    OmegaConf.save(cfg, tmp_path / "multirun.yaml")
    in_sweep(cfg)
    assert launch.launcher_name() == "joblib" and SweepJob([], []).jobs_at_once() == expected


def test_jobs_at_once_is_none_outside_joblib(tmp_path, in_sweep):
    assert launch.launcher_name() == "basic"   # no Hydra at all: a run of its own
    assert Job().jobs_at_once() is None
    in_sweep(hydra_config(["hydra/launcher=submitit_local"], tmp_path))
    assert launch.launcher_name() == "submitit_local" and SweepJob([], []).jobs_at_once() is None


def test_all_but_one_core_follows_joblib(tmp_path, in_sweep, monkeypatch):
    import joblib
    monkeypatch.setattr(joblib, "cpu_count", lambda: 6)
    cfg = hydra_config(["hydra/launcher=joblib", "hydra.launcher.n_jobs=-2"], tmp_path)
    with open_dict(cfg):
        cfg.hydra.overrides.task = ["trainer.seed=1,2,3,4,5,6,7,8"]
    OmegaConf.save(cfg, tmp_path / "multirun.yaml")
    in_sweep(cfg)
    assert SweepJob([], []).jobs_at_once() == 5


def test_the_job_command_of_a_parallel_sweep_drops_the_launcher(tmp_path, in_sweep):
    cfg = hydra_config(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], tmp_path)
    with open_dict(cfg):
        cfg.hydra.overrides.task = ["scaling=none", "trainer.seed=1"]
        cfg.hydra.overrides.hydra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                     f"hydra.sweep.dir={tmp_path}"]
    in_sweep(cfg)
    job = SweepJob(cfg.hydra.overrides.task, cfg.hydra.overrides.hydra)   # as train.py makes it
    commands = job.resume_commands(tmp_path / "job", 1, "train.py")
    assert len(commands) == 1   # a parallel sweep's launching process prints the whole sweep's
    job = shlex.split(commands[0][1])
    assert job[:2] == ["python", "train.py"] and "scaling=none" in job
    assert not [a for a in job if "launcher" in a or a.startswith("hydra.sweep")]


def cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, **kw)


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))


JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.subdir=${hydra.job.num}"]


@pytest.mark.slow
def test_joblib_sweep_a_failing_job_does_not_stop_the_others(tiny, tmp_path):
    """3 jobs, 2 at once, on a cold cache: n_head=3 does not divide d_model=32."""
    sweep = tmp_path / "sweep"
    auto = [o for o in tiny if not o.startswith("trainer.threads=")]   # the default: auto
    out = cli(["-m", *auto, "trainer.max_steps=4",
               "model.n_head=2,3,4", *JOBLIB, f"hydra.sweep.dir={sweep}"])
    assert out.returncode == 1, out.stderr
    assert "sweep job" in out.stderr and "failed with exit code 2" in out.stderr
    assert "Traceback" not in out.stderr
    assert [p.name for p in job_dirs(sweep)] == ["0", "2"]   # the bad job left nothing
    for run in job_dirs(sweep):
        assert json.loads((run / "summary.json").read_text())["steps"] == 4
    # every line a job prints carries its folder; threads: 2 cores / 2 jobs at once
    lines = [line for line in out.stdout.splitlines() if "x 1 process(es)" in line]
    assert len(lines) == 2 and all(line.startswith(("[0] data", "[2] data")) for line in lines), (
        out.stdout)
    cores = len(os.sched_getaffinity(0))
    assert f"trainer.threads=auto: {cores} core(s) available / 2 sweep job(s) at once" in lines[0]
    # the cold cache was prepared once: both jobs read the same preparation
    metas = [json.loads((run / "run.json").read_text())["data"] for run in job_dirs(sweep)]
    assert metas[0] == metas[1]
    tokens = tmp_path / "cache" / "tokens"
    assert len([p for p in tokens.iterdir() if not p.name.startswith(".")]) == 1


def wait_for(condition, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def cache_lock(overrides: list[str]) -> Path:
    """The file prepare() locks while it builds the token cache of these overrides' data."""
    cfg = DataConfig(**OmegaConf.to_container(make_config(overrides).data, resolve=True))
    root = default_cache_root(cfg.cache_dir)
    return root / "tokens" / f".{cache_key(cfg, open_source(cfg, root))}.lock"


def flock_waiters(holder: int) -> set[int]:
    """The processes blocked on a flock that process `holder` holds, from /proc/locks, where
    `1: FLOCK ADVISORY WRITE <pid> <dev:inode> 0 EOF` is a held lock and `1: -> FLOCK ...`
    a process waiting for the lock on the same file."""
    lines = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
    held = {f[5] for f in lines if f[1] == "FLOCK" and int(f[4]) == holder}
    return {int(f[5]) for f in lines if f[1:3] == ["->", "FLOCK"] and f[6] in held}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="reads the lock's waiters there")
def test_joblib_jobs_on_a_cold_cache_prepare_it_once(tiny, tmp_path):
    """2 jobs, 2 at once, on a cold cache. The test holds the cache's lock until both jobs are
    blocked on it (both inside prepare(), nothing built yet), then lets go: one job builds the
    cache, the other waits for it and reads what it built."""
    sweep, lock = tmp_path / "sweep", cache_lock(tiny)
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "train.py", "-m", *tiny, "trainer.max_steps=2", "trainer.seed=1,2",
             *JOBLIB, f"hydra.sweep.dir={sweep}"], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: len(flock_waiters(os.getpid())) == 2 or proc.poll() is not None,
                 "both jobs waiting on the cache lock")
        waiting = flock_waiters(os.getpid())
        built_meanwhile = [p.name for p in lock.parent.iterdir() if p != lock]
    _, stderr = proc.communicate(timeout=240)
    assert len(waiting) == 2 and proc.pid not in waiting, stderr   # the two jobs' workers
    assert built_meanwhile == []
    assert proc.returncode == 0, stderr   # the second to take the lock did not build again
    assert [p.name for p in job_dirs(sweep)] == ["0", "1"]
    # one cache folder, no leftovers; both jobs loaded the meta.json of the one build (its
    # timings differ from build to build)
    assert [p.name for p in lock.parent.iterdir() if p != lock] == [lock.name[1:-len(".lock")]]
    metas = [json.loads((run / "run.json").read_text())["data"] for run in job_dirs(sweep)]
    assert metas[0] == metas[1] and metas[0]["key"] == lock.name[1:-len(".lock")]


def trained(run: Path) -> bool:
    return (run / "metrics.jsonl").exists() and bool(records(run, "train"))


@pytest.mark.slow
def test_joblib_sweep_stops_on_sigterm_and_resumes_each_job_once(tiny, tmp_path):
    """3 jobs, 2 at once; SIGTERM to the sweep while the first two train: both write last.pt,
    the third never starts; the printed command finishes the sweep, each step once."""
    sweep, steps = tmp_path / "sweep", 400
    args = ["-m", *tiny, f"trainer.max_steps={steps}", "trainer.eval_every=200",
            "trainer.ckpt_every=200", "trainer.seed=1,2,3", *JOBLIB, f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: all(trained(sweep / str(n)) for n in (0, 1)), "two jobs training")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert [p.name for p in job_dirs(sweep)] == ["0", "1"]
    for run in job_dirs(sweep):
        assert (run / "checkpoints" / "last.pt").is_file() and not (run / "summary.json").exists()
        segment = json.loads((run / "run.json").read_text())["segments"][-1]
        assert segment["ended"] == "interrupted" and segment["end_step"] < steps
    command = shlex.split(stderr.split("Resume the whole sweep")[1].split("with:\n")[1])
    assert command[:2] == ["python", "train.py"] and "hydra/launcher=joblib" in command
    assert "trainer.resume=auto" in command
    resumed = cli(command[2:])
    assert resumed.returncode == 0, resumed.stderr
    for n, run in enumerate(job_dirs(sweep)):
        assert [r["step"] for r in records(run, "train")] == list(range(1, steps + 1))
        assert json.loads((run / "summary.json").read_text())["steps"] == steps
        assert len(json.loads((run / "run.json").read_text())["segments"]) == (2 if n < 2 else 1)
    assert len(job_dirs(sweep)) == 3 and not (sweep / launch.STOP_MARKER).exists()


def submitit_tasks(sweep: Path) -> list[int]:
    """The processes that run this sweep's submitit jobs (submitit.core._submit)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in args and any(str(sweep).encode() in a for a in args):
            pids.append(int(cmdline.parent.name))
    return pids


def writer_of(path: Path, pids: list[int]) -> Optional[int]:
    """The process among pids that holds `path` open (its /proc/PID/fd links), if any."""
    target = str(path.resolve())
    for pid in pids:
        try:
            if any(os.readlink(fd) == target for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
        except OSError:   # the process ended, or a descriptor closed while being read
            continue
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the job processes in /proc")
def test_submitit_requeue_signal_resumes_bit_identically(tiny, tmp_path):
    """2 jobs under submitit's local executor; each is sent submitit's time-limit signal
    (SIGUSR2) while it trains: it writes last.pt, is requeued by submitit, continues with
    trainer.resume=auto in its own folder and ends with the losses of an uninterrupted run."""
    sweep, steps = tmp_path / "sweep", 400   # both are signalled within their first ~30 steps
    common = [*tiny, f"trainer.max_steps={steps}", "trainer.eval_every=200",
              "trainer.ckpt_every=200"]
    proc = subprocess.Popen(
        [sys.executable, "train.py", "-m", *common, "trainer.seed=1,2", "trainer.resume=auto",
         "hydra/launcher=submitit_local", "hydra.sweep.subdir=${hydra.job.num}",
         f"hydra.sweep.dir={sweep}"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    signalled = set()

    def signal_jobs_that_train() -> bool:   # each job as soon as it trains: one may start late
        for n in {0, 1} - signalled:
            if not trained(sweep / str(n)):
                continue
            tasks = submitit_tasks(sweep)
            # both jobs, and for a while a signalled job's old process beside its requeued one
            assert len(tasks) >= 2
            pid = writer_of(sweep / str(n) / "metrics.jsonl", tasks)
            if pid is not None:
                os.kill(pid, signal.SIGUSR2)
                signalled.add(n)
        return len(signalled) == 2

    wait_for(signal_jobs_that_train, "both jobs training")
    _, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stderr
    for n, seed in enumerate((1, 2)):
        run = sweep / str(n)
        first, *rest = json.loads((run / "run.json").read_text())["segments"]
        assert first["ended"] == "interrupted" and first["end_step"] < steps
        assert [s["ended"] for s in rest] == ["finished"]   # requeued once, then done
        train.train(make_config([*common, f"trainer.seed={seed}"]), tmp_path / f"straight{n}")
        for kind, key in (("train", "loss"), ("eval", "val_loss")):
            resumed, straight = records(run, kind), records(tmp_path / f"straight{n}", kind)
            assert [r["step"] for r in resumed] == [r["step"] for r in straight]
            assert [r[key] for r in resumed] == [r[key] for r in straight]   # bit for bit
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.*"))
    assert logs.count("stopped by SIGUSR2") == 2 and "Requeued job" in logs


@pytest.mark.slow
def test_submitit_tasks_train_data_parallel_like_torchrun(tiny, tmp_path):
    """hydra.launcher.tasks_per_node=2: submitit's two processes become DDP ranks 0 and 1
    (TorchDistributedEnvironment) and match the one-process losses, as torchrun does."""
    args = [*tiny, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.grad_accum=2"]
    sweep = tmp_path / "sweep"
    out = cli(["-m", *args, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
               "hydra.sweep.subdir=job", f"hydra.sweep.dir={sweep}"])
    assert out.returncode == 0, out.stderr
    train.train(make_config(args), tmp_path / "one")
    assert json.loads((sweep / "job" / "run.json").read_text())["world_size"] == 2
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        one, two = records(tmp_path / "one", kind), records(sweep / "job", kind)
        assert [r["step"] for r in one] == [r["step"] for r in two]
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
