"""Sweeps under Hydra's launchers, their stop and resume, and SLURM (docs/training.md, "Parallel and
cluster sweeps"). The launcher configs name its callback
(configs/hydra/callbacks/parallel_sweep.yaml), and train.py's entry builds a SweepJob for a job of a
sweep (hydra.mode=MULTIRUN). This file is the one that reads Hydra's launcher state.

`hydra/launcher=joblib` runs the jobs in joblib's worker processes, `n_jobs` at a time;
`submitit_local|submitit_slurm` runs each as a submitit job.
"""

import io
import math
import multiprocessing as mp
import os
import shlex
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from trainer.files import display_path
from trainer.job import STOPS, Job
from trainer.resume import hydra_quoted, python_launcher, remove_if_unstarted

# configs/hydra/launcher/*.yaml are checked against the plugins' schemas of the same name, which
# Hydra 1.3 does with a deprecation warning in every process that composes the config; this
# module is imported there first (the callback in the launching process; a joblib worker
# unpickling ParallelSweep).
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/\w+' is validated against")

# A stopped sweep leaves this file (the signal number) in its folder; a job that starts while it
# is there does not train, and the next launch of the sweep removes it.
STOP_MARKER = ".stopped"
WHOLE_SWEEP = "the whole sweep (finished jobs are skipped, the others continue or start)"
_stopped: list[Path] = []       # the sweep folder, once ParallelSweep stopped that sweep
# The first stop signal this process received while it held them (0: none): a job's process
# holds them from its start, so a stop that arrives before its training loop counts.
_requested = 0
_held: dict = {}                # the handlers hold_stop_signals replaced


def hold_stop_signals(react: Optional[Callable[[int], None]]) -> None:
    """Record SIGINT/SIGTERM instead of dying of them, calling react(signum) on the first; a
    second SIGINT aborts (KeyboardInterrupt). release_stop_signals undoes it."""
    def handle(signum, frame):
        global _requested
        if not _requested:
            _requested = signum
            if react is not None:
                react(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
    for s in STOPS:
        _held.setdefault(s, signal.signal(s, handle))


def release_stop_signals() -> None:
    while _held:
        signal.signal(*_held.popitem())


def launcher_name() -> str:
    """What runs this job: basic (Hydra's serial launcher, or no Hydra), joblib, submitit_*."""
    if not HydraConfig.initialized():
        return "basic"
    target = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default=""))
    return {"JoblibLauncher": "joblib", "LocalLauncher": "submitit_local",
            "SlurmLauncher": "submitit_slurm"}.get(target.rsplit(".", 1)[-1], "basic")


def preempt_signal() -> Optional[int]:
    """The signal submitit sends before a job's time limit or on pre-emption; None outside."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


class JobFailed(CompactHydraException):
    """A sweep job that did not finish: the launcher runs the others, then exits with code 1."""


class SweepJob(Job):
    """A job of a sweep (-m or a preset), under any of Hydra's launchers."""

    def __init__(self, overrides: Sequence[str], hydra_overrides: Sequence[str],
                 config_files: Optional[dict[str, str]] = None):
        super().__init__(overrides, hydra_overrides, config_files)
        self.launcher = launcher_name()
        self.sweep_dir = Path(HydraConfig.get().sweep.dir)

    def join_processes(self, run_dir: Path, device: str) -> Path:
        self.export_ranks()
        return super().join_processes(run_dir, device)

    def export_ranks(self) -> None:
        """In a submitit job of several tasks (one per GPU), set torchrun's variables (RANK,
        WORLD_SIZE, LOCAL_RANK, ...) from submitit's job environment: DDP runs as under
        torchrun. Called before the processes join."""
        if not self.launcher.startswith("submitit") or "RANK" in os.environ:
            return
        import submitit

        if submitit.JobEnvironment().num_tasks > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)

    def stop_signals(self) -> Sequence[int]:
        return [*STOPS, *filter(None, [preempt_signal()])]

    def stopped_before_loop(self) -> int:
        return _requested

    def jobs_at_once(self) -> Optional[int]:
        """Under hydra/launcher=joblib: hydra.launcher.n_jobs (joblib's meaning: -1 every core,
        -2 all but one), at most the sweep's size; None for any other launcher."""
        if self.launcher != "joblib":
            return None
        import joblib

        n_jobs = int(HydraConfig.get().launcher.n_jobs)
        running = n_jobs if n_jobs > 0 else max(1, joblib.cpu_count() + 1 + n_jobs)
        size = sweep_size(self.sweep_dir)
        return max(1, min(running, size) if size else running)

    def skip_if_stopped(self, run_dir: Path) -> None:
        """A job that a parallel sweep starts after it was asked to stop does not train."""
        signum = sweep_stopped(self.sweep_dir) if self.launcher != "basic" else 0
        if signum:
            remove_if_unstarted(run_dir)
            print(f"not started: the sweep was stopped by {signal.Signals(signum).name} "
                  f"({display_path(run_dir)})", file=sys.stderr)
            self.end(128 + signum, run_dir)

    def resume_commands(self, run_dir: Path, world: int, script: str) -> list[tuple[str, str]]:
        """This run's command and, under the serial launcher (whose job is the launching
        process), the whole sweep's; a parallel sweep's launching process prints that one."""
        commands = super().resume_commands(run_dir, world, script)
        if self.launcher == "basic":
            commands.append((WHOLE_SWEEP, sweep_command(self.sweep_dir, script, world)))
        return commands

    def after_stop(self, signum: int, resume: Optional[str]) -> None:
        """After a submitit job stopped on its time-limit signal: call submitit's handler, which
        requeues the job and exits; only with trainer.resume=auto (else it would start over)."""
        if signum != preempt_signal():
            return
        handler = signal.getsignal(signum)
        if resume != "auto" or not callable(handler):
            print("not requeued: set trainer.resume=auto so that a requeued job continues from "
                  "its checkpoint", file=sys.stderr)
            return
        handler(signum, None)

    def end(self, code: int, run_dir: Path) -> NoReturn:
        """A stopped job of the serial launcher (which runs the whole sweep in this process)
        exits with `code`; any other unfinished job raises JobFailed, and the sweep goes on."""
        if self.launcher == "basic" and code > 128:
            sys.exit(code)
        what = (f"stopped by {signal.Signals(code - 128).name} (exit code {code}), as was every "
                "job then running" if code > 128 else
                f"failed with exit code {code} (its error is printed above); the sweep's other "
                "jobs ran on")
        raise JobFailed(f"sweep job {display_path(run_dir)} {what}. A job without summary.json did "
                        "not finish: run the sweep again with trainer.resume=auto and its "
                        "hydra.sweep.dir to continue it.")


