"""How a run stops early: SIGINT/SIGTERM (or a cluster's time-limit signal) between steps, or a
non-finite loss."""

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Optional

STOPS = (signal.SIGINT, signal.SIGTERM)

# The first stop signal this process received, 0 if none: a job that starts after its sweep
# was asked to stop reads it (trainer.launch), and so does the training loop when the signal
# came before the loop began.
_requested = 0
_held: dict = {}   # the handlers hold_stop_signals replaced


class Interrupted(Exception):
    """A stop signal arrived: the step in flight finished and last.pt was written."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(Exception):
    """The training loss became non-finite and trainer.on_nan=raise."""


def stop_requested() -> int:
    return _requested


def record(signum: int) -> bool:
    """Remember a stop signal; True when it is this process's first."""
    global _requested
    first = not _requested
    _requested = _requested or signum
    return first


def preempt_signal() -> Optional[int]:
    """The signal submitit sends a job `signal_delay_s` before its time limit or on pre-emption
    (submitit's JobEnvironment: SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL names another); None
    outside a submitit job (SUBMITIT_EXECUTOR unset)."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def hold_stop_signals(react: Optional[Callable[[int], None]]) -> None:
    """Until release_stop_signals: record SIGINT/SIGTERM instead of dying of them, calling
    react(signum) on the first; a second SIGINT aborts (KeyboardInterrupt)."""
    def handle(signum, frame):
        if record(signum):
            if react is not None:
                react(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
    for s in STOPS:
        previous = signal.signal(s, handle)
        _held.setdefault(s, previous)


def release_stop_signals() -> None:
    while _held:
        s, handler = _held.popitem()
        signal.signal(s, handler)


class StopSignal:
    """Turn SIGINT/SIGTERM (and, in a submitit job, its time-limit signal) into a flag the loop
    reads between steps; a second SIGINT aborts. A stop recorded before the loop began counts."""

    def __enter__(self):
        self.signum = _requested
        self.signals = [*STOPS, *filter(None, [preempt_signal()])]
        self.previous = {s: signal.signal(s, self.handle) for s in self.signals}
        return self

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
