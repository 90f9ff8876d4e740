"""Continuing a stopped run: which checkpoint, whether anything is left to do, and the shell
commands that continue a run, a sweep job or a whole sweep (docs/training.md, "Resume").

The command line is Hydra's: the functions that read Hydra's state (`overrides`,
`resume_commands`) are called from train.py's Hydra entry only.
"""

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import to_absolute_path


def resume_path(resume: Optional[str], run_dir: Path) -> Optional[Path]:
    """trainer.resume: null (fresh), auto (run_dir's last.pt if any), or a checkpoint path."""
    if resume is None:
        return None
    if resume == "auto":
        path = run_dir / "checkpoints" / "last.pt"
        return path if path.exists() else None
    return Path(to_absolute_path(resume))


def finished(step: int, max_steps: int, run_dir: Path, rank: int) -> bool:
    """Whether a resumed run has nothing left to do (its checkpoint is at trainer.max_steps, or
    its summary.json says it diverged); rank 0 says why."""
    summary = run_dir / "summary.json"
    if step >= max_steps:
        reason = (f"its checkpoint is at step {step} and trainer.max_steps={max_steps}; raise "
                  "trainer.max_steps to train it further")
    elif summary.is_file() and json.loads(summary.read_text()).get("diverged"):
        reason = ("it diverged (summary.json); start a new run, e.g. with a lower optim.lr, to "
                  "try again")
    else:
        return False
    if rank == 0:
        print(f"Nothing to do: the run in {run_dir} is finished ({reason}). Its files are left "
              "as they are.")
    return True


def overrides() -> list[str]:
    """The command-line overrides of this run (empty when called outside Hydra's main)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def shown(path: Path) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    inside = path.resolve().is_relative_to(Path.cwd().resolve())
    return os.path.relpath(path) if inside else str(path)


def hydra_quoted(value: str) -> str:
    """A Hydra override value that may hold `=` and `,` (a sweep job's folder name)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def resume_commands(run_dir: Path, world: int, script: str,
                    whole_sweep: bool = True) -> list[tuple[str, str]]:
    """(what, shell command) pairs that continue this run: the job alone, in its own folder
    (hydra.mode=RUN: a preset's MULTIRUN would ignore hydra.run.dir; hydra.output_subdir=null
    keeps the job's .hydra/ as its first segment wrote it), and, in a sweep whose jobs run in
    this process (whole_sweep), the whole sweep (sweep_command). `script` is train.py's path."""
    hc = HydraConfig.get()
    launcher = python_launcher(script, world)
    own = ("trainer.resume=", "hydra.mode=", "hydra.run.", "hydra.sweep.", "hydra.sweeper.",
           "hydra.output_subdir=", "hydra/launcher=", "hydra.launcher.")
    job = [*launcher, *(o for o in hc.overrides.task if not o.startswith(own)),
           *(o for o in hc.overrides.hydra if not o.startswith(own)),
           "trainer.resume=auto", "hydra.mode=RUN", "hydra.output_subdir=null",
           f"hydra.run.dir={hydra_quoted(shown(run_dir))}"]
    commands = [("this run", shlex.join(job))]
    if hc.mode == RunMode.MULTIRUN and whole_sweep:
        commands.append((WHOLE_SWEEP, sweep_command(Path(hc.sweep.dir), script, world)))
    return commands


WHOLE_SWEEP = "the whole sweep (finished jobs are skipped, the others continue or start)"


def python_launcher(script: str, world: int) -> list[str]:
    return (["python", script] if world == 1 else
            ["torchrun", "--standalone", f"--nproc_per_node={world}", script])


def sweep_command(sweep_dir: Path, script: str, world: int = 1) -> str:
    """The command that continues a whole sweep: this process's command line again (its
    launcher, e.g. hydra/launcher=joblib, included) with trainer.resume=auto and the sweep
    folder. Called in the process that launched the sweep."""
    again = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=", "hydra.sweep.dir="))]
    return shlex.join([*python_launcher(script, world), *again, "trainer.resume=auto",
                       f"hydra.sweep.dir={hydra_quoted(shown(sweep_dir))}"])
