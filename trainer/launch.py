"""How a run is launched, stopped and continued: stop signals, the printed resume commands, and
sweeps under Hydra's launchers (docs/training.md, "Resume" and "Parallel and cluster sweeps").

`hydra/launcher=joblib` runs the jobs in joblib's worker processes, `n_jobs` at a time;
`submitit_local|submitit_slurm` runs each as a submitit job. What reads Hydra's state is called
from train.py's Hydra entry (and `build` through `jobs_at_once`) only.
"""

import io
import multiprocessing as mp
import os
import shlex
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

# configs/hydra/launcher/*.yaml are checked against the plugins' schemas of the same name, which
# Hydra 1.3 does with a deprecation warning in every process that composes the config; this
# module is imported there first (train.py; a joblib worker unpickling ParallelSweep).
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/\w+' is validated against")

STOPS = (signal.SIGINT, signal.SIGTERM)
# A stopped sweep leaves this file (the signal number) in its folder; a job that starts while it
# is there does not train, and the next launch of the sweep removes it.
STOP_MARKER = ".stopped"
WHOLE_SWEEP = "the whole sweep (finished jobs are skipped, the others continue or start)"
# The first stop signal this process received (0: none), read by a job that starts after its
# sweep was asked to stop and by the training loop when it came before the loop began.
_requested = 0
_held: dict = {}                # the handlers hold_stop_signals replaced
_stopped: list[Path] = []       # the sweep folder, once ParallelSweep stopped that sweep


class Interrupted(Exception):
    """A stop signal arrived: the step in flight finished and last.pt was written."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(Exception):
    """The training loss became non-finite and trainer.on_nan=raise."""


def preempt_signal() -> Optional[int]:
    """The signal submitit sends before a job's time limit or on pre-emption; None outside."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def hold_stop_signals(react: Optional[Callable[[int], None]]) -> None:
    """Record SIGINT/SIGTERM instead of dying of them, calling react(signum) on the first; a
    second SIGINT aborts (KeyboardInterrupt)."""
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


class StopSignal:
    """Turn SIGINT/SIGTERM (and a submitit job's time-limit signal) into a flag the loop reads
    between steps; a second SIGINT aborts. A stop recorded before the loop began counts."""

    def __enter__(self):
        self.signum = _requested
        signals = [*STOPS, *filter(None, [preempt_signal()])]
        self.previous = {s: signal.signal(s, self.handle) for s in signals}
        return self

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def shown(path: Path) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    inside = path.resolve().is_relative_to(Path.cwd().resolve())
    return os.path.relpath(path) if inside else str(path)


def overrides() -> list[str]:
    """The command-line overrides of this run (empty when called outside Hydra's main)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def hydra_quoted(value: str) -> str:
    """A Hydra override value that may hold `=` and `,` (a sweep job's folder name)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def python_launcher(script: str, world: int) -> list[str]:
    return (["python", script] if world == 1 else
            ["torchrun", "--standalone", f"--nproc_per_node={world}", script])


def resume_commands(run_dir: Path, world: int, script: str,
                    whole_sweep: bool = True) -> list[tuple[str, str]]:
    """(what, shell command) pairs that continue this run: the job alone in its own folder
    (hydra.mode=RUN: a preset's MULTIRUN would ignore hydra.run.dir; hydra.output_subdir=null
    keeps the job's .hydra/) and, if whole_sweep, its sweep. `script` is train.py's path."""
    hc = HydraConfig.get()
    own = ("trainer.resume=", "hydra.mode=", "hydra.run.", "hydra.sweep.", "hydra.sweeper.",
           "hydra.output_subdir=", "hydra/launcher=", "hydra.launcher.")
    job = [*python_launcher(script, world),
           *(o for o in [*hc.overrides.task, *hc.overrides.hydra] if not o.startswith(own)),
           "trainer.resume=auto", "hydra.mode=RUN", "hydra.output_subdir=null",
           f"hydra.run.dir={hydra_quoted(shown(run_dir))}"]
    commands = [("this run", shlex.join(job))]
    if hc.mode == RunMode.MULTIRUN and whole_sweep:
        commands.append((WHOLE_SWEEP, sweep_command(Path(hc.sweep.dir), script, world)))
    return commands


def sweep_command(sweep_dir: Path, script: str, world: int = 1) -> str:
    """This process's command line again (its launcher included) with trainer.resume=auto and
    the sweep folder: it continues the whole sweep. Called in the process that launched it."""
    again = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=", "hydra.sweep.dir="))]
    return shlex.join([*python_launcher(script, world), *again, "trainer.resume=auto",
                       f"hydra.sweep.dir={hydra_quoted(shown(sweep_dir))}"])


def launcher_name() -> str:
    """What runs this job: basic (Hydra's serial launcher, or no Hydra), joblib, submitit_*."""
    if not HydraConfig.initialized():
        return "basic"
    target = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default=""))
    return {"JoblibLauncher": "joblib", "LocalLauncher": "submitit_local",
            "SlurmLauncher": "submitit_slurm"}.get(target.rsplit(".", 1)[-1], "basic")


