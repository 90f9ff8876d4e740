"""How a run stops and ends: stop signals, exit codes and the command that resumes it
(docs/training.md, "Resume").

SIGINT/SIGTERM become a flag the loop reads between steps: the step in flight finishes, last.pt
is written, and the process exits with 128 + the signal number after printing how to resume.
`Job` is a run started on its own (`python train.py`, torchrun); trainer/launch.py's SweepJob
is a sweep's. Under torchrun the processes join one group and share rank 0's run directory.
"""

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, Optional

import torch
import torch.distributed as dist

from model.errors import UserError
from trainer.build import process_rank, world_size
from trainer.run_dir import remove_if_unstarted

STOPS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A stop signal arrived: the step in flight finished and last.pt was written."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(Exception):
    """The training loss became non-finite and trainer.on_nan=raise."""


class StopSignal:
    """Turn the stop signals `signals` into a flag the loop reads between steps; a second
    SIGINT aborts. `before`: a stop signal that arrived before the loop began (0: none)."""

    def __init__(self, signals: Sequence[int] = STOPS, before: int = 0):
        self.signals, self.before = signals, before

    def __enter__(self):
        self.signum = self.before
        self.previous = {s: signal.signal(s, self.handle) for s in self.signals}
        return self

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Job:
    """A run started on its own. `overrides`: its command line's config overrides (run.json
    records them); `hydra_overrides`: Hydra's own (hydra.*). The resume command repeats both."""

    def __init__(self, overrides: Sequence[str] = (), hydra_overrides: Sequence[str] = ()):
        self.overrides, self.hydra_overrides = list(overrides), list(hydra_overrides)

    def stop_signals(self) -> Sequence[int]:
        """The signals that stop the training loop after its current step."""
        return STOPS

    def stopped_before_loop(self) -> int:
        """A stop signal this process received before its training loop began (0: none)."""
        return 0

    def jobs_at_once(self) -> Optional[int]:
        """How many jobs share this machine's cores (trainer.threads=auto); None: this one."""
        return None

    def skip_if_stopped(self, run_dir: Path) -> None:
        """End the job before it trains if its sweep was stopped (a single run never is)."""

    def resume_commands(self, run_dir: Path, world: int, script: str) -> list[tuple[str, str]]:
        """(what, shell command) pairs that continue this run (trainer/resume.py)."""
        from trainer.resume import run_command  # only a stopped run prints one
        return [("this run", run_command(run_dir, world, script,
                                          [*self.overrides, *self.hydra_overrides]))]

    def join_processes(self, run_dir: Path, device: str) -> Path:
        """Under torchrun, join the process group; the run directory, rank 0's for all."""
        if "RANK" not in os.environ or dist.is_initialized():
            return run_dir
        dist.init_process_group("nccl" if torch.cuda.is_available() and device != "cpu"
                                else "gloo")
        shared = [str(run_dir)]
        dist.broadcast_object_list(shared, src=0)   # only rank 0's Hydra made a directory
        return Path(shared[0])

    def leave_processes(self, together: bool) -> None:
        """Leave the process group, if any, at one barrier if all got here `together`."""
        if dist.is_initialized():
            if together:
                # gloo's worker threads release a finished collective's tensors after the caller
                # has moved on; a process that reaches interpreter shutdown before they do
                # aborts ("terminate called without an active exception").
                dist.barrier()
            dist.destroy_process_group()

    def end_on(self, err: Exception, run_dir: Path, script: str,
               resume: Optional[str]) -> NoReturn:
        """Exit after `err`: UserError 2, Interrupted 128 + signal (resume printed), Diverged 3."""
        rank = process_rank()
        if isinstance(err, Interrupted):
            if rank == 0:
                how = "".join(f"\nResume {what} with:\n  {command}" for what, command
                              in self.resume_commands(run_dir, world_size(), script))
                print(f"{err}; checkpoint {err.checkpoint}.{how}", file=sys.stderr)
            self.after_stop(err.signum, resume)
            self.end(128 + err.signum, run_dir)
        if isinstance(err, UserError):
            if rank == 0:
                remove_if_unstarted(run_dir)
            print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
            self.end(2, run_dir)
        print(f"error: {err}", file=sys.stderr)
        self.end(3, run_dir)

    def after_stop(self, signum: int, resume: Optional[str]) -> None:
        """What a stopped run does before it exits (a cluster job may requeue itself)."""

    def end(self, code: int, run_dir: Path) -> NoReturn:
        """Leave an unfinished run with exit code `code`."""
        sys.exit(code)


def rank_argv(argv: list[str]) -> list[str]:
    """The argv Hydra reads: a torchrun rank above 0 makes no run directory."""
    if int(os.environ.get("RANK", "0")) == 0:
        return argv
    kept = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return [*kept, "hydra.run.dir=.", "hydra.output_subdir=null"]


def exit_if_sweep_stopped(script: str) -> None:
    """If trainer/launch.py (loaded by launcher configs) stopped the sweep, exit as it says."""
    launch = sys.modules.get("trainer.launch")
    if launch is not None:
        launch.exit_if_stopped(script)
