"""How a run stops early: SIGINT/SIGTERM between steps, or a non-finite loss."""

import signal
from pathlib import Path


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: the step in flight finished and last.pt was written."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Diverged(Exception):
    """The training loss became non-finite and trainer.on_nan=raise."""


class StopSignal:
    """Turn SIGINT/SIGTERM into a flag the loop reads between steps; a second SIGINT aborts."""

    def __enter__(self):
        self.signum = 0
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