def sweep_command(sweep_dir: Path, script: str, world: int = 1) -> str:
    """This process's command line again (its launcher included) with trainer.resume=auto and
    the sweep folder: it continues the whole sweep. Called in the process that launched it."""
    again = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=", "hydra.sweep.dir="))]
    return shlex.join([*python_launcher(script, world), *again, "trainer.resume=auto",
                       f"hydra.sweep.dir={hydra_quoted(display_path(sweep_dir))}"])


def sweep_size(sweep_dir: Path) -> Optional[int]:
    """The number of jobs in the multirun.yaml Hydra's sweeper writes (the preset's
    hydra.sweeper.params, then the command line's overrides), as the basic sweeper expands
    them: the product of each override's number of values. None if the file is missing or a
    sweep needs the config loader to expand (a glob over a group's options)."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    hydra_cfg = OmegaConf.load(path).hydra
    params = OmegaConf.to_container(hydra_cfg.sweeper).get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(hydra_cfg.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
        values = {}   # per key; a later override of a key replaces an earlier one
        for override in overrides:
            values[override.get_key_element()] = (
                len(list(override.sweep_string_iterator())) if override.is_sweep_override() else 1)
        return math.prod(values.values())
    except HydraException:
        return None


def sweep_stopped(sweep_dir: Path) -> int:
    """The signal that stopped the sweep in sweep_dir (its stop marker), 0 if none."""
    marker = sweep_dir / STOP_MARKER
    return int(marker.read_text() or signal.SIGTERM) if marker.is_file() else 0


def catches(pid: int, signum: int) -> bool:
    """Whether process pid handles signum (SigCgt in /proc/PID/status); True if unreadable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    caught = next((line.split()[1] for line in status.splitlines()
                   if line.startswith("SigCgt:")), None)
    return caught is None or bool(int(caught, 16) >> (signum - 1) & 1)


class ParallelSweep(Callback):
    """Ctrl-C / SIGTERM for a sweep whose jobs run in other processes (a Hydra callback named
    in the launcher configs). The launching process records the first signal, writes the stop
    marker and sends SIGTERM on to the workers, whose running jobs write last.pt and stop; a
    job's process records the signals too, so one that arrives before its loop counts. The
    on_* methods keep the signature of Hydra's Callback (**kwargs: what Hydra passes)."""

    def __init__(self) -> None:
        self.sweep_dir: Optional[Path] = None
        _stopped.clear()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        (self.sweep_dir / STOP_MARKER).unlink(missing_ok=True)
        hold_stop_signals(self.stop_jobs)

    def stop_jobs(self, signum: int) -> None:
        if self.sweep_dir is not None:
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            (self.sweep_dir / STOP_MARKER).write_text(str(signum))
            _stopped.append(self.sweep_dir)
        tasks = Path("/proc/self/task")   # the children: Linux's /proc, else multiprocessing's
        children = ([int(pid) for f in tasks.glob("*/children") for pid in f.read_text().split()]
                    if tasks.is_dir() else [p.pid for p in mp.active_children() if p.pid])
        for pid in children:
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
        if launcher_name() == "joblib":   # jobs print at once into one terminal
            label = f"[{Path(str(config.hydra.runtime.output_dir)).name}] "
            sys.stdout, sys.stderr = Labelled(sys.stdout, label), Labelled(sys.stderr, label)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, Labelled):
                stream.flush()
                setattr(sys, name, stream.stream)


class Labelled(io.TextIOBase):
    """A text stream that starts every line with `label`; not a terminal (no progress bar)."""

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


def exit_if_stopped(script: str) -> None:
    """In the process that launched a parallel sweep and stopped it on a signal: print the
    command that resumes the whole sweep and exit with 128 + that signal."""
    if _stopped:
        print(f"Resume {WHOLE_SWEEP} with:\n  {sweep_command(_stopped[0], script)}",
              file=sys.stderr)
        sys.exit(128 + sweep_stopped(_stopped[0]))