def is_sweep_job() -> bool:
    """Whether this job is one of a sweep's (-m or a preset), not a single run."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def jobs_at_once() -> Optional[int]:
    """How many jobs of this sweep train on this machine at once under hydra/launcher=joblib:
    hydra.launcher.n_jobs (joblib's meaning: -1 every core, -2 all but one), at most the
    sweep's size; None for a single run and any other launcher."""
    if launcher_name() != "joblib" or not is_sweep_job():
        return None
    import joblib

    hc = HydraConfig.get()
    n_jobs = int(hc.launcher.n_jobs)
    running = n_jobs if n_jobs > 0 else max(1, joblib.cpu_count() + 1 + n_jobs)
    size = sweep_size(Path(hc.sweep.dir))
    return max(1, min(running, size) if size else running)


def sweep_size(sweep_dir: Path) -> Optional[int]:
    """The number of jobs in the multirun.yaml Hydra's sweeper writes (the preset's
    hydra.sweeper.params, then the command line's overrides), as the basic sweeper expands
    them; None if the file is missing or holds a sweep that needs the config loader (glob)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    hydra_cfg = OmegaConf.load(path).hydra
    params = OmegaConf.to_container(hydra_cfg.sweeper).get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(hydra_cfg.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
        return len(BasicSweeper.split_arguments(overrides, None)[0])
    except Exception:
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
    job's process records the signals too, so one that arrives before its loop counts."""

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
        while _held:   # the handlers hold_stop_signals replaced
            signal.signal(*_held.popitem())

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


def stopped_sweep() -> Optional[Path]:
    """The folder of the sweep this process launched and stopped on a signal, if it did."""
    return _stopped[0] if _stopped else None


class JobFailed(CompactHydraException):
    """A sweep job that did not finish: the launcher runs the others, then exits with code 1."""


def end_job(code: int, run_dir: Path) -> NoReturn:
    """Leave an unfinished job: a single run, and a stopped job of the serial launcher (which
    runs the whole sweep in this process), exit with `code`; a sweep job raises JobFailed."""
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
        from trainer.run_dir import remove_if_unstarted  # run_dir imports build, build this

        remove_if_unstarted(run_dir)
        print(f"not started: the sweep was stopped by {signal.Signals(signum).name} "
              f"({shown(run_dir)})", file=sys.stderr)
        end_job(128 + signum, run_dir)


def requeue_if_preempted(signum: int, resume: Optional[str]) -> None:
    """After a submitit job stopped on its time-limit signal: call submitit's handler, which
    requeues the job and exits; only with trainer.resume=auto (else the job would start over)."""
    if signum != preempt_signal():
        return
    handler = signal.getsignal(signum)
    if resume != "auto" or not callable(handler):
        print("not requeued: set trainer.resume=auto so that a requeued job continues from "
              "its checkpoint", file=sys.stderr)
        return
    handler(signum, None)


def export_submitit_ranks() -> None:
    """In a submitit job of several tasks (one per GPU), set torchrun's variables (RANK,
    WORLD_SIZE, LOCAL_RANK, ...) from submitit's job environment: DDP runs as under torchrun."""
    if not launcher_name().startswith("submitit") or "RANK" in os.environ:
        return
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
