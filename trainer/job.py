"""How a run stops: stop signals become a flag the loop reads between steps (the step in flight
finishes, last.pt is written), and `Job`, the hooks of a run started on its own (`python
train.py`, torchrun; a sweep's is trainer/launch.py's SweepJob). docs/training.md, "Resume"."""

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, Optional

import torch.distributed as dist

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
    records them); `hydra_overrides`: Hydra's own (hydra.*). The resume command repeats both.
    `config_files`: the files of the run folder's .hydra/ (name: text), which the run writes
    once its checks pass (train.py's hydra_files)."""

    def __init__(self, overrides: Sequence[str] = (), hydra_overrides: Sequence[str] = (),
                 config_files: Optional[dict[str, str]] = None):
        self.overrides, self.hydra_overrides = list(overrides), list(hydra_overrides)
        self.config_files = config_files or {}

    def stop_signals(self) -> Sequence[int]:
        return STOPS

    def stopped_before_loop(self) -> int:
        return 0   # a stop signal received before the training loop began (0: none)

    def jobs_at_once(self) -> Optional[int]:
        return None   # how many jobs share this machine's cores (trainer.threads=auto)

    def skip_if_stopped(self, run_dir: Path) -> None:
        """End the job before it trains if its sweep was stopped (a single run never is)."""

    def resume_commands(self, run_dir: Path, world: int, script: str) -> list[tuple[str, str]]:
        """(what, shell command) pairs that continue this run."""
        from trainer.resume import run_command  # only a stopped run prints one
        return [("this run", run_command(run_dir, world, script,
                                          [*self.overrides, *self.hydra_overrides]))]

    def join_processes(self, run_dir: Path, device: str) -> Path:
        """Under torchrun, join the process group; the run directory, rank 0's for all."""
        if "RANK" not in os.environ or dist.is_initialized():
            return run_dir
        from trainer.distributed import join  # loaded only under torchrun
        return join(run_dir, device)

    def leave_processes(self, together: bool) -> None:
        if dist.is_initialized():
            from trainer.distributed import leave
            leave(together)

    def after_stop(self, signum: int, resume: Optional[str]) -> None:
        """What a stopped run does before it exits (a cluster job may requeue itself)."""

    def end(self, code: int, run_dir: Path) -> NoReturn:
        """Leave an unfinished run with exit code `code` (trainer/exits.py chooses it)."""
        sys.exit(code)


def exit_if_sweep_stopped(script: str) -> None:
    """If trainer/launch.py (loaded by launcher configs) stopped the sweep, exit as it says."""
    launch = sys.modules.get("trainer.launch")
    if launch is not None:
        launch.exit_if_stopped(script)
