"""Sweeps under Hydra's launchers: which launcher runs this job, how many jobs share this
machine's cores, and what the launching process does with Ctrl-C / SIGTERM
(docs/training.md, "Parallel and cluster sweeps").

`hydra/launcher=joblib` runs the jobs in joblib's worker processes (loky), `n_jobs` at a time;
`hydra/launcher=submitit_local|submitit_slurm` runs each job as a submitit job. The functions
that read Hydra's state are called from train.py's Hydra entry (and `build` through
`jobs_at_once`) only; `SweepSignals` is a Hydra callback, named in the launcher configs.
"""

import io
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from trainer.resume import shown
from trainer.signals import hold_stop_signals, preempt_signal, release_stop_signals

# A stopped sweep leaves this file in its folder (the signal number); a job that starts while it
# is there does not train, and the next launch of the sweep removes it.
STOP_MARKER = ".stopped"

# configs/hydra/launcher/*.yaml set the plugins' keys and are checked against the plugins' own
# schemas of the same name, which Hydra 1.3 does with a deprecation warning in every process
# that composes the config. This module is imported there first (train.py; a joblib worker
# unpickling ParallelSweep), so the filter is set here.
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/\w+' is validated against")
_stopped: list[Path] = []   # the sweep folder, once SweepSignals stopped that sweep


def launcher_name() -> str:
    """basic (Hydra's serial launcher), joblib, submitit_local or submitit_slurm: what runs this
    job; basic outside Hydra's main."""
    if not HydraConfig.initialized():
        return "basic"
    target = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default=""))
    return {"JoblibLauncher": "joblib", "LocalLauncher": "submitit_local",
            "SlurmLauncher": "submitit_slurm"}.get(target.rsplit(".", 1)[-1], "basic")


def is_sweep_job() -> bool:
    """Whether this job is one of a sweep's (-m or a preset), not a single run."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def jobs_at_once() -> Optional[int]:
    """How many jobs of this sweep train on this machine at the same time under
    hydra/launcher=joblib: the smaller of hydra.launcher.n_jobs (joblib's meaning: -1 every
    core, -2 all but one, ...) and the number of jobs in the sweep. None for any other launcher
    (a single run, Hydra's serial launcher, a submitit job, which has its own cores)."""
    if launcher_name() != "joblib" or not is_sweep_job():   # a single run ignores launchers
        return None
    import joblib

    hc = HydraConfig.get()
    n_jobs = int(hc.launcher.n_jobs)
    running = n_jobs if n_jobs > 0 else max(1, joblib.cpu_count() + 1 + n_jobs)
    size = sweep_size(Path(hc.sweep.dir))
    return max(1, min(running, size) if size else running)


def sweep_size(sweep_dir: Path) -> Optional[int]:
    """The number of jobs of the sweep in sweep_dir, expanded from the multirun.yaml Hydra's
    sweeper writes before launching (the preset's hydra.sweeper.params, then the command line's
    overrides, as Hydra's basic sweeper combines them); None where that file is missing or
    holds a sweep this cannot expand (e.g. glob over a group's options)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    hydra_cfg = OmegaConf.load(path).hydra
    params = hydra_cfg.sweeper.get("params")
    params = OmegaConf.to_container(params) if params is not None else {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(hydra_cfg.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
        return len(BasicSweeper.split_arguments(overrides, None)[0])
    except Exception:   # a sweep syntax that needs the config loader: fall back to n_jobs
        return None


def sweep_stopped(sweep_dir: Path) -> int:
    """The signal that stopped the sweep in sweep_dir (its stop marker), 0 if none."""
    marker = sweep_dir / STOP_MARKER
    return int(marker.read_text() or signal.SIGTERM) if marker.is_file() else 0


def children() -> list[int]:
    """This process's child processes (Linux: /proc; elsewhere multiprocessing's)."""
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        return [int(pid) for f in tasks.glob("*/children") for pid in f.read_text().split()]
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid]


def catches(pid: int, signum: int) -> bool:
    """Whether process pid has a handler for signum (Linux: SigCgt in /proc/PID/status); True
    where that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    caught = next((line.split()[1] for line in status.splitlines()
                   if line.startswith("SigCgt:")), None)
    return caught is None or bool(int(caught, 16) >> (signum - 1) & 1)


