"""How a run that did not finish exits (the exit codes: docs/training.md, "Configuration"): a
UserError with code 2 (a folder it made, still empty, removed), a stop with 128
+ the signal after printing the commands that resume it, a divergence (on_nan=raise) with 3."""

import sys
from pathlib import Path
from typing import NoReturn, Optional

from model.errors import UserError
from trainer.build import process_rank, world_size
from trainer.job import Interrupted, Job
from trainer.resume import remove_if_unstarted


def end_on(job: Job, err: Exception, run_dir: Path, script: str,
           resume: Optional[str]) -> NoReturn:
    """Exit after `err` (UserError, Interrupted or Diverged) through the job's hooks."""
    rank = process_rank()
    if isinstance(err, Interrupted):
        if rank == 0:
            how = "".join(f"\nResume {what} with:\n  {command}" for what, command
                          in job.resume_commands(run_dir, world_size(), script))
            print(f"{err}; checkpoint {err.checkpoint}.{how}", file=sys.stderr)
        job.after_stop(err.signum, resume)
        job.end(128 + err.signum, run_dir)
    if isinstance(err, UserError):
        if rank == 0:
            remove_if_unstarted(run_dir)
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        job.end(2, run_dir)
    print(f"error: {err}", file=sys.stderr)
    job.end(3, run_dir)