class ParallelSweep(Callback):
    """Ctrl-C / SIGTERM for a sweep whose jobs run in other processes.

    In the launching process (on_multirun_start): the first SIGINT or SIGTERM is recorded
    (trainer.signals), written to the sweep folder's stop marker, so that jobs not yet started
    do not start, and sent on as SIGTERM to the worker processes that handle it, so that each
    running job finishes its step, writes last.pt and stops; the launcher then collects every
    job and train.py's `main` prints the command that resumes the sweep. A second SIGINT aborts.
    In a job's process (on_job_start): the same two signals are recorded, so that a signal that
    arrives before the training loop stops it at its first step; under joblib every line the
    job prints starts with its folder's name (jobs print at once into one terminal) and, as
    that output is no terminal, the progress bar is off."""

    def __init__(self) -> None:
        self.sweep_dir: Optional[Path] = None
        _stopped.clear()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        (self.sweep_dir / STOP_MARKER).unlink(missing_ok=True)
        hold_stop_signals(self.stop_jobs)

    def stop_jobs(self, signum: int) -> None:
        """The launching process's reaction to its first stop signal."""
        if self.sweep_dir is not None:
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            (self.sweep_dir / STOP_MARKER).write_text(str(signum))
            _stopped.append(self.sweep_dir)
        for pid in children():
            if catches(pid, signal.SIGTERM):   # a worker not yet in a job would die of it
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_stop_signals()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if launcher_name() == "basic":   # the serial launcher's job is the launching process
            return
        hold_stop_signals(None)
        if launcher_name() == "joblib":
            label = f"[{Path(str(config.hydra.runtime.output_dir)).name}] "
            sys.stdout, sys.stderr = Labelled(sys.stdout, label), Labelled(sys.stderr, label)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, Labelled):
                stream.flush()
                setattr(sys, name, stream.stream)


class Labelled(io.TextIOBase):
    """A text stream that starts every line it passes on with `label`; not a terminal."""

    def __init__(self, stream: Any, label: str):
        self.stream, self.label, self.at_line_start = stream, label, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                self.stream.write(self.label)
            self.stream.write(piece)
            self.at_line_start = piece.endswith(("\n", "\r"))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def stopped_sweep() -> Optional[Path]:
    """The folder of the sweep this process launched and stopped on a signal, if it did."""
    return _stopped[0] if _stopped else None


class JobFailed(CompactHydraException):
    """A sweep job that did not finish: Hydra's launchers record it and run the other jobs;
    after the sweep, Hydra prints the first such job's message and exits with code 1."""


def end_job(code: int, run_dir: Path) -> NoReturn:
    """Leave a job that did not finish with exit code `code`: a single run exits; so does an
    interrupted job of Hydra's serial launcher, which runs the whole sweep in this process (the
    jobs after it are not started). Any other sweep job raises JobFailed, so that a failing job
    does not stop the others, and a stopped one lets the launcher collect them all."""
    if not is_sweep_job() or (launcher_name() == "basic" and code > 128):
        sys.exit(code)
    what = (f"stopped by {signal.Signals(code - 128).name} (exit code {code}), as was every "
            "job then running" if code > 128 else
            f"failed with exit code {code} (its error is printed above); the sweep's other jobs "
            "ran on")
    raise JobFailed(f"sweep job {shown(run_dir)} {what}. A job without summary.json did not "
                    "finish: run the sweep again with trainer.resume=auto and its "
                    "hydra.sweep.dir to continue it.")


def skip_if_sweep_stopped(run_dir: Path) -> None:
    """A job that a parallel sweep starts after it was asked to stop does not train."""
    if launcher_name() == "basic" or not is_sweep_job():
        return
    signum = sweep_stopped(Path(HydraConfig.get().sweep.dir))
    if signum:
        # imported here: run_dir imports build, which imports this module
        from trainer.run_dir import remove_if_unstarted
        remove_if_unstarted(run_dir)
        print(f"not started: the sweep was stopped by {signal.Signals(signum).name} "
              f"({shown(run_dir)})", file=sys.stderr)
        end_job(128 + signum, run_dir)


def requeue_if_preempted(signum: int, resume: Optional[str]) -> None:
    """After a submitit job stopped on the time-limit signal with last.pt written: call the
    handler submitit installed for that signal, which asks the launcher's `checkpoint` for a
    resubmission of the same job (same overrides), requeues it and exits. trainer.resume=auto
    makes the requeued job continue from last.pt in its own folder; without it the job is not
    requeued (it would start over) and ends as stopped."""
    if signum != preempt_signal():
        return
    handler = signal.getsignal(signum)
    if resume != "auto" or not callable(handler):
        print("not requeued: set trainer.resume=auto so that a requeued job continues from "
              "its checkpoint", file=sys.stderr)
        return
    handler(signum, None)


def export_submitit_ranks() -> None:
    """In a submitit job of several tasks (tasks_per_node x nodes, one process per GPU), set
    the variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) from submitit's job environment, so that train.py's data parallelism runs as
    under torchrun. Every task runs Hydra's job function; only rank 0 writes the run folder."""
    if not launcher_name().startswith("submitit") or "RANK" in os.environ:
        return
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        # each process picks its own GPU by LOCAL_RANK (trainer.build.pick_device)
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
